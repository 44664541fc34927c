// pgx v5 used the way Go applications use it, against a real sluice server:
// pgx.Connect and pgxpool, every supported column type through pgx's default
// extended protocol (named prepared statements, binary parameters and results
// for the types pgx knows) and through QueryExecModeSimpleProtocol (text),
// SQLSTATEs as *pgconn.PgError, transactions (commit, rollback, 25P02 after
// an error), `-- ping`, named prepared statements, batches and CopyFrom.
//
// Reads inside a transaction do not yet see that transaction's own appends
// (issue 7), so nothing here reads its own uncommitted writes.
package tailtest

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
)

// driverTimeout bounds each test as a whole.
const driverTimeout = 90 * time.Second

// driverServer is serverURL, but first waits a little for the sluice binary,
// which another build may be replacing at this moment.
func driverServer(t *testing.T) string {
	t.Helper()
	if os.Getenv("SLUICE_URL") == "" {
		bin := os.Getenv("SLUICE_BIN")
		if bin == "" {
			bin = filepath.Join("..", "..", "target", "debug", "sluice")
		}
		for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
			if info, err := os.Stat(bin); err == nil && info.Mode().IsRegular() && info.Size() > 0 {
				break
			}
		}
	}
	return serverURL(t)
}

func driverContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), driverTimeout)
	t.Cleanup(cancel)
	return ctx
}

