//! The client port's security with real clients: psql over verified TLS with SCRAM-SHA-256
//! and channel binding, `pg_stat_ssl`, client certificates, and — with a raw socket — that a
//! password never crosses a connection (no cleartext or MD5 request is ever sent).

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use sluice_tests::psql::{psql_on_path, run_logged};
use sluice_tests::wire::{cstr, message, startup, Read, Wire, ANSWER};
use sluice_tests::{within, Server};

const PASSWORD: &str = "correct horse";

/// A throwaway CA with a server certificate for 127.0.0.1 and a client certificate for
/// CN=alice (`tests/fixtures/tls/make-certs.sh`).
fn certificates() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir for certificates");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/tls/make-certs.sh");
    let status = std::process::Command::new("bash")
        .arg(&script)
        .arg(dir.path())
        .status()
        .expect("run make-certs.sh (needs openssl)");
    assert!(status.success(), "make-certs.sh failed");
    dir
}

fn file(dir: &Path, name: &str) -> String {
    dir.join(name).to_string_lossy().into_owned()
}

async fn tls_server(certs: &Path) -> Server {
    Server::start_with(&[
        "--password",
        PASSWORD,
        "--tls-cert",
        &file(certs, "server.pem"),
        "--tls-key",
        &file(certs, "server.key"),
        "--tls-client-ca",
        &file(certs, "ca.pem"),
    ])
    .await
}

/// `psql -At -c sql` with a libpq connection string; returns the output.
async fn psql(conninfo: &str, password: &str, sql: &str) -> Output {
    let mut command = tokio::process::Command::new("psql");
    command
        .args(["-X", "-w", "-At", "-c", sql, conninfo])
        .env("PGPASSWORD", password)
        .env("PGCONNECT_TIMEOUT", "10");
    run_logged(command, &format!("psql {conninfo}")).await
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

fn conninfo(port: u16, certs: &Path, extra: &str) -> String {
    format!(
        "host=127.0.0.1 port={port} user=sluice dbname=sluice sslmode=verify-full \
         sslrootcert={} {extra}",
        file(certs, "ca.pem")
    )
}

#[tokio::test]
async fn psql_logs_in_with_scram_over_verified_tls_and_the_session_is_encrypted() {
    if !psql_on_path() {
        eprintln!("SKIPPED: psql is not on PATH");
        return;
    }
    let certs = certificates();
    let dir = certs.path();
    let server = tls_server(dir).await;
    let port = server.port();
    let query = "SELECT ssl, version, coalesce(client_dn, '-') FROM pg_stat_ssl \
                 WHERE pid = pg_backend_pid()";

    // verify-full checks the certificate against the CA and 127.0.0.1; channel_binding=require
    // makes libpq insist on SCRAM-SHA-256-PLUS bound to this TLS connection
    let out = psql(
        &conninfo(port, dir, "channel_binding=require"),
        PASSWORD,
        query,
    )
    .await;
    assert!(out.status.success());
    assert_eq!(stdout(&out), "t|TLSv1.3|-");

    // with a client certificate, pg_stat_ssl names it
    let with_cert = format!(
        "channel_binding=require sslcert={} sslkey={}",
        file(dir, "client.pem"),
        file(dir, "client.key")
    );
    let out = psql(&conninfo(port, dir, &with_cert), PASSWORD, query).await;
    assert!(out.status.success());
    assert_eq!(stdout(&out), "t|TLSv1.3|CN=alice");

    // a wrong password, over TLS and without
    let out = psql(&conninfo(port, dir, ""), "battery staple", "SELECT 1").await;
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("password authentication failed for user \"sluice\""),
        "{err}"
    );
    // a user without a password is refused the same way
    let nobody = conninfo(port, dir, "").replace("user=sluice", "user=nobody");
    let out = psql(&nobody, PASSWORD, "SELECT 1").await;
    assert!(String::from_utf8_lossy(&out.stderr)
        .contains("password authentication failed for user \"nobody\""));

    // a plain connection from loopback still authenticates with SCRAM, unbound
    let plain = format!("host=127.0.0.1 port={port} user=sluice dbname=sluice sslmode=disable");
    let out = psql(&plain, PASSWORD, query).await;
    assert!(out.status.success());
    assert_eq!(stdout(&out), "f||-");
    let out = psql(
        &format!("{plain} channel_binding=require"),
        PASSWORD,
        "SELECT 1",
    )
    .await;
    assert!(!out.status.success(), "channel binding without TLS");

    // a certificate signed by another CA is refused by the server
    let other = certificates();
    let foreign = format!(
        "sslcert={} sslkey={}",
        file(other.path(), "client.pem"),
        file(other.path(), "client.key")
    );
    let out = psql(&conninfo(port, dir, &foreign), PASSWORD, "SELECT 1").await;
    assert!(!out.status.success(), "a client certificate of another CA");
    // and the server's certificate is refused by a client trusting another CA
    let out = psql(&conninfo(port, other.path(), ""), PASSWORD, "SELECT 1").await;
    assert!(!out.status.success(), "verify-full against another CA");
}

