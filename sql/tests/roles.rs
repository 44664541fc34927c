//! Roles and privileges in-process: role statements and their PostgreSQL errors, what a
//! role without privileges is refused (42501) and what a grant, a membership or ownership
//! lets it do, and roles surviving a checkpoint and a restart.

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::sync::Arc;

use futures::StreamExt;
use sluice_sql::{Engine, EngineConfig, Error, Output, Session};

async fn open(dir: &Path) -> Arc<Engine> {
    let mut config = EngineConfig::single_node(dir.join("data"));
    // checkpoint after every command, so the restart reads roles from the checkpoint
    config.node.checkpoint_entries = 1;
    let engine = Engine::open(config).expect("open engine");
    engine.wait_ready().await.expect("engine ready");
    engine
}

fn session(engine: &Arc<Engine>, user: &str) -> Session {
    let mut s = Session::new(engine.clone()).expect("session");
    s.set_identity(user, "sluice");
    s
}

/// Runs `sql` (all statements), draining rows; the number of rows of the last one.
async fn exec(s: &mut Session, sql: &str) -> Result<usize, Error> {
    let parsed = s.parse_query(sql).await?;
    let mut n = 0;
    for p in &parsed {
        n = 0;
        match s.execute(p, &[]).await? {
            Output::Rows { mut stream, .. } => {
                while let Some(b) = stream.next().await {
                    n += b?.num_rows();
                }
            }
            Output::Tag(_) => {}
            other => panic!("{sql}: unexpected {other:?}"),
        }
    }
    Ok(n)
}

async fn ok(s: &mut Session, sql: &str) -> usize {
    match exec(s, sql).await {
        Ok(n) => n,
        Err(e) => panic!("{sql}: failed with {} {}", e.code, e.message),
    }
}

async fn fails(s: &mut Session, sql: &str, code: &str) -> String {
    match exec(s, sql).await {
        Ok(_) => panic!("{sql}: expected {code}, it succeeded"),
        Err(e) => {
            assert_eq!(e.code, code, "{sql}: {}", e.message);
            e.message
        }
    }
}

#[tokio::test]
async fn role_statements_answer_as_postgresql() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path()).await;
    let mut su = session(&engine, "sluice");
    ok(&mut su, "CREATE STREAM s (v INT)").await;
    ok(&mut su, "CREATE ROLE reader WITH LOGIN PASSWORD 'pw'").await;
    fails(&mut su, "CREATE ROLE reader", "42710").await;
    fails(&mut su, "ALTER ROLE nobody NOLOGIN", "42704").await;
    fails(&mut su, "DROP ROLE nobody", "42704").await;
    ok(&mut su, "DROP ROLE IF EXISTS nobody").await;
    fails(&mut su, "CREATE ROLE x INHERIT", "0A000").await;
    fails(&mut su, "CREATE ROLE x CREATEDB", "0A000").await;
    fails(&mut su, "GRANT SELECT ON nope TO reader", "42P01").await;
    fails(&mut su, "GRANT SELECT ON s TO nobody", "42704").await;
    fails(
        &mut su,
        "GRANT SELECT ON s TO reader WITH GRANT OPTION",
        "0A000",
    )
    .await;
    fails(&mut su, "GRANT SELECT ON s TO PUBLIC", "0A000").await;
    fails(&mut su, "GRANT USAGE ON SCHEMA public TO reader", "0A000").await;
    let roles = engine.catalog.roles();
    let reader = roles.get("reader").expect("reader exists");
    assert!(reader.login && !reader.superuser);
    let verifier = reader.verifier.clone().expect("a verifier");
    assert!(verifier.starts_with("SCRAM-SHA-256$4096:"), "{verifier}");
    assert!(sluice_sql::scram::Verifier::parse(&verifier)
        .unwrap()
        .matches("pw"));
    // a password given as a verifier is kept as it is; CREATE USER implies LOGIN
    ok(&mut su, &format!("CREATE USER bob PASSWORD '{verifier}'")).await;
    ok(&mut su, "CREATE ROLE nologin").await;
    let roles = engine.catalog.roles();
    assert_eq!(
        roles.get("bob").unwrap().verifier.as_deref(),
        Some(&*verifier)
    );
    assert!(roles.get("bob").unwrap().login);
    assert!(!roles.get("nologin").unwrap().login);
    ok(
        &mut su,
        "ALTER ROLE bob WITH NOLOGIN SUPERUSER PASSWORD NULL",
    )
    .await;
    let bob = engine.catalog.roles().get("bob").cloned().unwrap();
    assert_eq!(
        (bob.login, bob.superuser, bob.verifier.is_none()),
        (false, true, true)
    );
    ok(&mut su, "GRANT SELECT ON s TO reader").await;
    let m = fails(&mut su, "DROP ROLE reader", "2BP01").await;
    assert!(m.contains("privileges for relation s"), "{m}");
    ok(&mut su, "REVOKE SELECT ON s FROM reader").await;
    ok(&mut su, "DROP ROLE reader").await;
    assert!(engine.catalog.roles().get("reader").is_none());
    engine.shutdown().await;
}

