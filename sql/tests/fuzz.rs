//! Property tests for the SQL front end ([`parse`]): whatever text a client sends, it returns
//! statements or a clean error — never a panic, a stack overflow (which would abort the
//! process), a hang, or an internal error (`XX000`). Statements are generated three ways:
//! token soup from SQL's vocabulary; expressions nested and chained to random depths and
//! widths (up to and past the statement depth limit); and valid statements of every kind
//! Sluice parses, mutated (cut, spliced with fragments, ranges deleted or repeated).
//!
//! Runs on a thread with the 64 MiB stack that statements get in the server. The
//! `SLUICE_FUZZ_CASES` / `SLUICE_FUZZ_SEED` settings are the other fuzz targets'; see
//! `docs/fuzzing.md`.

#[path = "../../storage/tests/harness/mod.rs"]
mod harness;

use harness::*;
use proptest::prelude::*;
use proptest::test_runner::TestRunner;
use sluice_sql::statement::parse;

const VOCABULARY: &[&str] = &[
    "SELECT",
    "FROM",
    "WHERE",
    "AND",
    "OR",
    "NOT",
    "(",
    ")",
    "[",
    "]",
    ",",
    ";",
    "ARRAY[",
    "CASE",
    "WHEN",
    "THEN",
    "ELSE",
    "END",
    "CAST(",
    "AS",
    "::",
    "int",
    "text[]",
    "+",
    "-",
    "*",
    "/",
    "%",
    "^",
    "||",
    "=",
    "<>",
    "<",
    ">=",
    "IN",
    "EXISTS",
    "UNION",
    "ALL",
    "WITH",
    "x",
    "t",
    "\"quoted\"",
    "'str'",
    "E'\\x'",
    "$$dollar$$",
    "$1",
    "$99999999999",
    "1",
    "9223372036854775808",
    "1e999",
    "-0.0",
    "NULL",
    "TRUE",
    "INSERT",
    "INTO",
    "VALUES",
    "RETURNING",
    "offset",
    "ts",
    "COPY",
    "STDIN",
    "TO",
    "STDOUT",
    "WITH (",
    "FORMAT",
    "csv",
    "CREATE",
    "STREAM",
    "TABLE",
    "DROP",
    "IF",
    "EXISTS",
    "BEGIN",
    "COMMIT",
    "ROLLBACK",
    "SAVEPOINT",
    "SET",
    "SHOW",
    "LISTEN",
    "NOTIFY",
    "ALTER",
    "CLUSTER",
    "ADD",
    "NODE",
    "REMOVE",
    "'127.0.0.1:1'",
    "ORDER",
    "BY",
    "LIMIT",
    "GROUP",
    "HAVING",
    "JOIN",
    "ON",
    "OVER",
    "PARTITION",
    "count(*)",
    "now()",
    "interval '1 day'",
    "--",
    "/*",
    "*/",
    "\\.",
    "\n",
    "\t",
    "é",
    "\u{1F600}",
    "DECLARE",
    "CURSOR",
    "FETCH",
    "PREPARE",
    "EXECUTE",
];

const STATEMENTS: &[&str] = &[
    "SELECT a, b + 1 AS c FROM t WHERE offset > 10 AND ts >= now() - interval '5 minutes' ORDER BY offset LIMIT 10",
    "INSERT INTO events (payload, n) VALUES ('x', 1), ($1, $2::int) RETURNING offset, ts",
    "CREATE STREAM orders (customer text, amount numeric(12,2)) WITH (retention = '7 days', segment_bytes = '64MB')",
    "CREATE TABLE IF NOT EXISTS balances (id bigint PRIMARY KEY, amount bigint NOT NULL)",
    "COPY events (payload) FROM STDIN WITH (FORMAT csv, HEADER true)\nx\ny\n\\.\n",
    "COPY (SELECT * FROM events WHERE offset > 5) TO STDOUT WITH (FORMAT binary)",
    "BEGIN READ ONLY; UPDATE balances SET amount = amount - 1 WHERE id = 1; COMMIT",
    "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r WHERE n < 10) SELECT sum(n) FROM r",
    "SELECT count(DISTINCT a), string_agg(b, ',') FROM t JOIN u ON t.id = u.id GROUP BY 1 HAVING count(*) > 1",
    "ALTER CLUSTER ADD NODE 4 '127.0.0.1:7004'",
    "ALTER CLUSTER REMOVE NODE 4;",
    "SET statement_timeout = '5s'; SHOW transaction_isolation; RESET ALL",
    "LISTEN orders; NOTIFY orders, 'payload'; UNLISTEN *",
    "DELETE FROM events WHERE offset < 100",
    "DECLARE c CURSOR FOR SELECT * FROM events; FETCH 10 FROM c; CLOSE c",
    "SELECT ARRAY[ARRAY[1,2],ARRAY[3,4]], '{1,2}'::int[], CASE WHEN a IS NULL THEN 0 ELSE a END FROM t",
    "DROP STREAM IF EXISTS a, b",
    "EXPLAIN ANALYZE SELECT * FROM pg_catalog.pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace",
];

