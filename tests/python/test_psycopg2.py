"""psycopg2 against a real sluice server: client-side interpolated parameters
of every type over the simple protocol, SQLSTATEs, the implicit BEGIN of its
default (non-autocommit) mode, and `connection.reset()`."""

from decimal import Decimal

import psycopg2
import psycopg2.errors
import psycopg2.extensions
import psycopg2.extras
import pytest
from psycopg2.extras import Json
from typed_rows import (COLUMNS, EDGES_BACK, FULL_BACK, NULLS, TYPED_DDL, edges,
                        full)

INSERT = f"INSERT INTO typed ({', '.join(COLUMNS)}) VALUES ({', '.join(['%s'] * 16)})"
SELECT = f"SELECT offset, {', '.join(COLUMNS)} FROM typed ORDER BY offset"

FULL = full(Json, Json)
EDGES = edges(Json, Json)
ORDERS_DDL = "CREATE STREAM orders (customer text NOT NULL, amount numeric(12,2), note text)"


def connect(sluice, **kwargs):
    connection = psycopg2.connect(sluice.conninfo, **kwargs)
    psycopg2.extras.register_uuid(conn_or_curs=connection)
    return connection


@pytest.fixture
def pg2(sluice):
    """A psycopg2 connection in its default mode: the first statement of
    each transaction is preceded by BEGIN; commit() / rollback() end it."""
    connection = connect(sluice)
    try:
        yield connection
    finally:
        connection.close()


@pytest.fixture
def pg2_autocommit(sluice):
    connection = connect(sluice)
    connection.autocommit = True
    try:
        yield connection
    finally:
        connection.close()


def fetch(connection, sql, params=None):
    with connection.cursor() as cur:
        cur.execute(sql, params)
        return cur.fetchall()


def test_connect_reports_server_settings(pg2):
    assert pg2.server_version >= 100000
    assert pg2.get_parameter_status("DateStyle").startswith("ISO")
    assert pg2.get_parameter_status("client_encoding") == "UTF8"
    assert pg2.get_parameter_status("standard_conforming_strings") == "on"
    assert pg2.get_parameter_status("integer_datetimes") == "on"
    assert fetch(pg2, "SELECT 1 + %s", (1,)) == [(2,)]
    pg2.commit()


def test_every_type_round_trips(pg2):
    with pg2.cursor() as cur:
        cur.execute(TYPED_DDL)
        pg2.commit()
        for row in (FULL, NULLS, EDGES):
            cur.execute(INSERT, row)
            assert cur.rowcount == 1
        pg2.commit()

        cur.execute(SELECT)
        rows = [tuple(bytes(v) if isinstance(v, memoryview) else v for v in row)
                for row in cur.fetchall()]
        oids = [d.type_code for d in cur.description]
    pg2.commit()

    assert [r[0] for r in rows] == [0, 1, 2]
    assert [r[1:] for r in rows] == [FULL_BACK, NULLS, EDGES_BACK]
    # numeric(10,3) keeps its scale; Decimal equality alone would not show it.
    assert str(rows[0][7]) == "12.500"
    # int8, then bool int2 int4 int8 float4 float8 numeric text varchar bytea
    # timestamptz timestamp date json jsonb uuid.
    assert oids == [20, 16, 21, 23, 20, 700, 701, 1700, 25, 1043, 17, 1184, 1114, 1082,
                    114, 3802, 2950]


def test_select_star_lists_system_columns_first(pg2_autocommit):
    with pg2_autocommit.cursor() as cur:
        cur.execute(ORDERS_DDL)
        cur.execute("INSERT INTO orders (customer, amount) VALUES (%s, %s), (%s, %s)",
                    ("ann", Decimal("1.50"), "bob", 2))
        cur.execute("SELECT * FROM orders WHERE offset > %s", (0,))
        names = [d.name for d in cur.description]
        oids = [d.type_code for d in cur.description]
        rows = cur.fetchall()
    assert names == ["offset", "ts", "customer", "amount", "note"]
    assert oids == [20, 1184, 25, 1700, 25]
    assert len(rows) == 1
    offset, ts, customer, amount, note = rows[0]
    assert (offset, customer, amount, note) == (1, "bob", Decimal("2.00"), None)
    assert ts.tzinfo is not None