// sqlState returns the SQLSTATE of err if it is (or wraps) a *pgconn.PgError.
func sqlState(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

// wantSQLState fails unless err is a *pgconn.PgError with the given code.
func wantSQLState(t *testing.T, err error, code, what string) *pgconn.PgError {
	t.Helper()
	if err == nil {
		t.Errorf("%s: succeeded, want SQLSTATE %s", what, code)
		return nil
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		t.Errorf("%s: error %v (%T) is not a *pgconn.PgError, want SQLSTATE %s", what, err, err, code)
		return nil
	}
	if pgErr.Code != code {
		t.Errorf("%s: SQLSTATE %s (%s), want %s", what, pgErr.Code, pgErr.Message, code)
	}
	return pgErr
}

// ---------------------------------------------------------------------------
// 1. Connecting.

func TestDriverConnect(t *testing.T) {
	ctx := driverContext(t)
	url := driverServer(t)

	t.Run("pgx.Connect", func(t *testing.T) {
		conn := connect(t, ctx, url)
		var version string
		if err := conn.QueryRow(ctx, "SELECT version()").Scan(&version); err != nil {
			t.Fatalf("SELECT version(): %v", err)
		}
		if !strings.Contains(version, "PostgreSQL 16") {
			t.Errorf("version() = %q, want it to contain \"PostgreSQL 16\"", version)
		}
		if sv := conn.PgConn().ParameterStatus("server_version"); !strings.HasPrefix(sv, "16") {
			t.Errorf("server_version ParameterStatus = %q, want 16.x", sv)
		}
		// pgx refuses the simple protocol without these two.
		for name, want := range map[string]string{"standard_conforming_strings": "on", "client_encoding": "UTF8"} {
			if got := conn.PgConn().ParameterStatus(name); got != want {
				t.Errorf("ParameterStatus %s = %q, want %q", name, got, want)
			}
		}
		wantDB := conn.Config().Database
		var db string
		if err := conn.QueryRow(ctx, "SELECT current_database()").Scan(&db); err != nil {
			t.Fatalf("SELECT current_database(): %v", err)
		}
		if db != wantDB {
			t.Errorf("current_database() = %q, want %q", db, wantDB)
		}
		// The same through the simple protocol (text results).
		db = ""
		if err := conn.QueryRow(ctx, "SELECT current_database()", pgx.QueryExecModeSimpleProtocol).Scan(&db); err != nil || db != wantDB {
			t.Errorf("simple protocol current_database() = %q, %v; want %q", db, err, wantDB)
		}
	})

	t.Run("other database name", func(t *testing.T) {
		cfg, err := pgx.ParseConfig(url)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Database = "analytics"
		conn, err := pgx.ConnectConfig(ctx, cfg)
		if err != nil {
			t.Fatalf("connect to database analytics: %v", err)
		}
		defer conn.Close(context.Background())
		var db string
		if err := conn.QueryRow(ctx, "SELECT current_database()").Scan(&db); err != nil || db != "analytics" {
			t.Errorf("current_database() = %q, %v; want \"analytics\"", db, err)
		}
	})

	t.Run("pgxpool", func(t *testing.T) {
		cfg, err := pgxpool.ParseConfig(url)
		if err != nil {
			t.Fatal(err)
		}
		cfg.MaxConns = 4
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			t.Fatalf("pgxpool.NewWithConfig: %v", err)
		}
		defer pool.Close()
		if err := pool.Ping(ctx); err != nil {
			t.Fatalf("pool.Ping: %v", err)
		}
		var version string
		if err := pool.QueryRow(ctx, "SELECT version()").Scan(&version); err != nil || !strings.Contains(version, "PostgreSQL 16") {
			t.Errorf("pool SELECT version() = %q, %v", version, err)
		}

		stream := uniqueStream("pooled")
		if _, err := pool.Exec(ctx, fmt.Sprintf("CREATE STREAM %s (worker integer NOT NULL, n integer NOT NULL)", stream)); err != nil {
			t.Fatalf("CREATE STREAM: %v", err)
		}
		// 8 goroutines share 4 connections; each appends 5 rows and checks
		// current_database() on whichever connection it gets.
		const workers, each = 8, 5
		var wg sync.WaitGroup
		errs := make(chan error, workers*each)
		for w := 0; w < workers; w++ {
			wg.Add(1)
			go func(w int) {
				defer wg.Done()
				for n := 0; n < each; n++ {
					var offset int64
					if err := pool.QueryRow(ctx, fmt.Sprintf("INSERT INTO %s (worker, n) VALUES ($1, $2) RETURNING offset", stream), w, n).Scan(&offset); err != nil {
						errs <- fmt.Errorf("worker %d insert %d: %w", w, n, err)
						return
					}
					var db string
					if err := pool.QueryRow(ctx, "SELECT current_database()").Scan(&db); err != nil || db != cfg.ConnConfig.Database {
						errs <- fmt.Errorf("worker %d: current_database() = %q, %v", w, db, err)
						return
					}
				}
			}(w)
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
		var count, distinct, maxOffset int64
		if err := pool.QueryRow(ctx, fmt.Sprintf("SELECT count(*), count(DISTINCT offset), max(offset) FROM %s", stream)).Scan(&count, &distinct, &maxOffset); err != nil {
			t.Fatalf("count: %v", err)
		}
		if count != workers*each || distinct != workers*each || maxOffset != workers*each-1 {
			t.Errorf("count %d, distinct offsets %d, max offset %d; want %d, %d, %d", count, distinct, maxOffset,
				workers*each, workers*each, workers*each-1)
		}
		if total := pool.Stat().TotalConns(); total > 4 {
			t.Errorf("pool opened %d connections, MaxConns is 4", total)
		}
	})
}

// ---------------------------------------------------------------------------
// 2. Every supported column type.

var typedColumns = []string{"flag", "i2", "i4", "i8", "f4", "f8", "num", "big", "txt", "vc", "bin",
	"tstz", "tsp", "day", "doc", "docb", "id"}

const typedDDL = "CREATE STREAM %s (flag boolean, i2 smallint, i4 integer, i8 bigint, f4 real, " +
	"f8 double precision, num numeric(12,2), big numeric, txt text, vc varchar(5), bin bytea, " +
	"tstz timestamptz, tsp timestamp, day date, doc json, docb jsonb, id uuid)"

var typedOIDs = []uint32{pgtype.BoolOID, pgtype.Int2OID, pgtype.Int4OID, pgtype.Int8OID, pgtype.Float4OID,
	pgtype.Float8OID, pgtype.NumericOID, pgtype.NumericOID, pgtype.TextOID, pgtype.VarcharOID, pgtype.ByteaOID,
	pgtype.TimestamptzOID, pgtype.TimestampOID, pgtype.DateOID, pgtype.JSONOID, pgtype.JSONBOID, pgtype.UUIDOID}

func typedInsertSQL(stream string) string {
	params := make([]string, len(typedColumns))
	for i := range params {
		params[i] = fmt.Sprintf("$%d", i+1)
	}
	return fmt.Sprintf("INSERT INTO %s (%s) VALUES (%s) RETURNING offset", stream,
		strings.Join(typedColumns, ", "), strings.Join(params, ", "))
}

func typedSelectSQL(stream string) string {
	return fmt.Sprintf("SELECT offset, %s FROM %s ORDER BY offset", strings.Join(typedColumns, ", "), stream)
}

func mustNumeric(s string) pgtype.Numeric {
	var n pgtype.Numeric
	if err := n.Scan(s); err != nil {
		panic(fmt.Sprintf("numeric %q: %v", s, err))
	}
	return n
}

func mustUUID(s string) [16]byte {
	b, err := hex.DecodeString(strings.ReplaceAll(s, "-", ""))
	if err != nil || len(b) != 16 {
		panic(fmt.Sprintf("uuid %q: %v", s, err))
	}
	return [16]byte(b)
}

var (
	plus0530  = time.FixedZone("IST", 5*3600+30*60)
	minus0330 = time.FixedZone("NST", -(3*3600 + 30*60))

	fullUUID = mustUUID("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11")
	maxUUID  = mustUUID("ffffffff-ffff-ffff-ffff-ffffffffffff")

	edgeText    = "héllo wörld — 日本語 🚀 'single' \"double\" \\backslash\ttab\nnewline $1 -- not a comment"
	edgeVarchar = "žluťo" // 5 characters, 7 bytes: varchar(5) counts characters
)

// typedCase is one row: what the application passes in the default
// (extended, binary) mode, what it passes in the simple protocol (pgx can
// only interpolate types it has a default text encoding for), and the row
// read back in canonical form (see canonical).
type typedCase struct {
	name   string
	args   []any
	simple []any
	want   []string
}

func typedCases() []typedCase {
	full := []any{true, int16(12), int32(345), int64(6789012345), float32(1.5), float64(2.25),
		mustNumeric("12.5"), mustNumeric("12345678901234567890.123456789"), "hello world", "abc",
		[]byte{0xde, 0xad, 0xbe, 0xef},
		time.Date(2024, 1, 2, 8, 34, 5, 123456000, plus0530), // 03:04:05.123456Z
		time.Date(2024, 1, 2, 3, 4, 5, 123456000, time.UTC),
		time.Date(2024, 2, 29, 0, 0, 0, 0, time.UTC),
		map[string]any{"a": []any{1, 2}}, map[string]any{"b": 2, "a": 1}, fullUUID}
	// In the simple protocol pgx renders a time.Time as a timestamptz literal
	// whatever the column; TestDriverTypesSimpleProtocol checks that
	// separately, so the typed rows pass dates as pgtype.Date.
	fullSimple := append([]any(nil), full...)
	fullSimple[13] = pgtype.Date{Time: full[13].(time.Time), Valid: true}
	fullSimple[14] = `{"a":[1,2]}`
	fullSimple[15] = `{"b":2,"a":1}`
	fullSimple[16] = pgtype.UUID{Bytes: fullUUID, Valid: true}

	edges := []any{false, int16(math.MinInt16), int32(math.MinInt32), int64(math.MinInt64),
		float32(-math.MaxFloat32), float64(-1.2345678901234568e-300),
		mustNumeric("-9999999999.99"),
		mustNumeric("-9876543210987654321098765.4321"),
		edgeText, edgeVarchar, []byte{},
		time.Date(1969, 7, 20, 16, 47, 40, 1000, minus0330), // 20:17:40.000001Z, before the epoch
		time.Date(1999, 12, 31, 23, 59, 59, 500000000, time.UTC),
		time.Date(1969, 12, 31, 0, 0, 0, 0, time.UTC),
		[]any{}, map[string]any{"nested": map[string]any{"k": nil}, "ünï": "çødé"}, maxUUID}
	edgesSimple := append([]any(nil), edges...)
	edgesSimple[13] = pgtype.Date{Time: edges[13].(time.Time), Valid: true}
	edgesSimple[14] = `[]`
	edgesSimple[15] = `{"ünï": "çødé", "nested": {"k": null}}`
	edgesSimple[16] = pgtype.UUID{Bytes: maxUUID, Valid: true}

	nulls := make([]any, len(typedColumns))
	nullsWant := make([]string, len(typedColumns))
	for i := range nullsWant {
		nullsWant[i] = "NULL"
	}
	// Typed NULLs, as applications pass them from nullable fields.
	typedNulls := []any{pgtype.Bool{}, (*int16)(nil), pgtype.Int4{}, (*int64)(nil), pgtype.Float4{}, (*float64)(nil),
		pgtype.Numeric{}, (*pgtype.Numeric)(nil), (*string)(nil), pgtype.Text{}, []byte(nil),
		(*time.Time)(nil), pgtype.Timestamp{}, pgtype.Date{}, nil, nil, pgtype.UUID{}}

	return []typedCase{
		{
			name: "full", args: full, simple: fullSimple,
			want: []string{"true", "12", "345", "6789012345", "1.5", "2.25", "12.50",
				"12345678901234567890.123456789", `"hello world"`, `"abc"`, `\xdeadbeef`,
				"2024-01-02T03:04:05.123456Z", "2024-01-02 03:04:05.123456", "2024-02-29",
				`{"a":[1,2]}`, `{"a":1,"b":2}`, "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"},
		},
		{name: "all NULL", args: nulls, simple: nulls, want: nullsWant},
		{
			name: "edge values", args: edges, simple: edgesSimple,
			want: []string{"false", "-32768", "-2147483648", "-9223372036854775808", "-3.4028235e+38",
				"-1.2345678901234568e-300", "-9999999999.99",
				"-9876543210987654321098765.4321",
				strconv.Quote(edgeText), strconv.Quote(edgeVarchar), `\x`,
				"1969-07-20T20:17:40.000001Z", "1999-12-31 23:59:59.5", "1969-12-31",
				`[]`, `{"nested":{"k":null},"ünï":"çødé"}`, "ffffffff-ffff-ffff-ffff-ffffffffffff"},
		},
		{name: "typed NULLs", args: typedNulls, simple: typedNulls, want: nullsWant},
	}
}

// typedRow scans a typed row with pgtype types so NULL is distinguishable.
type typedRow struct {
	Offset int64
	Flag   pgtype.Bool
	I2     pgtype.Int2
	I4     pgtype.Int4
	I8     pgtype.Int8
	F4     pgtype.Float4
	F8     pgtype.Float8
	Num    pgtype.Numeric
	Big    pgtype.Numeric
	Txt    pgtype.Text
	Vc     pgtype.Text
	Bin    []byte
	Tstz   pgtype.Timestamptz
	Tsp    pgtype.Timestamp
	Day    pgtype.Date
	Doc    any
	Docb   any
	ID     pgtype.UUID
}

func (r *typedRow) targets() []any {
	return []any{&r.Offset, &r.Flag, &r.I2, &r.I4, &r.I8, &r.F4, &r.F8, &r.Num, &r.Big, &r.Txt, &r.Vc, &r.Bin,
		&r.Tstz, &r.Tsp, &r.Day, &r.Doc, &r.Docb, &r.ID}
}

// canonical renders the row exactly: floats in shortest round-trip form,
// numerics with their scale, text quoted, timestamptz as the UTC instant,
// JSON re-marshalled (sorted keys), "NULL" for SQL NULL.
func (r *typedRow) canonical() []string {
	var out []string
	add := func(valid bool, s string) {
		if valid {
			out = append(out, s)
		} else {
			out = append(out, "NULL")
		}
	}
	numeric := func(n pgtype.Numeric) string {
		v, err := n.Value()
		if err != nil {
			return "error: " + err.Error()
		}
		return fmt.Sprint(v)
	}
	jsonText := func(v any) string {
		b, err := json.Marshal(v)
		if err != nil {
			return "error: " + err.Error()
		}
		return string(b)
	}
	add(r.Flag.Valid, strconv.FormatBool(r.Flag.Bool))
	add(r.I2.Valid, strconv.FormatInt(int64(r.I2.Int16), 10))
	add(r.I4.Valid, strconv.FormatInt(int64(r.I4.Int32), 10))
	add(r.I8.Valid, strconv.FormatInt(r.I8.Int64, 10))
	add(r.F4.Valid, strconv.FormatFloat(float64(r.F4.Float32), 'g', -1, 32))
	add(r.F8.Valid, strconv.FormatFloat(r.F8.Float64, 'g', -1, 64))
	add(r.Num.Valid, numeric(r.Num))
	add(r.Big.Valid, numeric(r.Big))
	add(r.Txt.Valid, strconv.Quote(r.Txt.String))
	add(r.Vc.Valid, strconv.Quote(r.Vc.String))
	add(r.Bin != nil, `\x`+hex.EncodeToString(r.Bin))
	add(r.Tstz.Valid, r.Tstz.Time.UTC().Format("2006-01-02T15:04:05.999999Z07:00"))
	tsp := r.Tsp.Time.Format("2006-01-02 15:04:05.999999")
	if r.Tsp.Valid && r.Tsp.Time.Location() != time.UTC {
		tsp += " (location " + r.Tsp.Time.Location().String() + ", want UTC)"
	}
	add(r.Tsp.Valid, tsp)
	add(r.Day.Valid, r.Day.Time.Format("2006-01-02"))
	add(r.Doc != nil, jsonText(r.Doc))
	add(r.Docb != nil, jsonText(r.Docb))
	u := hex.EncodeToString(r.ID.Bytes[:])
	add(r.ID.Valid, u[0:8]+"-"+u[8:12]+"-"+u[12:16]+"-"+u[16:20]+"-"+u[20:32])
	return out
}

// compareTyped reports every column of every row that differs.
func compareTyped(t *testing.T, what string, got []typedRow, cases []typedCase, firstOffset int64) {
	t.Helper()
	if len(got) != len(cases) {
		t.Errorf("%s: %d rows, want %d", what, len(got), len(cases))
	}
	for i := range min(len(got), len(cases)) {
		if got[i].Offset != firstOffset+int64(i) {
			t.Errorf("%s: row %d has offset %d, want %d", what, i, got[i].Offset, firstOffset+int64(i))
		}
		values := got[i].canonical()
		for c, col := range typedColumns {
			if values[c] != cases[i].want[c] {
				t.Errorf("%s: %s row, column %s = %s, want %s", what, cases[i].name, col, values[c], cases[i].want[c])
			}
		}
	}
}

// readTyped runs SELECT offset, <typed columns> ... with the given exec mode
// and checks the RowDescription: names, type OIDs, and that every column
// came back in the format pgx asked for (binary for the types pgx has a
// binary codec for, in the default mode; text in the simple protocol).
func readTyped(t *testing.T, ctx context.Context, conn *pgx.Conn, stream string, mode pgx.QueryExecMode) []typedRow {
	t.Helper()
	rows, err := conn.Query(ctx, typedSelectSQL(stream), mode)
	if err != nil {
		t.Fatalf("%v: %s: %v", mode, typedSelectSQL(stream), err)
	}
	defer rows.Close()
	fields := rows.FieldDescriptions()
	wantNames := append([]string{"offset"}, typedColumns...)
	wantOIDs := append([]uint32{pgtype.Int8OID}, typedOIDs...)
	if len(fields) != len(wantNames) {
		t.Fatalf("%v: %d result columns, want %d", mode, len(fields), len(wantNames))
	}
	binary := 0
	for i, f := range fields {
		if f.Name != wantNames[i] || f.DataTypeOID != wantOIDs[i] {
			t.Errorf("%v: result column %d is %s (oid %d), want %s (oid %d)", mode, i, f.Name, f.DataTypeOID, wantNames[i], wantOIDs[i])
		}
		wantFormat := int16(pgx.TextFormatCode)
		if mode != pgx.QueryExecModeSimpleProtocol {
			wantFormat = conn.TypeMap().FormatCodeForOID(wantOIDs[i])
		}
		if f.Format != wantFormat {
			t.Errorf("%v: result column %s came back in format %d, want %d", mode, f.Name, f.Format, wantFormat)
		}
		if f.Format == pgx.BinaryFormatCode {
			binary++
		}
	}
	if mode != pgx.QueryExecModeSimpleProtocol && binary < 12 {
		t.Errorf("%v: only %d columns in binary format", mode, binary)
	}
	var out []typedRow
	for rows.Next() {
		var r typedRow
		if err := rows.Scan(r.targets()...); err != nil {
			t.Fatalf("%v: scan row %d: %v", mode, len(out), err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("%v: reading rows: %v", mode, err)
	}
	return out
}

// insertTyped appends the cases one INSERT ... RETURNING offset each.
func insertTyped(t *testing.T, ctx context.Context, conn *pgx.Conn, stream string, mode pgx.QueryExecMode, firstOffset int64) {
	t.Helper()
	for i, c := range typedCases() {
		args := c.args
		if mode == pgx.QueryExecModeSimpleProtocol {
			args = c.simple
		}
		var offset int64
		if err := conn.QueryRow(ctx, typedInsertSQL(stream), append([]any{mode}, args...)...).Scan(&offset); err != nil {
			t.Fatalf("%v: INSERT %s row: %v\nSQL: %s\nargs: %#v", mode, c.name, err, typedInsertSQL(stream), args)
		}
		if offset != firstOffset+int64(i) {
			t.Errorf("%v: INSERT %s row RETURNING offset = %d, want %d", mode, c.name, offset, firstOffset+int64(i))
		}
	}
}

func TestDriverTypesBinary(t *testing.T) {
	ctx := driverContext(t)
	conn := connect(t, ctx, driverServer(t))
	stream := uniqueStream("typed")
	mustExec(t, ctx, conn, fmt.Sprintf(typedDDL, stream))

	// The default mode prepares the INSERT (Parse + Describe); pgx encodes
	// each parameter by the type the server reports, so the server must
	// infer them all.
	sd, err := conn.Prepare(ctx, typedInsertSQL(stream), typedInsertSQL(stream))
	if err != nil {
		t.Fatalf("prepare %s: %v", typedInsertSQL(stream), err)
	}
	if !reflect.DeepEqual(sd.ParamOIDs, typedOIDs) {
		t.Errorf("INSERT parameter types %v, want %v", sd.ParamOIDs, typedOIDs)
	}

	insertTyped(t, ctx, conn, stream, pgx.QueryExecModeCacheStatement, 0)
	cases := typedCases()
	compareTyped(t, "binary results", readTyped(t, ctx, conn, stream, pgx.QueryExecModeCacheStatement), cases, 0)
	compareTyped(t, "text results", readTyped(t, ctx, conn, stream, pgx.QueryExecModeSimpleProtocol), cases, 0)

	// The full row into plain Go types, as most applications scan.
	var (
		flag         bool
		i2           int16
		i4           int32
		i8           int64
		f4           float32
		f8           float64
		num          pgtype.Numeric
		big          string
		txt, vc      string
		bin          []byte
		tstz, tsp    time.Time
		day          time.Time
		doc          string
		docb         map[string]any
		id           [16]byte
		offset       int64
		selectRowSQL = fmt.Sprintf("SELECT offset, %s FROM %s WHERE offset = $1", strings.Join(typedColumns, ", "), stream)
	)
	err = conn.QueryRow(ctx, selectRowSQL, int64(0)).Scan(&offset, &flag, &i2, &i4, &i8, &f4, &f8, &num, &big, &txt, &vc,
		&bin, &tstz, &tsp, &day, &doc, &docb, &id)
	if err != nil {
		t.Fatalf("%s: %v", selectRowSQL, err)
	}
	if numText, _ := num.Value(); numText != "12.50" {
		t.Errorf("numeric(12,2) = %v, want 12.50", numText)
	}
	wantTstz := time.Date(2024, 1, 2, 3, 4, 5, 123456000, time.UTC)
	got := []any{offset, flag, i2, i4, i8, f4, f8, big, txt, vc, bin, tstz.Equal(wantTstz),
		tsp, day, doc, docb, id}
	want := []any{int64(0), true, int16(12), int32(345), int64(6789012345), float32(1.5), float64(2.25),
		"12345678901234567890.123456789", "hello world", "abc", []byte{0xde, 0xad, 0xbe, 0xef}, true,
		time.Date(2024, 1, 2, 3, 4, 5, 123456000, time.UTC), time.Date(2024, 2, 29, 0, 0, 0, 0, time.UTC),
		`{"a":[1,2]}`, // json keeps the text pgx sent
		map[string]any{"a": float64(1), "b": float64(2)}, fullUUID}
	names := append([]string{"offset"}, typedColumns...)
	names = append(names[:7], names[8:]...) // num was checked above
	for i := range got {
		if !reflect.DeepEqual(got[i], want[i]) {
			t.Errorf("scan into Go types: %s = %#v, want %#v", names[i], got[i], want[i])
		}
	}
	if tstz.UTC() != wantTstz {
		t.Errorf("timestamptz = %v, want the instant %v", tstz, wantTstz)
	}
}

func TestDriverTypesSimpleProtocol(t *testing.T) {
	ctx := driverContext(t)
	conn := connect(t, ctx, driverServer(t))
	stream := uniqueStream("typed_text")
	mustExec(t, ctx, conn, fmt.Sprintf(typedDDL, stream))

	// pgx interpolates every argument into the SQL text as a quoted literal.
	insertTyped(t, ctx, conn, stream, pgx.QueryExecModeSimpleProtocol, 0)
	cases := typedCases()
	compareTyped(t, "text results", readTyped(t, ctx, conn, stream, pgx.QueryExecModeSimpleProtocol), cases, 0)
	compareTyped(t, "binary results", readTyped(t, ctx, conn, stream, pgx.QueryExecModeCacheStatement), cases, 0)

	// Applications pass time.Time for date and timestamp columns too. In the
	// simple protocol pgx renders it as a timestamptz literal in UTC,
	// '2024-02-29 07:44:15.5Z', whatever the column; PostgreSQL takes the
	// date, or the time without the offset, from such a literal. In binary,
	// pgx sends the date and the wall-clock time of the value's own zone.
	t.Run("time.Time for date, timestamp and timestamptz", func(t *testing.T) {
		times := uniqueStream("times")
		mustExec(t, ctx, conn, fmt.Sprintf("CREATE STREAM %s (day date, tsp timestamp, tstz timestamptz)", times))
		v := time.Date(2024, 2, 29, 13, 14, 15, 500000000, plus0530)
		insertSQL := fmt.Sprintf("INSERT INTO %s (day, tsp, tstz) VALUES ($1, $2, $3)", times)
		var want []string
		for _, m := range []struct {
			mode pgx.QueryExecMode
			want string
		}{
			{pgx.QueryExecModeSimpleProtocol, "2024-02-29 | 2024-02-29 07:44:15.5 | 2024-02-29T07:44:15.5Z"},
			{pgx.QueryExecModeCacheStatement, "2024-02-29 | 2024-02-29 13:14:15.5 | 2024-02-29T07:44:15.5Z"},
		} {
			if _, err := conn.Exec(ctx, insertSQL, m.mode, v, v, v); err != nil {
				t.Errorf("%v: %s with time.Time %v for every column: %v", m.mode, insertSQL, v, err)
			} else {
				want = append(want, m.want)
			}
		}
		for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeSimpleProtocol, pgx.QueryExecModeCacheStatement} {
			rows, err := conn.Query(ctx, fmt.Sprintf("SELECT day, tsp, tstz FROM %s ORDER BY offset", times), mode)
			if err != nil {
				t.Fatalf("%v: SELECT: %v", mode, err)
			}
			n := 0
			for rows.Next() {
				var day pgtype.Date
				var tsp pgtype.Timestamp
				var tstz pgtype.Timestamptz
				if err := rows.Scan(&day, &tsp, &tstz); err != nil {
					t.Fatalf("%v: scan: %v", mode, err)
				}
				got := fmt.Sprintf("%s | %s | %s", day.Time.Format("2006-01-02"), tsp.Time.Format("2006-01-02 15:04:05.999999"),
					tstz.Time.UTC().Format(time.RFC3339Nano))
				if n < len(want) && got != want[n] {
					t.Errorf("%v: row %d read back as %s, want %s", mode, n, got, want[n])
				}
				n++
			}
			if err := rows.Err(); err != nil {
				t.Fatalf("%v: %v", mode, err)
			}
			if n != len(want) {
				t.Errorf("%v: %d rows, want %d", mode, n, len(want))
			}
		}
	})
}

// numeric keeps the scale it was given, or the column's scale, rounding half
// away from zero, and holds far more than 38 digits when unconstrained.
func TestDriverNumeric(t *testing.T) {
	ctx := driverContext(t)
	conn := connect(t, ctx, driverServer(t))
	stream := uniqueStream("prices")
	mustExec(t, ctx, conn, fmt.Sprintf("CREATE STREAM %s (price numeric(12,2), exact numeric)", stream))

	// Sluice's unconstrained numeric is an explicit limit, not PostgreSQL's
	// arbitrary precision: up to 38 significant digits with at most 10
	// decimal places, trailing zeros not kept (README). Within it values
	// round-trip exactly; beyond it the insert fails with 22003, never
	// rounds (checked below).
	cases := []struct{ in, price, exact string }{
		{"12.5", "12.50", "12.5"},
		{"1.50", "1.50", "1.5"},
		{"2.345", "2.35", "2.345"},
		{"-2.345", "-2.35", "-2.345"},
		{"-0.005", "-0.01", "-0.005"},
		{"9999999999.994", "9999999999.99", "9999999999.994"},
		{"123456789.1234567891", "123456789.12", "123456789.1234567891"},
		{"-1234567890123456789012345678.0123456789", "", "-1234567890123456789012345678.0123456789"},
	}
	for _, beyond := range []string{
		"123456789.123456789012",
		"98765432109876543210987654321098765432.1234567890123456789000",
		"-123456789012345678901234567890123456789012345678901234567890",
		"0.000000000000000000000000000000000000001",
	} {
		for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeSimpleProtocol} {
			_, err := conn.Exec(ctx, fmt.Sprintf("INSERT INTO %s (exact) VALUES ($1)", stream), mode, mustNumeric(beyond))
			var pgErr *pgconn.PgError
			if !errors.As(err, &pgErr) || pgErr.Code != "22003" {
				t.Errorf("%v: %s beyond the unconstrained numeric limit: got %v, want SQLSTATE 22003", mode, beyond, err)
			}
		}
	}
	insertSQL := fmt.Sprintf("INSERT INTO %s (price, exact) VALUES ($1, $2)", stream)
	var want []string
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeSimpleProtocol} {
		for _, c := range cases {
			var price any
			if c.price != "" {
				price = mustNumeric(c.in)
			}
			if _, err := conn.Exec(ctx, insertSQL, mode, price, mustNumeric(c.in)); err != nil {
				t.Errorf("%v: %s with %v, %s: %v", mode, insertSQL, price, c.in, err)
				continue
			}
			p := c.price
			if p == "" {
				p = "NULL"
			}
			want = append(want, p+" "+c.exact)
		}
	}
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeSimpleProtocol} {
		rows, err := conn.Query(ctx, fmt.Sprintf("SELECT price, exact FROM %s ORDER BY offset", stream), mode)
		if err != nil {
			t.Fatalf("%v: SELECT: %v", mode, err)
		}
		var got []string
		for rows.Next() {
			var price, exact pgtype.Numeric
			if err := rows.Scan(&price, &exact); err != nil {
				t.Fatalf("%v: scan: %v", mode, err)
			}
			text := func(n pgtype.Numeric) string {
				if !n.Valid {
					return "NULL"
				}
				v, _ := n.Value()
				return fmt.Sprint(v)
			}
			got = append(got, text(price)+" "+text(exact))
		}
		if err := rows.Err(); err != nil {
			t.Fatalf("%v: %v", mode, err)
		}
		for i := range max(len(got), len(want)) {
			g, w := "(missing)", "(missing)"
			if i < len(got) {
				g = got[i]
			}
			if i < len(want) {
				w = want[i]
			}
			if g != w {
				t.Errorf("%v results: row %d is %q, want %q", mode, i, g, w)
			}
		}
	}

	// Too many integer digits for numeric(12,2) is 22003, as in PostgreSQL.
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeSimpleProtocol} {
		_, err := conn.Exec(ctx, insertSQL, mode, mustNumeric("10000000000"), nil)
		wantSQLState(t, err, "22003", fmt.Sprintf("%v: numeric(12,2) given 10000000000", mode))
		_, err = conn.Exec(ctx, insertSQL, mode, mustNumeric("9999999999.995"), nil)
		wantSQLState(t, err, "22003", fmt.Sprintf("%v: numeric(12,2) given 9999999999.995 (rounds to 10^10)", mode))
	}
}

