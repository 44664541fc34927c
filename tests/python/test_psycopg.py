"""psycopg 3 against a real sluice server: parameters of every type in text
and binary, results in text and binary, SQLSTATEs, transactions, COPY."""

from datetime import date, datetime
from decimal import Decimal
from uuid import UUID

import psycopg
import pytest
from psycopg import errors
from psycopg.types.json import Json, Jsonb
from typed_rows import (ARRAY_COLUMN_TYPES, ARRAY_COLUMNS, ARRAY_DECIMALS_BACK, ARRAY_ROWS,
                        COLUMNS, EDGES_BACK, FULL_BACK, NULLS, TYPED_DDL, UTC, edges, full)

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


ARRAY_INSERT = (f"INSERT INTO arr ({', '.join(['id'] + ARRAY_COLUMNS)}) "
                f"VALUES ({', '.join(['%s'] * 7)})")
ARRAY_SELECT = f"SELECT {', '.join(ARRAY_COLUMNS)} FROM arr ORDER BY id"


def decimal_texts(rows):
    """The numeric(6,2)[] column as text, for its scale."""
    d = ARRAY_COLUMNS.index("d")
    return [None if r[d] is None else [None if x is None else str(x) for x in r[d]]
            for r in rows]


@pytest.mark.parametrize("binary_params", [False, True], ids=["text-params", "binary-params"])
def test_array_columns_round_trip(conn, binary_params):
    """Python lists into the array columns of a table and a stream, as text
    (`%s`) or binary (`%b`) parameters, read back in text and in binary."""
    conn.execute(f"CREATE TABLE arr (id int PRIMARY KEY, {ARRAY_COLUMN_TYPES})")
    conn.execute(f"CREATE STREAM arr_s ({ARRAY_COLUMN_TYPES})")
    stream_insert = (f"INSERT INTO arr_s ({', '.join(ARRAY_COLUMNS)}) "
                     f"VALUES ({', '.join(['%s'] * 6)}) RETURNING offset")
    offsets = []
    with conn.cursor() as cur:
        for i, row in enumerate(ARRAY_ROWS, 1):
            cur.execute(ARRAY_INSERT, (i, *row), binary=binary_params)
            assert cur.rowcount == 1
            cur.execute(stream_insert, row, binary=binary_params)
            offsets.append(cur.fetchone()[0])
        # small ints go as int2[] (psycopg picks the narrowest type)
        cur.execute("UPDATE arr SET n = %s, tags = %s WHERE id = %s",
                    ([7, None], ["u v", None, ""], 3), binary=binary_params)
        assert cur.rowcount == 1
    assert offsets == [0, 1, 2, 3]

    updated = list(ARRAY_ROWS)
    updated[2] = (["u v", None, ""], [7, None], None, None, None, None)
    stream_select = f"SELECT {', '.join(ARRAY_COLUMNS)} FROM arr_s ORDER BY offset"
    for binary_results in (False, True):
        which = "binary results" if binary_results else "text results"
        with conn.cursor(binary=binary_results) as cur:
            table = cur.execute(ARRAY_SELECT).fetchall()
            stream = cur.execute(stream_select).fetchall()
        assert table == updated, which
        assert decimal_texts(table) == ARRAY_DECIMALS_BACK, which
        assert stream == ARRAY_ROWS, which
        assert decimal_texts(stream) == ARRAY_DECIMALS_BACK, which


def test_array_columns_text_output(conn):
    """The text form of array values is PostgreSQL's: elements quoted when
    they are empty, NULL, or hold spaces, quotes, commas, braces or
    backslashes (which are escaped)."""
    conn.execute(f"CREATE STREAM arr_txt ({ARRAY_COLUMN_TYPES})")
    with conn.cursor() as cur:
        cur.executemany(f"INSERT INTO arr_txt ({', '.join(ARRAY_COLUMNS)}) "
                        f"VALUES ({', '.join(['%b'] * 6)})", ARRAY_ROWS)
    conn.execute("SET TIME ZONE 'UTC'")
    cur = conn.execute(f"SELECT {', '.join(ARRAY_COLUMNS)} FROM arr_txt ORDER BY offset")
    # The values as sent, before psycopg parses them.
    result = cur.pgresult
    rows = [tuple(None if v is None else v.decode()
                  for v in (result.get_value(r, c) for c in range(result.nfields)))
            for r in range(result.ntuples)]
    assert rows[0] == (
        '{a,"b c","\\"q\\"","","NULL",NULL,"back\\\\slash","{x,y}","comma,here"," pad "}',
        "{1,NULL,-9223372036854775808,9223372036854775807}",
        "{1.5,NULL,-0.25,Infinity}",
        "{1.50,NULL,-9999.99,0.00}",
        "{t,NULL,f}",
        '{"2024-01-02 03:04:05.123456+00",NULL,"1970-01-01 00:00:00+00"}',
    )
    assert rows[1:] == [("{}",) * 6, (None,) * 6, ("{NULL}",) * 6]


