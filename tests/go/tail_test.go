// pgx against a real sluice server: LISTEN gets one JSON notification per
// committed row, a COPY-out tail with LIMIT returns its rows and ends, and
// NOTIFY travels between two connections.
//
// The server is $SLUICE_URL if set (a connection string or URL); otherwise
// each test starts $SLUICE_BIN (default ../../target/debug/sluice) on a
// temporary data directory and a random loopback port.
package tailtest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// arrival bounds how long one expected row or notification may take.
const arrival = 10 * time.Second

var listening = regexp.MustCompile(`listening on (\[[0-9a-fA-F:]+\]|[0-9.]+):(\d+)`)

// serverURL returns a connection string for a sluice server, starting one
// (stopped when the test ends) unless $SLUICE_URL is set.
func serverURL(t *testing.T) string {
	t.Helper()
	if url := os.Getenv("SLUICE_URL"); url != "" {
		return url
	}
	return fmt.Sprintf("postgres://sluice@127.0.0.1:%s/sluice?sslmode=disable&connect_timeout=10", startSluice(t))
}

// startSluice starts a sluice server with extra `serve` flags and returns its port.
func startSluice(t *testing.T, extra ...string) string {
	t.Helper()
	bin := os.Getenv("SLUICE_BIN")
	if bin == "" {
		bin = filepath.Join("..", "..", "target", "debug", "sluice")
	}
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("no sluice binary at %s (run `cargo build --bins` or set SLUICE_BIN): %v", bin, err)
	}
	args := append([]string{"serve", "--data-dir", t.TempDir(), "--listen", "127.0.0.1:0"}, extra...)
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "NO_COLOR=1")
	output, outputWriter, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout = outputWriter
	cmd.Stderr = outputWriter
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", bin, err)
	}
	outputWriter.Close()
	// The server's output is kept and shown if the test fails.
	var logMu sync.Mutex
	var log strings.Builder
	done := make(chan struct{})
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		<-done
		if t.Failed() {
			logMu.Lock()
			t.Logf("sluice output:\n%s", log.String())
			logMu.Unlock()
		}
	})
	ports := make(chan string, 1)
	go func() {
		defer close(done)
		scanner := bufio.NewScanner(output)
		announced := false
		for scanner.Scan() {
			line := scanner.Text()
			logMu.Lock()
			log.WriteString(line + "\n")
			logMu.Unlock()
			if m := listening.FindStringSubmatch(line); m != nil && !announced {
				announced = true
				ports <- m[2]
			}
		}
		if !announced {
			close(ports)
		}
	}()
	select {
	case port, ok := <-ports:
		if !ok {
			t.Fatal("sluice exited without printing `listening on HOST:PORT`")
		}
		return port
	case <-time.After(60 * time.Second):
		t.Fatal("sluice did not print `listening on HOST:PORT` within 60s")
	}
	return ""
}

