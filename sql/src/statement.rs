//! From SQL text to classified statements.
//!
//! Sluice's own syntax is rewritten at the token level into something the
//! PostgreSQL dialect of sqlparser accepts: `CREATE STREAM` / `DROP STREAM` / `ALTER STREAM`
//! become `CREATE TABLE` / `DROP TABLE` / `ALTER TABLE` (remembered per statement), and the
//! system column `offset`, a keyword, is quoted wherever it is used as a
//! column rather than as the `OFFSET n` clause. Each parsed statement is
//! then classified by what will execute it: DataFusion (queries), the
//! append path, DDL, transaction control, or session settings.

use sqlparser::ast::{
    ColumnOption, CopyOption, CopySource, CopyTarget, CreateTableOptions, Expr, ObjectName,
    ObjectType, SqlOption, Statement, Value,
};
use sqlparser::dialect::PostgreSqlDialect;
use sqlparser::keywords::Keyword;
use sqlparser::tokenizer::{Token, Tokenizer, Whitespace, Word};

pub use crate::ast::normalize_ident;
use crate::definition::{
    ColumnDef, Compression, StreamDef, StreamOptions, TableDef, OFFSET_COLUMN, TS_COLUMN,
};
use crate::error::{sqlstate, Error, Result};
use crate::param_type::ParamType;
use crate::table::check_name;
use crate::types::ColumnType;
use crate::units;

pub use datafusion::sql::sqlparser;

mod indexes;
mod roles;

/// A statement, classified by what executes it.
#[derive(Debug, Clone)]
pub enum Parsed {
    /// SELECT, VALUES, WITH, EXPLAIN: planned and run by DataFusion.
    Query(Box<Statement>),
    /// `ALTER CLUSTER ADD NODE id 'host:port'` / `ALTER CLUSTER REMOVE NODE id`.
    AlterCluster(sluice_consensus::Membership),
    Insert(Box<sqlparser::ast::Insert>),
    CreateStream {
        def: StreamDef,
        if_not_exists: bool,
    },
    /// `CREATE TABLE`; its UNIQUE constraints are `def.indexes` (unnamed ones with an empty
    /// name: the session picks it).
    CreateTable {
        def: TableDef,
        if_not_exists: bool,
    },
    /// `DROP STREAM` / `DROP TABLE` (either drops a stream or a table) / `DROP VIEW`.
    DropRelation {
        names: Vec<String>,
        if_exists: bool,
        /// Written as DROP STREAM (the command tag says which).
        stream: bool,
        /// `DROP VIEW`: drops views only (and the others drop no view).
        view: bool,
        /// Views over what is dropped go too.
        cascade: bool,
    },
    /// `CREATE [OR REPLACE] VIEW name [(columns)] AS query`.
    CreateView {
        name: String,
        /// The names `(a, b)` give the first columns; empty: PostgreSQL's names.
        columns: Vec<String>,
        query: Box<sqlparser::ast::Query>,
        or_replace: bool,
    },
    /// `CREATE [UNIQUE] INDEX [IF NOT EXISTS] [name] ON table (columns)`; without a name,
    /// the session picks one as PostgreSQL does.
    CreateIndex {
        name: Option<String>,
        table: String,
        columns: Vec<String>,
        /// Each column's `indoption` (see `IndexDef::options`).
        options: Vec<u32>,
        unique: bool,
        if_not_exists: bool,
    },
    /// `DROP INDEX [IF EXISTS] name [, ...] [CASCADE | RESTRICT]` (nothing depends on an
    /// index, so both drop the same).
    DropIndex {
        names: Vec<String>,
        if_exists: bool,
    },
    Delete(Box<sqlparser::ast::Delete>),
    Update(Box<sqlparser::ast::Update>),
    /// `BEGIN` / `START TRANSACTION` (every transaction is serializable;
    /// `READ ONLY` refuses writes). `read_only` is `None` when the statement
    /// names no access mode: `default_transaction_read_only` decides.
    Begin {
        read_only: Option<bool>,
    },
    Commit,
    Rollback,
    /// `SAVEPOINT name`, `RELEASE [SAVEPOINT] name`, `ROLLBACK TO [SAVEPOINT] name`.
    Savepoint(String),
    ReleaseSavepoint(String),
    RollbackTo(String),
    /// `DISCARD ALL`: settings, cursors, listeners and prepared state reset.
    Discard,
    Set {
        name: String,
        value: String,
    },
    Show(String),
    ShowStreams,
    Reset(Option<String>),
    /// Accepted and ignored (DISCARD ALL, SET SESSION CHARACTERISTICS, ...).
    NoOp(&'static str),
    CopyFrom(CopyFrom),
    /// `COPY (query) TO STDOUT` / `COPY s TO STDOUT`.
    CopyTo {
        query: Box<sqlparser::ast::Query>,
        format: CopyFormat,
    },
    Declare {
        name: String,
        query: Box<sqlparser::ast::Query>,
        hold: bool,
    },
    /// `FETCH [n | ALL] FROM c`; `None` = ALL.
    Fetch {
        name: String,
        count: Option<u64>,
    },
    /// `CLOSE c` / `CLOSE ALL` (`None`).
    Close(Option<String>),
    Listen(String),
    /// `UNLISTEN ch` / `UNLISTEN *` (`None`).
    Unlisten(Option<String>),
    Notify {
        channel: String,
        payload: String,
    },
    /// CREATE/ALTER/DROP ROLE, GRANT, REVOKE (a password still in clear until the session
    /// hashes it).
    Roles(crate::roles::RoleChange),
    /// `ALTER STREAM name SET (...)` / `RENAME TO new` (also written ALTER TABLE).
    AlterStream {
        name: String,
        if_exists: bool,
        /// Written as ALTER STREAM (the command tag says which).
        stream: bool,
        change: StreamChange,
    },
    /// `PREPARE name [(types)] AS statement`.
    Prepare(Box<Prepare>),
    /// `EXECUTE name [(arguments)]`.
    Execute {
        name: String,
        args: Vec<Expr>,
    },
    /// `DEALLOCATE [PREPARE] name` / `DEALLOCATE ALL` (`None`).
    Deallocate(Option<String>),
    /// Recognized but refused; the error is raised when it executes.
    Refused(Error),
}

/// What an `ALTER STREAM` changes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamChange {
    /// `SET (retention = ..., retention_bytes = ..., dedup_window = ...)`.
    Set(OptionChanges),
    RenameTo(String),
    /// `ADD [COLUMN] [IF NOT EXISTS] name type [NOT NULL] [DEFAULT constant]`: the column
    /// (without its default) and the default's expression, evaluated by the session.
    AddColumn {
        column: Box<ColumnDef>,
        default: Option<Box<Expr>>,
        if_not_exists: bool,
    },
    /// `RENAME [COLUMN] from TO to`.
    RenameColumn {
        from: String,
        to: String,
    },
}

/// The options an `ALTER STREAM ... SET` names: `Some(Some(v))` set, `Some(None)` removed
/// (`'none'`), `None` unchanged.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OptionChanges {
    pub retention_ms: Option<Option<u64>>,
    pub retention_bytes: Option<Option<u64>>,
    pub dedup_window_ms: Option<Option<u64>>,
    pub compression: Option<Compression>,
    pub retain_for_consumers: Option<bool>,
}

