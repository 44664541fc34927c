//! Roles and privileges in-process: role statements and their PostgreSQL errors, what a
//! role without privileges is refused (42501) and what a grant, a membership or ownership
//! lets it do, what the catalogs and privilege functions say (psql's own `\\du` and `\\dp`
//! queries), and roles surviving a checkpoint and a restart.

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::sync::Arc;

use arrow::array::Array;
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

/// The rows of one statement that must succeed, as text (NULL as `NULL`).
async fn rows(s: &mut Session, sql: &str) -> Vec<Vec<String>> {
    let parsed = s.parse_query(sql).await.unwrap();
    assert_eq!(parsed.len(), 1, "{sql}");
    let out = match s.execute(&parsed[0], &[]).await {
        Ok(out) => out,
        Err(e) => panic!("{sql}: failed with {} {}", e.code, e.message),
    };
    let Output::Rows { mut stream, .. } = out else {
        panic!("{sql}: no rows");
    };
    let mut rows = Vec::new();
    while let Some(b) = stream.next().await {
        let b = b.unwrap();
        for i in 0..b.num_rows() {
            rows.push(
                b.columns()
                    .iter()
                    .map(|c| {
                        if c.is_null(i) {
                            "NULL".to_string()
                        } else {
                            arrow::util::display::array_value_to_string(c, i).unwrap()
                        }
                    })
                    .collect(),
            );
        }
    }
    rows
}

fn table(rows: &[&[&str]]) -> Vec<Vec<String>> {
    rows.iter()
        .map(|r| r.iter().map(|c| c.to_string()).collect())
        .collect()
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
    // an index is the table owner's to make and drop
    let m = fails(&mut r, "CREATE INDEX k_v ON k (v)", "42501").await;
    assert_eq!(m, "must be owner of table k");
    ok(&mut su, "CREATE INDEX k_v ON k (v)").await;
    let m = fails(&mut r, "DROP INDEX k_v", "42501").await;
    assert_eq!(m, "must be owner of index k_v");
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
async fn views_answer_to_their_own_privileges() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path()).await;
    let mut su = session(&engine, "sluice");
    ok(&mut su, "CREATE STREAM s (v INT, secret TEXT)").await;
    ok(&mut su, "INSERT INTO s VALUES (1, 'x'), (2, 'y')").await;
    ok(&mut su, "CREATE VIEW pub AS SELECT v FROM s").await;
    ok(&mut su, "CREATE ROLE reader LOGIN; CREATE ROLE alice LOGIN").await;
    ok(&mut su, "GRANT SELECT ON pub TO reader").await;

    // SELECT on the view reads through it, not the stream under it
    let mut r = session(&engine, "reader");
    assert_eq!(ok(&mut r, "SELECT * FROM pub").await, 2);
    assert_eq!(ok(&mut r, "SELECT * FROM pub WHERE v > 1").await, 1);
    let m = fails(&mut r, "SELECT * FROM s", "42501").await;
    assert_eq!(m, "permission denied for table s");
    fails(&mut r, "INSERT INTO pub VALUES (3)", "42501").await;
    // creating a view needs CREATE on public and SELECT on what it reads
    fails(&mut r, "CREATE VIEW mine AS SELECT * FROM pub", "42501").await;
    ok(&mut su, "GRANT CREATE ON SCHEMA public TO reader").await;
    let m = fails(&mut r, "CREATE VIEW leak AS SELECT secret FROM s", "42501").await;
    assert_eq!(m, "permission denied for table s");
    ok(&mut r, "CREATE VIEW mine AS SELECT v * 10 AS w FROM pub").await;
    assert_eq!(engine.catalog.roles().owner("mine"), Some("reader"));
    assert_eq!(ok(&mut r, "SELECT * FROM mine").await, 2);

    // only the owner replaces or drops a view; the message names a view
    let mut a = session(&engine, "alice");
    ok(&mut su, "GRANT CREATE ON SCHEMA public TO alice").await;
    let m = fails(&mut a, "DROP VIEW mine", "42501").await;
    assert_eq!(m, "must be owner of view mine");
    let m = fails(
        &mut a,
        "CREATE OR REPLACE VIEW mine AS SELECT 1 AS w",
        "42501",
    )
    .await;
    assert_eq!(m, "must be owner of view mine");
    fails(&mut a, "SELECT * FROM mine", "42501").await;
    // ALL TABLES IN SCHEMA public includes views
    ok(
        &mut su,
        "GRANT SELECT ON ALL TABLES IN SCHEMA public TO alice",
    )
    .await;
    assert_eq!(ok(&mut a, "SELECT * FROM mine").await, 2);
    ok(&mut r, "DROP VIEW mine").await;
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

/// psql 15's `\\du` and `\\dp`, as sent.
const PSQL_DU: &str = r#"SELECT r.rolname, r.rolsuper, r.rolinherit,
  r.rolcreaterole, r.rolcreatedb, r.rolcanlogin,
  r.rolconnlimit, r.rolvaliduntil,
  ARRAY(SELECT b.rolname
        FROM pg_catalog.pg_auth_members m
        JOIN pg_catalog.pg_roles b ON (m.roleid = b.oid)
        WHERE m.member = r.oid) as memberof
