//! The README's session, typed into the real `psql` binary.

use sluice_tests::psql::{psql_on_path, run_script, squeeze, table_after};
use sluice_tests::Server;

const SESSION: &str = "\
CREATE STREAM orders (customer text NOT NULL, amount numeric(12,2));
INSERT INTO orders VALUES ('ann', 10.50), ('bob', 3) RETURNING offset;
SELECT offset, customer, amount FROM orders WHERE offset > 0;
SELECT customer, sum(amount) FROM orders GROUP BY customer ORDER BY 1;
UPDATE orders SET amount = 0;
SELECT count(*) AS total FROM orders;
";

#[tokio::test(flavor = "multi_thread")]
async fn readme_session_through_psql() {
    if !psql_on_path() {
        println!("SKIPPED readme_session_through_psql: `psql` is not on PATH");
        return;
    }
    let server = Server::start().await;
    let output = run_script(&server, SESSION, false).await;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);

    // psql exits 0 with ON_ERROR_STOP=0 even though UPDATE failed; 2 means
    // the connection was lost.
    assert!(output.status.success(), "psql failed: {}", output.status);
    let lines = squeeze(&stdout);
    assert_eq!(
        table_after(&lines, "offset"),
        ["0", "1"],
        "INSERT ... RETURNING offset"
    );
    assert!(
        lines.iter().any(|l| l == "INSERT 0 2"),
        "no `INSERT 0 2` command tag"
    );
    assert_eq!(
        table_after(&lines, "offset | customer | amount"),
        ["1 | bob | 3.00"],
        "SELECT ... WHERE offset > 0"
    );
    assert_eq!(
        // The aggregate's column name is not checked (PostgreSQL calls it `sum`).
        table_after(&lines, "customer | "),
        ["ann | 10.50", "bob | 3.00"],
        "SELECT customer, sum(amount) ... GROUP BY"
    );
    assert_eq!(
        table_after(&lines, "total"),
        ["2"],
        "rows after the failed UPDATE"
    );

    let errors: Vec<&str> = stderr.lines().filter(|l| l.contains("ERROR:")).collect();
    assert_eq!(
        errors.len(),
        1,
        "exactly one ERROR (for UPDATE), got {errors:?}"
    );
    assert!(
        errors[0].contains("append-only"),
        "UPDATE error should say append-only: {}",
        errors[0]
    );
}