impl OptionChanges {
    /// `options` with these changes; a dedup window still needs a dedup key.
    pub fn applied_to(&self, options: &StreamOptions) -> Result<StreamOptions> {
        let mut o = options.clone();
        if let Some(v) = self.retention_ms {
            o.retention_ms = v;
        }
        if let Some(v) = self.retention_bytes {
            o.retention_bytes = v;
        }
        if let Some(v) = self.dedup_window_ms {
            o.dedup_window_ms = v;
        }
        if let Some(v) = self.compression {
            o.compression = v;
        }
        if let Some(v) = self.retain_for_consumers {
            o.retain_for_consumers = v;
        }
        if o.dedup_window_ms.is_some() && o.dedup_key.is_none() {
            return Err(Error::new(
                sqlstate::INVALID_PARAMETER_VALUE,
                "dedup_window needs a dedup_key (set when the stream is created)",
            ));
        }
        Ok(o)
    }
}

/// A statement prepared with SQL's `PREPARE`.
#[derive(Debug, Clone)]
pub struct Prepare {
    pub name: String,
    /// The declared parameter types, in order (possibly fewer than the statement uses).
    pub types: Vec<sqlparser::ast::DataType>,
    /// A query, INSERT, UPDATE or DELETE.
    pub statement: Parsed,
}

#[derive(Debug, Clone)]
pub struct CopyFrom {
    pub stream: String,
    pub columns: Vec<String>,
    pub format: CopyFormat,
    /// Data given inline after the statement, up to a `\.` line (psql
    /// scripts), in the COPY's own format.
    pub inline: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CopyFormat {
    Text {
        delimiter: char,
        null: String,
    },
    Csv {
        delimiter: char,
        quote: char,
        escape: char,
        null: String,
        header: bool,
    },
    Binary,
}

/// Statements longer than this are parsed on a blocking thread by [`parse_off_thread`]
/// (parsing takes about a second per megabyte).
pub const PARSE_INLINE_BYTES: usize = 64 << 10;

/// Memory parsing takes per byte of a long statement, at most: its tokens, the rewritten
/// text and sqlparser's tree (a 4 MB `VALUES` list took about 1 GB). Reserved from the
/// statement's memory limits by `Session::parse_text`.
pub const PARSING_BYTES_PER_BYTE: usize = 256;

/// A turn to parse or plan a statement longer than [`PARSE_INLINE_BYTES`]: one at a time in
/// the server. While it is parsed and planned a statement takes about a hundred times its
/// size in memory (a 4 MB `IN` list becomes a large expression tree, copied by the
/// optimizer), so taking turns bounds that to one statement's worth (README: memory bound),
/// and keeps such work to one query thread. Waiting is an await point: a cancel or
/// `statement_timeout` stops it.
pub async fn long_statement_turn() -> tokio::sync::SemaphorePermit<'static> {
    static TURNS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(1);
    TURNS
        .acquire()
        .await
        .expect("the long-statement semaphore is never closed")
}

/// [`parse`], on one of the runtime's blocking threads when `sql` is long, so that a
/// multi-megabyte statement does not hold up the other clients of the connection thread
/// (blocking threads have the same stack as the workers: see [`crate::complexity`]), in its
/// turn ([`long_statement_turn`]).
pub async fn parse_off_thread(sql: &str) -> Result<Vec<Parsed>> {
    if sql.len() <= PARSE_INLINE_BYTES {
        return parse(sql);
    }
    let _turn = long_statement_turn().await;
    let sql = sql.to_owned();
    match tokio::task::spawn_blocking(move || parse(&sql)).await {
        Ok(parsed) => parsed,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(e) => Err(Error::internal(format!("parsing was stopped: {e}"))),
    }
}

/// Parse SQL text (possibly several statements) into classified statements.
/// `COPY ... FROM STDIN;` followed by data lines and a `\.` line (as psql
/// scripts write it) carries that data inline.
pub fn parse(sql: &str) -> Result<Vec<Parsed>> {
    if let Some(change) = parse_alter_cluster(sql)? {
        return Ok(vec![Parsed::AlterCluster(change)]);
    }
    if let Some((head, data, rest)) = split_inline_copy(sql) {
        let mut out = parse_statements(head)?;
        match out.last_mut() {
            Some(Parsed::CopyFrom(c)) => c.inline = Some(data.to_string()),
            _ => {
                return Err(Error::syntax(
                    "data lines after a statement that is not COPY FROM STDIN",
                ))
            }
        }
        out.extend(parse(rest)?);
        return Ok(out);
    }
    parse_statements(sql)
}

/// `ALTER CLUSTER ADD NODE <id> '<host:port>'` or `ALTER CLUSTER REMOVE NODE <id>`, alone
/// in the text (an optional `;` after it). `None` if the text is not an ALTER CLUSTER.
fn parse_alter_cluster(sql: &str) -> Result<Option<sluice_consensus::Membership>> {
    let dialect = PostgreSqlDialect {};
    let Ok(tokens) = Tokenizer::new(&dialect, sql).tokenize() else {
        return Ok(None);
    };
    let toks: Vec<&Token> = tokens
        .iter()
        .filter(|t| !matches!(t, Token::Whitespace(_)))
        .collect();
    let word = |i: usize, w: &str| matches!(toks.get(i), Some(Token::Word(x)) if x.quote_style.is_none() && x.value.eq_ignore_ascii_case(w));
    if !(word(0, "alter") && word(1, "cluster")) {
        return Ok(None);
    }
    let usage = "syntax error: expected ALTER CLUSTER ADD NODE <id> '<host:port>' or ALTER CLUSTER REMOVE NODE <id>";
    let id = match toks.get(4) {
        Some(Token::Number(n, _)) => n.parse::<u64>().ok().filter(|n| *n > 0).ok_or_else(|| {
            Error::new(
                sqlstate::INVALID_PARAMETER_VALUE,
                format!("node id must be a positive integer, not {n}"),
            )
        })?,
        _ => return Err(Error::syntax(usage)),
    };
    let end = |i: usize| {
        toks[i..]
            .iter()
            .all(|t| matches!(t, Token::SemiColon | Token::EOF))
    };
    if word(2, "add") && word(3, "node") {
        let Some(Token::SingleQuotedString(addr)) = toks.get(5) else {
            return Err(Error::syntax(usage));
        };
        if !end(6) {
            return Err(Error::syntax(usage));
        }
        if addr
            .rsplit_once(':')
            .and_then(|(_, p)| p.parse::<u16>().ok())
            .is_none()
        {
            return Err(Error::new(
                sqlstate::INVALID_PARAMETER_VALUE,
                format!("node address \"{addr}\" is not HOST:PORT"),
            ));
        }
        return Ok(Some(sluice_consensus::Membership::Add(id, addr.clone())));
    }
    if word(2, "remove") && word(3, "node") && end(5) {
        return Ok(Some(sluice_consensus::Membership::Remove(id)));
    }
    Err(Error::syntax(usage))
}