// ---------------------------------------------------------------------------
// 3. SQLSTATEs.

func TestDriverErrorSQLSTATEs(t *testing.T) {
	ctx := driverContext(t)
	conn := connect(t, ctx, driverServer(t))
	stream := uniqueStream("orders")
	mustExec(t, ctx, conn, fmt.Sprintf("CREATE STREAM %s (customer text NOT NULL, amount numeric(12,2))", stream))
	mustExec(t, ctx, conn, fmt.Sprintf("INSERT INTO %s (customer, amount) VALUES ($1, $2)", stream), "ann", mustNumeric("10.5"))

	cases := []struct {
		name, sql string
		args      []any
		code      string
		message   string // a substring the message must contain
	}{
		{"UPDATE", "UPDATE %s SET amount = 0", nil, "0A000", "append-only"},
		{"UPDATE with parameters", "UPDATE %s SET amount = $1 WHERE customer = $2", []any{mustNumeric("1"), "ann"}, "0A000", "append-only"},
		{"DELETE", "DELETE FROM %s WHERE customer = 'ann'", nil, "0A000", "append-only"},
		{"SELECT from unknown table", "SELECT * FROM no_such_stream_%s", nil, "42P01", ""},
		{"INSERT into unknown table", "INSERT INTO no_such_stream_%s VALUES ($1)", []any{"x"}, "42P01", ""},
		{"syntax", "SELEC 1", nil, "42601", ""},
		{"syntax with parameters", "INSERT INTO %s (customer, amount) VALUES ($1, $2", []any{"x", mustNumeric("1")}, "42601", ""},
		{"NOT NULL parameter", "INSERT INTO %s (customer, amount) VALUES ($1, $2)", []any{nil, mustNumeric("1")}, "23502", ""},
		{"NOT NULL literal", "INSERT INTO %s (customer, amount) VALUES (NULL, 1)", nil, "23502", ""},
		{"NOT NULL omitted column", "INSERT INTO %s (amount) VALUES (1)", nil, "23502", ""},
	}
	modes := []struct {
		name string
		mode pgx.QueryExecMode
	}{
		{"default", pgx.QueryExecModeCacheStatement},
		{"simple", pgx.QueryExecModeSimpleProtocol},
	}
	countSQL := fmt.Sprintf("SELECT count(*) FROM %s", stream)
	for _, m := range modes {
		for _, c := range cases {
			t.Run(m.name+"/"+c.name, func(t *testing.T) {
				sql := c.sql
				if strings.Contains(sql, "%s") {
					sql = fmt.Sprintf(sql, stream)
				}
				_, err := conn.Exec(ctx, sql, append([]any{m.mode}, c.args...)...)
				if pgErr := wantSQLState(t, err, c.code, sql); pgErr != nil && c.message != "" &&
					!strings.Contains(pgErr.Message, c.message) {
					t.Errorf("%s: message %q does not say %q", sql, pgErr.Message, c.message)
				}
				if conn.IsClosed() {
					t.Fatalf("the connection closed after %s", sql)
				}
				if status := conn.PgConn().TxStatus(); status != 'I' {
					t.Errorf("transaction status after the error is %q, want 'I'", status)
				}
				// The connection still works, in both modes, and nothing was appended.
				for _, mode := range []pgx.QueryExecMode{m.mode, pgx.QueryExecModeCacheStatement, pgx.QueryExecModeSimpleProtocol} {
					var n int64
					if err := conn.QueryRow(ctx, countSQL, mode).Scan(&n); err != nil || n != 1 {
						t.Errorf("after %s, %v %s = %d, %v; want 1", sql, mode, countSQL, n, err)
					}
				}
			})
		}
	}
}