/// Before: the server asked for the password in cleartext (AuthenticationCleartextPassword,
/// code 3) on any connection, TLS being impossible. Now a login is a SCRAM exchange
/// (AuthenticationSASL, code 10; `-PLUS` only over TLS), and a password sent anyway is
/// refused as a protocol violation and never logs in.
#[tokio::test]
async fn a_password_never_crosses_a_plain_connection() {
    let server = Server::start_with(&["--password", PASSWORD]).await;
    let mut wire = Wire::open(server.port()).await;
    wire.send(&startup()).await;
    let Read::Message(b'R', body) = wire.read_message(ANSWER).await else {
        panic!("no authentication request");
    };
    let code = i32::from_be_bytes(body[..4].try_into().expect("a code"));
    assert_eq!(
        code, 10,
        "authentication request {code} (3 is cleartext, 5 MD5)"
    );
    assert_eq!(
        &body[4..],
        b"SCRAM-SHA-256\0\0",
        "plain: no -PLUS mechanism"
    );

    // a client that sends its password in the clear anyway
    wire.send(&message(b'p', &cstr(PASSWORD))).await;
    let mut saw_error = false;
    loop {
        match wire.read_message(ANSWER).await {
            Read::Message(b'E', body) => {
                saw_error = true;
                let code = sluice_tests::wire::error_code(&body);
                assert!(code == "08P01" || code == "28P01", "{code}");
            }
            Read::Message(b'R', body) => panic!("authentication answered {body:?}"),
            Read::Message(tag, _) => panic!("unexpected message {}", tag as char),
            Read::Closed => break,
            Read::Quiet => panic!("the server neither refused nor closed"),
        }
    }
    assert!(saw_error, "closed without an error");

    // a SASL exchange naming a mechanism that was not offered
    let mut wire = Wire::open(server.port()).await;
    wire.send(&startup()).await;
    assert!(matches!(
        wire.read_message(ANSWER).await,
        Read::Message(b'R', _)
    ));
    let mut body = cstr("SCRAM-SHA-256-PLUS");
    let first = b"p=tls-server-end-point,,n=,r=abcdef";
    body.extend_from_slice(&(first.len() as i32).to_be_bytes());
    body.extend_from_slice(first);
    wire.send(&message(b'p', &body)).await;
    match wire.read_message(ANSWER).await {
        Read::Message(b'E', body) => {
            assert_eq!(sluice_tests::wire::error_code(&body), "08P01")
        }
        other => panic!("expected a protocol violation, got {other:?}"),
    }
}

/// `--tls-cert` and `--tls-key` that cannot be loaded stop the start with the file named.
#[tokio::test]
async fn unreadable_tls_files_stop_the_server_at_start() {
    let certs = certificates();
    let dir = certs.path();
    let missing: PathBuf = dir.join("missing.pem");
    let bin = sluice_tests::binary_path();
    let data = tempfile::tempdir().expect("data dir");
    let output = tokio::process::Command::new(bin)
        .arg("serve")
        .arg("--data-dir")
        .arg(data.path())
        .args(["--listen", "127.0.0.1:0", "--tls-cert"])
        .arg(&missing)
        .arg("--tls-key")
        .arg(dir.join("server.key"))
        .kill_on_drop(true)
        .output();
    let output = within(Duration::from_secs(60), "sluice", output)
        .await
        .expect("run sluice");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(!output.status.success(), "{text}");
    assert!(
        text.contains("--tls-cert") && text.contains("missing.pem"),
        "{text}"
    );
    assert!(!text.contains("listening on"), "{text}");
}