/// Split `...COPY x FROM STDIN ...;\n<data>\\.\n<rest>` into its parts.
fn split_inline_copy(sql: &str) -> Option<(&str, &str, &str)> {
    let lower = sql.to_ascii_lowercase();
    let at = lower.find("from stdin")?;
    let semi = at + sql[at..].find(';')?;
    let after = &sql[semi + 1..];
    let nl = after.find('\n')?;
    if !after[..nl].trim().is_empty() {
        return None;
    }
    let data_start = semi + 1 + nl + 1;
    let body = &sql[data_start..];
    let mut pos = 0;
    for line in body.split_inclusive('\n') {
        if line.trim_end_matches(['\n', '\r']) == "\\." {
            return Some((&sql[..=semi], &body[..pos], &body[pos + line.len()..]));
        }
        pos += line.len();
    }
    None
}

fn parse_statements(sql: &str) -> Result<Vec<Parsed>> {
    let (rewritten, stream_flags) = rewrite(sql)?;
    let stmts = crate::system::client_sql::parse(&rewritten).map_err(|e| match e {
        sqlparser::parser::ParserError::RecursionLimitExceeded => crate::complexity::too_complex(),
        e => Error::syntax(clean_parser_error(&e.to_string())),
    })?;
    stmts
        .into_iter()
        .enumerate()
        .map(|(i, s)| classify(s, stream_flags.get(i).copied().unwrap_or(false)))
        .collect()
}

fn clean_parser_error(msg: &str) -> String {
    let m = msg.strip_prefix("sql parser error: ").unwrap_or(msg);
    format!("syntax error: {m}")
}

/// Token-level rewrite; returns the new text and, per statement, whether it
/// was written as `CREATE/DROP STREAM`.
fn rewrite(sql: &str) -> Result<(String, Vec<bool>)> {
    let dialect = PostgreSqlDialect {};
    let tokens = Tokenizer::new(&dialect, sql)
        .tokenize()
        .map_err(|e| Error::syntax(format!("syntax error: {e}")))?;
    // before anything recursive sees the statement
    crate::complexity::check(&tokens)?;
    let significant: Vec<usize> = tokens
        .iter()
        .enumerate()
        .filter(|(_, t)| !matches!(t, Token::Whitespace(_)))
        .map(|(i, _)| i)
        .collect();
    let mut out = String::with_capacity(sql.len() + 16);
    let mut flags = vec![false];
    let mut prev_sig: Option<&Token> = None;
    let mut sig_pos = 0;
    for (i, tok) in tokens.iter().enumerate() {
        if let Token::Whitespace(
            Whitespace::SingleLineComment { .. } | Whitespace::MultiLineComment(_),
        ) = tok
        {
            out.push(' ');
            continue;
        }
        if matches!(tok, Token::Whitespace(_)) {
            out.push_str(&tok.to_string());
            continue;
        }
        let next_sig = significant.get(sig_pos + 1).map(|&j| &tokens[j]);
        sig_pos += 1;
        match tok {
            Token::SemiColon => {
                flags.push(false);
                out.push(';');
            }
            Token::Word(w)
                if w.quote_style.is_none()
                    && is_word(w, "stream")
                    && prev_is(prev_sig, &["create", "drop", "alter"]) =>
            {
                if let Some(last) = flags.last_mut() {
                    *last = true;
                }
                out.push_str("TABLE");
            }
            // `CREATE USER` is `CREATE ROLE ... LOGIN` (remembered like a stream)
            Token::Word(w)
                if w.quote_style.is_none()
                    && is_word(w, "user")
                    && prev_is(prev_sig, &["create"]) =>
            {
                if let Some(last) = flags.last_mut() {
                    *last = true;
                }
                out.push_str("ROLE");
            }
            // `GRANT r TO m` / `REVOKE r FROM m`: a role, which sqlparser reads as `ROLE r`
            Token::Word(w)
                if prev_is(prev_sig, &["grant", "revoke"])
                    && !roles::is_privilege_word(w)
                    && matches!(next_sig, Some(Token::Word(n)) if is_word(n, "to") || is_word(n, "from")) =>
            {
                out.push_str("ROLE ");
                out.push_str(&tok.to_string());
            }
            Token::Word(w)
                if w.quote_style.is_none()
                    && is_word(w, "streams")
                    && prev_is(prev_sig, &["show"]) =>
            {
                out.push_str("streams");
            }
            Token::Word(w)
                if w.quote_style.is_none()
                    && w.keyword == Keyword::OFFSET
                    && is_column_use(prev_sig, next_sig) =>
            {
                out.push_str("\"offset\"");
            }
            // the tokenizer unescaped these; write them back as standard
            // strings (standard_conforming_strings is on)
            Token::SingleQuotedString(v) | Token::EscapedStringLiteral(v) => {
                out.push('\'');
                out.push_str(&v.replace('\'', "''"));
                out.push('\'');
            }
            Token::NationalStringLiteral(v) => {
                out.push_str("N'");
                out.push_str(&v.replace('\'', "''"));
                out.push('\'');
            }
            Token::Word(w)
                if w.quote_style.is_none()
                    && is_word(w, "abort")
                    && matches!(prev_sig, None | Some(Token::SemiColon)) =>
            {
                out.push_str("ROLLBACK");
            }
            // a quoted identifier's quote inside it is doubled again (the token's Display
            // prints the unescaped value: `"a ""b"""` came out as `"a "b""`)
            Token::Word(Word {
                value,
                quote_style: Some(q),
                ..
            }) => {
                out.push(*q);
                out.push_str(&value.replace(*q, &format!("{q}{q}")));
                out.push(*q);
            }
            other => out.push_str(&other.to_string()),
        }
        let _ = i;
        prev_sig = Some(tok);
    }
    Ok((out, flags))
}

fn is_word(w: &Word, s: &str) -> bool {
    w.value.eq_ignore_ascii_case(s)
}

fn prev_is(prev: Option<&Token>, words: &[&str]) -> bool {
    matches!(prev, Some(Token::Word(w)) if words.iter().any(|x| w.value.eq_ignore_ascii_case(x)))
}

/// `offset` is the OFFSET clause when a count follows it; otherwise it names
/// the system column.
fn is_column_use(prev: Option<&Token>, next: Option<&Token>) -> bool {
    let clause_follows = matches!(
        next,
        Some(Token::Number(..)) | Some(Token::Placeholder(_)) | Some(Token::LParen)
    ) || matches!(next, Some(Token::Word(w)) if w.keyword == Keyword::ALL || w.keyword == Keyword::NULL);
    // `LIMIT 10 OFFSET x` / `OFFSET` right after a number is always the clause
    let after_limit = matches!(prev, Some(Token::Number(..)) | Some(Token::Placeholder(_)))
        || matches!(prev, Some(Token::Word(w)) if w.keyword == Keyword::ALL);
    !(clause_follows || after_limit && !matches!(next, Some(Token::Comma) | Some(Token::RParen)))
}

fn object_name(n: &ObjectName) -> String {
    n.0.last()
        .map(|p| match p.as_ident() {
            Some(id) => normalize_ident(id),
            None => p.to_string(),
        })
        .unwrap_or_default()
}

pub fn table_name(n: &ObjectName) -> String {
    object_name(n)
}