// ---------------------------------------------------------------------------
// 4. Transactions.

func TestDriverTransactions(t *testing.T) {
	ctx := driverContext(t)
	url := driverServer(t)
	writer := connect(t, ctx, url)
	reader := connect(t, ctx, url)
	stream := uniqueStream("ledger")
	mustExec(t, ctx, writer, fmt.Sprintf("CREATE STREAM %s (body text NOT NULL, n integer)", stream))
	insertSQL := fmt.Sprintf("INSERT INTO %s (body, n) VALUES ($1, $2)", stream)
	selectSQL := fmt.Sprintf("SELECT body FROM %s ORDER BY offset", stream)

	bodies := func(t *testing.T, conn *pgx.Conn) []string {
		t.Helper()
		rows, err := conn.Query(ctx, selectSQL)
		if err != nil {
			t.Fatalf("%s: %v", selectSQL, err)
		}
		got, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatalf("%s: %v", selectSQL, err)
		}
		return got
	}
	expectBodies := func(t *testing.T, what string, want ...string) {
		t.Helper()
		if got := bodies(t, reader); strings.Join(got, "|") != strings.Join(want, "|") {
			t.Errorf("%s: another connection sees %q, want %q", what, got, want)
		}
	}
	txStatus := func(t *testing.T, what string, want byte) {
		t.Helper()
		if got := writer.PgConn().TxStatus(); got != want {
			t.Errorf("%s: transaction status %q, want %q", what, got, want)
		}
	}
	committed := []string{}

	t.Run("commit", func(t *testing.T) {
		tx, err := writer.Begin(ctx)
		if err != nil {
			t.Fatalf("Begin: %v", err)
		}
		defer tx.Rollback(ctx)
		txStatus(t, "after BEGIN", 'T')
		if _, err := tx.Exec(ctx, insertSQL, "a", 1); err != nil {
			t.Fatalf("INSERT in transaction: %v", err)
		}
		tag, err := tx.Exec(ctx, fmt.Sprintf("INSERT INTO %s (body, n) VALUES ($1, $2), ($3, $4)", stream), "b", 2, "c", nil)
		if err != nil {
			t.Fatalf("INSERT of two rows in transaction: %v", err)
		}
		if tag.String() != "INSERT 0 2" {
			t.Errorf("command tag %q, want \"INSERT 0 2\"", tag.String())
		}
		if _, err := tx.Exec(ctx, fmt.Sprintf("INSERT INTO %s (body, n) VALUES ('literal', 3)", stream), pgx.QueryExecModeSimpleProtocol); err != nil {
			t.Fatalf("simple-protocol INSERT in transaction: %v", err)
		}
		expectBodies(t, "before COMMIT")
		if err := tx.Commit(ctx); err != nil {
			t.Fatalf("Commit: %v", err)
		}
		txStatus(t, "after COMMIT", 'I')
		committed = append(committed, "a", "b", "c", "literal")
		expectBodies(t, "after COMMIT", committed...)
	})

	t.Run("BeginTx with options and BeginFunc", func(t *testing.T) {
		opts := pgx.TxOptions{IsoLevel: pgx.Serializable, AccessMode: pgx.ReadWrite}
		err := pgx.BeginTxFunc(ctx, writer, opts, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, insertSQL, "d", 4)
			if err == nil {
				expectBodies(t, "inside BeginTxFunc", committed...)
			}
			return err
		})
		if err != nil {
			t.Fatalf("BeginTxFunc(%+v): %v", opts, err)
		}
		committed = append(committed, "d")
		expectBodies(t, "after BeginTxFunc", committed...)

		// A function that fails rolls back.
		failure := errors.New("application error")
		err = pgx.BeginFunc(ctx, writer, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, insertSQL, "undone by BeginFunc", 5); err != nil {
				return err
			}
			return failure
		})
		if !errors.Is(err, failure) {
			t.Errorf("BeginFunc returned %v, want the function's error", err)
		}
		txStatus(t, "after BeginFunc rolled back", 'I')
		expectBodies(t, "after BeginFunc rolled back", committed...)
	})

	t.Run("rollback", func(t *testing.T) {
		tx, err := writer.Begin(ctx)
		if err != nil {
			t.Fatalf("Begin: %v", err)
		}
		for _, body := range []string{"rolled back 1", "rolled back 2"} {
			if _, err := tx.Exec(ctx, insertSQL, body, 0); err != nil {
				t.Fatalf("INSERT in transaction: %v", err)
			}
		}
		expectBodies(t, "before ROLLBACK", committed...)
		if err := tx.Rollback(ctx); err != nil {
			t.Fatalf("Rollback: %v", err)
		}
		txStatus(t, "after ROLLBACK", 'I')
		expectBodies(t, "after ROLLBACK", committed...)
		if got := bodies(t, writer); strings.Join(got, "|") != strings.Join(committed, "|") {
			t.Errorf("after ROLLBACK the writer sees %q, want %q", got, committed)
		}
	})

	t.Run("error aborts the transaction", func(t *testing.T) {
		tx, err := writer.Begin(ctx)
		if err != nil {
			t.Fatalf("Begin: %v", err)
		}
		defer tx.Rollback(ctx)
		if _, err := tx.Exec(ctx, insertSQL, "lost", 6); err != nil {
			t.Fatalf("INSERT in transaction: %v", err)
		}
		_, err = tx.Exec(ctx, fmt.Sprintf("INSERT INTO no_such_stream_%s VALUES ($1)", stream), "x")
		wantSQLState(t, err, "42P01", "INSERT into an unknown table in a transaction")
		txStatus(t, "after the error", 'E')

		// Every further statement, in any mode, fails with 25P02 until ROLLBACK.
		_, err = tx.Exec(ctx, "SELECT 1")
		wantSQLState(t, err, "25P02", "SELECT 1 (extended) in a failed transaction")
		_, err = tx.Exec(ctx, insertSQL, "also lost", 7)
		wantSQLState(t, err, "25P02", "prepared INSERT in a failed transaction")
		_, err = tx.Exec(ctx, "SELECT 2", pgx.QueryExecModeSimpleProtocol)
		wantSQLState(t, err, "25P02", "SELECT 2 (simple) in a failed transaction")
		var n int
		err = tx.QueryRow(ctx, "SELECT $1::integer", 3).Scan(&n)
		wantSQLState(t, err, "25P02", "QueryRow in a failed transaction")
		txStatus(t, "after 25P02", 'E')

		if err := tx.Rollback(ctx); err != nil {
			t.Fatalf("Rollback of the failed transaction: %v", err)
		}
		txStatus(t, "after ROLLBACK", 'I')
		if err := writer.QueryRow(ctx, "SELECT 1").Scan(&n); err != nil || n != 1 {
			t.Errorf("SELECT 1 after ROLLBACK = %d, %v", n, err)
		}
		expectBodies(t, "after the failed transaction", committed...)
	})

	t.Run("commit of a failed transaction rolls back", func(t *testing.T) {
		tx, err := writer.Begin(ctx)
		if err != nil {
			t.Fatalf("Begin: %v", err)
		}
		defer tx.Rollback(ctx)
		if _, err := tx.Exec(ctx, insertSQL, "lost too", 8); err != nil {
			t.Fatalf("INSERT in transaction: %v", err)
		}
		_, err = tx.Exec(ctx, fmt.Sprintf("INSERT INTO %s (body, n) VALUES ($1, $2)", stream), nil, 9)
		wantSQLState(t, err, "23502", "NOT NULL violation in a transaction")
		// PostgreSQL answers COMMIT of a failed transaction with the tag
		// ROLLBACK, which pgx reports as ErrTxCommitRollback.
		if err := tx.Commit(ctx); !errors.Is(err, pgx.ErrTxCommitRollback) {
			t.Errorf("Commit of a failed transaction: %v, want pgx.ErrTxCommitRollback", err)
		}
		txStatus(t, "after COMMIT of a failed transaction", 'I')
		expectBodies(t, "after COMMIT of a failed transaction", committed...)
	})

	t.Run("offsets stay gapless", func(t *testing.T) {
		var offset int64
		err := writer.QueryRow(ctx, fmt.Sprintf("INSERT INTO %s (body, n) VALUES ($1, $2) RETURNING offset", stream), "after", 10).Scan(&offset)
		if err != nil {
			t.Fatalf("INSERT ... RETURNING offset: %v", err)
		}
		if want := int64(len(committed)); offset != want {
			t.Errorf("offset after the rolled-back transactions = %d, want %d", offset, want)
		}
		committed = append(committed, "after")
		expectBodies(t, "at the end", committed...)
	})
}

