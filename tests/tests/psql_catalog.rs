//! psql's describe commands (`\dt`, `\d`, `\d+`, `\dn`, `\l`) and display
//! toggles (`\x`, `\timing`), as a new user tries them: every one must run
//! its catalog queries without an error and show the streams truthfully.

use sluice_tests::psql::{psql_on_path, run_script, squeeze};
use sluice_tests::{exec, Server};

const SCRIPT: &str = r"\echo == dt
\dt
\echo == d orders
\d orders
\echo == d+ orders
\d+ orders
\echo == dn
\dn
\echo == l
\l
\echo == d
\d
\echo == x
\x
SELECT offset, customer, amount FROM orders WHERE offset = 1;
\x
\echo == timing
\timing
SELECT count(*) AS n FROM orders;
\timing
\echo == dv
\dv
\echo == d+ ov
\d+ ov
\echo == done
";

/// The lines of `stdout` between `== name` and the next `== ` marker.
fn section<'a>(lines: &'a [String], name: &str) -> &'a [String] {
    let marker = format!("== {name}");
    let start = lines
        .iter()
        .position(|l| *l == marker)
        .unwrap_or_else(|| panic!("no {marker:?} in psql output"));
    let len = lines[start + 1..]
        .iter()
        .position(|l| l.starts_with("== "))
        .unwrap_or(lines.len() - start - 1);
    &lines[start + 1..start + 1 + len]
}