, r.rolreplication
, r.rolbypassrls
FROM pg_catalog.pg_roles r
WHERE r.rolname !~ '^pg_'
ORDER BY 1;"#;
const PSQL_DP: &str = r#"SELECT n.nspname as "Schema",
  c.relname as "Name",
  CASE c.relkind WHEN 'r' THEN 'table' WHEN 'v' THEN 'view' WHEN 'm' THEN 'materialized view' WHEN 'S' THEN 'sequence' WHEN 'f' THEN 'foreign table' WHEN 'p' THEN 'partitioned table' END as "Type",
  pg_catalog.array_to_string(c.relacl, E'\n') AS "Access privileges",
  pg_catalog.array_to_string(ARRAY(
    SELECT attname || E':\n  ' || pg_catalog.array_to_string(attacl, E'\n  ')
    FROM pg_catalog.pg_attribute a
    WHERE attrelid = c.oid AND NOT attisdropped AND attacl IS NOT NULL
  ), E'\n') AS "Column privileges",
  pg_catalog.array_to_string(ARRAY(
    SELECT polname
    || CASE WHEN NOT polpermissive THEN
       E' (RESTRICTIVE)'
       ELSE '' END
    || CASE WHEN polcmd != '*' THEN
           E' (' || polcmd::pg_catalog.text || E'):'
       ELSE E':'
       END
    || CASE WHEN polqual IS NOT NULL THEN
           E'\n  (u): ' || pg_catalog.pg_get_expr(polqual, polrelid)
       ELSE E''
       END
    || CASE WHEN polwithcheck IS NOT NULL THEN
           E'\n  (c): ' || pg_catalog.pg_get_expr(polwithcheck, polrelid)
       ELSE E''
       END    || CASE WHEN polroles <> '{0}' THEN
           E'\n  to: ' || pg_catalog.array_to_string(
               ARRAY(
                   SELECT rolname
                   FROM pg_catalog.pg_roles
                   WHERE oid = ANY (polroles)
                   ORDER BY 1
               ), E', ')
       ELSE E''
       END
    FROM pg_catalog.pg_policy pol
    WHERE polrelid = c.oid), E'\n')
    AS "Policies"
FROM pg_catalog.pg_class c
     LEFT JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind IN ('r','v','m','S','f','p')
  AND n.nspname !~ '^pg_' AND pg_catalog.pg_table_is_visible(c.oid)
ORDER BY 1, 2;"#;