#[tokio::test]
async fn a_role_needs_privileges_for_what_it_does() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path()).await;
    let mut su = session(&engine, "sluice");
    assert!(su.is_superuser());
    ok(&mut su, "CREATE STREAM s (v INT); CREATE STREAM t (v INT)").await;
    ok(&mut su, "CREATE TABLE k (id INT PRIMARY KEY, v INT)").await;
    ok(
        &mut su,
        "INSERT INTO s VALUES (1), (2); INSERT INTO t VALUES (3)",
    )
    .await;
    ok(&mut su, "CREATE ROLE reader LOGIN; CREATE ROLE alice LOGIN").await;
    ok(&mut su, "GRANT SELECT ON s TO reader").await;

    let mut r = session(&engine, "reader");
    assert!(!r.is_superuser());
    assert_eq!(ok(&mut r, "SELECT * FROM s").await, 2);
    assert_eq!(ok(&mut r, "SELECT * FROM s WHERE offset > 0").await, 1);
    assert_eq!(
        ok(&mut r, "WITH x AS (SELECT * FROM s) SELECT * FROM x").await,
        2
    );
    ok(&mut r, "SELECT relname FROM pg_catalog.pg_class").await;
    ok(&mut r, "LISTEN s").await;
    ok(&mut r, "LISTEN some_channel").await;
    let m = fails(&mut r, "SELECT * FROM t", "42501").await;
    assert_eq!(m, "permission denied for table t");
    fails(&mut r, "SELECT * FROM s JOIN t ON true", "42501").await;
    fails(&mut r, "LISTEN t", "42501").await;
    fails(&mut r, "INSERT INTO s VALUES (9)", "42501").await;
    fails(&mut r, "DELETE FROM s WHERE offset < 1", "42501").await;
    fails(&mut r, "COPY s FROM STDIN", "42501").await;
    fails(&mut r, "COPY t TO STDOUT", "42501").await;
    fails(&mut r, "UPDATE k SET v = 1", "42501").await;
    fails(&mut r, "CREATE STREAM mine (v INT)", "42501").await;
    fails(&mut r, "DROP STREAM s", "42501").await;
    fails(&mut r, "CREATE ROLE x", "42501").await;
    fails(&mut r, "GRANT SELECT ON t TO reader", "42501").await;
    // a statement prepared while allowed is checked again when it runs
    let prepared = r.parse_query("SELECT * FROM s").await.unwrap();
    ok(&mut su, "REVOKE ALL ON s FROM reader").await;
    let e = r.execute(&prepared[0], &[]).await.unwrap_err();
    assert_eq!(e.code, "42501");

    // membership: alice inherits reader's privileges
    ok(&mut su, "GRANT SELECT, INSERT ON s TO reader").await;
    ok(&mut su, "GRANT reader TO alice").await;
    let mut a = session(&engine, "alice");
    ok(&mut a, "INSERT INTO s VALUES (4)").await;
    assert_eq!(ok(&mut a, "SELECT * FROM s").await, 3);
    fails(&mut a, "SELECT * FROM t", "42501").await;
    ok(&mut su, "REVOKE reader FROM alice").await;
    fails(&mut a, "SELECT * FROM s", "42501").await;

    // CREATE on schema public: the creator owns what it creates
    ok(&mut su, "GRANT CREATE ON SCHEMA public TO alice").await;
    ok(&mut a, "CREATE STREAM mine (v INT)").await;
    ok(&mut a, "INSERT INTO mine VALUES (1)").await;
    assert_eq!(ok(&mut a, "SELECT * FROM mine").await, 1);
    assert_eq!(engine.catalog.roles().owner("mine"), Some("alice"));
    fails(&mut r, "SELECT * FROM mine", "42501").await;
    let m = fails(&mut su, "DROP ROLE alice", "2BP01").await;
    assert!(m.contains("owner of relation mine"), "{m}");
    ok(&mut a, "DROP STREAM mine").await;
    assert_eq!(engine.catalog.roles().owner("mine"), None);
    // ALL TABLES IN SCHEMA public
    ok(
        &mut su,
        "GRANT SELECT ON ALL TABLES IN SCHEMA public TO reader",
    )
    .await;
    ok(&mut r, "SELECT * FROM t JOIN k ON true").await;
    // a superuser role has every right
    ok(&mut su, "ALTER ROLE reader SUPERUSER").await;
    assert!(r.is_superuser());
    ok(&mut r, "DROP STREAM t").await;
    engine.shutdown().await;
}

#[tokio::test]
async fn roles_survive_a_checkpoint_and_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path()).await;
    let mut su = session(&engine, "sluice");
    ok(&mut su, "CREATE STREAM s (v INT); CREATE STREAM t (v INT)").await;
    ok(
        &mut su,
        "CREATE ROLE reader LOGIN PASSWORD 'pw'; CREATE ROLE app",
    )
    .await;
    ok(&mut su, "GRANT SELECT ON s TO reader; GRANT app TO reader").await;
    ok(&mut su, "GRANT CREATE ON SCHEMA public TO app").await;
    let before = engine.catalog.roles();
    drop(su);
    engine.shutdown().await;
    drop(engine);

    let engine = open(dir.path()).await;
    let after = engine.catalog.roles();
    assert_eq!(*after, *before);
    let mut r = session(&engine, "reader");
    assert_eq!(ok(&mut r, "SELECT * FROM s").await, 0);
    fails(&mut r, "SELECT * FROM t", "42501").await;
    ok(&mut r, "CREATE STREAM r (v INT)").await;
    assert_eq!(engine.catalog.roles().owner("r"), Some("reader"));
    // role OIDs come from the relations' counter: no clash
    let oid = after.get("reader").unwrap().oid;
    let s_oid = engine.catalog.get("s").unwrap().def.oid;
    assert_ne!(oid, s_oid);
    engine.shutdown().await;
}
