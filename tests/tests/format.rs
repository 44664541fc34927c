//! The on-disk format cannot change by accident: `tests/fixtures/format-v1/data` is a data
//! directory written by the build that introduced format 1 (`make.sh` beside it says how:
//! part of its history behind a checkpoint, the rest only in the Raft log of a killed
//! server). Every run opens a copy and reads back exactly what was written — stream frames,
//! the table store and its checkpoint record, WAL records replayed on top, roles, views,
//! indexes, consumer offsets, frames compressed with ZSTD and LZ4. A change to any of those bytes that this build no longer reads
//! fails here; a deliberate change raises `sluice_sql::format::FORMAT_VERSION`, keeps a
//! reader of format 1 and adds a fixture of the new format.
//!
//! A data directory of a newer format is refused before anything in it is opened.

use std::path::{Path, PathBuf};
use std::process::Command;

use sluice_tests::{binary_path, simple_rows, Server};

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/format-v1/data")
}

/// A fresh copy of the fixture (the server writes to its data directory).
fn copy_of_fixture() -> tempfile::TempDir {
    let dir = tempfile::Builder::new()
        .prefix("sluice-format-")
        .tempdir()
        .expect("temporary directory");
    copy_tree(&fixture(), dir.path());
    dir
}

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("create directory");
    for entry in std::fs::read_dir(from).expect("read fixture directory") {
        let entry = entry.expect("fixture entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("file type").is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).expect("copy fixture file");
        }
    }
}

/// `rows` as `a|b|c` lines, NULL as empty.
fn lines(rows: Vec<Vec<Option<String>>>) -> Vec<String> {
    rows.into_iter()
        .map(|r| {
            r.into_iter()
                .map(Option::unwrap_or_default)
                .collect::<Vec<_>>()
                .join("|")
        })
        .collect()
}

#[tokio::test]
async fn the_format_1_fixture_opens_with_everything_it_holds() {
    let server = Server::start_in(copy_of_fixture(), &[]).await;
    let client = server.client().await;
    let q = |sql: &'static str| {
        let client = &client;
        async move { lines(simple_rows(client, sql).await) }
    };

    // stream frames: rows 0..4 were deleted (first offset 5), 5..41 written in one INSERT
    // before the checkpoint, 42.. after it (replayed from the WAL), a column added later
    let events = q(
        "SELECT offset, customer, amount, tags, at, payload, region FROM events ORDER BY offset",
    )
    .await;
    let mut expected: Vec<String> = (4..=40)
        .map(|g: i64| {
            let amount = g * 125;
            format!(
                "{}|c{}|{}.{:02}|{{x{g}}}|2026-01-01 00:{:02}:00+00|row {g}|eu",
                g + 1,
                g % 7,
                amount / 100,
                amount % 100,
                g
            )
        })
        .collect();
    expected.extend(["42|late|||||us", "43|later|||||eu", "44|txn|1.00||||eu"].map(String::from));
    assert_eq!(events, expected);
    assert_eq!(
        q(
            "SELECT name, first_offset, next_offset, segments, compression FROM sluice_streams \
           ORDER BY name"
        )
        .await,
        ["dedup|0|2|1|lz4", "events|5|45|3|lz4", "packed|0|150|1|lz4"]
    );
    // compressed frames: zstd before the checkpoint, lz4 after ALTER (replayed from the WAL)
    let packed = q("SELECT offset, n, body FROM packed ORDER BY offset").await;
    let expected: Vec<String> = (1..=150)
        .map(|n: i64| {
            let body = if n <= 100 {
                format!("body {} ", n % 5).repeat(20)
            } else {
                format!("lz4 {} ", n % 3).repeat(30)
            };
            format!("{}|{n}|{body}", n - 1)
        })
        .collect();
    assert_eq!(packed, expected);
    let ratio = q("SELECT compression_ratio > 5 FROM sluice_streams WHERE name = 'packed'").await;
    assert_eq!(
        ratio,
        ["t"],
        "the sizes are read from the compressed frames"
    );
    // commit times come from the frame headers: increasing, and all from the day the
    // fixture was written
    assert_eq!(
        q(
            "SELECT count(*), count(DISTINCT ts) > 1, min(ts) >= '2026-11-27', \
           bool_and(ts <= now()) FROM events"
        )
        .await,
        ["40|t|t|t"]
    );
    // the second row with the first id was a duplicate when written (the dedup index's
    // later use depends on the clock: its window is relative to the last commit)
    assert_eq!(
        q("SELECT offset, id, v FROM dedup ORDER BY offset").await,
        [
            "0|6b1f2a3c-0000-4000-8000-000000000001|1",
            "1|6b1f2a3c-0000-4000-8000-000000000002|3"
        ]
    );

    // tables, their indexes (the UNIQUE one still refuses), consumer offsets
    assert_eq!(
        q("SELECT * FROM accounts ORDER BY id").await,
        ["1|ann|10.00|ann@example.com", "2|bob|21.50|bob@example.com"]
    );
    assert_eq!(
        q(
            "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'accounts' \
           ORDER BY indexname"
        )
        .await,
        [
            "accounts_email_key|CREATE UNIQUE INDEX accounts_email_key ON public.accounts \
             USING btree (email)",
            "accounts_owner|CREATE INDEX accounts_owner ON public.accounts USING btree \
             (owner DESC)",
            "accounts_pkey|CREATE UNIQUE INDEX accounts_pkey ON public.accounts USING btree (id)"
        ]
    );
    let dup = client
        .simple_query("INSERT INTO accounts VALUES (5, 'eve', 1, 'ann@example.com')")
        .await
        .expect_err("the unique index holds");
    assert_eq!(sluice_tests::sqlstate(&dup), Some("23505"));
    assert_eq!(
        q("SELECT * FROM consumer_offsets").await,
        ["billing|events|50"]
    );

    // the catalog: view, roles and grants
    assert_eq!(
        q("SELECT customer, amount FROM big ORDER BY amount DESC LIMIT 2").await,
        ["c5|50.00", "c4|48.75"]
    );
    assert_eq!(
        q("SELECT rolname, rolcanlogin, rolsuper FROM pg_roles ORDER BY rolname").await,
        ["app|t|f", "sluice|t|t"]
    );
    assert_eq!(
        q("SELECT has_table_privilege('app', 'events', 'SELECT'), \
           has_table_privilege('app', 'accounts', 'SELECT')")
        .await,
        ["t|f"]
    );

    // and it goes on: the next append gets the next offset
    assert_eq!(
        q("INSERT INTO events (customer) VALUES ('new') RETURNING offset").await,
        ["45"]
    );
}

#[test]
fn a_data_directory_of_a_newer_format_is_refused_untouched() {
    let dir = copy_of_fixture();
    std::fs::write(dir.path().join("FORMAT"), "sluice data format 2\n").expect("write FORMAT");
    let wal = dir.path().join("raft/00000000000000000001.wal");
    let before = std::fs::read(&wal).expect("read the WAL");
    let out = Command::new(binary_path())
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path())
        .env("NO_COLOR", "1")
        .output()
        .expect("run sluice");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a newer format must not start");
    assert!(
        stderr.contains("data format 2, written by a newer Sluice"),
        "{stderr}"
    );
    assert_eq!(
        std::fs::read(&wal).expect("read the WAL"),
        before,
        "nothing was opened (the WAL gets its preallocation when opened)"
    );
}
