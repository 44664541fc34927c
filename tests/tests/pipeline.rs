//! Implicit transactions, byte for byte: statements pipelined between two
//! Syncs (and several in one simple Query) commit together or not at all,
//! and a stream INSERT's RETURNING inside them answers in its place with
//! the offsets the commit assigned — or NULL when the pipeline failed.
//!
//! On a server without implicit transactions every statement before the
//! failure stayed committed: the row counts here fail there.

use sluice_tests::wire::{cstr, error_code, execute, message, parse, Wire, ANSWER};
use sluice_tests::{exec, simple_rows, Server};

/// Bind of the unnamed statement to the unnamed portal with text parameters.
fn bind_text(params: &[Option<&str>]) -> Vec<u8> {
    let mut body = cstr("");
    body.extend(cstr(""));
    body.extend_from_slice(&0i16.to_be_bytes()); // parameter formats: all text
    body.extend_from_slice(&(params.len() as i16).to_be_bytes());
    for p in params {
        match p {
            Some(v) => {
                body.extend_from_slice(&(v.len() as i32).to_be_bytes());
                body.extend_from_slice(v.as_bytes());
            }
            None => body.extend_from_slice(&(-1i32).to_be_bytes()),
        }
    }
    body.extend_from_slice(&0i16.to_be_bytes()); // result formats: text
    message(b'B', &body)
}

/// Parse, Bind and Execute of `sql` with `params`.
fn statement(sql: &str, params: &[Option<&str>]) -> Vec<u8> {
    let mut m = parse(sql);
    m.extend(bind_text(params));
    m.extend(execute());
    m
}

fn sync() -> Vec<u8> {
    message(b'S', &[])
}

/// The columns of a DataRow body (text format; None for NULL).
fn data_row(body: &[u8]) -> Vec<Option<String>> {
    let n = i16::from_be_bytes([body[0], body[1]]) as usize;
    let mut at = 2;
    let mut cols = Vec::with_capacity(n);
    for _ in 0..n {
        let len = i32::from_be_bytes([body[at], body[at + 1], body[at + 2], body[at + 3]]);
        at += 4;
        if len < 0 {
            cols.push(None);
        } else {
            let len = len as usize;
            cols.push(Some(
                String::from_utf8_lossy(&body[at..at + len]).into_owned(),
            ));
            at += len;
        }
    }
    cols
}

/// Every message up to and including ReadyForQuery.
async fn until_ready(wire: &mut Wire) -> Vec<(u8, Vec<u8>)> {
    let mut out = Vec::new();
    loop {
        let m = wire
            .next(ANSWER)
            .await
            .expect("an answer before ReadyForQuery");
        let ready = m.0 == b'Z';
        out.push(m);
        if ready {
            return out;
        }
    }
}

fn tags(messages: &[(u8, Vec<u8>)]) -> String {
    messages.iter().map(|m| m.0 as char).collect()
}

fn rows(messages: &[(u8, Vec<u8>)]) -> Vec<Vec<Option<String>>> {
    messages
        .iter()
        .filter(|m| m.0 == b'D')
        .map(|m| data_row(&m.1))
        .collect()
}

const INSERT: &str = "INSERT INTO events (body, n) VALUES ($1, $2) RETURNING offset, body";

async fn events(server: &Server) -> Vec<Vec<Option<String>>> {
    let client = server.client().await;
    simple_rows(&client, "SELECT offset, body FROM events ORDER BY offset").await
}

/// A server with stream `events`, and a raw connection to it.
async fn with_events() -> (Server, Wire) {
    let server = Server::start().await;
    let client = server.client().await;
    exec(
        &client,
        "CREATE STREAM events (body text NOT NULL, n bigint)",
    )
    .await;
    let wire = Wire::connect(server.port()).await;
    (server, wire)
}

#[tokio::test]
async fn a_pipeline_commits_at_sync_all_or_nothing() {
    let (server, mut wire) = with_events().await;

    // three appends and one Sync: each RETURNING answers in its place with
    // the offset the commit gave it
    let mut batch = Vec::new();
    for (body, n) in [("a", "1"), ("b", "2"), ("c", "3")] {
        batch.extend(statement(INSERT, &[Some(body), Some(n)]));
    }
    batch.extend(sync());
    wire.send(&batch).await;
    let answer = until_ready(&mut wire).await;
    assert_eq!(tags(&answer), "12DC12DC12DCZ");
    let want = |o: &str, b: &str| vec![Some(o.to_string()), Some(b.to_string())];
    assert_eq!(
        rows(&answer),
        vec![want("0", "a"), want("1", "b"), want("2", "c")]
    );
    assert_eq!(
        answer.last().expect("ReadyForQuery").1,
        b"I",
        "idle after the pipeline"
    );

    // the second statement fails: the first is undone and its RETURNING
    // says so (offset NULL), the third is skipped
    let mut batch = statement(INSERT, &[Some("undone"), Some("4")]);
    batch.extend(statement(INSERT, &[None, Some("5")]));
    batch.extend(statement(INSERT, &[Some("never run"), Some("6")]));
    batch.extend(sync());
    wire.send(&batch).await;
    let answer = until_ready(&mut wire).await;
    assert_eq!(tags(&answer), "12DC12EZ");
    assert_eq!(rows(&answer), vec![vec![None, Some("undone".to_string())]]);
    let error = answer.iter().find(|m| m.0 == b'E').expect("an error");
    assert_eq!(error_code(&error.1), "23502");
    assert_eq!(
        answer.last().expect("ReadyForQuery").1,
        b"I",
        "idle after the failed pipeline"
    );
    assert_eq!(
        events(&server).await.len(),
        3,
        "the failed pipeline appended"
    );

    // plain appends (no RETURNING) are one transaction too
    let plain = "INSERT INTO events (body, n) VALUES ($1, $2)";
    let mut batch = statement(plain, &[Some("undone"), Some("7")]);
    batch.extend(statement(plain, &[Some("undone too"), Some("8")]));
    batch.extend(statement(plain, &[None, Some("9")]));
    batch.extend(sync());
    wire.send(&batch).await;
    assert_eq!(tags(&until_ready(&mut wire).await), "12C12C12EZ");
    assert_eq!(
        events(&server).await.len(),
        3,
        "the failed pipeline appended"
    );

    // offsets stay gapless: the next append gets 3
    let mut batch = statement(INSERT, &[Some("d"), Some("10")]);
    batch.extend(sync());
    wire.send(&batch).await;
    let answer = until_ready(&mut wire).await;
    assert_eq!(rows(&answer), vec![want("3", "d")]);
}