pub(crate) fn classify(stmt: Statement, is_stream: bool) -> Result<Parsed> {
    Ok(match stmt {
        Statement::Explain {
            analyze: true,
            ref statement,
            ..
        } if !matches!(**statement, Statement::Query(_)) => Parsed::Refused(Error::unsupported(
            "EXPLAIN ANALYZE of a statement that writes is not supported",
        )),
        Statement::Query(_) | Statement::Explain { .. } => Parsed::Query(Box::new(stmt)),
        Statement::Insert(ins) => Parsed::Insert(Box::new(ins)),
        Statement::CreateTable(ct) if !is_stream => classify_create_table(&ct)?,
        Statement::CreateTable(ct) => classify_create_stream(&ct)?,
        Statement::Drop {
            object_type: object_type @ (ObjectType::Table | ObjectType::View | ObjectType::Index),
            if_exists,
            names,
            cascade,
            table: None,
            ..
        } => classify_drop(object_type, &names, if_exists, cascade, is_stream),
        Statement::CreateView(cv) => classify_create_view(cv)?,
        Statement::CreateIndex(ci) => indexes::classify_create(ci)?,
        Statement::Delete(d) => Parsed::Delete(Box::new(d)),
        Statement::Update(u) => Parsed::Update(Box::new(u)),
        Statement::StartTransaction { modes, .. } => Parsed::Begin {
            read_only: access_mode(&modes),
        },
        Statement::Commit { .. } => Parsed::Commit,
        Statement::Rollback {
            savepoint: None, ..
        } => Parsed::Rollback,
        Statement::Rollback {
            savepoint: Some(name),
            ..
        } => Parsed::RollbackTo(normalize_ident(&name)),
        Statement::Savepoint { name } => Parsed::Savepoint(normalize_ident(&name)),
        Statement::ReleaseSavepoint { name } => Parsed::ReleaseSavepoint(normalize_ident(&name)),
        Statement::Set(set) => classify_set(set),
        Statement::ShowVariable { variable } => classify_show(&variable),
        // SQL's prepared statements live in the session; the extended protocol's in the wire
        // layer's store (where a new Parse replaces one of the same name), so DEALLOCATE of a
        // name the session does not know (psycopg frees its protocol statements so) succeeds.
        Statement::Deallocate { name, .. } => Parsed::Deallocate(
            (name.quote_style.is_some() || !name.value.eq_ignore_ascii_case("all"))
                .then(|| normalize_ident(&name)),
        ),
        Statement::Prepare {
            name,
            data_types,
            statement,
        } => classify_prepare(normalize_ident(&name), data_types, *statement)?,
        Statement::AlterTable(at) => classify_alter(&at, is_stream)?,
        Statement::Execute {
            name: Some(name),
            parameters,
            immediate: false,
            ref into,
            ref using,
            output: false,
            ..
        } if into.is_empty() && using.is_empty() => Parsed::Execute {
            name: object_name(&name),
            args: parameters,
        },
        Statement::Discard { object_type } => classify_discard(object_type),
        Statement::Reset(r) => match r.reset {
            sqlparser::ast::Reset::ALL => Parsed::Reset(None),
            sqlparser::ast::Reset::ConfigurationParameter(name) => {
                Parsed::Reset(Some(object_name(&name)))
            }
        },
        Statement::Copy {
            source,
            to,
            target,
            options,
            legacy_options,
            values,
        } => classify_copy(source, to, target, options, legacy_options, values)?,
        Statement::Declare { stmts } => classify_declare(stmts)?,
        Statement::Fetch {
            name, direction, ..
        } => classify_fetch(&name, &direction)?,
        Statement::Close { cursor } => match cursor {
            sqlparser::ast::CloseCursor::All => Parsed::Close(None),
            sqlparser::ast::CloseCursor::Specific { name } => {
                Parsed::Close(Some(normalize_ident(&name)))
            }
        },
        Statement::LISTEN { channel } => Parsed::Listen(normalize_ident(&channel)),
        Statement::UNLISTEN { channel } => {
            Parsed::Unlisten((channel.value != "*").then(|| normalize_ident(&channel)))
        }
        Statement::NOTIFY { channel, payload } => Parsed::Notify {
            channel: normalize_ident(&channel),
            payload: payload.unwrap_or_default(),
        },
        Statement::Truncate(t) => refuse_truncate(&t),
        Statement::CreateRole(c) => roles::classify_create(&c, is_stream)?,
        Statement::AlterRole { name, operation } => roles::classify_alter(&name, &operation)?,
        Statement::Drop {
            object_type: ObjectType::Role | ObjectType::User,
            if_exists,
            names,
            cascade,
            ..
        } => roles::classify_drop(&names, if_exists, cascade)?,
        Statement::Grant(g) => roles::classify_grant(&g)?,
        Statement::Revoke(r) => roles::classify_revoke(&r)?,
        other => refuse(&other),
    })
}

/// `DROP TABLE|STREAM|VIEW|INDEX name, ...`.
fn classify_drop(
    object_type: ObjectType,
    names: &[ObjectName],
    if_exists: bool,
    cascade: bool,
    is_stream: bool,
) -> Parsed {
    if object_type == ObjectType::Index {
        return indexes::classify_drop(names, if_exists);
    }
    Parsed::DropRelation {
        names: names.iter().map(object_name).collect(),
        if_exists,
        stream: is_stream,
        view: object_type == ObjectType::View,
        cascade,
    }
}

/// `CREATE [OR REPLACE] VIEW name [(a, b)] AS query`; what only other databases' views have
/// (materialized, temporary, options, IF NOT EXISTS) is refused.
fn classify_create_view(cv: sqlparser::ast::CreateView) -> Result<Parsed> {
    let refused = [
        (cv.materialized, "CREATE MATERIALIZED VIEW is not supported"),
        (cv.temporary, "CREATE TEMPORARY VIEW is not supported"),
        (
            cv.or_alter || cv.secure || cv.copy_grants,
            "this form of CREATE VIEW is not supported",
        ),
        (
            cv.if_not_exists,
            "CREATE VIEW IF NOT EXISTS is not supported (CREATE OR REPLACE VIEW is)",
        ),
        (
            !matches!(cv.options, sqlparser::ast::CreateTableOptions::None),
            "view options (WITH ...) are not supported",
        ),
        (
            cv.to.is_some() || cv.params.is_some() || cv.with_no_schema_binding,
            "this form of CREATE VIEW is not supported",
        ),
        (
            !cv.cluster_by.is_empty() || cv.comment.is_some(),
            "this form of CREATE VIEW is not supported",
        ),
        (
            cv.columns
                .iter()
                .any(|c| c.data_type.is_some() || c.options.is_some()),
            "types or options in a view's column list are not supported",
        ),
    ];
    if let Some((_, what)) = refused.iter().find(|(r, _)| *r) {
        return Err(Error::unsupported(*what));
    }
    Ok(Parsed::CreateView {
        name: object_name(&cv.name),
        columns: cv
            .columns
            .iter()
            .map(|c| normalize_ident(&c.name))
            .collect(),
        query: cv.query,
        or_replace: cv.or_replace,
    })
}

/// `DISCARD ALL` resets the session; there are no cached plans, sequences
/// or temporary objects to drop.
fn classify_discard(object_type: sqlparser::ast::DiscardObject) -> Parsed {
    use sqlparser::ast::DiscardObject;
    match object_type {
        DiscardObject::ALL => Parsed::Discard,
        DiscardObject::PLANS => Parsed::NoOp("DISCARD PLANS"),
        DiscardObject::SEQUENCES => Parsed::NoOp("DISCARD SEQUENCES"),
        DiscardObject::TEMP => Parsed::NoOp("DISCARD TEMP"),
    }
}