func connect(t *testing.T, ctx context.Context, url string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatalf("connect %s: %v", url, err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

func mustExec(t *testing.T, ctx context.Context, conn *pgx.Conn, sql string, args ...any) {
	t.Helper()
	if _, err := conn.Exec(ctx, sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// uniqueStream names a stream so tests can share a server from SLUICE_URL.
func uniqueStream(prefix string) string {
	return fmt.Sprintf("%s_%d", prefix, time.Now().UnixNano())
}

func TestListenGetsRowsAsJSON(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	url := serverURL(t)
	writer := connect(t, ctx, url)
	listener := connect(t, ctx, url)
	stream := uniqueStream("orders")
	mustExec(t, ctx, writer, fmt.Sprintf("CREATE STREAM %s (customer text NOT NULL, amount numeric(12,2))", stream))
	mustExec(t, ctx, writer, fmt.Sprintf("INSERT INTO %s VALUES ('before', 1)", stream))
	mustExec(t, ctx, listener, "LISTEN "+stream)

	var offsets []int64
	rows, err := writer.Query(ctx, fmt.Sprintf("INSERT INTO %s VALUES ($1, $2), ('bob', NULL) RETURNING offset", stream), "ann", "10.50")
	if err != nil {
		t.Fatal(err)
	}
	offsets, err = pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		t.Fatalf("INSERT ... RETURNING offset: %v", err)
	}
	if len(offsets) != 2 || offsets[0] != 1 || offsets[1] != 2 {
		t.Fatalf("RETURNING offset = %v, want [1 2]", offsets)
	}

	for i, want := range []struct {
		customer string
		amount   any
	}{{"ann", 10.5}, {"bob", nil}} {
		waitCtx, waitCancel := context.WithTimeout(ctx, arrival)
		n, err := listener.WaitForNotification(waitCtx)
		waitCancel()
		if err != nil {
			t.Fatalf("notification %d: %v", i, err)
		}
		if n.Channel != stream {
			t.Errorf("channel = %q, want %q", n.Channel, stream)
		}
		var row map[string]any
		if err := json.Unmarshal([]byte(n.Payload), &row); err != nil {
			t.Fatalf("payload %q is not JSON: %v", n.Payload, err)
		}
		if got, _ := row["offset"].(float64); int64(got) != offsets[i] {
			t.Errorf("payload %s: offset %v, want %d", n.Payload, row["offset"], offsets[i])
		}
		if _, ok := row["ts"].(string); !ok {
			t.Errorf("payload %s has no ts string", n.Payload)
		}
		if row["customer"] != want.customer {
			t.Errorf("payload %s: customer %v, want %v", n.Payload, row["customer"], want.customer)
		}
		if fmt.Sprint(row["amount"]) != fmt.Sprint(want.amount) {
			t.Errorf("payload %s: amount %v, want %v", n.Payload, row["amount"], want.amount)
		}
	}
	// Exactly one per row: nothing else is pending.
	quiet, quietCancel := context.WithTimeout(ctx, 700*time.Millisecond)
	defer quietCancel()
	if n, err := listener.WaitForNotification(quiet); err == nil {
		t.Errorf("unexpected extra notification %+v", n)
	}
}

func TestCopyToWithLimitReturnsRows(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	url := serverURL(t)
	reader := connect(t, ctx, url)
	writer := connect(t, ctx, url)
	stream := uniqueStream("s")
	mustExec(t, ctx, writer, fmt.Sprintf("CREATE STREAM %s (v text)", stream))
	mustExec(t, ctx, writer, fmt.Sprintf("INSERT INTO %s VALUES ('a')", stream))

	// One row exists; the other two commit while the COPY is running.
	var wg sync.WaitGroup
	var insertErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		time.Sleep(300 * time.Millisecond)
		for _, v := range []string{"b", "c", "d"} {
			if _, err := writer.Exec(ctx, fmt.Sprintf("INSERT INTO %s VALUES ($1)", stream), v); err != nil {
				insertErr = err
				return
			}
		}
	}()
	var out bytes.Buffer
	copyCtx, copyCancel := context.WithTimeout(ctx, 3*arrival)
	defer copyCancel()
	tag, err := reader.PgConn().CopyTo(copyCtx, &out,
		fmt.Sprintf("COPY (SELECT offset, v FROM %s WHERE offset >= 0 LIMIT 3) TO STDOUT", stream))
	wg.Wait()
	if insertErr != nil {
		t.Fatalf("insert: %v", insertErr)
	}
	if err != nil {
		t.Fatalf("COPY tail with LIMIT 3: %v (got so far %q)", err, out.String())
	}
	if want := "0\ta\n1\tb\n2\tc\n"; out.String() != want {
		t.Errorf("COPY output %q, want %q", out.String(), want)
	}
	if tag.RowsAffected() != 3 {
		t.Errorf("COPY command tag %q, want COPY 3", tag.String())
	}
	var one int
	if err := reader.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil || one != 1 {
		t.Fatalf("SELECT 1 after the COPY: %v %v", one, err)
	}
}

func TestNotifyBetweenConnections(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	url := serverURL(t)
	notifier := connect(t, ctx, url)
	listener := connect(t, ctx, url)
	channel := uniqueStream("jobs")
	mustExec(t, ctx, listener, "LISTEN "+channel)

	mustExec(t, ctx, notifier, fmt.Sprintf("NOTIFY %s, 'hello'", channel))
	mustExec(t, ctx, notifier, "SELECT pg_notify($1, $2)", channel, "from pg_notify")
	tx, err := notifier.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, fmt.Sprintf("NOTIFY %s, 'in a transaction'", channel)); err != nil {
		t.Fatal(err)
	}
	var got []string
	for len(got) < 2 {
		waitCtx, waitCancel := context.WithTimeout(ctx, arrival)
		n, err := listener.WaitForNotification(waitCtx)
		waitCancel()
		if err != nil {
			t.Fatalf("after %v: %v", got, err)
		}
		if n.Channel != channel {
			t.Errorf("channel %q, want %q", n.Channel, channel)
		}
		got = append(got, n.Payload)
	}
	quiet, quietCancel := context.WithTimeout(ctx, 700*time.Millisecond)
	if n, err := listener.WaitForNotification(quiet); err == nil {
		t.Errorf("notification %+v delivered before its transaction committed", n)
	}
	quietCancel()
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	waitCtx, waitCancel := context.WithTimeout(ctx, arrival)
	defer waitCancel()
	n, err := listener.WaitForNotification(waitCtx)
	if err != nil {
		t.Fatalf("after COMMIT: %v", err)
	}
	got = append(got, n.Payload)
	if want := []string{"hello", "from pg_notify", "in a transaction"}; strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("payloads %q, want %q", got, want)
	}
}