def test_string_literals_are_quoted_correctly(pg2):
    """psycopg2 interpolates parameters into the SQL text: quotes are doubled
    ('it''s'), backslashes stay literal (standard_conforming_strings=on)."""
    values = ["it's", "''", "back\\slash \\' and \\n", "multi\nline\ttab",
              "caf\u00e9 \u2603 \U0001f600", "$$dollar$$", "--not a comment", "/* nor this */"]
    with pg2.cursor() as cur:
        cur.execute("CREATE STREAM s (txt text, vc varchar(5), bin bytea, doc jsonb)")
        pg2.commit()
        for v in values:
            cur.execute("INSERT INTO s (txt, bin, doc) VALUES (%s, %s, %s)",
                        (v, v.encode(), Json({"k": v})))
        cur.execute("INSERT INTO s (vc, bin) VALUES (%s, %s)", ("d'\u00e9\\x", b"\x00'\\\""))
        pg2.commit()
        cur.execute("SELECT txt, bin, doc FROM s WHERE vc IS NULL ORDER BY offset")
        rows = [(t, bytes(b), d) for t, b, d in cur.fetchall()]
        assert rows == [(v, v.encode(), {"k": v}) for v in values]
        cur.execute("SELECT vc, bin FROM s WHERE vc IS NOT NULL")
        assert [(vc, bytes(b)) for vc, b in cur.fetchall()] == [("d'\u00e9\\x", b"\x00'\\\"")]
        cur.execute("SELECT count(*) FROM s WHERE txt = %s", ("it's",))
        assert cur.fetchone() == (1,)
    pg2.commit()


SQLSTATE_CASES = [
    ("SELECT * FROM no_such_stream", None, psycopg2.errors.UndefinedTable, "42P01"),
    ("SELECT no_such_column FROM orders", None, psycopg2.errors.UndefinedColumn, "42703"),
    ("SELEC 1", None, psycopg2.errors.SyntaxError, "42601"),
    ("INSERT INTO orders (customer, amount) VALUES (%s, %s)", ("a", "abc"),
     psycopg2.errors.InvalidTextRepresentation, "22P02"),
    ("INSERT INTO orders (customer, amount) VALUES (%s, %s)", (None, 1),
     psycopg2.errors.NotNullViolation, "23502"),
    ("UPDATE orders SET amount = %s", (0,), psycopg2.errors.FeatureNotSupported, "0A000"),
    ("DELETE FROM orders WHERE customer = %s", ("a",),
     psycopg2.errors.FeatureNotSupported, "0A000"),
]


@pytest.mark.parametrize("sql,params,error,sqlstate", SQLSTATE_CASES,
                         ids=[c[3] + ":" + c[0].split()[0] for c in SQLSTATE_CASES])
def test_sqlstates(pg2, sql, params, error, sqlstate):
    with pg2.cursor() as cur:
        cur.execute(ORDERS_DDL)
        pg2.commit()
        with pytest.raises(error) as info:
            cur.execute(sql, params)
        assert info.value.pgcode == sqlstate
        assert info.value.diag.sqlstate == sqlstate
        assert info.value.pgerror.startswith("ERROR:")
        if sqlstate == "0A000":
            assert "append-only" in info.value.diag.message_primary
        # The failed statement aborted the implicit transaction.
        assert pg2.info.transaction_status == psycopg2.extensions.TRANSACTION_STATUS_INERROR
        pg2.rollback()
        assert pg2.info.transaction_status == psycopg2.extensions.TRANSACTION_STATUS_IDLE
        cur.execute("SELECT count(*) FROM orders")
        assert cur.fetchone() == (0,)
    pg2.commit()


