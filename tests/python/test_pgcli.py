"""pgcli against a real sluice server: the catalog queries its completion
refresher runs at startup (through pgcli's own PGExecute), completion of a
stream name, backslash commands, and the real `pgcli` program in a
pseudo-terminal."""

import os
import pathlib
import re
import shutil
import sys
import threading

import pexpect
import pytest
from pgcli.completion_refresher import CompletionRefresher
from pgcli.pgcompleter import PGCompleter
from pgcli.pgexecute import PGExecute
from pgspecial.main import PGSpecial
from prompt_toolkit.document import Document

TIMEOUT = 30  # seconds for any one wait
PGCLI = pathlib.Path(sys.executable).with_name("pgcli")
if not PGCLI.exists():
    PGCLI = pathlib.Path(shutil.which("pgcli") or PGCLI)
ORDERS_COLUMNS = [("offset", "bigint"), ("ts", "timestamp with time zone"),
                  ("customer", "text"), ("amount", "numeric"), ("note", "text")]
# A view over the stream, created with it: pgcli lists it among the views
# (and its columns among the view columns), the stream never.
ORDERS_VIEW = "big_orders"
ORDERS_VIEW_COLUMNS = [("offset", "bigint"), ("ts", "timestamp with time zone"),
                       ("customer", "text"), ("amount", "numeric")]


@pytest.fixture
def orders(conn):
    conn.execute("CREATE STREAM orders (customer text NOT NULL, amount numeric(12,2), note text)")
    with conn.cursor() as cur:
        cur.executemany("INSERT INTO orders (customer, amount, note) VALUES (%s, %s, %s)",
                        [("ann", 1, None), ("bob", 2, "gift"), ("cid", None, None)])
    conn.execute(f"CREATE VIEW {ORDERS_VIEW} AS SELECT offset, ts, customer, amount FROM orders "
                 "WHERE amount > 1")
    return "orders"


@pytest.fixture
def executor(sluice):
    executor = PGExecute(database="sluice", user="sluice", host="127.0.0.1", port=sluice.port,
                         connect_timeout=10)
    try:
        yield executor
    finally:
        executor.conn.close()


def completions(completer, text):
    document = Document(text=text, cursor_position=len(text))
    return [c.text for c in completer.get_completions(document, None)]


def test_pgexecute_connects_and_runs(executor, orders):
    assert executor.dbname == "sluice"
    assert executor.user == "sluice"
    assert executor.server_version
    assert not executor.is_virtual_database()
    assert executor.get_timezone()
    results = list(executor.run("SELECT count(*) FROM orders; SELECT customer FROM orders "
                                "WHERE offset = 1", pgspecial=PGSpecial()))
    assert [r[5] for r in results] == [True, True], "both statements succeeded"
    assert [list(r[1]) for r in results] == [[(3,)], [("bob",)]]


def _check_search_path(rows, _):
    assert "public" in rows
    assert "pg_catalog" in rows


def _check_schemata(rows, _):
    assert {"public", "pg_catalog", "information_schema"} <= set(rows)


def _check_tables(rows, stream):
    assert ("public", stream) in [tuple(r) for r in rows]
    assert ORDERS_VIEW not in [r[1] for r in rows]


def _check_views(rows, stream):
    assert ("public", ORDERS_VIEW) in [tuple(r) for r in rows]
    assert stream not in [r[1] for r in rows]


def _check_table_columns(rows, stream):
    columns = [(r[2], r[3]) for r in rows if tuple(r[:2]) == ("public", stream)]
    assert columns == ORDERS_COLUMNS
    has_default = {r[2]: r[4] for r in rows if tuple(r[:2]) == ("public", stream)}
    assert [has_default[c] for c in ("customer", "amount", "note")] == [False, False, False]


def _check_view_columns(rows, stream):
    columns = [(r[2], r[3]) for r in rows if tuple(r[:2]) == ("public", ORDERS_VIEW)]
    assert columns == ORDERS_VIEW_COLUMNS
    assert not any(r[4] for r in rows if tuple(r[:2]) == ("public", ORDERS_VIEW))
    assert stream not in [r[1] for r in rows]


def _check_databases(rows, _):
    assert "sluice" in rows


def _check_foreignkeys(rows, stream):
    assert stream not in [r.childtable for r in rows]


def _check_functions(rows, _):
    names = {(f.schema_name, f.func_name) for f in rows}
    assert ("pg_catalog", "now") in names
    assert ("pg_catalog", "count") in names


def _check_datatypes(rows, _):
    assert all(len(r) == 2 for r in rows)
    assert not any(r[0] == "pg_catalog" for r in rows)


# Every query the completion refresher runs, in its order.
METADATA = {
    "search_path": _check_search_path,
    "schemata": _check_schemata,
    "tables": _check_tables,
    "table_columns": _check_table_columns,
    "foreignkeys": _check_foreignkeys,
    "views": _check_views,
    "view_columns": _check_view_columns,
    "datatypes": _check_datatypes,
    "databases": _check_databases,
    "functions": _check_functions,
}


@pytest.mark.parametrize("method", list(METADATA))
def test_pgexecute_metadata(executor, orders, method):
    rows = list(getattr(executor, method)())
    METADATA[method](rows, orders)


