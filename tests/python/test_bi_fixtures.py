"""Replays the introspection SQL of Grafana, Metabase, DBeaver and Superset
(tests/fixtures/bi/*.sql, format in tests/fixtures/bi/README.md) against a real
sluice server, one test per query (`grafana-3` is the third query of
grafana.sql), and checks each query's `-- expect:` lines.

Queries go over the simple query protocol exactly as written in the fixture,
after the `{{...}}` placeholders are filled in. With `SLUICE_REF_DSN` set (a
libpq conninfo of a real PostgreSQL) the same fixtures are also replayed there
(`ref-grafana-3`), with table `orders` emulating the stream; that keeps the
fixtures honest.
"""

import os
import pathlib
import re
import time
from dataclasses import dataclass, field

import psycopg
import pytest
from psycopg import pq

from conftest import SluiceServer, sluice_binary

FIXTURES = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "bi"
TOOLS = ("grafana", "metabase", "dbeaver", "superset")
DIRECTIVE = re.compile(r"^-- (source|expect|note):\s?(.*)$")
PLACEHOLDER = re.compile(r"\{\{([a-z]+)(?::([A-Za-z0-9_.]+))?\}\}")

STREAM_DDL = "CREATE STREAM orders (customer text NOT NULL, amount numeric(12,2), note text)"
TABLE_DDL = ('CREATE TABLE orders ("offset" bigint NOT NULL, ts timestamptz NOT NULL, '
             "customer text NOT NULL, amount numeric(12,2), note text)")
ROWS = [("ann", "10.50", "first"), ("bob", "20.00", None)]


@dataclass
class Fixture:
    id: str
    source: str
    sql: str
    expects: list = field(default_factory=list)
    notes: list = field(default_factory=list)


def parse_fixture_file(path: pathlib.Path, tool: str) -> list:
    """Blocks end at a line that is exactly `-- end`. In a block, text before
    the first `-- source:` line is commentary; the directive lines follow it;
    everything after them is the SQL, sent verbatim (outer blank lines aside)."""
    fixtures = []
    chunk = []
    lines = path.read_text().split("\n")
    for lineno, line in enumerate(lines, 1):
        if line.rstrip() != "-- end":
            chunk.append(line)
            continue
        starts = [i for i, l in enumerate(chunk) if l.startswith("-- source:")]
        if not starts:
            raise ValueError(f"{path}:{lineno}: block without `-- source:`")
        body = chunk[starts[0]:]
        fixture = Fixture(id=f"{tool}-{len(fixtures) + 1}", source="", sql="")
        while body and DIRECTIVE.match(body[0]):
            kind, value = DIRECTIVE.match(body[0]).groups()
            if kind == "source":
                fixture.source = value
            elif kind == "expect":
                fixture.expects.append(value.strip())
            else:
                fixture.notes.append(value)
            body = body[1:]
        fixture.sql = "\n".join(body).strip("\n")
        if not fixture.sql.strip():
            raise ValueError(f"{path}:{lineno}: block without SQL")
        if not fixture.expects:
            raise ValueError(f"{path}:{lineno}: block without `-- expect:`")
        for expect in fixture.expects:
            if not (expect == "ok" or re.fullmatch(r"rows>=\d+", expect)
                    or expect.startswith("contains:")):
                raise ValueError(f"{path}:{lineno}: unknown expectation {expect!r}")
        fixtures.append(fixture)
        chunk = []
    leftover = [l for l in chunk if l.strip() and not l.startswith("--")]
    if leftover:
        raise ValueError(f"{path}: SQL after the last `-- end`")
    return fixtures


ALL = [f for tool in TOOLS for f in parse_fixture_file(FIXTURES / f"{tool}.sql", tool)]


# ----------------------------------------------------------------- placeholders

RESOLVERS = {
    # namespace oid, as the tools read it from pg_namespace
    "oid_schema": "SELECT oid FROM pg_catalog.pg_namespace WHERE nspname = '{0}'",
    # relation oid, as the tools read it from pg_class
    "oid_table": ("SELECT c.oid FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n "
                  "ON n.oid = c.relnamespace WHERE n.nspname = '{0}' AND c.relname = '{1}'"),
}


def run_simple(conn: psycopg.Connection, sql: str):
    """Runs `sql` as one simple Query message; returns the last PGresult."""
    return conn.pgconn.exec_(sql.encode())


def error_text(res) -> str:
    sqlstate = res.error_field(pq.DiagnosticField.SQLSTATE)
    message = (res.error_message or b"").decode(errors="replace").strip()
    return f"[{sqlstate.decode() if sqlstate else '?'}] {message}"


class Unresolved(Exception):
    pass


