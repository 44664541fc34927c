"""psycopg 3 against a real sluice server: parameters of every type in text
and binary, results in text and binary, SQLSTATEs, transactions, COPY."""

from datetime import datetime
from decimal import Decimal
from uuid import UUID

import psycopg
import pytest
from psycopg import errors
from psycopg.types.json import Json, Jsonb
from typed_rows import (COLUMNS, EDGES_BACK, FULL_BACK, NULLS, TYPED_DDL, UTC, edges,
                        full)

INSERT = f"INSERT INTO typed ({', '.join(COLUMNS)}) VALUES ({', '.join(['%s'] * 16)}) RETURNING offset"
SELECT = f"SELECT {', '.join(COLUMNS)} FROM typed ORDER BY offset"

FULL = full(Json, Jsonb)
EDGES = edges(Json, Jsonb)


def read_back(conn, binary: bool):
    with conn.cursor(binary=binary) as cur:
        cur.execute(SELECT)
        return [tuple(bytes(v) if isinstance(v, memoryview) else v for v in row)
                for row in cur.fetchall()]


@pytest.mark.parametrize("binary_params", [False, True], ids=["text-params", "binary-params"])
def test_every_type_round_trips(conn, binary_params):
    conn.execute(TYPED_DDL)
    offsets = []
    with conn.cursor() as cur:
        for row in (FULL, NULLS, EDGES):
            cur.execute(INSERT, row, binary=binary_params)
            offsets.append(cur.fetchone()[0])
    assert offsets == [0, 1, 2]

    expected = [FULL_BACK, NULLS, EDGES_BACK]
    assert read_back(conn, binary=False) == expected, "text results"
    assert read_back(conn, binary=True) == expected, "binary results"


def test_select_star_columns(conn):
    conn.execute(TYPED_DDL)
    cur = conn.execute("SELECT * FROM typed")
    names = [d.name for d in cur.description]
    types = [conn.adapters.types.get(d.type_code).name for d in cur.description]
    assert names == ["offset", "ts"] + COLUMNS
    assert types == ["int8", "timestamptz", "bool", "int2", "int4", "int8", "float4", "float8",
                     "numeric", "text", "varchar", "bytea", "timestamptz", "timestamp", "date",
                     "json", "jsonb", "uuid"]


def test_returning_offsets_across_prepared_statements(conn):
    """psycopg switches to a named prepared statement after 5 runs."""
    conn.execute("CREATE STREAM notes (body text, n integer)")
    with conn.cursor() as cur:
        for n in range(12):
            cur.execute("INSERT INTO notes VALUES (%s, %s), (%s, %s) RETURNING offset, ts",
                        ("a", n, "b", n))
            rows = cur.fetchall()
            assert [r[0] for r in rows] == [2 * n, 2 * n + 1]
            assert all(r[1].tzinfo is not None for r in rows)
    count = conn.execute("SELECT count(*), max(offset) FROM notes WHERE n >= %s", (6,)).fetchone()
    assert count == (12, 23)


SQLSTATE_CASES = [
    ("SELECT * FROM no_such_stream", None, errors.UndefinedTable, "42P01"),
    ("SELECT no_such_column FROM orders", None, errors.UndefinedColumn, "42703"),
    ("SELEC 1", None, errors.SyntaxError, "42601"),
    ("INSERT INTO orders (customer, amount) VALUES ('a', 'abc')", None,
     errors.InvalidTextRepresentation, "22P02"),
    ("INSERT INTO orders (customer, code) VALUES (%s, %s)", (None, "x"),
     errors.NotNullViolation, "23502"),
    ("INSERT INTO orders (customer, code) VALUES (%s, %s)", ("a", "abcd"),
     errors.StringDataRightTruncation, "22001"),
    ("CREATE STREAM orders (x integer)", None, errors.DuplicateTable, "42P07"),
    ("UPDATE orders SET amount = 0", None, errors.FeatureNotSupported, "0A000"),
    ("DELETE FROM orders", None, errors.FeatureNotSupported, "0A000"),
]


@pytest.mark.parametrize("sql,params,error,sqlstate", SQLSTATE_CASES,
                         ids=[c[3] + ":" + c[0].split()[0] for c in SQLSTATE_CASES])
def test_sqlstates(conn, sql, params, error, sqlstate):
    conn.execute("CREATE STREAM orders (customer text NOT NULL, amount numeric(12,2), code varchar(3))")
    with pytest.raises(error) as info:
        conn.execute(sql, params)
    assert info.value.sqlstate == sqlstate
    if sqlstate == "0A000":
        assert "append-only" in str(info.value)
    # The connection is still usable and nothing was appended.
    assert conn.execute("SELECT count(*) FROM orders").fetchone() == (0,)