#[tokio::test]
async fn a_flush_answers_the_returning_it_owes() {
    let (server, mut wire) = with_events().await;

    // a write followed by more of the pipeline, then Flush: the client asked
    // for the rows, so the statements so far commit there
    let mut batch = statement(INSERT, &[Some("a"), Some("1")]);
    batch.extend(statement(INSERT, &[Some("b"), Some("2")]));
    batch.extend(message(b'H', &[]));
    wire.send(&batch).await;
    let mut answer = Vec::new();
    for _ in 0..8 {
        answer.push(wire.next(ANSWER).await.expect("rows after Flush"));
    }
    assert_eq!(tags(&answer), "12DC12DC");
    assert_eq!(rows(&answer)[1][0].as_deref(), Some("1"));
    wire.send(&sync()).await;
    assert_eq!(tags(&until_ready(&mut wire).await), "Z");
    assert_eq!(events(&server).await.len(), 2);
}

#[tokio::test]
async fn an_error_anywhere_in_a_pipeline_undoes_it() {
    let (server, mut wire) = with_events().await;
    // a row-limited RETURNING: its rows could only come after the commit, all
    // at once; refused, and the pipeline with it
    let mut batch = statement(INSERT, &[Some("a"), Some("1")]);
    batch.extend(parse(INSERT));
    batch.extend(bind_text(&[Some("b"), Some("2")]));
    let mut limited = cstr("");
    limited.extend_from_slice(&1i32.to_be_bytes());
    batch.extend(message(b'E', &limited));
    batch.extend(sync());
    wire.send(&batch).await;
    let answer = until_ready(&mut wire).await;
    assert_eq!(tags(&answer), "12DC12EZ");
    let error = answer.iter().find(|m| m.0 == b'E').expect("an error");
    assert_eq!(error_code(&error.1), "0A000");
    assert_eq!(rows(&answer), vec![vec![None, Some("a".to_string())]]);
    assert!(events(&server).await.is_empty());

    // so is one whose second statement does not parse
    let mut batch = statement(
        "INSERT INTO events (body, n) VALUES ($1, $2)",
        &[Some("a"), Some("1")],
    );
    batch.extend(parse("INSERT INTO events VALUES ("));
    batch.extend(sync());
    wire.send(&batch).await;
    assert_eq!(tags(&until_ready(&mut wire).await), "12CEZ");
    assert!(events(&server).await.is_empty());
}

#[tokio::test]
async fn several_statements_in_one_query_are_one_transaction() {
    let (server, mut wire) = with_events().await;
    let client = server.client().await;
    exec(&client, "CREATE TABLE kv (k text PRIMARY KEY, v bigint)").await;

    // a failing statement undoes the ones before it, streams and tables alike
    let err = client
        .batch_execute(
            "INSERT INTO events (body) VALUES ('undone'); \
             INSERT INTO kv VALUES ('k', 1); \
             INSERT INTO events (body) VALUES (NULL)",
        )
        .await
        .expect_err("a NOT NULL violation");
    assert_eq!(sluice_tests::sqlstate(&err), Some("23502"));
    assert!(events(&server).await.is_empty());
    assert!(simple_rows(&client, "SELECT k FROM kv").await.is_empty());

    // RETURNING answers with the offsets the commit gave
    let query = "INSERT INTO events (body) VALUES ('a') RETURNING offset, body; \
                 INSERT INTO events (body) VALUES ('b'), ('c') RETURNING offset, body";
    wire.send(&message(b'Q', &cstr(query))).await;
    let answer = until_ready(&mut wire).await;
    assert_eq!(tags(&answer), "TDCTDDCZ");
    let offsets: Vec<_> = rows(&answer).into_iter().map(|r| r[0].clone()).collect();
    assert_eq!(
        offsets,
        vec![Some("0".into()), Some("1".into()), Some("2".into())]
    );

    // BEGIN ... COMMIT in one Query still works as written
    exec(
        &client,
        "BEGIN; INSERT INTO events (body) VALUES ('d'); INSERT INTO kv VALUES ('k', 2); COMMIT",
    )
    .await;
    assert_eq!(events(&server).await.len(), 4);
}