/// `CREATE STREAM`: typed columns (NOT NULL the only option) and the
/// stream's WITH options; no constraints.
fn classify_create_stream(ct: &sqlparser::ast::CreateTable) -> Result<Parsed> {
    let name = object_name(&ct.name);
    check_name("relation", &name)?;
    let mut columns = Vec::new();
    for c in &ct.columns {
        let cname = normalize_ident(&c.name);
        if cname == OFFSET_COLUMN || cname == TS_COLUMN {
            return Err(Error::new(
                sqlstate::DUPLICATE_COLUMN,
                format!("column name \"{cname}\" conflicts with a system column name"),
            ));
        }
        let ty = column_type(&cname, c, &columns)?;
        let mut not_null = false;
        for o in &c.options {
            match &o.option {
                ColumnOption::NotNull => not_null = true,
                ColumnOption::Null => not_null = false,
                other => {
                    return Ok(Parsed::Refused(Error::unsupported(format!(
                        "column option {other} is not supported on a stream"
                    ))))
                }
            }
        }
        columns.push(ColumnDef {
            name: cname,
            ty,
            not_null,
            default: None,
        });
    }
    if !ct.constraints.is_empty() {
        return Ok(Parsed::Refused(Error::unsupported(
            "streams have no constraints other than NOT NULL (they are append-only logs)",
        )));
    }
    let options = stream_options(&ct.table_options)?;
    if let Some(k) = &options.dedup_key {
        let Some(c) = columns.iter().find(|c| &c.name == k) else {
            return Err(Error::new(
                sqlstate::UNDEFINED_COLUMN,
                format!("dedup_key column \"{k}\" does not exist in stream \"{name}\""),
            ));
        };
        if c.ty.element().is_some() {
            return Err(Error::unsupported(format!(
                "dedup_key column \"{k}\" is of type {}: a dedup key cannot be an array",
                c.ty.sql_name()
            )));
        }
    }
    if options.dedup_window_ms.is_some() && options.dedup_key.is_none() {
        return Err(Error::new(
            sqlstate::INVALID_PARAMETER_VALUE,
            "dedup_window needs a dedup_key",
        ));
    }
    Ok(Parsed::CreateStream {
        def: StreamDef {
            id: 0,
            oid: 0,
            name,
            columns,
            options,
        },
        if_not_exists: ct.if_not_exists,
    })
}

/// `SHOW name` (a setting) or `SHOW STREAMS`.
fn classify_show(variable: &[sqlparser::ast::Ident]) -> Parsed {
    let name = variable
        .iter()
        .map(|v| v.value.to_lowercase())
        .collect::<Vec<_>>()
        .join(" ");
    if name == "streams" {
        Parsed::ShowStreams
    } else {
        Parsed::Show(name)
    }
}

/// `DECLARE name [WITH HOLD] CURSOR FOR query`: forward-only cursors.
fn classify_declare(stmts: Vec<sqlparser::ast::Declare>) -> Result<Parsed> {
    let Some(d) = stmts.into_iter().next() else {
        return Err(Error::syntax("empty DECLARE"));
    };
    let Some(query) = d.for_query else {
        return Ok(Parsed::Refused(Error::unsupported(
            "only DECLARE ... CURSOR FOR <query> is supported",
        )));
    };
    if d.scroll == Some(true) {
        return Ok(Parsed::Refused(Error::unsupported(
            "SCROLL cursors are not supported; cursors are forward-only",
        )));
    }
    let name = d.names.first().map(normalize_ident).unwrap_or_default();
    Ok(Parsed::Declare {
        name,
        query,
        hold: d.hold == Some(true),
    })
}

/// `FETCH [n | NEXT | FORWARD [n] | ALL] FROM c`: only forward.
fn classify_fetch(
    name: &sqlparser::ast::Ident,
    direction: &sqlparser::ast::FetchDirection,
) -> Result<Parsed> {
    use sqlparser::ast::FetchDirection as F;
    let count = |v: &sqlparser::ast::ValueWithSpan| -> Result<u64> {
        match &v.value {
            Value::Number(n, _) => n
                .parse::<u64>()
                .map_err(|_| Error::syntax(format!("invalid FETCH count {n}"))),
            other => Err(Error::syntax(format!("invalid FETCH count {other}"))),
        }
    };
    let n = match direction {
        F::Count { limit } => Some(count(limit)?),
        F::Next => Some(1),
        F::Forward { limit } => Some(limit.as_ref().map(count).transpose()?.unwrap_or(1)),
        F::All | F::ForwardAll => None,
        other => {
            return Ok(Parsed::Refused(Error::new(
                sqlstate::OBJECT_NOT_IN_PREREQUISITE_STATE,
                format!("cursor can only scan forward (FETCH {other} is not supported)"),
            )))
        }
    };
    Ok(Parsed::Fetch {
        name: normalize_ident(name),
        count: n,
    })
}

/// TRUNCATE is refused: a stream drops a prefix with DELETE instead.
fn refuse_truncate(t: &sqlparser::ast::Truncate) -> Parsed {
    let name = t
        .table_names
        .first()
        .map(|n| object_name(&n.name))
        .unwrap_or_default();
    Parsed::Refused(Error::unsupported(format!(
        "TRUNCATE is not supported on stream \"{name}\"; use DELETE FROM {name} WHERE offset < n to drop a prefix"
    )))
}

/// `ALTER STREAM|TABLE [IF EXISTS] name SET (...)` or `RENAME TO new`, one change per
/// statement; any other alteration (columns, constraints) is refused with `0A000`.
fn classify_alter(at: &sqlparser::ast::AlterTable, is_stream: bool) -> Result<Parsed> {
    use sqlparser::ast::{AlterTableOperation, RenameTableNameKind};
    let name = object_name(&at.name);
    let change = match at.operations.as_slice() {
        [AlterTableOperation::SetOptionsParens { options }] => {
            StreamChange::Set(option_changes(options)?)
        }
        [AlterTableOperation::RenameTable {
            table_name: RenameTableNameKind::To(new) | RenameTableNameKind::As(new),
        }] => {
            let new = object_name(new);
            check_name("relation", &new)?;
            StreamChange::RenameTo(new)
        }
        [AlterTableOperation::AddColumn {
            if_not_exists,
            column_def,
            column_position: None,
            ..
        }] => match added_column(column_def, *if_not_exists)? {
            Some(change) => change,
            None => {
                return Ok(Parsed::Refused(Error::unsupported(
                    "ADD COLUMN takes NOT NULL, NULL and DEFAULT, no other column option",
                )))
            }
        },
        [AlterTableOperation::RenameColumn {
            old_column_name,
            new_column_name,
        }] => {
            let to = normalize_ident(new_column_name);
            check_name("column", &to)?;
            StreamChange::RenameColumn {
                from: normalize_ident(old_column_name),
                to,
            }
        }
        [op] => {
            return Ok(Parsed::Refused(Error::unsupported(format!(
                "ALTER {} ... {op} is not supported (SET (...), RENAME TO, ADD COLUMN and RENAME COLUMN are)",
                if is_stream { "STREAM" } else { "TABLE" }
            ))))
        }
        _ => {
            return Ok(Parsed::Refused(Error::unsupported(
                "ALTER STREAM takes one change per statement",
            )))
        }
    };
    Ok(Parsed::AlterStream {
        name,
        if_exists: at.if_exists,
        stream: is_stream,
        change,
    })
}

