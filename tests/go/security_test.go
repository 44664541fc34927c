// pgx logs in with SCRAM-SHA-256 over TLS that verifies the server against a CA made for
// the test (tests/fixtures/tls/make-certs.sh), with channel binding required; a wrong
// password is 28P01.
package tailtest

import (
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

const securePassword = "correct horse"

func TestSecurityScramOverVerifiedTLS(t *testing.T) {
	ctx := driverContext(t)
	certs := t.TempDir()
	if out, err := exec.Command("bash", filepath.Join("..", "fixtures", "tls", "make-certs.sh"), certs).CombinedOutput(); err != nil {
		t.Fatalf("make-certs.sh: %v\n%s", err, out)
	}
	port := startSluice(t, "--password", securePassword,
		"--tls-cert", filepath.Join(certs, "server.pem"), "--tls-key", filepath.Join(certs, "server.key"))
	url := func(password string) string {
		return fmt.Sprintf("postgres://sluice:%s@127.0.0.1:%s/sluice?sslmode=verify-full&sslrootcert=%s&channel_binding=require&connect_timeout=10",
			password, port, filepath.Join(certs, "ca.pem"))
	}
	conn, err := pgx.Connect(ctx, url("correct%20horse"))
	if err != nil {
		t.Fatalf("connect over TLS with SCRAM: %v", err)
	}
	defer conn.Close(ctx)
	var encrypted bool
	var version string
	if err := conn.QueryRow(ctx, "SELECT ssl, version FROM pg_stat_ssl WHERE pid = pg_backend_pid()").Scan(&encrypted, &version); err != nil {
		t.Fatal(err)
	}
	if !encrypted || version != "TLSv1.3" {
		t.Fatalf("pg_stat_ssl: ssl=%v version=%q", encrypted, version)
	}
	_, err = pgx.Connect(ctx, url("wrong"))
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "28P01" {
		t.Fatalf("wrong password: %v", err)
	}
}
