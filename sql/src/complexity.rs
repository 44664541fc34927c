//! How deeply a statement may nest, checked before anything recursive sees it.
//!
//! The parser, DataFusion's planner and optimizer, the executor and the code that walks or
//! drops an expression tree all recurse once per level of it, so a deep enough statement
//! (`SELECT 1+1+...` with a few thousand terms, thousands of nested parentheses, a chain of
//! `UNION ALL`s or of CTEs each reading the one before) would overflow any thread's stack and
//! abort the whole process. [`check`] estimates, from the statement's tokens and without
//! recursion, the depth of the deepest path through the tree it would parse into, and refuses
//! a statement deeper than [`MAX_DEPTH`] with `54001` ("statement too complex"), as
//! PostgreSQL refuses one beyond `max_stack_depth`.
//!
//! Invariants: the estimate never under-counts a path — every token that can add a level to
//! a tree (an opening bracket, a binary or unary operator, a set operation, a cast, a CTE) adds
//! one to the level it is in — so a statement that passes nests at most [`MAX_DEPTH`] deep;
//! threads that parse, plan and run statements have [`STACK_BYTES`] of stack, enough for
//! that depth in a debug build (the `deep_statements_*` tests run each shape at the limit).

use std::any::TypeId;
use std::sync::atomic::{AtomicUsize, Ordering};

use datafusion::sql::sqlparser::ast::Expr;
use datafusion::sql::sqlparser::dialect::{Dialect, PostgreSqlDialect, Precedence};
use datafusion::sql::sqlparser::keywords::Keyword;
use datafusion::sql::sqlparser::parser::{Parser, ParserError};
use datafusion::sql::sqlparser::tokenizer::{Token, Tokenizer};

use crate::error::{sqlstate, Error, Result};

/// The deepest a statement may nest: operators chained at one level plus brackets, set
/// operations and CTEs along the deepest path, arithmetic operators counting
/// [`ARITHMETIC_WEIGHT`] each. PostgreSQL's default `max_stack_depth` takes about a thousand
/// `+` terms and refuses ten thousand.
pub const MAX_DEPTH: usize = 1000;

/// Levels an arithmetic operator counts for: chains of `+ - * /` are planned as checked
/// function calls, whose planning cost grows faster than their depth, so they may chain a
/// quarter as far (250 operators).
pub const ARITHMETIC_WEIGHT: usize = 4;

/// Stack of every thread that parses, plans or runs a statement (virtual memory: only what
/// a statement uses is ever touched).
pub const STACK_BYTES: usize = 64 << 20;

/// The sqlparser recursion limit: the parser counts up to two levels (a query and an
/// expression) where [`check`] counts one, so a statement that passes never reaches it.
pub const PARSER_RECURSION_LIMIT: usize = 2 * MAX_DEPTH + 16;

/// Expression parses the parser may start per byte of statement (plus [`PARSE_BASE`]) before
/// it gives up with `54001`. A statement parses each expression once or, where sqlparser tries
/// one reading and falls back to another, a few times; only a statement whose failed readings
/// nest (`ARRAY[ARRAY[...` with an error at the bottom: each level tried twice, 2^depth in
/// all) comes near it.
pub const PARSES_PER_BYTE: usize = 4;
/// See [`PARSES_PER_BYTE`].
pub const PARSE_BASE: usize = 50_000;

/// Depth up to which a statement may also be parsed by a parser without [`Bounded`]'s work
/// bound (the client catalog-query parser, whose recursion limit is 50): below its limit it
/// does the same work as the bounded parse did.
pub const UNBOUNDED_PARSE_DEPTH: usize = 40;

/// Refuses a statement, given as its tokens, that would nest deeper than [`MAX_DEPTH`]. The
/// statement front end calls it on the tokens it already has (`statement::rewrite`).
pub fn check(tokens: &[Token]) -> Result<()> {
    if estimate(tokens) > MAX_DEPTH {
        return Err(too_complex());
    }
    Ok(())
}

/// The estimated depth of `sql` (see [`check`]); 0 if it does not tokenize.
pub fn depth(sql: &str) -> usize {
    Tokenizer::new(&PostgreSqlDialect {}, sql)
        .tokenize()
        .map_or(0, |t| estimate(&t))
}