#[tokio::test]
async fn the_catalogs_tell_the_truth_about_roles() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path()).await;
    let mut su = session(&engine, "sluice");
    ok(&mut su, "CREATE STREAM s (v INT); CREATE STREAM t (v INT)").await;
    ok(
        &mut su,
        "CREATE ROLE reader; CREATE USER alice PASSWORD 'pw'",
    )
    .await;
    ok(&mut su, "CREATE ROLE boss SUPERUSER LOGIN").await;
    ok(
        &mut su,
        "GRANT reader TO alice; GRANT CREATE ON SCHEMA public TO alice",
    )
    .await;
    ok(
        &mut su,
        "GRANT SELECT ON s TO reader; GRANT INSERT, DELETE ON s TO alice",
    )
    .await;
    let mut a = session(&engine, "alice");
    ok(&mut a, "CREATE STREAM mine (v INT)").await;

    // \du: every role, its attributes and memberships
    let du: Vec<Vec<String>> = rows(&mut su, PSQL_DU)
        .await
        .into_iter()
        .map(|r| vec![r[0].clone(), r[1].clone(), r[5].clone(), r[8].clone()])
        .collect();
    assert_eq!(
        du,
        table(&[
            &["alice", "false", "true", "[reader]"],
            &["boss", "true", "true", "[]"],
            &["reader", "false", "false", "[]"],
            &["sluice", "true", "true", "[]"],
        ])
    );
    // \dp: the ACL of each relation, the owner first (NULL: nothing granted yet)
    let dp: Vec<Vec<String>> = rows(&mut a, PSQL_DP)
        .await
        .into_iter()
        .filter(|r| r[2] == "table")
        .map(|r| vec![r[1].clone(), r[3].clone(), r[4].clone(), r[5].clone()])
        .collect();
    assert_eq!(
        dp,
        table(&[
            &["consumer_offsets", "NULL", "", ""],
            &["mine", "NULL", "", ""],
            &[
                "s",
                "sluice=arwd/sluice\nalice=ad/sluice\nreader=r/sluice",
                "",
                ""
            ],
            &["t", "NULL", "", ""],
        ])
    );
    // owners, as psql \dt shows them
    assert_eq!(
        rows(
            &mut a,
            "SELECT tablename, tableowner FROM pg_tables WHERE tablename IN ('s', 'mine') ORDER BY 1"
        )
        .await,
        table(&[&["mine", "alice"], &["s", "sluice"]])
    );
    assert_eq!(
        rows(
            &mut a,
            "SELECT pg_get_userbyid(c.relowner) FROM pg_class c WHERE relname = 'mine'"
        )
        .await,
        table(&[&["alice"]])
    );
    // the privilege functions agree with what the session may do
    let asks = "SELECT has_table_privilege('s', 'SELECT'), has_table_privilege('s', 'insert'), \
                has_table_privilege('t', 'SELECT'), has_table_privilege('s', 'UPDATE, DELETE'), \
                has_table_privilege('mine', 'TRUNCATE'), has_table_privilege('pg_class', 'SELECT'), \
                has_table_privilege('reader', 'public.s', 'SELECT'), \
                has_table_privilege('reader', 's', 'INSERT'), \
                has_table_privilege('s', 'SELECT WITH GRANT OPTION'), \
                has_schema_privilege('public', 'CREATE'), \
                has_schema_privilege('reader', 'public', 'CREATE')";
    assert_eq!(
        rows(&mut a, asks).await,
        table(&[&[
            "true", "true", "false", "true", "true", "true", "true", "false", "false", "true",
            "false"
        ]])
    );
    fails(&mut a, "SELECT * FROM t", "42501").await;
    ok(&mut a, "SELECT * FROM s").await;
    fails(
        &mut a,
        "SELECT has_table_privilege('nobody', 's', 'SELECT')",
        "42704",
    )
    .await;
    fails(&mut a, "SELECT has_table_privilege('s', 'FLY')", "22023").await;
    fails(
        &mut a,
        "SELECT has_table_privilege('nope', 'SELECT')",
        "42P01",
    )
    .await;
    // information_schema.table_privileges: what alice's roles were granted, or own
    assert_eq!(
        rows(
            &mut a,
            "SELECT grantee, table_name, privilege_type, is_grantable \
             FROM information_schema.table_privileges WHERE table_schema = 'public' \
             AND table_name IN ('s', 't', 'mine') ORDER BY 2, 1, 3"
        )
        .await,
        table(&[
            &["alice", "mine", "DELETE", "YES"],
            &["alice", "mine", "INSERT", "YES"],
            &["alice", "mine", "SELECT", "YES"],
            &["alice", "mine", "UPDATE", "YES"],
            &["alice", "s", "DELETE", "NO"],
            &["alice", "s", "INSERT", "NO"],
            &["reader", "s", "SELECT", "NO"],
        ])
    );
    // pg_authid holds the verifiers: superusers only; pg_roles hides them
    fails(&mut a, "SELECT rolname FROM pg_authid", "42501").await;
    let verifier = rows(
        &mut su,
        "SELECT rolpassword FROM pg_authid WHERE rolname = 'alice'",
    )
    .await;
    assert!(
        verifier[0][0].starts_with("SCRAM-SHA-256$4096:"),
        "{verifier:?}"
    );
    assert_eq!(
        rows(
            &mut a,
            "SELECT rolname, rolpassword FROM pg_roles WHERE rolname IN ('alice', 'reader') ORDER BY 1"
        )
        .await,
        table(&[&["alice", "********"], &["reader", "NULL"]])
    );
    assert_eq!(
        rows(&mut a, "SELECT usename FROM pg_user ORDER BY 1").await,
        table(&[&["alice"], &["boss"], &["sluice"]])
    );
    assert_eq!(
        rows(
            &mut a,
            "SELECT r.rolname, m.rolname FROM pg_auth_members am \
             JOIN pg_roles r ON r.oid = am.roleid JOIN pg_roles m ON m.oid = am.member"
        )
        .await,
        table(&[&["reader", "alice"]])
    );
    // EXPLAIN needs what its statement would
    let mut r = session(&engine, "reader");
    fails(&mut r, "EXPLAIN SELECT * FROM t", "42501").await;
    fails(&mut r, "EXPLAIN INSERT INTO s (v) VALUES (1)", "42501").await;
    ok(&mut r, "EXPLAIN SELECT * FROM s").await;
    fails(
        &mut su,
        "EXPLAIN ANALYZE INSERT INTO s (v) VALUES (1)",
        "0A000",
    )
    .await;
    engine.shutdown().await;
}

/// `log_min_duration_statement` decides what the operator's log shows: as in
/// PostgreSQL only a superuser may change it (SET, set_config, RESET keeps
/// it), so a role can neither hide its statements nor flood the log.
#[tokio::test]
async fn only_a_superuser_sets_log_min_duration_statement() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path()).await;
    let mut su = session(&engine, "sluice");
    ok(&mut su, "CREATE ROLE plain LOGIN").await;
    ok(&mut su, "SET log_min_duration_statement = 250").await;
    assert_eq!(
        rows(&mut su, "SHOW log_min_duration_statement").await,
        table(&[&["250ms"]])
    );
    let mut plain = session(&engine, "plain");
    for sql in [
        "SET log_min_duration_statement = -1",
        "SET log_min_duration_statement = 0",
        "SELECT set_config('log_min_duration_statement', '0', false)",
    ] {
        fails(&mut plain, sql, "42501").await;
    }
    assert_eq!(
        rows(&mut plain, "SHOW log_min_duration_statement").await,
        table(&[&["-1"]])
    );
    engine.shutdown().await;
}