def test_transaction_commit_and_rollback(pg2, pg2_autocommit):
    with pg2_autocommit.cursor() as cur:
        cur.execute("CREATE STREAM t (body text)")

    def bodies():
        return [r[0] for r in fetch(pg2_autocommit, "SELECT body FROM t ORDER BY offset")]

    idle = psycopg2.extensions.TRANSACTION_STATUS_IDLE
    in_transaction = psycopg2.extensions.TRANSACTION_STATUS_INTRANS
    with pg2.cursor() as cur:
        assert pg2.info.transaction_status == idle
        cur.execute("INSERT INTO t (body) VALUES (%s)", ("a",))  # preceded by BEGIN
        assert pg2.info.transaction_status == in_transaction
        cur.execute("INSERT INTO t (body) VALUES (%s), (%s)", ("b", "c"))
        assert bodies() == [], "uncommitted rows are invisible to other sessions"
        pg2.commit()
        assert pg2.info.transaction_status == idle
        assert bodies() == ["a", "b", "c"]

        cur.execute("INSERT INTO t (body) VALUES (%s)", ("rolled back",))
        pg2.rollback()
        assert bodies() == ["a", "b", "c"]

        # A failed statement poisons the transaction until ROLLBACK.
        cur.execute("INSERT INTO t (body) VALUES ('lost')")
        with pytest.raises(psycopg2.errors.UndefinedTable):
            cur.execute("INSERT INTO nowhere VALUES (1)")
        with pytest.raises(psycopg2.errors.InFailedSqlTransaction) as info:
            cur.execute("SELECT 1")
        assert info.value.pgcode == "25P02"
        pg2.rollback()
        assert bodies() == ["a", "b", "c"]

    # `with connection:` commits on success and rolls back on an exception.
    with pg2:
        with pg2.cursor() as cur:
            cur.execute("INSERT INTO t (body) VALUES (%s)", ("d",))
    with pytest.raises(ZeroDivisionError):
        with pg2:
            with pg2.cursor() as cur:
                cur.execute("INSERT INTO t (body) VALUES (%s)", ("discarded",))
                1 / 0
    assert bodies() == ["a", "b", "c", "d"]

    assert fetch(pg2_autocommit, "SELECT max(offset) FROM t") == [(3,)]


def test_transaction_reads_its_own_appends(pg2, pg2_autocommit):
    """As in PostgreSQL, a transaction sees the rows it has written."""
    with pg2_autocommit.cursor() as cur:
        cur.execute("CREATE STREAM t (body text)")
        cur.execute("INSERT INTO t (body) VALUES ('a')")
    with pg2.cursor() as cur:
        cur.execute("INSERT INTO t (body) VALUES (%s)", ("b",))
        cur.execute("SELECT body FROM t")
        assert sorted(r[0] for r in cur.fetchall()) == ["a", "b"]
    pg2.commit()
    assert fetch(pg2_autocommit, "SELECT offset, body FROM t ORDER BY offset") == [
        (0, "a"), (1, "b")]


def test_explicit_isolation_level(pg2):
    pg2.set_session(isolation_level="SERIALIZABLE", readonly=False)
    assert fetch(pg2, "SELECT 1") == [(1,)]
    pg2.commit()
    pg2.set_session(isolation_level="REPEATABLE READ", readonly=True)
    assert fetch(pg2, "SELECT 2") == [(2,)]
    pg2.commit()


def test_reset_discards_session_state(pg2):
    """reset() outside a transaction sends DISCARD ALL."""
    default = fetch(pg2, "SHOW TimeZone")[0][0]
    with pg2.cursor() as cur:
        cur.execute("SET TIME ZONE 'Asia/Tokyo'")
    pg2.commit()
    assert fetch(pg2, "SHOW TimeZone") == [("Asia/Tokyo",)]
    pg2.commit()

    pg2.reset()

    assert pg2.info.transaction_status == psycopg2.extensions.TRANSACTION_STATUS_IDLE
    assert fetch(pg2, "SHOW TimeZone") == [(default,)]
    assert fetch(pg2, "SELECT 40 + %s", (2,)) == [(42,)]
    pg2.commit()


def test_reset_inside_transaction_rolls_back(pg2, pg2_autocommit):
    """reset() inside a transaction sends ABORT, then DISCARD ALL."""
    with pg2_autocommit.cursor() as cur:
        cur.execute("CREATE STREAM t (body text)")
    with pg2.cursor() as cur:
        cur.execute("INSERT INTO t (body) VALUES (%s)", ("kept",))
        pg2.commit()
        cur.execute("INSERT INTO t (body) VALUES (%s)", ("abandoned",))
    assert pg2.info.transaction_status == psycopg2.extensions.TRANSACTION_STATUS_INTRANS

    pg2.reset()

    assert pg2.info.transaction_status == psycopg2.extensions.TRANSACTION_STATUS_IDLE
    assert fetch(pg2, "SELECT body FROM t ORDER BY offset") == [("kept",)]
    pg2.commit()
    assert fetch(pg2_autocommit, "SELECT body FROM t ORDER BY offset") == [("kept",)]