// ---------------------------------------------------------------------------
// 5. Ping and named prepared statements.

func TestDriverPing(t *testing.T) {
	ctx := driverContext(t)
	url := driverServer(t)
	conn := connect(t, ctx, url)
	for i := 0; i < 3; i++ {
		if err := conn.Ping(ctx); err != nil {
			t.Fatalf("Ping %d (`-- ping`): %v", i, err)
		}
	}
	// Other comment-only and empty queries get EmptyQueryResponse too.
	for _, sql := range []string{"-- ping", "", ";", "/* ping */", "  -- two\n-- lines\n"} {
		results, err := conn.PgConn().Exec(ctx, sql).ReadAll()
		if err != nil {
			t.Errorf("Exec(%q): %v", sql, err)
			continue
		}
		for _, r := range results {
			if r.CommandTag.String() != "" || len(r.Rows) != 0 {
				t.Errorf("Exec(%q): result %q with %d rows, want an empty query response", sql, r.CommandTag.String(), len(r.Rows))
			}
		}
	}
	// Ping still works after an error.
	_, err := conn.Exec(ctx, "SELECT * FROM no_such_stream_for_ping")
	wantSQLState(t, err, "42P01", "SELECT from an unknown table")
	if err := conn.Ping(ctx); err != nil {
		t.Fatalf("Ping after an error: %v", err)
	}
	var one int
	if err := conn.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil || one != 1 {
		t.Fatalf("SELECT 1 after Ping = %d, %v", one, err)
	}

	// pgxpool pings a connection that sat idle before handing it out.
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 1
	cfg.PingTimeout = 5 * time.Second
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	for i := 0; i < 3; i++ {
		if err := pool.Ping(ctx); err != nil {
			t.Fatalf("pool.Ping %d: %v", i, err)
		}
	}
}