def test_completion_refresher_offers_stream(executor, orders, monkeypatch):
    """pgcli's background refresh, as at startup; then completion of
    `SELECT * FROM ord` offers the stream, and its columns after WHERE."""
    done = threading.Event()
    refreshed = []
    failures = []

    def excepthook(args):
        failures.append(args.exc_value)
        done.set()

    monkeypatch.setattr(threading, "excepthook", excepthook)

    def callback(completer):
        refreshed.append(completer)
        done.set()

    CompletionRefresher().refresh(executor, PGSpecial(), callback, settings={})
    assert done.wait(TIMEOUT), f"completion refresh did not finish within {TIMEOUT}s"
    assert not failures, f"completion refresh failed: {failures[0]!r}"
    completer = refreshed[0]
    assert isinstance(completer, PGCompleter)

    assert "orders" in completions(completer, "SELECT * FROM ord")
    assert "customer" in completions(completer, "SELECT * FROM orders WHERE cust")
    # offset is a reserved word: pgcli offers it quoted.
    assert '"offset"' in completions(completer, "SELECT * FROM orders WHERE off")


def test_backslash_dt_lists_stream(executor, orders):
    [(title, rows, headers, status, *_)] = executor.run("\\dt", pgspecial=PGSpecial())
    rows = [tuple(r) for r in rows]
    assert [h.lower() for h in headers[:3]] == ["schema", "name", "type"]
    assert ("public", "orders", "table") in [r[:3] for r in rows]


def test_backslash_d_describes_stream(executor, orders):
    [(title, rows, headers, status, *_)] = executor.run("\\d orders", pgspecial=PGSpecial())
    columns = [(r[0], r[1]) for r in rows]
    assert columns == [("offset", "bigint"), ("ts", "timestamp with time zone"),
                       ("customer", "text"), ("amount", "numeric(12,2)"), ("note", "text")]
    modifiers = {r[0]: r[2] for r in rows}
    assert "not null" in modifiers["customer"]
    assert "not null" not in modifiers["note"]


def spawn_pgcli(sluice, tmp_path, tz="UTC"):
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    env = {
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / "config"),
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "TERM": "xterm",
        "LANG": "C.UTF-8",
        "PAGER": "cat",
        "TZ": tz,
        "PROMPT_TOOLKIT_NO_CPR": "1",
    }
    child = pexpect.spawn(
        str(PGCLI), ["-h", "127.0.0.1", "-p", str(sluice.port), "-U", "sluice", "-d", "sluice",
                     "--no-password"],
        env=env, dimensions=(40, 200), timeout=TIMEOUT, encoding="utf-8",
        codec_errors="replace")
    return child


PROMPT = r"sluice@127\.0\.0\.1:sluice>"
ANSI = re.compile(r"\x1b\[[0-9;?]*[a-zA-Z]")


def quit_pgcli(child):
    child.sendline("\\q")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def test_pgcli_terminal_query(sluice, orders, tmp_path):
    child = spawn_pgcli(sluice, tmp_path)
    try:
        child.expect(PROMPT)
        child.sendline("SELECT count(*) FROM orders;")
        child.expect(r"Time: \d")
        table = ANSI.sub("", child.before)
        child.expect(PROMPT)
        assert "SELECT 1" in table, table
        assert re.search(r"\|\s*count\s*\|", table), table
        assert re.search(r"\|\s*3\s*\|", table), table
        quit_pgcli(child)
    finally:
        child.close(force=True)


def test_pgcli_terminal_completion(sluice, orders, tmp_path):
    """Tab after `SELECT * FROM ord` completes the stream name once the
    background refresh is done; the refresh prints no traceback."""
    child = spawn_pgcli(sluice, tmp_path)
    transcript = []
    child.logfile_read = _Collect(transcript)
    try:
        child.expect(PROMPT)
        child.send("SELECT * FROM ord")
        completed = False
        for _ in range(20):  # the refresh runs in the background: retry for up to ~20s
            child.send("\t")
            if child.expect([r"orders", pexpect.TIMEOUT], timeout=1) == 0:
                completed = True
                break
        child.send("\x03")  # Ctrl-C clears the line
        child.expect(PROMPT)
        quit_pgcli(child)
    finally:
        child.close(force=True)
    output = ANSI.sub("", "".join(transcript))
    assert "Traceback" not in output, output
    assert completed, output


def test_pgcli_local_time_zone(sluice, orders, tmp_path):
    """With a local time zone that differs from the server's, pgcli runs
    `set time zone "Europe/Paris"` at startup."""
    child = spawn_pgcli(sluice, tmp_path, tz="Europe/Paris")
    try:
        child.expect(PROMPT)
        child.sendline("SHOW TimeZone;")
        child.expect(r"Time: \d")
        table = ANSI.sub("", child.before)
        child.expect(PROMPT)
        assert "Europe/Paris" in table, table
        quit_pgcli(child)
    finally:
        child.close(force=True)


class _Collect:
    def __init__(self, sink):
        self.sink = sink

    def write(self, data):
        self.sink.append(data)

    def flush(self):
        pass
