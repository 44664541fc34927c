//! tokio-postgres against a real server: binary parameters and results for
//! every column type, text results of the same rows, RETURNING, SQLSTATEs,
//! COPY FROM STDIN (text and csv), transactions, and the psql session from
//! the README.

#[path = "driver_tokio_postgres/typed.rs"]
mod typed;

use std::time::SystemTime;

use bytes::Bytes;
use chrono::{DateTime, Utc};
use futures::SinkExt;
use rust_decimal::Decimal;
use sluice_tests::{exec, expect_sqlstate, simple_rows, within, Server, STATEMENT_TIMEOUT};
use tokio_postgres::error::SqlState;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::Client;
use typed::{samples, Typed, TYPED_COLUMNS, TYPED_DDL};

#[tokio::test(flavor = "multi_thread")]
async fn every_type_round_trips_in_binary_and_text() {
    let server = Server::start().await;
    let client = server.client().await;
    exec(&client, TYPED_DDL).await;

    let insert = client
        .prepare(&format!(
            "INSERT INTO typed ({TYPED_COLUMNS}) VALUES \
             ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16)"
        ))
        .await
        .expect("prepare INSERT with 16 parameters");
    let param_types: Vec<Type> = insert.params().to_vec();
    assert_eq!(
        param_types,
        [
            Type::BOOL,
            Type::INT2,
            Type::INT4,
            Type::INT8,
            Type::FLOAT4,
            Type::FLOAT8,
            Type::NUMERIC,
            Type::TEXT,
            Type::VARCHAR,
            Type::BYTEA,
            Type::TIMESTAMPTZ,
            Type::TIMESTAMP,
            Type::DATE,
            Type::JSON,
            Type::JSONB,
            Type::UUID,
        ],
        "inferred parameter types of the INSERT"
    );
    let samples = samples();
    for (row, _) in &samples {
        let n = within(
            STATEMENT_TIMEOUT,
            "insert typed row",
            client.execute(&insert, &row.params()),
        )
        .await
        .unwrap_or_else(|e| panic!("insert {row:?}: {e:?}"));
        assert_eq!(n, 1);
    }

    // SELECT * is offset, ts, then the declared columns, with their types.
    let select_all = client
        .prepare("SELECT * FROM typed ORDER BY offset")
        .await
        .expect("prepare SELECT *");
    let columns: Vec<(&str, &Type)> = select_all
        .columns()
        .iter()
        .map(|c| (c.name(), c.type_()))
        .collect();
    let expected_columns = [
        ("offset", &Type::INT8),
        ("ts", &Type::TIMESTAMPTZ),
        ("flag", &Type::BOOL),
        ("i2", &Type::INT2),
        ("i4", &Type::INT4),
        ("i8", &Type::INT8),
        ("f4", &Type::FLOAT4),
        ("f8", &Type::FLOAT8),
        ("num", &Type::NUMERIC),
        ("txt", &Type::TEXT),
        ("vc", &Type::VARCHAR),
        ("bin", &Type::BYTEA),
        ("tstz", &Type::TIMESTAMPTZ),
        ("tsp", &Type::TIMESTAMP),
        ("day", &Type::DATE),
        ("doc", &Type::JSON),
        ("docb", &Type::JSONB),
        ("id", &Type::UUID),
    ];
    assert_eq!(columns, expected_columns, "columns of SELECT *");

    // Binary results.
    let rows = client
        .query(&select_all, &[])
        .await
        .expect("SELECT * (binary)");
    assert_eq!(rows.len(), samples.len());
    for (i, (row, (expected, _))) in rows.iter().zip(&samples).enumerate() {
        assert_eq!(row.get::<_, i64>("offset"), i as i64);
        assert_eq!(
            &Typed::from_row(row),
            expected,
            "binary round trip of row {i}"
        );
    }

    // Text results of the same rows.
    let text = simple_rows(
        &client,
        &format!("SELECT {TYPED_COLUMNS} FROM typed ORDER BY offset"),
    )
    .await;
    for (i, (row, (_, expected))) in text.iter().zip(&samples).enumerate() {
        let expected: Vec<Option<String>> =
            expected.iter().map(|v| v.map(str::to_string)).collect();
        assert_eq!(row, &expected, "text rendering of row {i}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn predicate_parameters_take_the_column_type() {
    let server = Server::start().await;
    let client = server.client().await;
    exec(&client, TYPED_DDL).await;
    let insert = format!(
        "INSERT INTO typed ({TYPED_COLUMNS}) VALUES \
         ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16)"
    );
    let samples = samples();
    for (row, _) in &samples {
        client
            .execute(insert.as_str(), &row.params())
            .await
            .expect("insert typed row");
    }
    // `WHERE col = $1` with the first sample's value finds exactly offset 0.
    // (json has no equality operator in PostgreSQL, so it is left out.)
    let first = &samples[0].0;
    let cases: [(&str, &(dyn ToSql + Sync)); 16] = [
        ("flag", &first.flag),
        ("i2", &first.i2),
        ("i4", &first.i4),
        ("i8", &first.i8),
        ("f4", &first.f4),
        ("f8", &first.f8),
        ("num", &first.num),
        ("txt", &first.txt),
        ("vc", &first.vc),
        ("bin", &first.bin),
        ("tstz", &first.tstz),
        ("tsp", &first.tsp),
        ("day", &first.day),
        ("docb", &first.docb),
        ("id", &first.id),
        ("offset", &0_i64),
    ];
    let mut failures = Vec::new();
    for (column, value) in cases {
        let sql = format!("SELECT offset FROM typed WHERE {column} = $1");
        match client.query(sql.as_str(), &[value]).await {
            Ok(rows) => {
                let offsets: Vec<i64> = rows.iter().map(|r| r.get(0)).collect();
                if offsets != [0] {
                    failures.push(format!("{sql}: offsets {offsets:?}, expected [0]"));
                }
            }
            Err(e) => failures.push(format!("{sql}: {e:?}")),
        }
    }
    assert!(
        failures.is_empty(),
        "parameter typing failures:\n{}",
        failures.join("\n")
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn returning_gives_gapless_offsets_and_commit_times() {
    let server = Server::start().await;
    let client = server.client().await;
    exec(&client, "CREATE STREAM notes (body text)").await;
    let insert = client
        .prepare("INSERT INTO notes VALUES ($1), ($2) RETURNING offset, ts")
        .await
        .expect("prepare INSERT ... RETURNING");
    let started: DateTime<Utc> = SystemTime::now().into();
    let mut last_ts = DateTime::<Utc>::MIN_UTC;
    for round in 0..5_i64 {
        let rows = client
            .query(&insert, &[&"x", &"y"])
            .await
            .expect("INSERT ... RETURNING");
        let offsets: Vec<i64> = rows.iter().map(|r| r.get(0)).collect();
        assert_eq!(offsets, [2 * round, 2 * round + 1]);
        for row in &rows {
            let ts: DateTime<Utc> = row.get(1);
            assert!(ts >= last_ts, "ts went backwards: {ts} after {last_ts}");
            let drift = (ts - started).num_seconds().abs();
            assert!(
                drift < 120,
                "ts {ts} is far from the local clock ({started})"
            );
            last_ts = ts;
        }
    }
    let other = client
        .query_one(
            "INSERT INTO notes (body) VALUES ('z') RETURNING offset, body",
            &[],
        )
        .await
        .expect("INSERT ... RETURNING offset, body");
    assert_eq!(other.get::<_, i64>(0), 10);
    assert_eq!(other.get::<_, String>(1), "z");
}

#[tokio::test(flavor = "multi_thread")]
async fn errors_carry_sqlstates() {
    let server = Server::start().await;
    let client = server.client().await;
    exec(
        &client,
        "CREATE STREAM orders (customer text NOT NULL, amount numeric(12,2), code varchar(3))",
    )
    .await;

    let simple_cases: [(&str, SqlState); 9] = [
        ("SELECT * FROM no_such_stream", SqlState::UNDEFINED_TABLE),
        (
            "SELECT no_such_column FROM orders",
            SqlState::UNDEFINED_COLUMN,
        ),
        ("SELEC 1", SqlState::SYNTAX_ERROR),
        (
            "INSERT INTO orders (customer, amount) VALUES ('a', 'abc')",
            SqlState::INVALID_TEXT_REPRESENTATION,
        ),
        (
            "INSERT INTO orders (amount) VALUES (1)",
            SqlState::NOT_NULL_VIOLATION,
        ),
        (
            "INSERT INTO orders (customer, code) VALUES ('a', 'abcd')",
            SqlState::STRING_DATA_RIGHT_TRUNCATION,
        ),
        (
            "CREATE STREAM orders (x integer)",
            SqlState::DUPLICATE_TABLE,
        ),
        (
            "UPDATE orders SET amount = 0",
            SqlState::FEATURE_NOT_SUPPORTED,
        ),
        ("DELETE FROM orders", SqlState::FEATURE_NOT_SUPPORTED),
    ];
    for (sql, code) in &simple_cases {
        let err = expect_sqlstate(client.batch_execute(sql).await, code, sql);
        if *code == SqlState::FEATURE_NOT_SUPPORTED {
            let message = sluice_tests::error_message(&err);
            assert!(
                message.contains("append-only"),
                "{sql}: message {message:?} should say append-only"
            );
        }
    }

    // The same checks through bound parameters.
    let insert = "INSERT INTO orders (customer, code) VALUES ($1, $2)";
    let none: Option<&str> = None;
    expect_sqlstate(
        client.execute(insert, &[&none, &"x"]).await,
        &SqlState::NOT_NULL_VIOLATION,
        "NULL parameter",
    );
    expect_sqlstate(
        client.execute(insert, &[&"a", &"abcd"]).await,
        &SqlState::STRING_DATA_RIGHT_TRUNCATION,
        "long parameter",
    );
    expect_sqlstate(
        client
            .prepare("SELECT no_such_column FROM orders WHERE customer = $1")
            .await,
        &SqlState::UNDEFINED_COLUMN,
        "prepare",
    );

    // Nothing above appended a row, and the connection still works.
    let n = client
        .execute(insert, &[&"ok", &"abc"])
        .await
        .expect("valid insert after errors");
    assert_eq!(n, 1);
    assert_eq!(sluice_tests::assert_gapless(&client, "orders").await, 1);
}

async fn copy_in(client: &Client, sql: &str, data: &str) -> Result<u64, tokio_postgres::Error> {
    let sink = client.copy_in::<_, Bytes>(sql).await?;
    futures::pin_mut!(sink);
    sink.send(Bytes::from(data.to_string())).await?;
    sink.finish().await
}

#[tokio::test(flavor = "multi_thread")]
async fn copy_from_stdin_text_and_csv() {
    let server = Server::start().await;
    let client = server.client().await;
    exec(
        &client,
        "CREATE STREAM c (customer text NOT NULL, amount numeric(12,2), note text)",
    )
    .await;

    let text = "ann\t1.50\t\\N\nbob\t2\tnote with\\ttab\n";
    let n = within(
        STATEMENT_TIMEOUT,
        "COPY text",
        copy_in(&client, "COPY c FROM STDIN", text),
    )
    .await;
    assert_eq!(n.expect("COPY ... FROM STDIN (text)"), 2);

    let csv = "cid,3.25,\"quoted, with comma\"\ndee,,\"\"\n";
    let n = within(
        STATEMENT_TIMEOUT,
        "COPY csv",
        copy_in(&client, "COPY c FROM STDIN WITH (FORMAT csv)", csv),
    )
    .await;
    assert_eq!(n.expect("COPY ... FROM STDIN (csv)"), 2);

    let n = within(
        STATEMENT_TIMEOUT,
        "COPY cols",
        copy_in(&client, "COPY c (note, customer) FROM STDIN", "n1\teve\n"),
    )
    .await;
    assert_eq!(n.expect("COPY with a column list"), 1);

    // A bad row fails the whole COPY: nothing of it is appended.
    let bad = "fay\t1\t\\N\ngus\tnot-a-number\t\\N\n";
    let result = within(
        STATEMENT_TIMEOUT,
        "bad COPY",
        copy_in(&client, "COPY c FROM STDIN", bad),
    )
    .await;
    expect_sqlstate(
        result,
        &SqlState::INVALID_TEXT_REPRESENTATION,
        "COPY with a bad numeric",
    );

    let rows = client
        .query(
            "SELECT offset, customer, amount, note FROM c ORDER BY offset",
            &[],
        )
        .await
        .expect("read back copied rows");
    let got: Vec<(i64, String, Option<Decimal>, Option<String>)> = rows
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect();
    let some = |s: &str| Some(s.to_string());
    let expected = vec![
        (0, "ann".to_string(), Some(Decimal::new(150, 2)), None),
        (
            1,
            "bob".to_string(),
            Some(Decimal::new(2, 0)),
            some("note with\ttab"),
        ),
        (
            2,
            "cid".to_string(),
            Some(Decimal::new(325, 2)),
            some("quoted, with comma"),
        ),
        (3, "dee".to_string(), None, some("")),
        (4, "eve".to_string(), None, some("n1")),
    ];
    assert_eq!(got, expected);
    let next = client
        .query_one(
            "INSERT INTO c VALUES ('hal', 1, NULL) RETURNING offset",
            &[],
        )
        .await
        .expect("insert after COPY");
    assert_eq!(next.get::<_, i64>(0), 5);
}

async fn count(client: &Client, stream: &str) -> i64 {
    let row = within(
        STATEMENT_TIMEOUT,
        "count",
        client.query_one(format!("SELECT count(*) FROM {stream}").as_str(), &[]),
    )
    .await
    .expect("count(*)");
    row.get(0)
}

#[tokio::test(flavor = "multi_thread")]
async fn transactions_commit_and_roll_back() {
    let server = Server::start().await;
    let mut writer = server.client().await;
    let reader = server.client().await;
    exec(&writer, "CREATE STREAM t (body text)").await;

    let tx = writer.transaction().await.expect("BEGIN");
    tx.execute("INSERT INTO t VALUES ($1)", &[&"a"])
        .await
        .expect("insert a");
    tx.execute("INSERT INTO t VALUES ($1), ($2)", &[&"b", &"c"])
        .await
        .expect("insert b, c");
    assert_eq!(
        count(&reader, "t").await,
        0,
        "uncommitted rows are invisible to others"
    );
    tx.commit().await.expect("COMMIT");
    assert_eq!(count(&reader, "t").await, 3);

    let tx = writer.transaction().await.expect("BEGIN");
    tx.execute("INSERT INTO t VALUES ($1)", &[&"rolled back"])
        .await
        .expect("insert");
    tx.rollback().await.expect("ROLLBACK");
    assert_eq!(count(&reader, "t").await, 3);

    // Dropping an open transaction rolls it back too.
    let tx = writer.transaction().await.expect("BEGIN");
    tx.execute("INSERT INTO t VALUES ($1)", &[&"dropped"])
        .await
        .expect("insert");
    drop(tx);

    let next = writer
        .query_one("INSERT INTO t VALUES ($1) RETURNING offset", &[&"d"])
        .await
        .expect("insert after rollbacks");
    assert_eq!(
        next.get::<_, i64>(0),
        3,
        "rolled-back rows consume no offsets"
    );
    let bodies: Vec<String> = reader
        .query("SELECT body FROM t ORDER BY offset", &[])
        .await
        .expect("read back")
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(bodies, ["a", "b", "c", "d"]);
}

#[tokio::test(flavor = "multi_thread")]
async fn readme_orders_session() {
    let server = Server::start().await;
    let client = server.client().await;
    exec(
        &client,
        "CREATE STREAM orders (customer text NOT NULL, amount numeric(12,2))",
    )
    .await;

    let offsets: Vec<i64> = client
        .query(
            "INSERT INTO orders VALUES ('ann', 10.50), ('bob', 3) RETURNING offset",
            &[],
        )
        .await
        .expect("INSERT ... RETURNING offset")
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(offsets, [0, 1]);

    let rows = client
        .query(
            "SELECT offset, customer, amount FROM orders WHERE offset > 0",
            &[],
        )
        .await
        .expect("SELECT WHERE offset > 0");
    let got: Vec<(i64, String, Decimal)> = rows
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    assert_eq!(got, [(1, "bob".to_string(), Decimal::new(300, 2))]);

    let sums = simple_rows(
        &client,
        "SELECT customer, sum(amount) FROM orders GROUP BY customer ORDER BY 1",
    )
    .await;
    let some = |s: &str| Some(s.to_string());
    assert_eq!(
        sums,
        [[some("ann"), some("10.50")], [some("bob"), some("3.00")]]
    );

    let err = expect_sqlstate(
        client.batch_execute("UPDATE orders SET amount = 0").await,
        &SqlState::FEATURE_NOT_SUPPORTED,
        "UPDATE on a stream",
    );
    assert!(sluice_tests::error_message(&err).contains("append-only"));
    assert_eq!(sluice_tests::assert_gapless(&client, "orders").await, 2);
}

/// A statement prepared before `ALTER STREAM ... ADD COLUMN` announced fewer columns than
/// `SELECT *` now has: executing it is PostgreSQL's 0A000 "cached plan must not change result
/// type" (drivers prepare again on it), never rows that do not match the RowDescription; a
/// statement prepared after the ALTER sees the new column, and a row-limited portal too.
#[tokio::test(flavor = "multi_thread")]
async fn a_prepared_select_star_after_add_column_is_refused_not_garbled() {
    let server = Server::start().await;
    let mut client = server.client().await;
    exec(&client, "CREATE STREAM grown (n bigint)").await;
    exec(&client, "INSERT INTO grown VALUES (1), (2)").await;
    let before = client
        .prepare("SELECT * FROM grown")
        .await
        .expect("prepare");
    assert_eq!(before.columns().len(), 3);
    exec(
        &client,
        "ALTER STREAM grown ADD COLUMN tag text DEFAULT 'x'",
    )
    .await;
    expect_sqlstate(
        client.query(&before, &[]).await,
        &SqlState::FEATURE_NOT_SUPPORTED,
        "prepared SELECT * after ADD COLUMN",
    );
    let after = client
        .prepare("SELECT * FROM grown")
        .await
        .expect("prepare");
    let rows = client.query(&after, &[]).await.expect("query");
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0].get::<_, Option<String>>(3).as_deref(), Some("x"));
    // a row-limited portal (the path with its own encoder)
    let tx = client.transaction().await.expect("begin");
    let portal = tx.bind(&before, &[]).await.expect("bind");
    expect_sqlstate(
        tx.query_portal(&portal, 1).await,
        &SqlState::FEATURE_NOT_SUPPORTED,
        "row-limited portal after ADD COLUMN",
    );
}