func TestDriverPreparedStatements(t *testing.T) {
	ctx := driverContext(t)
	conn := connect(t, ctx, driverServer(t))
	stream := uniqueStream("orders")
	mustExec(t, ctx, conn, fmt.Sprintf("CREATE STREAM %s (customer text NOT NULL, amount numeric(12,2))", stream))

	insert, err := conn.Prepare(ctx, "insert_order", fmt.Sprintf("INSERT INTO %s (customer, amount) VALUES ($1, $2) RETURNING offset, ts", stream))
	if err != nil {
		t.Fatalf("Prepare insert_order: %v", err)
	}
	if want := []uint32{pgtype.TextOID, pgtype.NumericOID}; !reflect.DeepEqual(insert.ParamOIDs, want) {
		t.Errorf("insert_order parameter types %v, want %v", insert.ParamOIDs, want)
	}
	if len(insert.Fields) != 2 || insert.Fields[0].Name != "offset" || insert.Fields[0].DataTypeOID != pgtype.Int8OID ||
		insert.Fields[1].Name != "ts" || insert.Fields[1].DataTypeOID != pgtype.TimestamptzOID {
		t.Errorf("insert_order result columns %+v, want offset bigint, ts timestamptz", insert.Fields)
	}

	var lastTs time.Time
	for i := 0; i < 5; i++ {
		var offset int64
		var ts time.Time
		err := conn.QueryRow(ctx, "insert_order", fmt.Sprintf("c%d", i), mustNumeric(fmt.Sprintf("%d.25", i))).Scan(&offset, &ts)
		if err != nil {
			t.Fatalf("insert_order run %d: %v", i, err)
		}
		if offset != int64(i) {
			t.Errorf("insert_order run %d: offset %d, want %d", i, offset, i)
		}
		if ts.Before(lastTs) || time.Since(ts) > time.Hour || time.Until(ts) > time.Hour {
			t.Errorf("insert_order run %d: ts %v (previous %v)", i, ts, lastTs)
		}
		lastTs = ts
	}
	for i := 5; i < 7; i++ {
		tag, err := conn.Exec(ctx, "insert_order", fmt.Sprintf("c%d", i), nil)
		if err != nil {
			t.Fatalf("Exec insert_order run %d: %v", i, err)
		}
		if tag.String() != "INSERT 0 1" {
			t.Errorf("Exec insert_order run %d: command tag %q, want \"INSERT 0 1\"", i, tag.String())
		}
	}

	sel, err := conn.Prepare(ctx, "select_orders", fmt.Sprintf(
		"SELECT offset, customer, amount FROM %s WHERE offset >= $1 AND customer <> $2 ORDER BY offset", stream))
	if err != nil {
		t.Fatalf("Prepare select_orders: %v", err)
	}
	if want := []uint32{pgtype.Int8OID, pgtype.TextOID}; !reflect.DeepEqual(sel.ParamOIDs, want) {
		t.Errorf("select_orders parameter types %v, want %v", sel.ParamOIDs, want)
	}
	type order struct {
		Offset   int64
		Customer string
		Amount   *string
	}
	for _, run := range []struct {
		from    int64
		exclude string
		want    string
	}{
		{0, "c1", "0 c0 0.25|2 c2 2.25|3 c3 3.25|4 c4 4.25|5 c5 NULL|6 c6 NULL"},
		{4, "nobody", "4 c4 4.25|5 c5 NULL|6 c6 NULL"},
		{6, "c6", ""},
		{2, "c5", "2 c2 2.25|3 c3 3.25|4 c4 4.25|6 c6 NULL"},
	} {
		rows, err := conn.Query(ctx, "select_orders", run.from, run.exclude)
		if err != nil {
			t.Fatalf("select_orders(%d, %q): %v", run.from, run.exclude, err)
		}
		for i, f := range rows.FieldDescriptions() {
			if f.DataTypeOID != pgtype.TextOID && f.Format != pgx.BinaryFormatCode {
				t.Errorf("select_orders result column %d (oid %d) in format %d, want binary", i, f.DataTypeOID, f.Format)
			}
		}
		got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[order])
		if err != nil {
			t.Fatalf("select_orders(%d, %q): %v", run.from, run.exclude, err)
		}
		var parts []string
		for _, o := range got {
			amount := "NULL"
			if o.Amount != nil {
				amount = *o.Amount
			}
			parts = append(parts, fmt.Sprintf("%d %s %s", o.Offset, o.Customer, amount))
		}
		if strings.Join(parts, "|") != run.want {
			t.Errorf("select_orders(%d, %q) = %q, want %q", run.from, run.exclude, strings.Join(parts, "|"), run.want)
		}
	}

	// DEALLOCATE, then the name can be prepared again for other SQL.
	if err := conn.Deallocate(ctx, "select_orders"); err != nil {
		t.Fatalf("Deallocate select_orders: %v", err)
	}
	if _, err := conn.Prepare(ctx, "select_orders", fmt.Sprintf("SELECT count(*) FROM %s WHERE amount IS NULL", stream)); err != nil {
		t.Fatalf("Prepare select_orders again: %v", err)
	}
	var nulls int64
	if err := conn.QueryRow(ctx, "select_orders").Scan(&nulls); err != nil || nulls != 2 {
		t.Errorf("re-prepared select_orders = %d, %v; want 2", nulls, err)
	}
	// A prepared statement that fails at execution leaves the connection
	// and the statement usable.
	_, err = conn.Exec(ctx, "insert_order", nil, mustNumeric("1"))
	wantSQLState(t, err, "23502", "insert_order with a NULL customer")
	var offset int64
	var ts time.Time
	if err := conn.QueryRow(ctx, "insert_order", "c7", mustNumeric("7")).Scan(&offset, &ts); err != nil || offset != 7 {
		t.Errorf("insert_order after an error: offset %d, %v; want 7", offset, err)
	}
	// Preparing bad SQL fails with the right SQLSTATE and changes nothing.
	_, err = conn.Prepare(ctx, "bad", "SELECT * FROM no_such_stream_prepared")
	wantSQLState(t, err, "42P01", "Prepare of a SELECT from an unknown table")
	_, err = conn.Prepare(ctx, "bad", "SELEC 1")
	wantSQLState(t, err, "42601", "Prepare of SELEC 1")
	if err := conn.QueryRow(ctx, "insert_order", "c8", mustNumeric("8")).Scan(&offset, &ts); err != nil || offset != 8 {
		t.Errorf("insert_order after failed Prepares: offset %d, %v; want 8", offset, err)
	}
}