/// The `54001` error for a statement nested too deeply.
pub fn too_complex() -> Error {
    Error::new(
        sqlstate::STATEMENT_TOO_COMPLEX,
        format!(
            "statement too complex: it nests more than {MAX_DEPTH} levels deep (operators \
             chained at one level, brackets, set operations and CTEs count); split it up"
        ),
    )
}

/// The deepest path, in levels: at each bracket level, one plus the operators seen at that
/// level so far (a chain `a + b + c` parses left-deep), summed over the open levels.
fn estimate(tokens: &[Token]) -> usize {
    // Levels added by each open bracket (operators seen inside it, plus one for itself).
    let mut open: Vec<usize> = vec![1];
    let mut path = 1;
    let mut deepest = 1;
    let mut prev: Option<&Token> = None;
    for t in tokens.iter().filter(|t| !matches!(t, Token::Whitespace(_))) {
        match t {
            Token::LParen | Token::LBracket | Token::LBrace => {
                if matches!(prev, Some(Token::Word(w)) if w.keyword == Keyword::AS) {
                    // a CTE (or a subquery alias list): the next one may read it
                    if let Some(level) = open.last_mut() {
                        *level += 1;
                    }
                    path += 1;
                }
                open.push(1);
                path += 1;
            }
            Token::RParen | Token::RBracket | Token::RBrace if open.len() > 1 => {
                path -= open.pop().unwrap_or(0);
            }
            t if adds_level(t, prev) => {
                let weight = if is_arithmetic(t) {
                    ARITHMETIC_WEIGHT
                } else {
                    1
                };
                if let Some(level) = open.last_mut() {
                    *level += weight;
                }
                path += weight;
            }
            _ => {}
        }
        deepest = deepest.max(path);
        prev = Some(t);
    }
    deepest
}

/// Whether `t` (after `prev`) adds a level to the tree: an operator, a cast, a set operation,
/// a boolean connective, or the `AS (` that opens a CTE (each CTE can read the ones before).
fn adds_level(t: &Token, prev: Option<&Token>) -> bool {
    match t {
        Token::Word(w) if w.quote_style.is_none() => matches!(
            w.keyword,
            Keyword::AND
                | Keyword::OR
                | Keyword::NOT
                | Keyword::UNION
                | Keyword::INTERSECT
                | Keyword::EXCEPT
                | Keyword::IS
                | Keyword::LIKE
                | Keyword::ILIKE
                | Keyword::SIMILAR
                | Keyword::BETWEEN
                | Keyword::IN
                | Keyword::CASE
                | Keyword::COLLATE
                | Keyword::AT
        ),
        Token::LParen => false,
        Token::Comma | Token::SemiColon | Token::Period | Token::Colon => false,
        Token::EOF | Token::Whitespace(_) => false,
        Token::Word(_)
        | Token::Number(..)
        | Token::Char(_)
        | Token::SingleQuotedString(_)
        | Token::DoubleQuotedString(_)
        | Token::DollarQuotedString(_)
        | Token::NationalStringLiteral(_)
        | Token::EscapedStringLiteral(_)
        | Token::UnicodeStringLiteral(_)
        | Token::HexStringLiteral(_)
        | Token::Placeholder(_)
        | Token::RParen
        | Token::RBracket
        | Token::RBrace => false,
        _ => is_operator(t, prev),
    }
}

/// `+ - * /`: each is a checked function call (see [`crate::arithmetic`]), which DataFusion
/// plans in time growing faster than the chain's length.
fn is_arithmetic(t: &Token) -> bool {
    matches!(t, Token::Plus | Token::Minus | Token::Mul | Token::Div)
}

/// Any other punctuation is an operator (`+`, `||`, `::`, `->>`, `@>`, ...), except the `*`
/// of `SELECT *` / `count(*)` / `t.*`.
fn is_operator(t: &Token, prev: Option<&Token>) -> bool {
    match t {
        Token::Mul => {
            !matches!(
                prev,
                None | Some(Token::Comma | Token::LParen | Token::Period)
            ) && !matches!(prev, Some(Token::Word(w))
            if matches!(w.keyword, Keyword::SELECT | Keyword::DISTINCT | Keyword::ALL))
        }
        _ => true,
    }
}

