//! Making the SQL clients send plannable by DataFusion.
//!
//! `datafusion-pg-catalog`'s rewriter handles most client catalog queries
//! (`'t'::regclass`, `OPERATOR(pg_catalog.~)`, `COLLATE`, duplicate
//! projection names, a few whole-query substitutions). Its rule set also
//! turns correlated scalar subqueries in a projection into NULL — right for
//! the catalog queries it targets (Sluice has no column defaults or
//! collations to show), wrong for a user's query — so the full set applies
//! only to statements that read the system catalogs, and every other query
//! gets the meaning-preserving subset.
//!
//! `FRAGMENTS` adds substitutions of our own for client query fragments
//! DataFusion cannot plan, each replaced by one that means the same for
//! Sluice's catalogs.

use std::sync::LazyLock;

use datafusion::sql::sqlparser::ast::{SetExpr, Statement};
use datafusion::sql::sqlparser::parser::{Parser, ParserError};
use datafusion_pg_catalog::sql::rules::{self, SqlStatementRewriteRule};
use datafusion_pg_catalog::sql::PostgresCompatibilityParser;

use crate::complexity;

static CATALOG_SQL: LazyLock<PostgresCompatibilityParser> =
    LazyLock::new(PostgresCompatibilityParser::new);

static QUERY_RULES: LazyLock<Vec<Box<dyn SqlStatementRewriteRule>>> = LazyLock::new(|| {
    vec![
        Box::new(rules::StripCallableQualifier),
        Box::new(super::rewrite::KeywordColumnNames),
        Box::new(rules::CurrentUserVariableToSessionUserFunctionCall),
        Box::new(rules::StripCollate),
        Box::new(rules::RewritePgCatalogOperator),
        Box::new(rules::RewriteRegCastToSubquery::new()),
        Box::new(rules::FixVersionColumnName),
        Box::new(super::rewrite::PgFunctions),
        Box::new(super::rewrite::IntLiterals),
    ]
});

/// (fragment as the client sends it, replacement). Matched ignoring
/// whitespace differences.
const FRAGMENTS: &[(&str, &str)] = &[
    // psql \d+: TOAST table options. Sluice has no TOAST tables, so the
    // `array(select ... unnest(tc.reloptions))` part (an ARRAY(subquery)
    // DataFusion cannot plan) is always empty.
    (
        "pg_catalog.array_to_string(c.reloptions || array(select 'toast.' || x from pg_catalog.unnest(tc.reloptions) x), ', ')",
        "pg_catalog.array_to_string(c.reloptions, ', ')",
    ),
    // Grafana: "is the schema on search_path". DataFusion can neither take
    // a function result as a FROM item (`string_to_array(...) s`) nor run an
    // IN (subquery) inside CASE; the same test as an array membership.
    (
        "IN ( SELECT CASE WHEN trim(s[i]) = '\"$user\"' THEN user ELSE trim(s[i]) END FROM generate_series( array_lower(string_to_array(current_setting('search_path'),','),1), array_upper(string_to_array(current_setting('search_path'),','),1) ) as i, string_to_array(current_setting('search_path'),',') s )",
        "= ANY(array_replace(string_to_array(replace(current_setting('search_path'), ' ', ''), ','), '\"$user\"', user))",
    ),
    // psql \du: a role's memberships, an ARRAY(subquery) DataFusion cannot plan, as a
    // function that reads the same roles
    (
        "ARRAY(SELECT b.rolname FROM pg_catalog.pg_auth_members m JOIN pg_catalog.pg_roles b ON (m.roleid = b.oid) WHERE m.member = r.oid) as memberof",
        "sluice_role_memberof(r.oid) as memberof",
    ),
    // psql \d: a column's default, a correlated scalar subquery over pg_attrdef (the catalog
    // parser would make it NULL), as a function that reads the same defaults
    (
        "(SELECT pg_catalog.pg_get_expr(d.adbin, d.adrelid, true) FROM pg_catalog.pg_attrdef d WHERE d.adrelid = a.attrelid AND d.adnum = a.attnum AND a.atthasdef)",
        "sluice_column_default(a.attrelid, a.attnum)",
    ),
    // psql \dp: column privileges and row security policies, which Sluice does not have
    // (no attacl is ever set, pg_policy is empty), so both lists are always empty. Its E''
    // strings are written as the statement front end leaves them (plain, newlines inside)
    (
        r#"pg_catalog.array_to_string(ARRAY( SELECT attname || ':  ' || pg_catalog.array_to_string(attacl, '  ') FROM pg_catalog.pg_attribute a WHERE attrelid = c.oid AND NOT attisdropped AND attacl IS NOT NULL ), ' ') AS "Column privileges""#,
        r#"'' AS "Column privileges""#,
    ),
    (
        r#"pg_catalog.array_to_string(ARRAY( SELECT polname || CASE WHEN NOT polpermissive THEN ' (RESTRICTIVE)' ELSE '' END || CASE WHEN polcmd <> '*' THEN ' (' || polcmd::pg_catalog.text || '):' ELSE ':' END || CASE WHEN polqual IS NOT NULL THEN '  (u): ' || pg_catalog.pg_get_expr(polqual, polrelid) ELSE '' END || CASE WHEN polwithcheck IS NOT NULL THEN '  (c): ' || pg_catalog.pg_get_expr(polwithcheck, polrelid) ELSE '' END || CASE WHEN polroles <> '{0}' THEN '  to: ' || pg_catalog.array_to_string( ARRAY( SELECT rolname FROM pg_catalog.pg_roles WHERE oid = ANY (polroles) ORDER BY 1 ), ', ') ELSE '' END FROM pg_catalog.pg_policy pol WHERE polrelid = c.oid), ' ') AS "Policies""#,
        r#"'' AS "Policies""#,
    ),
    // pgcli's function list: argument types as type names. The static
    // pg_proc keeps them as text, which does not cast to regtype[].
    (
        "COALESCE(proallargtypes::regtype[], proargtypes::regtype[])::text[]",
        "pg_arg_type_names(COALESCE(proallargtypes, proargtypes))",
    ),
];