// ---------------------------------------------------------------------------
// Beyond the basics: batches and CopyFrom, which Go applications use for
// bulk writes.

func TestDriverBatch(t *testing.T) {
	ctx := driverContext(t)
	conn := connect(t, ctx, driverServer(t))
	stream := uniqueStream("batched")
	mustExec(t, ctx, conn, fmt.Sprintf("CREATE STREAM %s (body text NOT NULL, n bigint)", stream))
	insertSQL := fmt.Sprintf("INSERT INTO %s (body, n) VALUES ($1, $2) RETURNING offset", stream)

	// One round trip: the statements are prepared, then all executed
	// before a single Sync.
	batch := &pgx.Batch{}
	for i := 0; i < 5; i++ {
		batch.Queue(insertSQL, fmt.Sprintf("b%d", i), int64(i))
	}
	results := conn.SendBatch(ctx, batch)
	for i := 0; i < 5; i++ {
		var offset int64
		if err := results.QueryRow().Scan(&offset); err != nil {
			t.Fatalf("batch insert %d: %v", i, err)
		}
		if offset != int64(i) {
			t.Errorf("batch insert %d: offset %d, want %d", i, offset, i)
		}
	}
	if err := results.Close(); err != nil {
		t.Fatalf("closing the batch: %v", err)
	}
}

// A batch is one implicit transaction (as in PostgreSQL): its statements
// run between two Syncs outside BEGIN and commit together at the Sync, or
// not at all. Here it appends to two streams: a passing batch gets gapless
// offsets in both; in a failing one the statements before the failure
// return their RETURNING rows with offset and ts NULL (nothing was
// appended), the failure is 23502, the statement after it never runs, and
// neither stream holds any of that batch's rows.
func TestDriverBatchIsOneTransaction(t *testing.T) {
	ctx := driverContext(t)
	url := driverServer(t)
	conn := connect(t, ctx, url)
	reader := connect(t, ctx, url)
	streamA := uniqueStream("batched_a")
	streamB := uniqueStream("batched_b")
	insertSQL := map[string]string{}
	for _, stream := range []string{streamA, streamB} {
		mustExec(t, ctx, conn, fmt.Sprintf("CREATE STREAM %s (body text NOT NULL, n bigint)", stream))
		insertSQL[stream] = fmt.Sprintf("INSERT INTO %s (body, n) VALUES ($1, $2) RETURNING offset, ts", stream)
	}
	bodies := func(stream string) string {
		t.Helper()
		rows, err := reader.Query(ctx, fmt.Sprintf("SELECT body FROM %s ORDER BY offset", stream))
		if err != nil {
			t.Fatalf("reading %s: %v", stream, err)
		}
		got, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatalf("reading %s: %v", stream, err)
		}
		return strings.Join(got, "|")
	}

	// A passing batch alternating between the streams: each statement's
	// offset is the real one, gapless per stream.
	type queued struct {
		stream string
		body   any
		offset int64
	}
	passing := []queued{
		{streamA, "a0", 0}, {streamB, "b0", 0}, {streamA, "a1", 1}, {streamB, "b1", 1},
	}
	batch := &pgx.Batch{}
	for i, q := range passing {
		batch.Queue(insertSQL[q.stream], q.body, int64(i))
	}
	results := conn.SendBatch(ctx, batch)
	for i, q := range passing {
		var offset *int64
		var ts *time.Time
		if err := results.QueryRow().Scan(&offset, &ts); err != nil {
			t.Fatalf("passing batch, statement %d: %v", i, err)
		}
		if offset == nil || *offset != q.offset || ts == nil {
			t.Errorf("passing batch, statement %d (%s): offset %s, ts %s; want offset %d and a ts",
				i, q.body, orNull(offset), orNull(ts), q.offset)
		}
	}
	if err := results.Close(); err != nil {
		t.Fatalf("closing the passing batch: %v", err)
	}

	// A failing batch: the fourth statement (into B) violates NOT NULL.
	batch = &pgx.Batch{}
	batch.Queue(insertSQL[streamA], "undone a", int64(10))
	batch.Queue(insertSQL[streamB], "undone b", int64(11))
	batch.Queue(insertSQL[streamA], "undone a again", int64(12))
	batch.Queue(insertSQL[streamB], nil, int64(13)) // NOT NULL violation at execution
	batch.Queue(insertSQL[streamA], "never run", int64(14))
	results = conn.SendBatch(ctx, batch)
	for i := 0; i < 3; i++ {
		var offset *int64
		var ts *time.Time
		if err := results.QueryRow().Scan(&offset, &ts); err != nil {
			t.Errorf("failing batch, statement %d before the failure: %v, want its row", i, err)
		} else if offset != nil || ts != nil {
			t.Errorf("failing batch, statement %d before the failure: offset %s, ts %s; want both NULL (nothing appended)",
				i, orNull(offset), orNull(ts))
		}
	}
	var offset *int64
	var ts *time.Time
	wantSQLState(t, results.QueryRow().Scan(&offset, &ts), "23502", "NOT NULL violation in a batch")
	if err := results.QueryRow().Scan(&offset, &ts); err == nil {
		t.Errorf("failing batch, statement after the failure: returned a row (offset %s), want it skipped", orNull(offset))
	}
	if err := results.Close(); err == nil {
		t.Errorf("closing the failing batch: no error")
	}
	if status := conn.PgConn().TxStatus(); status != 'I' {
		t.Errorf("transaction status after the failing batch %q, want 'I'", status)
	}
	if got, want := bodies(streamA), "a0|a1"; got != want {
		t.Errorf("stream A after the failing batch: %q, want %q", got, want)
	}
	if got, want := bodies(streamB), "b0|b1"; got != want {
		t.Errorf("stream B after the failing batch: %q, want %q", got, want)
	}

	// The connection is usable and the offsets stay gapless.
	for _, stream := range []string{streamA, streamB} {
		var after int64
		if err := conn.QueryRow(ctx, insertSQL[stream], "after", int64(20)).Scan(&after, &ts); err != nil || after != 2 {
			t.Errorf("INSERT into %s after the failing batch: offset %d, %v; want 2", stream, after, err)
		}
	}
}

// orNull shows a scanned nullable value.
func orNull[T any](p *T) string {
	if p == nil {
		return "NULL"
	}
	return fmt.Sprint(*p)
}

func TestDriverCopyFrom(t *testing.T) {
	ctx := driverContext(t)
	conn := connect(t, ctx, driverServer(t))
	stream := uniqueStream("copied")
	mustExec(t, ctx, conn, fmt.Sprintf(typedDDL, stream))

	// pgx.CopyFrom describes `SELECT <columns> FROM stream` for the column
	// types, then sends COPY ... FROM STDIN BINARY.
	cases := typedCases()
	var rows [][]any
	for _, c := range cases {
		rows = append(rows, c.args)
	}
	n, err := conn.CopyFrom(ctx, pgx.Identifier{stream}, typedColumns, pgx.CopyFromRows(rows))
	if err != nil {
		t.Fatalf("CopyFrom: %v", err)
	}
	if n != int64(len(rows)) {
		t.Errorf("CopyFrom copied %d rows, want %d", n, len(rows))
	}
	compareTyped(t, "after CopyFrom, binary results", readTyped(t, ctx, conn, stream, pgx.QueryExecModeCacheStatement), cases, 0)
	compareTyped(t, "after CopyFrom, text results", readTyped(t, ctx, conn, stream, pgx.QueryExecModeSimpleProtocol), cases, 0)
}

// Go slices go in as arrays: pgx sends them in binary after describing the
// parameter as int8[] / text[] (issue 22: arrays as parameters).
func TestDriverArrayParameters(t *testing.T) {
	ctx := driverContext(t)
	url := driverServer(t)
	conn := connect(t, ctx, url)
	var ints []int64
	if err := conn.QueryRow(ctx, "SELECT $1::bigint[]", []int64{1, 2, 7}).Scan(&ints); err != nil {
		t.Fatalf("SELECT $1::bigint[]: %v", err)
	}
	if len(ints) != 3 || ints[0] != 1 || ints[2] != 7 {
		t.Fatalf("bigint[] round trip = %v", ints)
	}
	if _, err := conn.Exec(ctx, "CREATE STREAM go_tagged (id int, tag text)"); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "INSERT INTO go_tagged VALUES (1, 'a'), (2, 'b c'), (3, 'd')"); err != nil {
		t.Fatal(err)
	}
	rows, err := conn.Query(ctx, "SELECT id FROM go_tagged WHERE tag = ANY($1::text[]) ORDER BY id", []string{"b c", "d"})
	if err != nil {
		t.Fatalf("= ANY($1::text[]): %v", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		t.Fatalf("collect: %v", err)
	}
	if len(ids) != 2 || ids[0] != 2 || ids[1] != 3 {
		t.Fatalf("ids = %v, want [2 3]", ids)
	}
}