/// `ADD COLUMN`'s column; `None` for a column option other than NOT NULL, NULL and DEFAULT.
fn added_column(
    c: &sqlparser::ast::ColumnDef,
    if_not_exists: bool,
) -> Result<Option<StreamChange>> {
    let name = normalize_ident(&c.name);
    check_name("column", &name)?;
    let ty = ColumnType::parse(&c.data_type.to_string())?;
    let mut not_null = false;
    let mut default = None;
    for o in &c.options {
        match &o.option {
            ColumnOption::NotNull => not_null = true,
            ColumnOption::Null => not_null = false,
            ColumnOption::Default(e) => default = Some(Box::new(e.clone())),
            _ => return Ok(None),
        }
    }
    Ok(Some(StreamChange::AddColumn {
        column: Box::new(ColumnDef {
            name,
            ty,
            not_null,
            default: None,
        }),
        default,
        if_not_exists,
    }))
}

/// The options `ALTER STREAM ... SET (...)` may change; `'none'` removes one.
fn option_changes(options: &[SqlOption]) -> Result<OptionChanges> {
    let mut c = OptionChanges::default();
    for item in options {
        let SqlOption::KeyValue { key, value } = item else {
            return Err(Error::syntax(format!("unrecognized stream option {item}")));
        };
        let text = expr_setting_value(value);
        let none = text.eq_ignore_ascii_case("none");
        let duration = || -> Result<Option<u64>> {
            Ok(if none {
                None
            } else {
                Some(units::parse_duration_ms(&text)?)
            })
        };
        match key.value.to_lowercase().as_str() {
            "retention" => c.retention_ms = Some(duration()?),
            "retention_bytes" => {
                c.retention_bytes = Some(if none {
                    None
                } else {
                    Some(units::parse_bytes(&text)?)
                })
            }
            "dedup_window" => c.dedup_window_ms = Some(duration()?),
            "compression" => c.compression = Some(compression(&text)?),
            "retain_for_consumers" => c.retain_for_consumers = Some(boolean(&key.value, &text)?),
            fixed @ ("dedup_key" | "segment_bytes") => {
                return Err(Error::unsupported(format!(
                    "{fixed} cannot be changed after the stream is created"
                )))
            }
            other => {
                return Err(Error::new(
                    sqlstate::INVALID_PARAMETER_VALUE,
                    format!("unrecognized stream option \"{other}\" (ALTER can set: retention, retention_bytes, dedup_window, compression, retain_for_consumers)"),
                ))
            }
        }
    }
    Ok(c)
}

/// `PREPARE name [(types)] AS statement`: PostgreSQL prepares a query (SELECT, VALUES, WITH),
/// INSERT, UPDATE or DELETE, and nothing else.
fn classify_prepare(
    name: String,
    types: Vec<sqlparser::ast::DataType>,
    statement: Statement,
) -> Result<Parsed> {
    if !matches!(
        statement,
        Statement::Query(_) | Statement::Insert(_) | Statement::Update(_) | Statement::Delete(_)
    ) {
        return Err(Error::syntax(
            "syntax error: PREPARE takes a SELECT, VALUES, INSERT, UPDATE or DELETE statement",
        ));
    }
    Ok(Parsed::Prepare(Box::new(Prepare {
        name,
        types,
        statement: classify(statement, false)?,
    })))
}

/// Any other statement is refused, named by its first two words.
fn refuse(other: &Statement) -> Parsed {
    let text = other.to_string();
    let verb = text
        .split_whitespace()
        .take(2)
        .collect::<Vec<_>>()
        .join(" ");
    Parsed::Refused(Error::unsupported(format!("{verb} is not supported")))
}

/// The type of a new column `cname`, which must not repeat one in `columns`.
fn column_type(
    cname: &str,
    c: &sqlparser::ast::ColumnDef,
    columns: &[ColumnDef],
) -> Result<ColumnType> {
    if columns.iter().any(|x| x.name == cname) {
        return Err(Error::new(
            sqlstate::DUPLICATE_COLUMN,
            format!("column \"{cname}\" specified more than once"),
        ));
    }
    ColumnType::parse(&c.data_type.to_string())
}

/// `CREATE TABLE`: a mutable table with an optional primary key.
fn classify_create_table(ct: &sqlparser::ast::CreateTable) -> Result<Parsed> {
    use sqlparser::ast::TableConstraint;
    let name = object_name(&ct.name);
    check_name("relation", &name)?;
    if ct.query.is_some() {
        return Ok(Parsed::Refused(Error::unsupported(
            "CREATE TABLE ... AS is not supported",
        )));
    }
    let mut columns: Vec<ColumnDef> = Vec::new();
    let mut primary_key: Vec<String> = Vec::new();
    // UNIQUE constraints: (name, columns); the session names unnamed ones
    let mut unique: Vec<(String, Vec<String>)> = Vec::new();
    let mut key_name: Option<String> = None;
    let pk_twice = || {
        Error::new(
            sqlstate::INVALID_TABLE_DEFINITION,
            format!("multiple primary keys for table \"{name}\" are not allowed"),
        )
    };
    for c in &ct.columns {
        let cname = normalize_ident(&c.name);
        check_name("column", &cname)?;
        let ty = column_type(&cname, c, &columns)?;
        let mut not_null = false;
        for o in &c.options {
            match &o.option {
                ColumnOption::NotNull => not_null = true,
                ColumnOption::Null => not_null = false,
                ColumnOption::PrimaryKey(pk) => {
                    if !primary_key.is_empty() {
                        return Err(pk_twice());
                    }
                    primary_key.push(cname.clone());
                    key_name = o.name.as_ref().or(pk.name.as_ref()).map(normalize_ident);
                    not_null = true;
                }
                ColumnOption::Unique(u) => {
                    let name = o.name.as_ref().or(u.name.as_ref());
                    unique.push(indexes::unique_constraint(u, name, Some(&cname))?);
                }
                other => {
                    return Ok(Parsed::Refused(Error::unsupported(format!(
                        "column option {other} is not supported (tables have PRIMARY KEY, UNIQUE, NOT NULL and NULL)"
                    ))))
                }
            }
        }
        columns.push(ColumnDef {
            name: cname,
            ty,
            not_null,
            default: None,
        });
    }
    for c in &ct.constraints {
        match c {
            TableConstraint::PrimaryKey(pk) => {
                if !primary_key.is_empty() {
                    return Err(pk_twice());
                }
                key_name = pk.name.as_ref().map(normalize_ident);
                for col in &pk.columns {
                    match &col.column.expr {
                        Expr::Identifier(id) => primary_key.push(normalize_ident(id)),
                        other => {
                            return Ok(Parsed::Refused(Error::unsupported(format!(
                                "primary key on expression {other} is not supported"
                            ))))
                        }
                    }
                }
            }
            TableConstraint::Unique(u) => {
                unique.push(indexes::unique_constraint(u, u.name.as_ref(), None)?)
            }
            other => {
                return Ok(Parsed::Refused(Error::unsupported(format!(
                    "constraint {other} is not supported (tables have PRIMARY KEY, UNIQUE and NOT NULL)"
                ))))
            }
        }
    }
    let mut key = Vec::with_capacity(primary_key.len());
    for k in &primary_key {
        let Some(i) = columns.iter().position(|c| &c.name == k) else {
            return Err(Error::new(
                sqlstate::UNDEFINED_COLUMN,
                format!("column \"{k}\" named in key does not exist"),
            ));
        };
        if key.contains(&i) {
            return Err(Error::new(
                sqlstate::DUPLICATE_COLUMN,
                format!("column \"{k}\" appears twice in primary key constraint"),
            ));
        }
        columns[i].check_key_column()?;
        columns[i].not_null = true;
        key.push(i);
    }
    let indexes = indexes::unique_indexes(unique, &columns)?;
    Ok(Parsed::CreateTable {
        def: TableDef {
            id: 0,
            oid: 0,
            name,
            columns,
            primary_key: key,
            index_oid: 0,
            key_name,
            indexes,
        },
        if_not_exists: ct.if_not_exists,
    })
}