/// Token soup: any sequence of SQL's words and punctuation.
fn soup() -> impl Strategy<Value = String> {
    proptest::collection::vec(proptest::sample::select(VOCABULARY), 0..200)
        .prop_map(|words| words.join(" "))
}

/// Expressions nested to random depths with every kind of bracket and operator.
fn nested() -> impl Strategy<Value = String> {
    let leaf = prop_oneof![
        Just("1".to_string()),
        Just("x".to_string()),
        Just("'s'".to_string()),
        Just("NULL".to_string()),
        Just("$1".to_string()),
    ];
    let expr = leaf.prop_recursive(12, 256, 4, |inner| {
        prop_oneof![
            inner.clone().prop_map(|e| format!("({e})")),
            inner.clone().prop_map(|e| format!("ARRAY[{e}]")),
            inner.clone().prop_map(|e| format!("CAST({e} AS int)")),
            inner.clone().prop_map(|e| format!("{e}::text")),
            inner.clone().prop_map(|e| format!("NOT {e}")),
            inner.clone().prop_map(|e| format!("(SELECT {e})")),
            inner
                .clone()
                .prop_map(|e| format!("EXISTS (SELECT {e} FROM t)")),
            inner.clone().prop_map(|e| format!("abs({e})")),
            (inner.clone(), inner.clone()).prop_map(|(a, b)| format!("{a} + {b}")),
            (inner.clone(), inner.clone()).prop_map(|(a, b)| format!("{a} AND {b}")),
            (inner.clone(), inner.clone()).prop_map(|(a, b)| format!("{a} IN ({b}, {a})")),
            (inner.clone(), inner.clone(), inner.clone())
                .prop_map(|(a, b, c)| format!("CASE WHEN {a} THEN {b} ELSE {c} END")),
        ]
    });
    // Deep towers and long chains of one construct, up to well past the depth limit.
    let tower = (
        proptest::sample::select(vec![
            ("(", ")"),
            ("ARRAY[", "]"),
            ("(SELECT ", ")"),
            ("abs(", ")"),
            ("CAST(", " AS int)"),
            ("CASE WHEN true THEN ", " END"),
        ]),
        0..1500usize,
    )
        .prop_map(|((open, close), n)| format!("{}1{}", open.repeat(n), close.repeat(n)));
    let chain = (
        proptest::sample::select(vec![
            " + ",
            " * ",
            " AND ",
            " OR ",
            " || ",
            " UNION ALL SELECT ",
        ]),
        0..3000usize,
    )
        .prop_map(|(op, n)| vec!["1"; n + 1].join(op));
    prop_oneof![
        expr.prop_map(|e| format!("SELECT {e} FROM t WHERE {e}")),
        tower.prop_map(|e| format!("SELECT {e}")),
        chain.prop_map(|e| format!("SELECT {e}")),
    ]
}

/// Valid statements cut, spliced, with ranges deleted or repeated (on char boundaries).
fn mutated() -> impl Strategy<Value = String> {
    let edit = prop_oneof![
        any::<usize>().prop_map(|at| (0u8, at, 0usize, "")),
        (any::<usize>(), proptest::sample::select(VOCABULARY)).prop_map(|(at, w)| (1, at, 0, w)),
        (any::<usize>(), 0..40usize).prop_map(|(at, n)| (2, at, n, "")),
        (any::<usize>(), 0..40usize).prop_map(|(at, n)| (3, at, n, "")),
    ];
    (
        proptest::sample::select(STATEMENTS),
        proptest::collection::vec(edit, 1..6),
    )
        .prop_map(|(sql, edits)| {
            let mut chars: Vec<char> = sql.chars().collect();
            for (kind, at, n, word) in edits {
                let at = at % (chars.len() + 1);
                let end = (at + n).min(chars.len());
                match kind {
                    0 => chars.truncate(at),
                    1 => {
                        chars.splice(at..at, word.chars());
                    }
                    2 => {
                        chars.drain(at..end);
                    }
                    _ => {
                        let copy: Vec<char> = chars[at..end].to_vec();
                        chars.splice(at..at, copy.into_iter().cycle().take((end - at) * 8));
                    }
                }
            }
            chars.into_iter().collect()
        })
}

fn front_end(sql: &str) -> Result<(), TestCaseError> {
    match parse(sql) {
        Ok(_) => Ok(()),
        Err(e) => {
            prop_assert!(
                e.code.len() == 5 && e.code != "XX000",
                "{sql:?} → {} {}",
                e.code,
                e.message
            );
            Ok(())
        }
    }
}

fn run<S: Strategy<Value = String> + 'static>(strategy: fn() -> S) {
    let _serial = serial();
    std::thread::Builder::new()
        .name("statement".into())
        .stack_size(64 << 20)
        .spawn(move || {
            let mut runner = TestRunner::new(config(cases()));
            runner
                .run(&strategy(), |sql| timed(|| front_end(&sql)))
                .expect("a property failed");
        })
        .expect("spawn the statement thread")
        .join()
        .expect("the property thread panicked");
}

#[test]
fn token_soup() {
    run(soup);
}

#[test]
fn nested_and_chained_expressions() {
    run(nested);
}

#[test]
fn mutated_statements() {
    run(mutated);
}