/// Parse `sql` (already through Sluice's own token rewrite) into statements
/// DataFusion can plan.
pub fn parse(sql: &str) -> Result<Vec<Statement>, ParserError> {
    let dialect = complexity::Bounded::for_statement(sql.len());
    let plain = Parser::new(&dialect)
        .with_recursion_limit(complexity::PARSER_RECURSION_LIMIT)
        .try_with_sql(sql)
        .and_then(|mut p| p.parse_statements());
    // the catalog parser has no work bound (see complexity::UNBOUNDED_PARSE_DEPTH); it
    // parses the text after FRAGMENTS, which may have taken the deepest part away (\dp)
    // made once, when a catalog parse is considered
    let substituted = std::cell::OnceCell::new();
    let substituted = || substituted.get_or_init(|| substitute(sql)).as_str();
    let catalog_parse_ok = || complexity::depth(substituted()) <= complexity::UNBOUNDED_PARSE_DEPTH;
    match plain {
        Ok(stmts) if !stmts.iter().any(reads_catalogs) || !catalog_parse_ok() => Ok(stmts
            .into_iter()
            .map(|s| match s {
                Statement::Query(_) => QUERY_RULES.iter().fold(s, |s, r| r.rewrite(s)),
                // a prepared query is rewritten as the query itself would be
                Statement::Prepare {
                    name,
                    data_types,
                    statement,
                } if matches!(*statement, Statement::Query(_)) => Statement::Prepare {
                    name,
                    data_types,
                    statement: Box::new(QUERY_RULES.iter().fold(*statement, |s, r| r.rewrite(s))),
                },
                other => other,
            })
            // every query inside any statement (EXPLAIN, INSERT ... SELECT, CREATE VIEW,
            // DECLARE, COPY (query) TO); not INSERT ... VALUES, which has no FROM to
            // correlate with and is the appends' hot path
            .map(|s| match &s {
                Statement::Insert(i)
                    if i.source
                        .as_ref()
                        .is_some_and(|q| matches!(q.body.as_ref(), SetExpr::Values(_))) =>
                {
                    s
                }
                _ => super::decorrelate::CorrelatedAggregates.rewrite(s),
            })
            .collect()),
        // reads the catalogs, or (a client catalog query the crate knows)
        // does not parse as sent
        Ok(_) => catalog_parse(substituted()),
        Err(ParserError::RecursionLimitExceeded) => Err(ParserError::RecursionLimitExceeded),
        Err(e) if mentions_catalogs(sql) && catalog_parse_ok() => {
            catalog_parse(substituted()).map_err(|_| e)
        }
        Err(e) => Err(e),
    }
}