pub fn append_only(name: &str) -> Error {
    Error::unsupported(format!(
        "stream \"{name}\" is append-only: rows cannot be updated or deleted (only DELETE FROM {name} WHERE offset < n, which drops a prefix)"
    ))
}

fn classify_set(set: sqlparser::ast::Set) -> Parsed {
    use sqlparser::ast::Set as S;
    match set {
        S::SingleAssignment {
            variable, values, ..
        } => {
            let name = variable.to_string().to_lowercase();
            let value = values
                .iter()
                .map(expr_setting_value)
                .collect::<Vec<_>>()
                .join(", ");
            Parsed::Set { name, value }
        }
        S::SetTimeZone { value, .. } => Parsed::Set {
            name: "timezone".into(),
            value: expr_setting_value(&value),
        },
        S::SetNames { charset_name, .. } => Parsed::Set {
            name: "client_encoding".into(),
            value: charset_name.to_string(),
        },
        // `SET TRANSACTION READ ONLY` is `SET transaction_read_only`, and
        // `SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY` is
        // `SET default_transaction_read_only`, as in PostgreSQL; isolation
        // levels are accepted and ignored (every transaction is serializable)
        S::SetTransaction { modes, session, .. } => match access_mode(&modes) {
            Some(read_only) => Parsed::Set {
                name: if session {
                    "default_transaction_read_only"
                } else {
                    "transaction_read_only"
                }
                .into(),
                value: if read_only { "on" } else { "off" }.into(),
            },
            None => Parsed::NoOp("SET"),
        },
        _ => Parsed::NoOp("SET"),
    }
}

/// The access mode a list of transaction modes names, if any (the last wins).
fn access_mode(modes: &[sqlparser::ast::TransactionMode]) -> Option<bool> {
    use sqlparser::ast::{TransactionAccessMode as A, TransactionMode as M};
    modes.iter().rev().find_map(|m| match m {
        M::AccessMode(A::ReadOnly) => Some(true),
        M::AccessMode(A::ReadWrite) => Some(false),
        _ => None,
    })
}

fn expr_setting_value(e: &Expr) -> String {
    match e {
        Expr::Value(v) => match &v.value {
            Value::SingleQuotedString(s) | Value::DoubleQuotedString(s) => s.clone(),
            other => other.to_string(),
        },
        Expr::Identifier(id) => id.value.clone(),
        other => other.to_string(),
    }
}

fn classify_copy(
    source: CopySource,
    to: bool,
    target: CopyTarget,
    options: Vec<CopyOption>,
    legacy: Vec<sqlparser::ast::CopyLegacyOption>,
    values: Vec<Option<String>>,
) -> Result<Parsed> {
    if to {
        if !matches!(target, CopyTarget::Stdout) {
            return Ok(Parsed::Refused(Error::unsupported(
                "COPY TO supports only STDOUT",
            )));
        }
        let format = copy_format(options, legacy)?;
        let query = match source {
            CopySource::Query(q) => q,
            CopySource::Table {
                table_name,
                columns,
            } => {
                let cols = if columns.is_empty() {
                    "*".to_string()
                } else {
                    columns
                        .iter()
                        .map(|c| format!("\"{}\"", normalize_ident(c)))
                        .collect::<Vec<_>>()
                        .join(", ")
                };
                let sql = format!("SELECT {cols} FROM \"{}\"", object_name(&table_name));
                match parse(&sql)?.pop() {
                    Some(Parsed::Query(stmt)) => match *stmt {
                        Statement::Query(q) => q,
                        _ => return Err(Error::internal("COPY TO query did not parse")),
                    },
                    _ => return Err(Error::internal("COPY TO query did not parse")),
                }
            }
        };
        return Ok(Parsed::CopyTo { query, format });
    }
    if !matches!(target, CopyTarget::Stdin) {
        return Ok(Parsed::Refused(Error::unsupported(
            "COPY FROM supports only STDIN",
        )));
    }
    let CopySource::Table {
        table_name,
        columns,
    } = source
    else {
        return Err(Error::syntax("COPY FROM needs a stream name"));
    };
    let format = copy_format(options, legacy)?;
    let _ = values; // inline data is cut out before parsing (see `parse`)
    let inline = None;
    Ok(Parsed::CopyFrom(CopyFrom {
        stream: object_name(&table_name),
        columns: columns.iter().map(normalize_ident).collect(),
        format,
        inline,
    }))
}

fn copy_format(
    options: Vec<CopyOption>,
    legacy: Vec<sqlparser::ast::CopyLegacyOption>,
) -> Result<CopyFormat> {
    let mut fmt = "text".to_string();
    let (mut delimiter, mut null, mut quote, mut escape, mut header) =
        (None, None, '"', None, false);
    for o in options {
        match o {
            CopyOption::Format(f) => fmt = f.value.to_lowercase(),
            CopyOption::Delimiter(c) => delimiter = Some(c),
            CopyOption::Null(s) => null = Some(s),
            CopyOption::Header(h) => header = h,
            CopyOption::Quote(c) => quote = c,
            CopyOption::Escape(c) => escape = Some(c),
            other => {
                return Err(Error::unsupported(format!(
                    "COPY option {other} is not supported"
                )))
            }
        }
    }
    for o in legacy {
        use sqlparser::ast::CopyLegacyOption as L;
        match o {
            L::Binary => fmt = "binary".into(),
            L::Csv(_) => fmt = "csv".into(),
            L::Delimiter(c) => delimiter = Some(c),
            L::Null(s) => null = Some(s),
            L::Header => header = true,
            other => {
                return Err(Error::unsupported(format!(
                    "COPY option {other} is not supported"
                )))
            }
        }
    }
    Ok(match fmt.as_str() {
        "text" => CopyFormat::Text {
            delimiter: delimiter.unwrap_or('\t'),
            null: null.unwrap_or_else(|| "\\N".into()),
        },
        "csv" => CopyFormat::Csv {
            delimiter: delimiter.unwrap_or(','),
            quote,
            escape: escape.unwrap_or(quote),
            null: null.unwrap_or_default(),
            header,
        },
        "binary" => CopyFormat::Binary,
        other => {
            return Err(Error::new(
                sqlstate::INVALID_PARAMETER_VALUE,
                format!("COPY format \"{other}\" not recognized"),
            ))
        }
    })
}