// ---------------------------------------------------------------------------
// Array columns: Go slices into text[], int8[] and int4[] columns of a table
// and a stream, through Exec (binary parameters, and text literals in the
// simple protocol) and CopyFrom (binary COPY), scanned back into slices.

// arrayRow is one row of the array columns; a nil slice is SQL NULL.
type arrayRow struct {
	names []string
	n     []int64
	m     []*int32
	tags  []*string
}

func ptr[T any](v T) *T { return &v }

func arrayRows() []arrayRow {
	return []arrayRow{
		{
			names: []string{"a", "b c", `"q"`, "", "NULL", `back\slash`, "{x,y}", "comma,here", " pad ", "ünï"},
			n:     []int64{1, math.MinInt64, math.MaxInt64},
			m:     []*int32{ptr(int32(1)), nil, ptr(int32(math.MinInt32))},
			tags:  []*string{ptr("x"), nil, ptr("NULL"), ptr("")},
		},
		{names: []string{}, n: []int64{}, m: []*int32{}, tags: []*string{}},
		{},
		{names: []string{"only"}, n: []int64{0}, m: []*int32{nil}, tags: []*string{nil}},
	}
}

func (r arrayRow) args() []any { return []any{r.names, r.n, r.m, r.tags} }

// show renders a row with NULL (nil slice or element) and {} (empty) told apart.
func (r arrayRow) show() string {
	slice := func(isNil bool, elems []string) string {
		if isNil {
			return "NULL"
		}
		return "{" + strings.Join(elems, ",") + "}"
	}
	var names, n, m, tags []string
	for _, s := range r.names {
		names = append(names, strconv.Quote(s))
	}
	for _, v := range r.n {
		n = append(n, strconv.FormatInt(v, 10))
	}
	for _, v := range r.m {
		m = append(m, orNull(v))
	}
	for _, v := range r.tags {
		if v == nil {
			tags = append(tags, "NULL")
		} else {
			tags = append(tags, strconv.Quote(*v))
		}
	}
	return fmt.Sprintf("names=%s n=%s m=%s tags=%s", slice(r.names == nil, names), slice(r.n == nil, n),
		slice(r.m == nil, m), slice(r.tags == nil, tags))
}

// readArrays reads id (or offset) and the array columns in key order.
func readArrays(t *testing.T, ctx context.Context, conn *pgx.Conn, sql string, mode pgx.QueryExecMode) ([]int64, []arrayRow) {
	t.Helper()
	rows, err := conn.Query(ctx, sql, mode)
	if err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	defer rows.Close()
	var keys []int64
	var got []arrayRow
	for rows.Next() {
		var key int64
		var r arrayRow
		if err := rows.Scan(&key, &r.names, &r.n, &r.m, &r.tags); err != nil {
			t.Fatalf("%s: scan: %v", sql, err)
		}
		keys = append(keys, key)
		got = append(got, r)
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return keys, got
}

func compareArrays(t *testing.T, what string, keys []int64, got []arrayRow, wantKeys []int64, want []arrayRow) {
	t.Helper()
	if !reflect.DeepEqual(keys, wantKeys) {
		t.Errorf("%s: keys %v, want %v", what, keys, wantKeys)
	}
	for i := 0; i < len(got) || i < len(want); i++ {
		var g, w string
		if i < len(got) {
			g = got[i].show()
		}
		if i < len(want) {
			w = want[i].show()
		}
		if g != w {
			t.Errorf("%s: row %d\n got %s\nwant %s", what, i, g, w)
		}
	}
}

const arrayColumns = "names text[], n int8[], m int4[], tags text[]"

func TestDriverArrayColumnsExec(t *testing.T) {
	ctx := driverContext(t)
	conn := connect(t, ctx, driverServer(t))
	want := arrayRows()
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeSimpleProtocol} {
		t.Run(mode.String(), func(t *testing.T) {
			table := uniqueStream("arr_t")
			stream := uniqueStream("arr_s")
			mustExec(t, ctx, conn, fmt.Sprintf("CREATE TABLE %s (id int8 PRIMARY KEY, %s)", table, arrayColumns))
			mustExec(t, ctx, conn, fmt.Sprintf("CREATE STREAM %s (%s)", stream, arrayColumns))
			var ids, offsets []int64
			for i, r := range want {
				id := int64(i + 1)
				tag, err := conn.Exec(ctx, fmt.Sprintf("INSERT INTO %s (id, names, n, m, tags) VALUES ($1, $2, $3, $4, $5)", table),
					append([]any{mode, id}, r.args()...)...)
				if err != nil || tag.String() != "INSERT 0 1" {
					t.Fatalf("insert row %d into the table: %q, %v", i, tag.String(), err)
				}
				if _, err := conn.Exec(ctx, fmt.Sprintf("INSERT INTO %s (names, n, m, tags) VALUES ($1, $2, $3, $4)", stream),
					append([]any{mode}, r.args()...)...); err != nil {
					t.Fatalf("insert row %d into the stream: %v", i, err)
				}
				ids = append(ids, id)
				offsets = append(offsets, int64(i))
			}
			for _, read := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeSimpleProtocol} {
				keys, got := readArrays(t, ctx, conn, fmt.Sprintf("SELECT id, names, n, m, tags FROM %s ORDER BY id", table), read)
				compareArrays(t, "table, read with "+read.String(), keys, got, ids, want)
				keys, got = readArrays(t, ctx, conn, fmt.Sprintf("SELECT offset, names, n, m, tags FROM %s ORDER BY offset", stream), read)
				compareArrays(t, "stream, read with "+read.String(), keys, got, offsets, want)
			}

			// UPDATE with slices, and a slice as the key's filter.
			tag, err := conn.Exec(ctx, fmt.Sprintf("UPDATE %s SET names = $1, m = $2 WHERE id = $3", table),
				mode, []string{"new", "x y"}, []*int32{nil, ptr(int32(5))}, int64(3))
			if err != nil || tag.String() != "UPDATE 1" {
				t.Fatalf("UPDATE with slices: %q, %v", tag.String(), err)
			}
			updated := arrayRows()
			updated[2].names = []string{"new", "x y"}
			updated[2].m = []*int32{nil, ptr(int32(5))}
			keys, got := readArrays(t, ctx, conn, fmt.Sprintf("SELECT id, names, n, m, tags FROM %s ORDER BY id", table), pgx.QueryExecModeCacheStatement)
			compareArrays(t, "table after UPDATE", keys, got, ids, updated)
		})
	}
}

func TestDriverArrayColumnsCopyFrom(t *testing.T) {
	ctx := driverContext(t)
	conn := connect(t, ctx, driverServer(t))
	stream := uniqueStream("arr_copied")
	mustExec(t, ctx, conn, fmt.Sprintf("CREATE STREAM %s (note text, %s)", stream, arrayColumns))
	want := arrayRows()
	var rows [][]any
	for _, r := range want {
		rows = append(rows, r.args())
	}
	// pgx.CopyFrom describes `SELECT names, n, m, tags FROM stream` for the
	// array types, then sends binary arrays in COPY ... FROM STDIN BINARY.
	n, err := conn.CopyFrom(ctx, pgx.Identifier{stream}, []string{"names", "n", "m", "tags"}, pgx.CopyFromRows(rows))
	if err != nil {
		t.Fatalf("CopyFrom: %v", err)
	}
	if n != int64(len(rows)) {
		t.Errorf("CopyFrom copied %d rows, want %d", n, len(rows))
	}
	// The columns in another order, with a scalar among them.
	n, err = conn.CopyFrom(ctx, pgx.Identifier{stream}, []string{"m", "note", "names"},
		pgx.CopyFromRows([][]any{{[]*int32{nil, ptr(int32(9))}, "second copy", []string{"p q"}}}))
	if err != nil || n != 1 {
		t.Fatalf("second CopyFrom: %d rows, %v", n, err)
	}
	want = append(want, arrayRow{names: []string{"p q"}, m: []*int32{nil, ptr(int32(9))}})
	offsets := []int64{0, 1, 2, 3, 4}
	for _, read := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeSimpleProtocol} {
		keys, got := readArrays(t, ctx, conn, fmt.Sprintf("SELECT offset, names, n, m, tags FROM %s ORDER BY offset", stream), read)
		compareArrays(t, "after CopyFrom, read with "+read.String(), keys, got, offsets, want)
	}
	noteRows, err := conn.Query(ctx, fmt.Sprintf("SELECT note FROM %s ORDER BY offset", stream))
	if err != nil {
		t.Fatal(err)
	}
	notes, err := pgx.CollectRows(noteRows, pgx.RowTo[*string])
	if err != nil {
		t.Fatal(err)
	}
	if len(notes) != 5 || notes[0] != nil || notes[4] == nil || *notes[4] != "second copy" {
		t.Errorf("notes = %v, want 4 NULLs then \"second copy\"", notes)
	}
}