/// Parse `substituted` (the text after [`FRAGMENTS`]) with the catalog parser and rules.
fn catalog_parse(substituted: &str) -> Result<Vec<Statement>, ParserError> {
    let stmts = CATALOG_SQL.parse(substituted)?;
    Ok(stmts
        .into_iter()
        .map(|s| super::rewrite::OwnRelations.rewrite(s))
        .map(|s| super::rewrite::PgFunctions.rewrite(s))
        .map(|s| super::rewrite::CaseSubqueries.rewrite(s))
        .map(|s| super::rewrite::AggregateScalarSubqueries.rewrite(s))
        .map(|s| super::rewrite::IntLiterals.rewrite(s))
        .collect())
}

/// Whether a statement reads a system catalog relation: anything in
/// `pg_catalog` or `information_schema`, or an unqualified pg_catalog
/// relation name.
fn reads_catalogs(stmt: &Statement) -> bool {
    use datafusion::sql::sqlparser::ast::{ObjectName, Visit, Visitor};
    use std::ops::ControlFlow;
    struct Find(bool);
    impl Visitor for Find {
        type Break = ();
        fn pre_visit_relation(&mut self, name: &ObjectName) -> ControlFlow<()> {
            let parts: Vec<String> = name
                .0
                .iter()
                .map(|p| p.to_string().trim_matches('"').to_ascii_lowercase())
                .collect();
            let hit = match parts.as_slice() {
                [.., schema, _] => schema == "pg_catalog" || schema == "information_schema",
                [table] => {
                    datafusion_pg_catalog::pg_catalog::PG_CATALOG_TABLES.contains(&table.as_str())
                        || super::rewrite::OWN_UNLISTED.contains(&table.as_str())
                }
                [] => false,
            };
            if hit {
                self.0 = true;
                return ControlFlow::Break(());
            }
            ControlFlow::Continue(())
        }
    }
    let mut f = Find(false);
    let _ = stmt.visit(&mut f);
    f.0
}

/// Whether the text names the catalogs at all (for SQL that only parses
/// after the crate's whole-query substitutions).
fn mentions_catalogs(sql: &str) -> bool {
    let b = sql.as_bytes();
    b.windows(3).any(|w| w.eq_ignore_ascii_case(b"pg_"))
        || b.windows(18)
            .any(|w| w.eq_ignore_ascii_case(b"information_schema"))
}

/// Apply [`FRAGMENTS`].
fn substitute(sql: &str) -> String {
    let mut out = sql.to_string();
    for (pattern, replacement) in FRAGMENTS {
        let (pat, _) = normalize(pattern);
        let (norm, map) = normalize(&out);
        if let Some(at) = norm.find(&pat) {
            let start = map[at];
            let end = map[at + pat.len() - 1] + 1;
            out.replace_range(start..end, replacement);
        }
    }
    out
}

/// `sql` with whitespace runs collapsed to one space and removed next to
/// punctuation, plus each normalized byte's offset in `sql`.
fn normalize(sql: &str) -> (String, Vec<usize>) {
    let mut norm = String::with_capacity(sql.len());
    let mut map = Vec::with_capacity(sql.len());
    let mut pending_space = false;
    for (i, ch) in sql.char_indices() {
        if ch.is_whitespace() {
            pending_space = !norm.is_empty();
            continue;
        }
        if pending_space {
            let prev_word = norm.chars().last().is_some_and(is_word);
            if prev_word && is_word(ch) {
                norm.push(' ');
                map.push(i);
            }
            pending_space = false;
        }
        let mut buf = [0u8; 4];
        for _ in ch.encode_utf8(&mut buf).bytes() {
            map.push(i);
        }
        norm.push(ch);
    }
    (norm, map)
}

fn is_word(c: char) -> bool {
    c.is_alphanumeric() || c == '_' || c == '\'' || c == '"'
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fragments_match_across_whitespace() {
        let sql = "SELECT c.relchecks, pg_catalog.array_to_string(c.reloptions || array(select 'toast.' || x from pg_catalog.unnest(tc.reloptions) x), ', ')\n, c.reltablespace FROM pg_catalog.pg_class c";
        let out = substitute(sql);
        assert_eq!(
            out,
            "SELECT c.relchecks, pg_catalog.array_to_string(c.reloptions, ', ')\n, c.reltablespace FROM pg_catalog.pg_class c"
        );
    }

    #[test]
    fn user_queries_keep_correlated_subqueries() {
        let stmts = parse("SELECT (SELECT max(b) FROM u WHERE u.a = t.a) FROM t").unwrap();
        assert!(stmts[0].to_string().contains("SELECT max(b) FROM u"));
    }
}