/// Whitespace-insensitive form of a squeezed line (empty cells collapse).
fn norm(l: &str) -> String {
    l.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn has(lines: &[String], want: &str, what: &str) {
    assert!(
        lines.iter().any(|l| norm(l) == norm(want)),
        "{what}: no line {want:?} in\n{}",
        lines.join("\n")
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn psql_describe_commands() {
    if !psql_on_path() {
        println!("SKIPPED psql_describe_commands: `psql` is not on PATH");
        return;
    }
    let server = Server::start().await;
    let client = server.client().await;
    exec(
        &client,
        "CREATE STREAM orders (customer text NOT NULL, amount numeric(12,2), note varchar(40), id uuid, payload jsonb)",
    )
    .await;
    exec(&client, "CREATE STREAM clicks (url text)").await;
    exec(
        &client,
        "ALTER STREAM orders ADD COLUMN region text NOT NULL DEFAULT 'eu'",
    )
    .await;
    exec(
        &client,
        "CREATE VIEW ov (who, amount) AS SELECT customer, amount FROM orders",
    )
    .await;
    exec(
        &client,
        "INSERT INTO orders (customer, amount) VALUES ('ann', 10.5), ('bob', 3)",
    )
    .await;

    let output = run_script(&server, SCRIPT, true).await;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "psql failed: {}", output.status);
    assert!(
        stderr.trim().is_empty(),
        "psql printed errors or warnings:\n{stderr}"
    );
    let lines = squeeze(&stdout);

    let dt = section(&lines, "dt");
    has(dt, "List of relations", "\\dt title");
    has(dt, "public | clicks | table | sluice", "\\dt");
    has(dt, "public | orders | table | sluice", "\\dt");
    assert!(
        !dt.iter().any(|l| l.contains("sluice_stats")),
        "\\dt lists only tables, not system views: {dt:?}"
    );

    let d = section(&lines, "d orders");
    has(d, "Table \"public.orders\"", "\\d orders title");
    has(
        d,
        "Column | Type | Collation | Nullable | Default",
        "\\d orders header",
    );
    has(d, "offset | bigint | | not null |", "\\d orders");
    has(
        d,
        "ts | timestamp with time zone | | not null |",
        "\\d orders",
    );
    has(d, "customer | text | | not null |", "\\d orders");
    has(d, "amount | numeric(12,2) | | |", "\\d orders");
    has(d, "note | character varying(40) | | |", "\\d orders");
    has(d, "id | uuid | | |", "\\d orders");
    has(d, "payload | jsonb | | |", "\\d orders");
    // a default as PostgreSQL shows it (pg_attrdef through pg_get_expr)
    has(d, "region | text | | not null | 'eu'::text", "\\d orders");
    let columns: Vec<&String> = d
        .iter()
        .filter(|l| l.contains(" | ") && !l.starts_with("Column"))
        .collect();
    assert_eq!(columns.len(), 8, "\\d orders lists 8 columns: {columns:?}");
    assert!(
        columns[0].starts_with("offset |") && columns[1].starts_with("ts |"),
        "system columns first: {columns:?}"
    );

    let dplus = section(&lines, "d+ orders");
    has(dplus, "Table \"public.orders\"", "\\d+ orders title");
    assert!(
        dplus.iter().any(
            |l| norm(l).starts_with("Column | Type | Collation | Nullable | Default | Storage")
        ),
        "\\d+ shows storage columns: {dplus:?}"
    );
    assert!(
        dplus
            .iter()
            .any(|l| norm(l).starts_with("offset | bigint | | not null | | plain")),
        "\\d+ offset row: {dplus:?}"
    );
    assert!(
        dplus
            .iter()
            .any(|l| norm(l).starts_with("customer | text | | not null | | extended")),
        "\\d+ customer row: {dplus:?}"
    );

    let dn = section(&lines, "dn");
    has(dn, "public | sluice", "\\dn");

    let l = section(&lines, "l");
    assert!(
        l.iter()
            .any(|line| line.starts_with("sluice | sluice | UTF8")),
        "\\l lists the database: {l:?}"
    );

    let all = section(&lines, "d");
    has(all, "public | clicks | table | sluice", "\\d");
    has(all, "public | orders | table | sluice", "\\d");
    has(all, "public | sluice_stats | view | sluice", "\\d");

    let x = section(&lines, "x");
    has(x, "Expanded display is on.", "\\x");
    assert!(
        x.iter().any(|l| l.starts_with("-[ RECORD 1 ]")),
        "\\x record header: {x:?}"
    );
    has(x, "offset | 1", "\\x");
    has(x, "customer | bob", "\\x");
    has(x, "amount | 3.00", "\\x");
    has(x, "Expanded display is off.", "\\x off");

    // a user's view is listed by \dv (with Sluice's own) and described with its query
    let dv = section(&lines, "dv");
    has(dv, "public | ov | view | sluice", "\\dv");
    assert!(
        !dt.iter().any(|l| l.contains("| ov ")),
        "\\dt lists no view: {dt:?}"
    );
    let dov = section(&lines, "d+ ov");
    has(dov, "View \"public.ov\"", "\\d+ ov title");
    has(dov, "who | text | | | | extended |", "\\d+ ov column");
    has(dov, "View definition:", "\\d+ ov definition");
    has(dov, "SELECT customer, amount FROM orders;", "\\d+ ov query");

    let timing = section(&lines, "timing");
    has(timing, "Timing is on.", "\\timing");
    has(timing, "2", "\\timing query result");
    assert!(
        timing
            .iter()
            .any(|l| l.starts_with("Time: ") && l.ends_with(" ms")),
        "\\timing prints the time: {timing:?}"
    );
    has(timing, "Timing is off.", "\\timing off");
}

/// A table shows its primary key the way PostgreSQL's psql prints it, and
/// its index is listed by `\di`.
#[tokio::test(flavor = "multi_thread")]
async fn psql_describes_tables_and_primary_keys() {
    if !psql_on_path() {
        println!("SKIPPED psql_describes_tables_and_primary_keys: `psql` is not on PATH");
        return;
    }
    let server = Server::start().await;
    let client = server.client().await;
    exec(
        &client,
        r#"CREATE TABLE pairs (a int, "B" text, v numeric(10,2), PRIMARY KEY (a, "B"))"#,
    )
    .await;
    exec(&client, "CREATE TABLE notes (body text)").await;
    let script = "\\echo == d pairs\n\\d pairs\n\\echo == d notes\n\\d notes\n\\echo == di\n\\di\n\\echo == dt\n\\dt\n\\echo == done\n";
    let output = run_script(&server, script, true).await;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "psql failed: {}", output.status);
    assert!(stderr.trim().is_empty(), "psql printed errors:\n{stderr}");
    let lines = squeeze(&stdout);

    let d = section(&lines, "d pairs");
    has(d, "Table \"public.pairs\"", "\\d pairs title");
    has(d, "a | integer | | not null |", "\\d pairs");
    has(d, "B | text | | not null |", "\\d pairs");
    has(d, "v | numeric(10,2) | | |", "\\d pairs");
    has(d, "Indexes:", "\\d pairs");
    has(
        d,
        "\"pairs_pkey\" PRIMARY KEY, btree (a, \"B\")",
        "\\d pairs index",
    );

    let notes = section(&lines, "d notes");
    assert!(
        !notes.iter().any(|l| l.contains("Indexes:")),
        "a table without a key has no index: {notes:?}"
    );

    let di = section(&lines, "di");
    has(di, "public | pairs_pkey | index | sluice | pairs", "\\di");
    has(
        di,
        "public | consumer_offsets_pkey | index | sluice | consumer_offsets",
        "\\di",
    );

    let dt = section(&lines, "dt");
    has(dt, "public | pairs | table | sluice", "\\dt");
    has(dt, "public | notes | table | sluice", "\\dt");
    has(dt, "public | consumer_offsets | table | sluice", "\\dt");
}