def test_array_columns_copy_from_stdin(conn):
    """COPY of lists into a stream's array columns: text COPY (write_row), csv
    written by hand, and binary COPY (set_types)."""
    conn.execute(f"CREATE STREAM arr_c (note text, {ARRAY_COLUMN_TYPES})")
    cols = ", ".join(ARRAY_COLUMNS)
    with conn.cursor() as cur:
        with cur.copy(f"COPY arr_c ({cols}) FROM STDIN") as copy:
            for row in ARRAY_ROWS:
                copy.write_row(row)
        assert cur.rowcount == 4
        with cur.copy(f"COPY arr_c ({cols}) FROM STDIN WITH (FORMAT binary)") as copy:
            copy.set_types(["text[]", "int8[]", "float8[]", "numeric[]", "bool[]",
                            "timestamptz[]"])
            for row in ARRAY_ROWS:
                copy.write_row(row)
        assert cur.rowcount == 4
        with cur.copy("COPY arr_c (note, tags, n) FROM STDIN WITH (FORMAT csv)") as copy:
            copy.write(b'csv,"{a,""b c"",NULL,""NULL"",""x\\\\y""}","{1, 2 ,NULL}"\n'
                       b'csv empty,{},\n')
        assert cur.rowcount == 2
    rows = conn.execute(f"SELECT offset, note, {cols} FROM arr_c ORDER BY offset").fetchall()
    assert [r[0] for r in rows] == list(range(10))
    assert [r[2:] for r in rows[:8]] == ARRAY_ROWS + ARRAY_ROWS
    assert decimal_texts([r[2:] for r in rows[:8]]) == ARRAY_DECIMALS_BACK * 2
    assert [r[1] for r in rows[:8]] == [None] * 8
    assert rows[8][1:4] == ("csv", ["a", "b c", None, "NULL", "x\\y"], [1, 2, None])
    assert rows[9][1:4] == ("csv empty", [], None)


@pytest.mark.parametrize("sql,params,sqlstate", [
    ("CREATE TABLE arr_bad (tags text[] PRIMARY KEY)", None, "0A000"),
    ("CREATE TABLE arr_bad (id int PRIMARY KEY, tags text[] UNIQUE)", None, "0A000"),
    ("CREATE INDEX arr_tags ON arr (tags)", None, "0A000"),
    ("INSERT INTO arr (id, n) VALUES (1, %b)", ([[1, 2], [3, 4]],), "0A000"),
    ("INSERT INTO arr (id, tags) VALUES (1, '{{a,b},{c,d}}')", None, "0A000"),
    ("INSERT INTO arr (id, tags) VALUES (1, '{a,b')", None, "22P02"),
    ("INSERT INTO arr (id, n) VALUES (1, '{1,x}')", None, "22P02"),
    ("INSERT INTO arr (id, d) VALUES (1, %s)", ([Decimal("10000")],), "22003"),
], ids=["pk", "unique", "index", "binary-2d", "text-2d", "malformed", "bad-element",
        "numeric-overflow"])
def test_array_columns_refused(conn, sql, params, sqlstate):
    """Arrays are one-dimensional (a 2-D value, binary or text, is 0A000) and
    cannot be keys or indexed (0A000); malformed literals and bad elements
    fail as in PostgreSQL."""
    conn.execute(f"CREATE TABLE arr (id int PRIMARY KEY, {ARRAY_COLUMN_TYPES})")
    with pytest.raises(psycopg.Error) as info:
        conn.execute(sql, params)
    assert info.value.sqlstate == sqlstate, str(info.value)
    assert conn.execute("SELECT count(*) FROM arr").fetchone() == (0,)


OTHER_ARRAY_TYPES = ("i2 int2[], i4 int4[], f4 float4[], vc varchar(5)[], bin bytea[], "
                     "tsp timestamp[], day date[], doc json[], docb jsonb[], uid uuid[]")
OTHER_ARRAY_COLUMNS = ["i2", "i4", "f4", "vc", "bin", "tsp", "day", "doc", "docb", "uid"]
OTHER_ARRAYS = (
    [-32768, None, 32767], [-2147483648, 0, None], [1.5, None, -0.25], ["abcde", "", None, "a,b"],
    [b"\xde\xad\xbe\xef", b"", None, b"\\{\""],
    [datetime(2024, 1, 2, 3, 4, 5, 6), None, datetime(1999, 12, 31, 23, 59, 59, 500000)],
    [date(2024, 2, 29), None, date(1970, 1, 1)],
    [Json({"b": 1, "a": [1, 2]}), None, Json([])], [Jsonb({"b": 2, "a": 1}), None, Jsonb("s")],
    [UUID("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"), None, UUID(int=0)],
)
OTHER_ARRAYS_BACK = OTHER_ARRAYS[:7] + ([{"b": 1, "a": [1, 2]}, None, []], [{"a": 1, "b": 2}, None, "s"],
                                        OTHER_ARRAYS[9])


def other_arrays_read(cur, sql):
    return [tuple(None if v is None else [bytes(x) if isinstance(x, memoryview) else x for x in v]
                  for v in row) for row in cur.execute(sql).fetchall()]