def test_transaction_commit_and_rollback(sluice, conn):
    conn.execute("CREATE STREAM t (body text)")

    def bodies():
        return [r[0] for r in conn.execute("SELECT body FROM t ORDER BY offset")]

    with sluice.connect() as writer:  # not autocommit: psycopg sends BEGIN
        writer.execute("INSERT INTO t VALUES (%s)", ("a",))
        writer.execute("INSERT INTO t VALUES (%s), (%s)", ("b", "c"))
        assert bodies() == [], "uncommitted rows are invisible to other sessions"
        writer.commit()
        assert bodies() == ["a", "b", "c"]

        writer.execute("INSERT INTO t VALUES (%s)", ("rolled back",))
        writer.rollback()
        assert bodies() == ["a", "b", "c"]

        with pytest.raises(errors.UndefinedTable):
            writer.execute("INSERT INTO t VALUES ('lost')")
            writer.execute("INSERT INTO nowhere VALUES (1)")
        writer.rollback()
        assert bodies() == ["a", "b", "c"]

    with conn.transaction():
        conn.execute("INSERT INTO t VALUES (%s)", ("d",))
    with conn.transaction():
        conn.execute("INSERT INTO t VALUES (%s)", ("discarded",))
        raise psycopg.Rollback()
    assert bodies() == ["a", "b", "c", "d"]
    assert conn.execute("INSERT INTO t VALUES ('e') RETURNING offset").fetchone() == (4,)


def test_copy_from_stdin(conn):
    conn.execute("CREATE STREAM c (customer text NOT NULL, amount numeric(12,2), note text)")
    with conn.cursor() as cur:
        with cur.copy("COPY c FROM STDIN") as copy:
            copy.write_row(("ann", Decimal("1.50"), None))
            copy.write_row(("bob", 2, "tab\there, newline\nthere"))
        assert cur.rowcount == 2
        with cur.copy("COPY c (note, customer) FROM STDIN") as copy:
            copy.write_row(("n1", "cid"))
        with cur.copy("COPY c FROM STDIN WITH (FORMAT csv)") as copy:
            copy.write(b'dee,3.25,"quoted, with comma"\neve,,""\n')
        with pytest.raises(errors.InvalidTextRepresentation):
            with cur.copy("COPY c FROM STDIN") as copy:
                copy.write_row(("fay", "1", None))
                copy.write_row(("gus", "not-a-number", None))
    rows = conn.execute("SELECT offset, customer, amount, note FROM c ORDER BY offset").fetchall()
    assert rows == [
        (0, "ann", Decimal("1.50"), None),
        (1, "bob", Decimal("2.00"), "tab\there, newline\nthere"),
        (2, "cid", None, "n1"),
        (3, "dee", Decimal("3.25"), "quoted, with comma"),
        (4, "eve", None, ""),
    ]


def test_binary_copy_from_stdin(conn):
    conn.execute("CREATE STREAM b (id uuid, n bigint, at timestamptz)")
    at = datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC)
    with conn.cursor() as cur:
        with cur.copy("COPY b (id, n, at) FROM STDIN WITH (FORMAT binary)") as copy:
            copy.set_types(["uuid", "int8", "timestamptz"])
            copy.write_row((UUID(int=1), 1, at))
            copy.write_row((UUID(int=2), None, at))
    rows = conn.execute("SELECT offset, id, n, at FROM b ORDER BY offset").fetchall()
    assert rows == [(0, UUID(int=1), 1, at), (1, UUID(int=2), None, at)]


@pytest.mark.parametrize("binary_results", [False, True], ids=["text-results", "binary-results"])
def test_array_parameters_in_binary(conn, binary_results):
    """`%b` sends a Python list as a binary array (int4[] / text[], with NULLs and
    quoting-worthy text); the server reads it and answers the same list."""
    with conn.cursor(binary=binary_results) as cur:
        cur.execute("SELECT %b::int[], %b::text[], %b::bigint[]",
                    ([1, None, -7], ["a", None, 'q"u,o{te}', ""], [2**40]))
        assert cur.fetchone() == ([1, None, -7], ["a", None, 'q"u,o{te}', ""], [2**40])
        cur.execute("SELECT cardinality(%b::int[]), %b::text[] IS NULL", ([4, 5, 6], None))
        assert cur.fetchone() == (3, True)