/// PostgreSQL's dialect, with a bound on the parser's work: past [`PARSES_PER_BYTE`] per byte
/// of the statement, every further expression parse fails with `RecursionLimitExceeded`,
/// which no fallback reading catches, so the parse ends (as `54001`) in time linear in the
/// statement. sqlparser dispatches on the dialect's type id, so this one reports
/// PostgreSqlDialect's and otherwise delegates every method PostgreSqlDialect defines.
#[derive(Debug)]
pub struct Bounded {
    inner: PostgreSqlDialect,
    prefixes: AtomicUsize,
    budget: usize,
}

impl Bounded {
    /// A dialect for parsing one statement text of `bytes` bytes.
    pub fn for_statement(bytes: usize) -> Bounded {
        Bounded {
            inner: PostgreSqlDialect {},
            prefixes: AtomicUsize::new(0),
            budget: bytes.saturating_mul(PARSES_PER_BYTE) + PARSE_BASE,
        }
    }
}

impl Dialect for Bounded {
    fn dialect(&self) -> TypeId {
        TypeId::of::<PostgreSqlDialect>()
    }

    fn parse_prefix(&self, parser: &mut Parser) -> Option<std::result::Result<Expr, ParserError>> {
        if self.prefixes.fetch_add(1, Ordering::Relaxed) >= self.budget {
            return Some(Err(ParserError::RecursionLimitExceeded));
        }
        self.inner.parse_prefix(parser)
    }

    fn identifier_quote_style(&self, identifier: &str) -> Option<char> {
        self.inner.identifier_quote_style(identifier)
    }

    fn is_delimited_identifier_start(&self, ch: char) -> bool {
        self.inner.is_delimited_identifier_start(ch)
    }

    fn is_identifier_start(&self, ch: char) -> bool {
        self.inner.is_identifier_start(ch)
    }

    fn is_identifier_part(&self, ch: char) -> bool {
        self.inner.is_identifier_part(ch)
    }

    fn supports_unicode_string_literal(&self) -> bool {
        self.inner.supports_unicode_string_literal()
    }

    fn is_reserved_for_identifier(&self, kw: Keyword) -> bool {
        self.inner.is_reserved_for_identifier(kw)
    }

    fn is_custom_operator_part(&self, ch: char) -> bool {
        self.inner.is_custom_operator_part(ch)
    }

    fn get_next_precedence(&self, parser: &Parser) -> Option<std::result::Result<u8, ParserError>> {
        self.inner.get_next_precedence(parser)
    }

    fn supports_filter_during_aggregation(&self) -> bool {
        self.inner.supports_filter_during_aggregation()
    }

    fn supports_group_by_expr(&self) -> bool {
        self.inner.supports_group_by_expr()
    }

    fn prec_value(&self, prec: Precedence) -> u8 {
        self.inner.prec_value(prec)
    }

    fn allow_extract_custom(&self) -> bool {
        self.inner.allow_extract_custom()
    }

    fn allow_extract_single_quotes(&self) -> bool {
        self.inner.allow_extract_single_quotes()
    }

    fn supports_create_index_with_clause(&self) -> bool {
        self.inner.supports_create_index_with_clause()
    }

    fn supports_explain_with_utility_options(&self) -> bool {
        self.inner.supports_explain_with_utility_options()
    }

    fn supports_listen_notify(&self) -> bool {
        self.inner.supports_listen_notify()
    }

    fn supports_factorial_operator(&self) -> bool {
        self.inner.supports_factorial_operator()
    }

    fn supports_bitwise_shift_operators(&self) -> bool {
        self.inner.supports_bitwise_shift_operators()
    }

    fn supports_comment_on(&self) -> bool {
        self.inner.supports_comment_on()
    }

    fn supports_load_extension(&self) -> bool {
        self.inner.supports_load_extension()
    }

    fn supports_named_fn_args_with_colon_operator(&self) -> bool {
        self.inner.supports_named_fn_args_with_colon_operator()
    }

    fn supports_named_fn_args_with_expr_name(&self) -> bool {
        self.inner.supports_named_fn_args_with_expr_name()
    }

    fn supports_empty_projections(&self) -> bool {
        self.inner.supports_empty_projections()
    }

    fn supports_nested_comments(&self) -> bool {
        self.inner.supports_nested_comments()
    }

    fn supports_string_escape_constant(&self) -> bool {
        self.inner.supports_string_escape_constant()
    }

