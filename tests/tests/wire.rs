//! The wire protocol byte for byte, with a raw socket: what the server
//! sends, and when. Drivers hide both, so these are checked here.
//!
//! The extended protocol's ParseComplete, BindComplete, CloseComplete and
//! Describe answers wait in the server's buffer until the client sends Sync
//! or Flush, as in PostgreSQL; a server that flushed each one would cost
//! every statement an extra send and an extra client wake-up.

use std::time::Duration;

use sluice_tests::wire::{bind, close, execute, message, parse, Wire, ANSWER};
use sluice_tests::{exec, Server};

/// How long the test waits to be sure nothing more arrives.
const QUIET: Duration = Duration::from_millis(300);

#[tokio::test]
async fn extended_protocol_answers_wait_for_sync_or_flush() {
    let server = Server::start().await;
    let mut wire = Wire::connect(server.port()).await;

    // Parse and Bind alone: nothing is sent yet
    let mut batch = parse("SELECT 1");
    batch.extend(bind());
    wire.send(&batch).await;
    nothing_yet(&mut wire).await;

    // Flush sends what was held, in order
    wire.send(&message(b'H', &[])).await;
    assert_eq!(wire.next(ANSWER).await.map(|m| m.0), Some(b'1'));
    assert_eq!(wire.next(ANSWER).await.map(|m| m.0), Some(b'2'));

    // Execute, Close, Sync: the row, the tag, CloseComplete, ReadyForQuery
    let mut batch = execute();
    batch.extend(close());
    batch.extend(message(b'S', &[]));
    wire.send(&batch).await;
    assert_eq!(wire.until_ready().await, b"DC3Z".to_vec());

    // a pipeline of two statements and one Sync answers both in order
    let mut batch = Vec::new();
    for sql in ["SELECT 1", "SELECT 2"] {
        batch.extend(parse(sql));
        batch.extend(bind());
        batch.extend(execute());
    }
    batch.extend(message(b'S', &[]));
    wire.send(&batch).await;
    assert_eq!(wire.until_ready().await, b"12DC12DCZ".to_vec());

    // an error reaches the client at Sync, after the answers held before it
    let mut batch = parse("SELECT 1");
    batch.extend(bind());
    batch.extend(parse("SELEC 1"));
    batch.extend(bind()); // skipped: the pipeline failed
    batch.extend(message(b'S', &[]));
    wire.send(&batch).await;
    assert_eq!(wire.until_ready().await, b"12EZ".to_vec());
}

/// Nothing arrives while the client has sent neither Sync nor Flush.
async fn nothing_yet(wire: &mut Wire) {
    assert_eq!(
        wire.next(QUIET).await,
        None,
        "answered before Sync or Flush"
    );
}

/// Describe of the unnamed statement (`b'S'`) or portal (`b'P'`).
fn describe(target: u8) -> Vec<u8> {
    let mut body = vec![target];
    body.extend(sluice_tests::wire::cstr(""));
    message(b'D', &body)
}

/// Describe's answers wait for Sync or Flush too. A prepared INSERT as
/// pgbench -M prepared sends it (Bind, Describe, Execute, Sync in one
/// packet) was answered in two writes: BindComplete and NoData at once
/// (pgwire's default Describe flushes), the rest after the commit — two
/// client wake-ups per statement. The old server fails the first check.
#[tokio::test]
async fn describe_answers_wait_for_sync_or_flush() {
    let server = Server::start().await;
    let client = server.client().await;
    exec(&client, "CREATE STREAM dw (n bigint)").await;
    let mut wire = Wire::connect(server.port()).await;

    let mut batch = parse("INSERT INTO dw (n) VALUES (1)");
    batch.extend(message(b'S', &[]));
    wire.send(&batch).await;
    assert_eq!(wire.until_ready().await, b"1Z".to_vec());

    // the prepared INSERT without its Sync: nothing is answered yet
    let mut batch = bind();
    batch.extend(describe(b'P'));
    batch.extend(execute());
    wire.send(&batch).await;
    nothing_yet(&mut wire).await;
    wire.send(&message(b'S', &[])).await;
    assert_eq!(wire.until_ready().await, b"2nCZ".to_vec());

    // a statement and a portal with columns, described before a Flush
    let mut batch = parse("SELECT $1::bigint AS n");
    batch.extend(describe(b'S'));
    wire.send(&batch).await;
    nothing_yet(&mut wire).await;
    wire.send(&message(b'H', &[])).await;
    for tag in [b'1', b't', b'T'] {
        assert_eq!(wire.next(ANSWER).await.map(|m| m.0), Some(tag));
    }
    let mut body = sluice_tests::wire::cstr("");
    body.extend(sluice_tests::wire::cstr(""));
    body.extend_from_slice(&0i16.to_be_bytes()); // parameter formats: text
    body.extend_from_slice(&1i16.to_be_bytes()); // one parameter
    body.extend_from_slice(&1i32.to_be_bytes());
    body.push(b'7');
    body.extend_from_slice(&0i16.to_be_bytes()); // result formats
    let mut batch = message(b'B', &body);
    batch.extend(describe(b'P'));
    batch.extend(execute());
    batch.extend(message(b'S', &[]));
    wire.send(&batch).await;
    assert_eq!(wire.until_ready().await, b"2TDCZ".to_vec());

    // a Describe of what does not exist is an error at Sync
    let mut batch = describe(b'S');
    batch.extend(close());
    batch.extend(describe(b'S'));
    batch.extend(message(b'S', &[]));
    wire.send(&batch).await;
    assert_eq!(wire.until_ready().await, b"tT3EZ".to_vec());
    let row = client
        .query_one("SELECT count(*) FROM dw", &[])
        .await
        .expect("count");
    assert_eq!(row.get::<_, i64>(0), 1, "the INSERT committed once");
}