fn stream_options(opts: &CreateTableOptions) -> Result<StreamOptions> {
    let list = match opts {
        CreateTableOptions::With(l)
        | CreateTableOptions::Options(l)
        | CreateTableOptions::Plain(l) => l.as_slice(),
        _ => &[],
    };
    let mut o = StreamOptions::default();
    for item in list {
        let SqlOption::KeyValue { key, value } = item else {
            return Err(Error::syntax(format!("unrecognized stream option {item}")));
        };
        let text = expr_setting_value(value);
        match key.value.to_lowercase().as_str() {
            "retention" => o.retention_ms = Some(units::parse_duration_ms(&text)?),
            "retention_bytes" => o.retention_bytes = Some(units::parse_bytes(&text)?),
            "dedup_key" => o.dedup_key = Some(text),
            "dedup_window" => o.dedup_window_ms = Some(units::parse_duration_ms(&text)?),
            "segment_bytes" => o.segment_bytes = Some(units::parse_bytes(&text)?.max(4096)),
            "compression" => o.compression = compression(&text)?,
            "retain_for_consumers" => o.retain_for_consumers = boolean(&key.value, &text)?,
            other => {
                return Err(Error::new(
                    sqlstate::INVALID_PARAMETER_VALUE,
                    format!("unrecognized stream option \"{other}\" (known: retention, retention_bytes, dedup_key, dedup_window, segment_bytes, compression, retain_for_consumers)"),
                ))
            }
        }
    }
    Ok(o)
}

/// A boolean option's value, spelled as PostgreSQL's reloptions accept it.
fn boolean(option: &str, text: &str) -> Result<bool> {
    match text.to_ascii_lowercase().as_str() {
        "true" | "on" | "yes" | "1" => Ok(true),
        "false" | "off" | "no" | "0" => Ok(false),
        _ => Err(Error::new(
            sqlstate::INVALID_PARAMETER_VALUE,
            format!("invalid value for boolean option \"{option}\": {text}"),
        )),
    }
}

/// The `compression` option's value.
fn compression(text: &str) -> Result<Compression> {
    Compression::parse(text).ok_or_else(|| {
        Error::new(
            sqlstate::INVALID_PARAMETER_VALUE,
            format!("invalid value for compression: \"{text}\" (known: lz4, zstd, none)"),
        )
    })
}

/// Parameter types a statement states with casts (`$1::int`), by number.
pub fn cast_param_types(stmt: &Statement) -> std::collections::HashMap<usize, ParamType> {
    use sqlparser::ast::{Expr, Value, Visit, Visitor};
    use std::ops::ControlFlow;
    struct Casts(std::collections::HashMap<usize, ParamType>);
    impl Visitor for Casts {
        type Break = ();
        fn pre_visit_expr(&mut self, e: &Expr) -> ControlFlow<()> {
            if let Expr::Cast {
                expr, data_type, ..
            } = e
            {
                if let Expr::Value(v) = &**expr {
                    if let Value::Placeholder(p) = &v.value {
                        if let (Ok(i), Some(t)) = (
                            p.trim_start_matches('$').parse::<usize>(),
                            param_type(data_type),
                        ) {
                            self.0.entry(i).or_insert(t);
                        }
                    }
                }
            }
            ControlFlow::Continue(())
        }
    }
    let mut casts = Casts(Default::default());
    let _ = stmt.visit(&mut casts);
    casts.0
}

/// The parameter type a cast names: a column type, or a one-dimensional array of one.
pub fn param_type(data_type: &sqlparser::ast::DataType) -> Option<ParamType> {
    use sqlparser::ast::{ArrayElemTypeDef, DataType};
    match data_type {
        DataType::Array(
            ArrayElemTypeDef::SquareBracket(elem, _)
            | ArrayElemTypeDef::AngleBracket(elem)
            | ArrayElemTypeDef::Parenthesis(elem),
        ) if elem.to_string().eq_ignore_ascii_case("oid") => Some(ParamType::oid_array()),
        DataType::Array(
            ArrayElemTypeDef::SquareBracket(elem, _)
            | ArrayElemTypeDef::AngleBracket(elem)
            | ArrayElemTypeDef::Parenthesis(elem),
        ) => ColumnType::parse(&elem.to_string())
            .ok()
            .map(ParamType::array),
        other => ColumnType::parse(&other.to_string())
            .ok()
            .map(ParamType::Scalar),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotes_offset_only_where_it_is_a_column() {
        let (s, _) =
            rewrite("SELECT offset, x FROM s WHERE offset > 1 ORDER BY offset LIMIT 5 OFFSET 2")
                .unwrap();
        assert_eq!(
            s,
            "SELECT \"offset\", x FROM s WHERE \"offset\" > 1 ORDER BY \"offset\" LIMIT 5 OFFSET 2"
        );
        let (s, _) = rewrite("select * from s offset $1").unwrap();
        assert_eq!(s, "select * from s offset $1");
        let (s, _) = rewrite("INSERT INTO s VALUES (1) RETURNING offset, ts").unwrap();
        assert_eq!(s, "INSERT INTO s VALUES (1) RETURNING \"offset\", ts");
    }

    #[test]
    fn create_stream_becomes_a_flagged_create_table() {
        let p = parse("CREATE STREAM orders (customer text NOT NULL, amount numeric(12,2)) WITH (retention = '7 days'); SELECT 1").unwrap();
        match &p[0] {
            Parsed::CreateStream { def, .. } => {
                assert_eq!(def.name, "orders");
                assert_eq!(def.columns.len(), 2);
                assert!(def.columns[0].not_null);
                assert_eq!(def.options.retention_ms, Some(7 * 86_400_000));
            }
            other => panic!("unexpected {other:?}"),
        }
        assert!(matches!(p[1], Parsed::Query(_)));
        match &parse("CREATE TABLE t (a int, b text NOT NULL, c int, PRIMARY KEY (c, a))").unwrap()
            [0]
        {
            Parsed::CreateTable { def, .. } => {
                assert_eq!(def.primary_key, vec![2, 0]);
                assert!(def.columns.iter().all(|c| c.not_null));
            }
            other => panic!("unexpected {other:?}"),
        }
        match &parse("CREATE TABLE t (a int PRIMARY KEY, b text)").unwrap()[0] {
            Parsed::CreateTable { def, .. } => assert_eq!(def.primary_key, vec![0]),
            other => panic!("unexpected {other:?}"),
        }
        assert_eq!(
            parse("CREATE TABLE t (a int PRIMARY KEY, b int PRIMARY KEY)")
                .unwrap_err()
                .code,
            "42P16"
        );
        assert_eq!(
            parse("CREATE TABLE \"sluice$x\" (a int)").unwrap_err().code,
            sqlstate::RESERVED_NAME
        );
    }

    #[test]
    fn syntax_errors_are_42601() {
        assert_eq!(parse("SELEC 1").unwrap_err().code, sqlstate::SYNTAX_ERROR);
    }
}