    fn supports_numeric_literal_underscores(&self) -> bool {
        self.inner.supports_numeric_literal_underscores()
    }

    fn supports_array_typedef_with_brackets(&self) -> bool {
        self.inner.supports_array_typedef_with_brackets()
    }

    fn supports_geometric_types(&self) -> bool {
        self.inner.supports_geometric_types()
    }

    fn supports_set_names(&self) -> bool {
        self.inner.supports_set_names()
    }

    fn supports_alter_column_type_using(&self) -> bool {
        self.inner.supports_alter_column_type_using()
    }

    fn supports_notnull_operator(&self) -> bool {
        self.inner.supports_notnull_operator()
    }

    fn supports_interval_options(&self) -> bool {
        self.inner.supports_interval_options()
    }

    fn supports_insert_table_alias(&self) -> bool {
        self.inner.supports_insert_table_alias()
    }

    fn supports_create_table_like_parenthesized(&self) -> bool {
        self.inner.supports_create_table_like_parenthesized()
    }

    fn supports_select_wildcard_with_alias(&self) -> bool {
        self.inner.supports_select_wildcard_with_alias()
    }

    fn supports_comma_separated_trim(&self) -> bool {
        self.inner.supports_comma_separated_trim()
    }

    fn supports_xml_expressions(&self) -> bool {
        self.inner.supports_xml_expressions()
    }

    fn supports_comment_optimizer_hint(&self) -> bool {
        self.inner.supports_comment_optimizer_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens(sql: &str) -> Vec<Token> {
        Tokenizer::new(&PostgreSqlDialect {}, sql)
            .tokenize()
            .unwrap()
    }

    fn depth(sql: &str) -> usize {
        estimate(&tokens(sql))
    }

    fn chain(n: usize, term: &str, op: &str) -> String {
        vec![term; n].join(op)
    }

    #[test]
    fn operator_chains_count_each_operator() {
        assert_eq!(depth("SELECT 1"), 1);
        assert_eq!(depth("SELECT 1+1+1"), 9);
        assert_eq!(depth(&format!("SELECT {}", chain(200, "1", "+"))), 797);
        assert_eq!(depth("SELECT a AND b OR c"), 3);
        assert_eq!(depth("SELECT x::int::text"), 3);
    }

    #[test]
    fn brackets_nest_and_close() {
        assert_eq!(depth("SELECT ((((1))))"), 5);
        assert_eq!(depth("SELECT (1+1), (1+1)"), 6);
        assert_eq!(depth("SELECT ARRAY[ARRAY[1]]"), 3);
    }

    #[test]
    fn wide_statements_are_not_deep() {
        let values = vec!["(1, 'a', now())"; 5000].join(", ");
        assert!(depth(&format!("INSERT INTO t VALUES {values}")) < 5);
        let list = vec!["7"; 10_000].join(", ");
        assert!(depth(&format!("SELECT * FROM t WHERE x IN ({list})")) < 5);
        assert!(depth("SELECT count(*), t.* FROM t") < 3);
    }

    #[test]
    fn set_operations_and_ctes_chain() {
        let unions = chain(600, "SELECT 1", " UNION ALL ");
        assert_eq!(depth(&unions), 600);
        let ctes: Vec<String> = (1..=600)
            .map(|i| format!("c{i} AS (SELECT * FROM c{})", i - 1))
            .collect();
        assert!(depth(&format!("WITH {} SELECT 1", ctes.join(", "))) > 600);
    }

    #[test]
    fn beyond_the_limit_is_54001() {
        let sql = format!("SELECT {}", chain(MAX_DEPTH + 1, "1", " AND "));
        assert_eq!(check(&tokens(&sql)).unwrap_err().code, "54001");
        let sql = format!("SELECT {}", chain(MAX_DEPTH - 1, "1", " AND "));
        assert!(check(&tokens(&sql)).is_ok());
        let sql = format!(
            "SELECT {}",
            chain(MAX_DEPTH / ARITHMETIC_WEIGHT + 1, "1", "+")
        );
        assert_eq!(check(&tokens(&sql)).unwrap_err().code, "54001");
        let sql = format!(
            "SELECT {}",
            chain(MAX_DEPTH / ARITHMETIC_WEIGHT - 1, "1", "+")
        );
        assert!(check(&tokens(&sql)).is_ok());
    }
}
