//! The wire protocol byte for byte, with a raw socket: what the server
//! sends, and when. Drivers hide both, so these are checked here.
//!
//! The extended protocol's ParseComplete, BindComplete and CloseComplete
//! wait in the server's buffer until the client sends Sync or Flush, as
//! in PostgreSQL; a server that flushed each one would cost every
//! statement an extra send and an extra client wake-up.

use std::time::Duration;

use sluice_tests::wire::{bind, close, execute, message, parse, Wire, ANSWER};
use sluice_tests::Server;

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
    assert_eq!(
        wire.next(QUIET).await,
        None,
        "answered before Sync or Flush"
    );

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