/// Bind of the unnamed statement to portal `portal`, no parameters.
fn bind_portal(portal: &str) -> Vec<u8> {
    let mut body = sluice_tests::wire::cstr(portal);
    body.extend(sluice_tests::wire::cstr(""));
    body.extend_from_slice(&0i16.to_be_bytes());
    body.extend_from_slice(&0i16.to_be_bytes());
    body.extend_from_slice(&0i16.to_be_bytes());
    message(b'B', &body)
}

/// Execute of portal `portal`, at most `rows` rows.
fn execute_portal(portal: &str, rows: i32) -> Vec<u8> {
    let mut body = sluice_tests::wire::cstr(portal);
    body.extend_from_slice(&rows.to_be_bytes());
    message(b'E', &body)
}

/// Close of portal `portal`.
fn close_portal(portal: &str) -> Vec<u8> {
    let mut body = vec![b'P'];
    body.extend(sluice_tests::wire::cstr(portal));
    message(b'C', &body)
}

/// A tailing portal closed before its end must not leave its tail to the
/// next portal: a portal's tail was once kept by the bare address of the
/// portal's state, and a new portal allocated at the freed address continued
/// the closed one's query (rows of another width, 0A000 "cached plan must not
/// change result type", or the wrong rows silently). Many portals in a row
/// make the allocator reuse the address.
#[tokio::test]
async fn a_closed_tailing_portal_leaves_nothing_to_the_next() {
    let server = Server::start().await;
    let client = server.client().await;
    exec(
        &client,
        "CREATE STREAM s (a text, b text); INSERT INTO s VALUES ('a0', 'b0'), ('a1', 'b1')",
    )
    .await;
    let mut wire = Wire::connect(server.port()).await;
    for round in 0..60 {
        // a two-column tail, suspended after one row, then closed
        let mut batch = parse("SELECT a, b FROM s WHERE offset >= 0");
        batch.extend(bind_portal("wide"));
        batch.extend(execute_portal("wide", 1));
        batch.extend(close_portal("wide"));
        batch.extend(message(b'S', &[]));
        wire.send(&batch).await;
        assert_eq!(
            wire.until_ready().await,
            b"12Ds3Z".to_vec(),
            "round {round}"
        );
        // a one-column tail in a new portal: its own rows, from its start
        let mut batch = parse("SELECT a FROM s WHERE offset >= 1");
        batch.extend(bind_portal("narrow"));
        batch.extend(execute_portal("narrow", 1));
        batch.extend(close_portal("narrow"));
        batch.extend(message(b'S', &[]));
        wire.send(&batch).await;
        let mut tags = Vec::new();
        loop {
            let (tag, body) = wire.next(ANSWER).await.expect("an answer");
            tags.push(tag);
            if tag == b'D' {
                let columns = i16::from_be_bytes([body[0], body[1]]);
                assert_eq!(
                    columns, 1,
                    "round {round}: a row of the closed portal's query"
                );
                assert_eq!(
                    &body[6..],
                    b"a1",
                    "round {round}: not this portal's first row"
                );
            }
            if tag == b'E' {
                panic!("round {round}: {}", sluice_tests::wire::error_code(&body));
            }
            if tag == b'Z' {
                break;
            }
        }
        assert_eq!(tags, b"12Ds3Z".to_vec(), "round {round}");
    }
}