@pytest.mark.parametrize("binary_params", [False, True], ids=["text-params", "binary-params"])
def test_array_columns_of_every_other_element_type(conn, binary_params):
    """int2/int4/float4/varchar/bytea/timestamp/date/json/jsonb/uuid arrays
    through text or binary parameters, read back in text and in binary."""
    conn.execute(f"CREATE TABLE arr_o (id int PRIMARY KEY, {OTHER_ARRAY_TYPES})")
    cols = ", ".join(OTHER_ARRAY_COLUMNS)
    with conn.cursor() as cur:
        cur.execute(f"INSERT INTO arr_o (id, {cols}) VALUES ({', '.join(['%s'] * 11)})",
                    (1, *OTHER_ARRAYS), binary=binary_params)
        cur.execute(f"INSERT INTO arr_o (id, {cols}) VALUES ({', '.join(['%s'] * 11)})",
                    (2, *([None] for _ in OTHER_ARRAY_COLUMNS)), binary=binary_params)
    for binary_results in (False, True):
        with conn.cursor(binary=binary_results) as cur:
            rows = other_arrays_read(cur, f"SELECT {cols} FROM arr_o ORDER BY id")
        assert rows == [OTHER_ARRAYS_BACK, ([None],) * 10], \
            "binary results" if binary_results else "text results"


def test_array_columns_of_every_other_element_type_copy(conn):
    """The same arrays through text and binary COPY into a stream."""
    conn.execute(f"CREATE STREAM arr_oc ({OTHER_ARRAY_TYPES})")
    cols = ", ".join(OTHER_ARRAY_COLUMNS)
    with conn.cursor() as cur:
        with cur.copy(f"COPY arr_oc ({cols}) FROM STDIN") as copy:
            copy.write_row(OTHER_ARRAYS)
        with cur.copy(f"COPY arr_oc ({cols}) FROM STDIN WITH (FORMAT binary)") as copy:
            copy.set_types(["int2[]", "int4[]", "float4[]", "varchar[]", "bytea[]",
                            "timestamp[]", "date[]", "json[]", "jsonb[]", "uuid[]"])
            copy.write_row(OTHER_ARRAYS)
    for binary_results in (False, True):
        with conn.cursor(binary=binary_results) as cur:
            rows = other_arrays_read(cur, f"SELECT {cols} FROM arr_oc ORDER BY offset")
        assert rows == [OTHER_ARRAYS_BACK, OTHER_ARRAYS_BACK], \
            "binary results" if binary_results else "text results"


def test_array_columns_copy_to_stdout(conn):
    """COPY ... TO STDOUT writes arrays in PostgreSQL's text form (escaped once
    more by COPY text, quoted once more by csv) and in binary."""
    conn.execute(f"CREATE STREAM arr_out ({ARRAY_COLUMN_TYPES})")
    conn.execute("SET TIME ZONE 'UTC'")
    cols = ", ".join(ARRAY_COLUMNS)
    with conn.cursor() as cur:
        cur.executemany(f"INSERT INTO arr_out ({cols}) VALUES ({', '.join(['%b'] * 6)})",
                        ARRAY_ROWS)

        def copy_out(options):
            with cur.copy(f"COPY arr_out ({cols}) TO STDOUT{options}") as copy:
                return b"".join(bytes(chunk) for chunk in copy)

        assert copy_out("") == (
            b'{a,"b c","\\\\"q\\\\"","","NULL",NULL,"back\\\\\\\\slash","{x,y}","comma,here",'
            b'" pad "}\t{1,NULL,-9223372036854775808,9223372036854775807}\t'
            b'{1.5,NULL,-0.25,Infinity}\t{1.50,NULL,-9999.99,0.00}\t{t,NULL,f}\t'
            b'{"2024-01-02 03:04:05.123456+00",NULL,"1970-01-01 00:00:00+00"}\n'
            b"{}\t{}\t{}\t{}\t{}\t{}\n"
            b"\\N\t\\N\t\\N\t\\N\t\\N\t\\N\n"
            b"{NULL}\t{NULL}\t{NULL}\t{NULL}\t{NULL}\t{NULL}\n")
        assert copy_out(" WITH (FORMAT csv)") == (
            b'"{a,""b c"",""\\""q\\"""","""",""NULL"",NULL,""back\\\\slash"",""{x,y}"",'
            b'""comma,here"","" pad ""}","{1,NULL,-9223372036854775808,9223372036854775807}",'
            b'"{1.5,NULL,-0.25,Infinity}","{1.50,NULL,-9999.99,0.00}","{t,NULL,f}",'
            b'"{""2024-01-02 03:04:05.123456+00"",NULL,""1970-01-01 00:00:00+00""}"\n'
            b"{},{},{},{},{},{}\n"
            b",,,,,\n"
            b"{NULL},{NULL},{NULL},{NULL},{NULL},{NULL}\n")
        with cur.copy(f"COPY arr_out ({cols}) TO STDOUT WITH (FORMAT binary)") as copy:
            copy.set_types(["text[]", "int8[]", "float8[]", "numeric[]", "bool[]",
                            "timestamptz[]"])
            rows = list(copy.rows())
    assert rows == ARRAY_ROWS
    assert decimal_texts(rows) == ARRAY_DECIMALS_BACK