/// Acceptance 4: a role with only SELECT on one stream logs in with SCRAM, reads and tails
/// that stream, and gets `42501` for everything else; a NOLOGIN role gets `28000`.
#[tokio::test]
async fn a_role_with_select_on_one_stream_may_only_read_it() {
    if !psql_on_path() {
        eprintln!("SKIPPED: psql is not on PATH");
        return;
    }
    let certs = certificates();
    let dir = certs.path();
    let server = tls_server(dir).await;
    let port = server.port();
    let admin = conninfo(port, dir, "channel_binding=require");
    let setup = "CREATE STREAM events (v INT); CREATE STREAM secret (v INT); \
                 INSERT INTO events VALUES (1), (2), (3); \
                 CREATE ROLE reader LOGIN PASSWORD 'reader pw'; \
                 CREATE ROLE locked NOLOGIN PASSWORD 'locked pw'; \
                 GRANT SELECT ON events TO reader";
    let out = psql(&admin, PASSWORD, setup).await;
    assert!(out.status.success());
    let as_reader = admin.replace("user=sluice", "user=reader");
    let out = psql(
        &as_reader,
        "reader pw",
        "SELECT current_user, session_user, count(*) FROM events",
    )
    .await;
    assert!(out.status.success());
    assert_eq!(stdout(&out), "reader|reader|3");
    let out = psql(&as_reader, "reader pw", "SHOW is_superuser").await;
    assert_eq!(stdout(&out), "off");
    // a tail through a cursor: the rows after offset 0 (FETCH waits tail_wait for more)
    let out = psql(
        &as_reader,
        "reader pw",
        "BEGIN; DECLARE c CURSOR FOR SELECT v FROM events WHERE offset > 0; \
         SET tail_wait = '200ms'; FETCH 100 FROM c",
    )
    .await;
    assert!(out.status.success());
    // psql prints the other statements' tags before the rows
    assert_eq!(stdout(&out), "BEGIN\nDECLARE CURSOR\nSET\n2\n3");
    for sql in [
        "INSERT INTO events VALUES (4)",
        "DROP STREAM events",
        "SELECT * FROM secret",
        "CREATE STREAM mine (v INT)",
        "DELETE FROM events WHERE offset < 1",
        "CREATE ROLE x",
        "LISTEN secret",
    ] {
        let out = psql(&as_reader, "reader pw", sql).await;
        assert!(!out.status.success(), "{sql}");
        // (the SQLSTATEs themselves are pinned in sql/tests/roles.rs)
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("permission denied") || err.contains("must be owner"),
            "{sql}: {err}"
        );
    }
    // COPY FROM STDIN, through psql's \copy
    let out = psql(&as_reader, "reader pw", "\\copy events from stdin").await;
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("permission denied for table events"));
    // the right password, but no LOGIN
    let as_locked = admin.replace("user=sluice", "user=locked");
    let out = psql(&as_locked, "locked pw", "SELECT 1").await;
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("role \"locked\" is not permitted to log in")
    );
    let out = psql(&as_locked, "wrong", "SELECT 1").await;
    assert!(String::from_utf8_lossy(&out.stderr)
        .contains("password authentication failed for user \"locked\""));
    // the superuser still reads everything
    let out = psql(&admin, PASSWORD, "SELECT count(*) FROM secret").await;
    assert_eq!(stdout(&out), "0");
    // psql's \du and \dp print the truth, to the reader as to the superuser
    for (who, password) in [(&admin, PASSWORD), (&as_reader, "reader pw")] {
        let out = psql(who, password, "\\du").await;
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            stdout(&out),
            "locked|Cannot login|{}\n\
             reader||{}\n\
             sluice|Superuser, Create role, Create DB, Replication, Bypass RLS|{}"
        );
        let out = psql(who, password, "\\dp e*").await;
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            stdout(&out),
            "public|events|table|sluice=arwd/sluice\nreader=r/sluice||"
        );
    }
}

#[tokio::test]
async fn connection_rules_decide_what_a_login_must_prove() {
    if !psql_on_path() {
        eprintln!("SKIPPED: psql is not on PATH");
        return;
    }
    let certs = certificates();
    let dir = certs.path();
    let config = dir.join("sluice.toml");
    std::fs::write(
        &config,
        r#"
[[connection_rules]]
address = "loopback"
user = "banned"
reject = true

[[connection_rules]]
address = "127.0.0.0/8"
user = "alice"
require = ["cert"]

[[connection_rules]]
address = "loopback"
user = "sluice"
require = ["tls", "scram"]

[[connection_rules]]
address = "::1/128"
require = []
"#,
    )
    .expect("write the config file");
    let server = Server::start_with(&[
        "--password",
        PASSWORD,
        "--tls-cert",
        &file(dir, "server.pem"),
        "--tls-key",
        &file(dir, "server.key"),
        "--tls-client-ca",
        &file(dir, "ca.pem"),
        "--config",
        &config.to_string_lossy(),
    ])
    .await;
    let port = server.port();
    let as_user = |user: &str, extra: &str| {
        conninfo(port, dir, extra).replace("user=sluice", &format!("user={user}"))
    };
    let refused = |out: &Output, says: &str| {
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says), "expected \"{says}\" in: {err}");
    };
    // the superuser: TLS and its password
    let out = psql(&as_user("sluice", ""), PASSWORD, "CREATE ROLE alice LOGIN").await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let plain = format!("host=127.0.0.1 port={port} user=sluice dbname=sluice sslmode=disable");
    refused(
        &psql(&plain, PASSWORD, "SELECT 1").await,
        "requires an encrypted connection",
    );
    refused(
        &psql(&as_user("sluice", ""), "wrong", "SELECT 1").await,
        "password authentication failed",
    );
    // alice: her certificate (CN=alice) is her proof, no password asked
    let with_cert = as_user(
        "alice",
        &format!(
            "sslcert={} sslkey={}",
            file(dir, "client.pem"),
            file(dir, "client.key")
        ),
    );
    let out = psql(&with_cert, "", "SELECT current_user").await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(stdout(&out), "alice");
    refused(
        &psql(&as_user("alice", ""), PASSWORD, "SELECT 1").await,
        "certificate authentication failed for user \"alice\"",
    );
    // a certificate proves only the name it carries: the superuser is still asked for its
    // password (psql has none to give)
    let out = psql(
        &with_cert.replace("user=alice", "user=sluice"),
        "",
        "SELECT 1",
    )
    .await;
    refused(&out, "no password supplied");
    refused(
        &psql(&as_user("banned", ""), PASSWORD, "SELECT 1").await,
        "connection rule 1 rejects it",
    );
    refused(
        &psql(&as_user("carol", ""), PASSWORD, "SELECT 1").await,
        "no connection rule matches it",
    );
}