def resolve(conn: psycopg.Connection, text: str, fallback_oid: "str | None" = None) -> str:
    """Fills in the placeholders. An oid that cannot be looked up raises
    `Unresolved`, or becomes `fallback_oid` when one is given."""
    def fill(match):
        kind, arg = match.groups()
        if kind == "database":
            return conn.info.dbname
        if kind == "oid":
            parts = arg.split(".")
            query = (RESOLVERS["oid_schema"].format(*parts) if len(parts) == 1
                     else RESOLVERS["oid_table"].format(*parts))
            res = run_simple(conn, query)
            if res.status != pq.ExecStatus.TUPLES_OK or res.ntuples != 1:
                if fallback_oid is not None:
                    return fallback_oid
                detail = error_text(res) if res.status == pq.ExecStatus.FATAL_ERROR \
                    else f"{res.ntuples} rows"
                raise Unresolved(f"cannot resolve {match.group(0)} with `{query}`: {detail}")
            return res.get_value(0, 0).decode()
        raise ValueError(f"unknown placeholder {match.group(0)}")
    return PLACEHOLDER.sub(fill, text)


# ----------------------------------------------------------------- checks

def check(fixture: Fixture, conn: psycopg.Connection) -> None:
    try:
        sql = resolve(conn, fixture.sql)
    except Unresolved as unresolved:
        # Still run the query (oid 0) so the failure also shows its own error.
        res = run_simple(conn, resolve(conn, fixture.sql, fallback_oid="0"))
        own = error_text(res) if res.status == pq.ExecStatus.FATAL_ERROR \
            else f"no error ({pq.ExecStatus(res.status).name})"
        pytest.fail(f"{fixture.id} failed: {unresolved}\n  with oid 0 the query itself gives: {own}\n"
                    f"  source: {fixture.source}")
    res = run_simple(conn, sql)
    first_line = sql.strip().splitlines()[0][:120]
    if res.status == pq.ExecStatus.FATAL_ERROR:
        pytest.fail(f"{fixture.id} failed: {error_text(res)}\n  query: {first_line}\n"
                    f"  source: {fixture.source}")
    assert res.status in (pq.ExecStatus.TUPLES_OK, pq.ExecStatus.COMMAND_OK,
                          pq.ExecStatus.EMPTY_QUERY), \
        f"{fixture.id}: unexpected result status {pq.ExecStatus(res.status).name}"
    cells = set()
    if res.status == pq.ExecStatus.TUPLES_OK:
        for row in range(res.ntuples):
            for col in range(res.nfields):
                value = res.get_value(row, col)
                if value is not None:
                    cells.add(value.decode())
    for expect in fixture.expects:
        expect = resolve(conn, expect)
        if expect == "ok":
            continue
        if expect.startswith("rows>="):
            wanted = int(expect[len("rows>="):])
            rows = res.ntuples if res.status == pq.ExecStatus.TUPLES_OK else 0
            assert rows >= wanted, f"{fixture.id}: {rows} rows, expected at least {wanted}"
        elif expect.startswith("contains:"):
            wanted = expect[len("contains:"):]
            sample = sorted(cells)[:20]
            assert wanted in cells, \
                f"{fixture.id}: no cell equals {wanted!r}; {len(cells)} distinct cells, e.g. {sample}"


# ----------------------------------------------------------------- servers

def wait_for_binary(timeout: float = 60) -> None:
    """The binary may be replaced by a rebuild while the suite runs."""
    path = pathlib.Path(os.environ["SLUICE_BIN"]) if os.environ.get("SLUICE_BIN") else None
    deadline = time.monotonic() + timeout
    while path is not None and not path.is_file() and time.monotonic() < deadline:
        time.sleep(1)
    sluice_binary()


@pytest.fixture(scope="module")
def bi_sluice(tmp_path_factory):
    wait_for_binary()
    data_dir = tmp_path_factory.mktemp("bi") / "data"
    data_dir.mkdir()
    server = SluiceServer(data_dir)
    server.start()
    try:
        with server.connect(autocommit=True) as conn:
            conn.execute(STREAM_DDL)
            conn.execute("INSERT INTO orders (customer, amount, note) VALUES (%s, %s, %s), (%s, %s, %s)",
                         [v for row in ROWS for v in row])
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def ref_dsn():
    dsn = os.environ.get("SLUICE_REF_DSN")
    if not dsn:
        pytest.skip("SLUICE_REF_DSN is not set")
    with psycopg.connect(dsn, autocommit=True) as conn:
        exists = conn.execute("SELECT to_regclass('public.orders') IS NOT NULL").fetchone()[0]
        if not exists:
            conn.execute(TABLE_DDL)
            conn.execute("INSERT INTO orders VALUES (0, now(), %s, %s, %s), (1, now(), %s, %s, %s)",
                         [v for row in ROWS for v in row])
    return dsn


@pytest.mark.parametrize("fixture", ALL, ids=[f.id for f in ALL])
def test_bi_query(bi_sluice, fixture):
    with bi_sluice.connect(autocommit=True) as conn:
        check(fixture, conn)


@pytest.mark.parametrize("fixture", ALL, ids=[f"ref-{f.id}" for f in ALL])
def test_bi_query_reference(ref_dsn, fixture):
    with psycopg.connect(ref_dsn, autocommit=True) as conn:
        check(fixture, conn)
