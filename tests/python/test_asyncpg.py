"""asyncpg against a real sluice server: extended protocol only, binary
parameters and results for every column, SQLSTATEs, transactions, and a pool
whose release resets the connection with
`SELECT pg_advisory_unlock_all(); CLOSE ALL; UNLISTEN *; RESET ALL;`."""

import asyncio
import json
from datetime import date, datetime
from decimal import Decimal
from uuid import UUID

import asyncpg
import pytest
from typed_rows import (ARRAY_COLUMN_TYPES, ARRAY_COLUMNS, ARRAY_DECIMALS_BACK, ARRAY_ROWS,
                        COLUMNS, EDGES_BACK, FULL_BACK, NULLS, TYPED_DDL, UTC, edges, full)

TIMEOUT = 30  # seconds, for every connect and every whole test body

PLACEHOLDERS = ", ".join(f"${i}" for i in range(1, 17))
INSERT = f"INSERT INTO typed ({', '.join(COLUMNS)}) VALUES ({PLACEHOLDERS})"
SELECT = f"SELECT offset, {', '.join(COLUMNS)} FROM typed ORDER BY offset"

# asyncpg exchanges json and jsonb as text (str) unless a codec is set.
FULL = full(json.dumps, json.dumps)
EDGES = edges(json.dumps, json.dumps)


def connect_kwargs(sluice):
    return dict(host="127.0.0.1", port=sluice.port, user="sluice", database="sluice",
                timeout=TIMEOUT, command_timeout=TIMEOUT)


def run(coro):
    async def bounded():
        return await asyncio.wait_for(coro, TIMEOUT)
    return asyncio.run(bounded())


def decoded(row):
    """Values as compared: json and jsonb text parsed (key order is not kept
    by jsonb)."""
    values = list(row.values())[1:]
    for i in (COLUMNS.index("doc"), COLUMNS.index("docb")):
        if values[i] is not None:
            values[i] = json.loads(values[i])
    return tuple(values)


def test_connect_and_server_version(sluice):
    async def body():
        conn = await asyncpg.connect(**connect_kwargs(sluice))
        try:
            version = conn.get_server_version()
            assert version.major >= 10
            assert conn.get_settings().client_encoding == "UTF8"
            assert await conn.fetchval("SELECT $1::int + 1", 41) == 42
        finally:
            await conn.close()
    run(body())


def test_every_type_round_trips(sluice):
    async def body():
        conn = await asyncpg.connect(**connect_kwargs(sluice))
        try:
            await conn.execute(TYPED_DDL)
            for row in (FULL, NULLS, EDGES):
                assert await conn.execute(INSERT, *row) == "INSERT 0 1"

            statement = await conn.prepare(SELECT)
            types = [(a.name, a.type.name) for a in statement.get_attributes()]
            rows = await statement.fetch()

            # executemany pipelines Bind/Execute for each row of one statement
            await conn.executemany(INSERT, [FULL, EDGES])
            count = await conn.fetchval("SELECT count(*) FROM typed WHERE offset >= $1", 3)
        finally:
            await conn.close()
        return types, rows, count

    types, rows, count = run(body())
    assert types == [("offset", "int8"), ("flag", "bool"), ("i2", "int2"), ("i4", "int4"),
                     ("i8", "int8"), ("f4", "float4"), ("f8", "float8"), ("num", "numeric"),
                     ("txt", "text"), ("vc", "varchar"), ("bin", "bytea"),
                     ("tstz", "timestamptz"), ("tsp", "timestamp"), ("day", "date"),
                     ("doc", "json"), ("docb", "jsonb"), ("id", "uuid")]
    assert [r["offset"] for r in rows] == [0, 1, 2]
    assert [decoded(r) for r in rows] == [FULL_BACK, NULLS, EDGES_BACK]
    assert str(rows[0]["num"]) == "12.500", "numeric(10,3) keeps its scale"
    assert count == 2


def test_parameters_in_where_and_select_star(sluice):
    async def body():
        conn = await asyncpg.connect(**connect_kwargs(sluice))
        try:
            await conn.execute(
                "CREATE STREAM orders (customer text NOT NULL, amount numeric(12,2), note text)")
            rows = await conn.fetch(
                "INSERT INTO orders (customer, amount, note) VALUES ($1, $2, $3), ($4, $5, $6) "
                "RETURNING offset, ts",
                "ann", Decimal("1.5"), None, "bob", Decimal("2"), "gift")
            assert [r["offset"] for r in rows] == [0, 1]
            assert all(r["ts"].tzinfo is not None for r in rows)
            star = await conn.fetch("SELECT * FROM orders WHERE offset > $1 AND customer = $2",
                                    0, "bob")
            ts_range = await conn.fetch(
                "SELECT customer FROM orders WHERE ts >= $1 ORDER BY offset",
                datetime(2000, 1, 1, tzinfo=UTC))
        finally:
            await conn.close()
        return star, ts_range

    star, ts_range = run(body())
    assert len(star) == 1
    assert list(star[0].keys()) == ["offset", "ts", "customer", "amount", "note"]
    assert (star[0]["offset"], star[0]["customer"], star[0]["amount"], star[0]["note"]) == (
        1, "bob", Decimal("2.00"), "gift")
    assert [r["customer"] for r in ts_range] == ["ann", "bob"]


def test_jsonb_codec(sluice):
    """`set_type_codec` looks the type up in pg_type, as many asyncpg users do
    to get dicts back for json/jsonb."""
    async def body():
        conn = await asyncpg.connect(**connect_kwargs(sluice))
        try:
            for name in ("json", "jsonb"):
                await conn.set_type_codec(name, schema="pg_catalog", encoder=json.dumps,
                                          decoder=json.loads, format="text")
            await conn.execute("CREATE STREAM docs (doc json, docb jsonb)")
            await conn.execute("INSERT INTO docs (doc, docb) VALUES ($1, $2)",
                               {"a": [1, 2]}, {"b": {"c": None}})
            return await conn.fetchrow("SELECT doc, docb FROM docs")
        finally:
            await conn.close()

    row = run(body())
    assert (row["doc"], row["docb"]) == ({"a": [1, 2]}, {"b": {"c": None}})


def test_sql_prepare_and_execute(sluice):
    """SQL's PREPARE/EXECUTE through the extended protocol: EXECUTE is
    described with its prepared statement's columns; an unknown name is
    26000."""
    async def body():
        conn = await asyncpg.connect(**connect_kwargs(sluice))
        try:
            await conn.execute("PREPARE plus (int, text) AS SELECT $1 + 1 AS x, $2 AS y")
            rows = await conn.fetch("EXECUTE plus(41, 'hi')")
            with pytest.raises(asyncpg.InvalidSQLStatementNameError):
                await conn.fetch("EXECUTE missing(1)")
            return rows
        finally:
            await conn.close()

    rows = run(body())
    assert [tuple(r) for r in rows] == [(42, "hi")]
    assert list(rows[0].keys()) == ["x", "y"]


def test_array_parameters(sluice):
    """Python lists go in as arrays (asyncpg introspects the array type with
    its own `$1::oid[]` query first, then sends binary arrays)."""
    async def body():
        conn = await asyncpg.connect(**connect_kwargs(sluice))
        try:
            await conn.execute("CREATE STREAM tagged (id int, tag text)")
            await conn.execute("INSERT INTO tagged VALUES (1, 'a'), (2, 'b c'), (3, 'd')")
            ints = await conn.fetchval("SELECT $1::int[]", [1, None, 7])
            texts = await conn.fetchval("SELECT $1::text[]", ["a", "b c", None, "NULL"])
            empty = await conn.fetchval("SELECT $1::bigint[]", [])
            ids = await conn.fetch(
                "SELECT id FROM tagged WHERE tag = ANY($1::text[]) ORDER BY id", ["b c", "d"])
            stmt = await conn.prepare("SELECT $1::int[]")
            oids = [t.oid for t in stmt.get_parameters()]
            return ints, texts, empty, [r["id"] for r in ids], oids
        finally:
            await conn.close()

    ints, texts, empty, ids, oids = run(body())
    assert ints == [1, None, 7]
    assert texts == ["a", "b c", None, "NULL"]
    assert empty == []
    assert ids == [2, 3]
    assert oids == [1007]


def array_values(record):
    """The array columns of a fetched record, lists as lists."""
    return tuple(record[c] for c in ARRAY_COLUMNS)


def decimal_texts(rows):
    return [None if r["d"] is None else [None if x is None else str(x) for x in r["d"]]
            for r in rows]


def test_array_columns_executemany_and_update(sluice):
    """executemany into a table and a stream with array columns (binary arrays
    in Bind), read back equal; UPDATE ... SET tags = $1 with a list."""
    insert_cols = ", ".join(ARRAY_COLUMNS)
    marks = ", ".join(f"${i}" for i in range(2, 8))

    async def body():
        conn = await asyncpg.connect(**connect_kwargs(sluice))
        try:
            await conn.execute(f"CREATE TABLE arr_t (id int PRIMARY KEY, {ARRAY_COLUMN_TYPES})")
            await conn.execute(f"CREATE STREAM arr_s ({ARRAY_COLUMN_TYPES})")
            await conn.executemany(f"INSERT INTO arr_t (id, {insert_cols}) VALUES ($1, {marks})",
                                   [(i, *row) for i, row in enumerate(ARRAY_ROWS, 1)])
            await conn.executemany(
                f"INSERT INTO arr_s ({insert_cols}) VALUES "
                f"({', '.join(f'${i}' for i in range(1, 7))})", ARRAY_ROWS)
            table = await conn.fetch(f"SELECT id, {insert_cols} FROM arr_t ORDER BY id")
            stream = await conn.fetch(f"SELECT offset, {insert_cols} FROM arr_s ORDER BY offset")

            updated = [
                await conn.execute("UPDATE arr_t SET tags = $1 WHERE id = $2",
                                   ["new", None, "x y", ""], 1),
                await conn.execute("UPDATE arr_t SET n = $1, tags = $2 WHERE id = $3",
                                   [7, None], [], 3),
                await conn.execute("UPDATE arr_t SET tags = $1 WHERE id = $2", None, 2),
            ]
            after = await conn.fetch("SELECT id, tags, n FROM arr_t ORDER BY id")
            found = await conn.fetchval("SELECT id FROM arr_t WHERE tags = $1",
                                        ["new", None, "x y", ""])
            return table, stream, updated, after, found
        finally:
            await conn.close()

    table, stream, updated, after, found = run(body())
    assert [r["id"] for r in table] == [1, 2, 3, 4]
    assert [array_values(r) for r in table] == ARRAY_ROWS
    assert decimal_texts(table) == ARRAY_DECIMALS_BACK
    assert [r["offset"] for r in stream] == [0, 1, 2, 3]
    assert [array_values(r) for r in stream] == ARRAY_ROWS
    assert decimal_texts(stream) == ARRAY_DECIMALS_BACK
    assert updated == ["UPDATE 1", "UPDATE 1", "UPDATE 1"]
    assert [tuple(r) for r in after] == [
        (1, ["new", None, "x y", ""], [1, None, -2**63, 2**63 - 1]),
        (2, None, []),
        (3, [], [7, None]),
        (4, [None], [None]),
    ]
    assert found == 1


def test_array_columns_copy_records_to_table(sluice):
    """copy_records_to_table (binary COPY, every column) into a table."""
    async def body():
        conn = await asyncpg.connect(**connect_kwargs(sluice))
        try:
            await conn.execute(f"CREATE TABLE arr_ct (id int PRIMARY KEY, {ARRAY_COLUMN_TYPES})")
            status = await conn.copy_records_to_table(
                "arr_ct", records=[(i, *row) for i, row in enumerate(ARRAY_ROWS, 1)])
            table = await conn.fetch(
                f"SELECT id, {', '.join(ARRAY_COLUMNS)} FROM arr_ct ORDER BY id")
            return status, table
        finally:
            await conn.close()

    status, table = run(body())
    assert status == "COPY 4"
    assert [r["id"] for r in table] == [1, 2, 3, 4]
    assert [array_values(r) for r in table] == ARRAY_ROWS
    assert decimal_texts(table) == ARRAY_DECIMALS_BACK


def test_array_columns_copy_records_to_stream(sluice):
    """copy_records_to_table (binary COPY) into a stream: columns=[...] names
    its user columns (offset and ts are the stream's own), in any order."""
    async def body():
        conn = await asyncpg.connect(**connect_kwargs(sluice))
        try:
            await conn.execute(f"CREATE STREAM arr_cs (note text, {ARRAY_COLUMN_TYPES})")
            statuses = [
                await conn.copy_records_to_table(
                    "arr_cs", records=ARRAY_ROWS, columns=ARRAY_COLUMNS),
                await conn.copy_records_to_table(
                    "arr_cs", records=[(["only", None], "tags row")], columns=["tags", "note"]),
            ]
            stream = await conn.fetch(
                f"SELECT offset, note, {', '.join(ARRAY_COLUMNS)} FROM arr_cs ORDER BY offset")
            return statuses, stream
        finally:
            await conn.close()

    statuses, stream = run(body())
    assert statuses == ["COPY 4", "COPY 1"]
    assert [r["offset"] for r in stream] == [0, 1, 2, 3, 4]
    assert [array_values(r) for r in stream] == ARRAY_ROWS + [
        (["only", None], None, None, None, None, None)]
    assert [r["note"] for r in stream] == [None, None, None, None, "tags row"]
    assert decimal_texts(stream) == ARRAY_DECIMALS_BACK + [None]


# The other element types, one array column each.
OTHER_ARRAY_TYPES = ("i2 int2[], i4 int4[], f4 float4[], vc varchar(5)[], bin bytea[], "
                     "tsp timestamp[], day date[], doc json[], docb jsonb[], id uuid[]")
OTHER_ARRAY_COLUMNS = ["i2", "i4", "f4", "vc", "bin", "tsp", "day", "doc", "docb", "id"]
OTHER_ARRAYS = (
    [-32768, None, 32767], [-2147483648, 0, None], [1.5, None, -0.25], ["abcde", "", None, "a,b"],
    [b"\xde\xad\xbe\xef", b"", None, b"\\"],
    [datetime(2024, 1, 2, 3, 4, 5, 6), None, datetime(1999, 12, 31, 23, 59, 59, 500000)],
    [date(2024, 2, 29), None, date(1970, 1, 1)],
    ['{"b": 1, "a": [1, 2]}', None, "[]"], ['{"b": 2, "a": 1}', None, '"s"'],
    [UUID("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"), None, UUID(int=0)],
)
OTHER_ARRAYS_BACK = OTHER_ARRAYS[:8] + (['{"a": 1, "b": 2}', None, '"s"'],) + OTHER_ARRAYS[9:]


def test_array_columns_of_every_other_element_type(sluice):
    """int2/int4/float4/varchar/bytea/timestamp/date/json/jsonb/uuid arrays,
    through Bind (executemany) and binary COPY (copy_records_to_table)."""
    cols = ", ".join(OTHER_ARRAY_COLUMNS)

    async def body():
        conn = await asyncpg.connect(**connect_kwargs(sluice))
        try:
            await conn.execute(f"CREATE STREAM arr_other ({OTHER_ARRAY_TYPES})")
            await conn.executemany(
                f"INSERT INTO arr_other ({cols}) VALUES "
                f"({', '.join(f'${i}' for i in range(1, 11))})",
                [OTHER_ARRAYS, (None,) * 10])
            await conn.copy_records_to_table("arr_other", records=[OTHER_ARRAYS],
                                             columns=OTHER_ARRAY_COLUMNS)
            return await conn.fetch(f"SELECT offset, {cols} FROM arr_other ORDER BY offset")
        finally:
            await conn.close()

    rows = run(body())
    assert [r["offset"] for r in rows] == [0, 1, 2]
    assert [tuple(r)[1:] for r in rows] == [OTHER_ARRAYS_BACK, (None,) * 10, OTHER_ARRAYS_BACK]


SQLSTATE_CASES = [
    ("SELECT * FROM no_such_stream", (), asyncpg.UndefinedTableError, "42P01"),
    ("SELECT no_such_column FROM orders", (), asyncpg.UndefinedColumnError, "42703"),
    ("SELEC 1", (), asyncpg.PostgresSyntaxError, "42601"),
    ("INSERT INTO orders (customer, amount) VALUES ($1, $2)", (None, Decimal(1)),
     asyncpg.NotNullViolationError, "23502"),
    ("UPDATE orders SET amount = $1", (Decimal(0),), asyncpg.FeatureNotSupportedError, "0A000"),
    ("DELETE FROM orders WHERE customer = $1", ("a",),
     asyncpg.FeatureNotSupportedError, "0A000"),
]


@pytest.mark.parametrize("sql,params,error,sqlstate", SQLSTATE_CASES,
                         ids=[c[3] + ":" + c[0].split()[0] for c in SQLSTATE_CASES])
def test_sqlstates(sluice, sql, params, error, sqlstate):
    async def body():
        conn = await asyncpg.connect(**connect_kwargs(sluice))
        try:
            await conn.execute(
                "CREATE STREAM orders (customer text NOT NULL, amount numeric(12,2), note text)")
            with pytest.raises(error) as info:
                await conn.execute(sql, *params)
            # The connection is still usable and nothing was appended.
            assert await conn.fetchval("SELECT count(*) FROM orders") == 0
            return info.value
        finally:
            await conn.close()

    exc = run(body())
    assert exc.sqlstate == sqlstate
    if sqlstate == "0A000":
        assert "append-only" in exc.message


def test_transaction(sluice):
    async def body():
        conn = await asyncpg.connect(**connect_kwargs(sluice))
        other = await asyncpg.connect(**connect_kwargs(sluice))
        try:
            await conn.execute("CREATE STREAM t (body text)")

            async def bodies():
                return [r[0] for r in await other.fetch("SELECT body FROM t ORDER BY offset")]

            async with conn.transaction():
                assert conn.is_in_transaction()
                await conn.execute("INSERT INTO t (body) VALUES ($1)", "a")
                await conn.execute("INSERT INTO t (body) VALUES ($1), ($2)", "b", "c")
                assert await bodies() == [], "uncommitted rows are invisible to other sessions"
            assert not conn.is_in_transaction()
            assert await bodies() == ["a", "b", "c"]

            with pytest.raises(ZeroDivisionError):
                async with conn.transaction():
                    await conn.execute("INSERT INTO t (body) VALUES ($1)", "rolled back")
                    1 / 0
            assert not conn.is_in_transaction()
            assert await bodies() == ["a", "b", "c"]

            with pytest.raises(asyncpg.UndefinedTableError):
                async with conn.transaction():
                    await conn.execute("INSERT INTO t (body) VALUES ($1)", "lost")
                    await conn.execute("INSERT INTO nowhere VALUES (1)")
            assert await bodies() == ["a", "b", "c"]

            # Explicit isolation options are accepted (BEGIN ISOLATION LEVEL ...).
            async with conn.transaction(isolation="serializable"):
                await conn.execute("INSERT INTO t (body) VALUES ($1)", "d")
            async with conn.transaction(isolation="repeatable_read", readonly=True):
                assert await conn.fetchval("SELECT count(*) FROM t") == 4

            # A manually driven transaction object.
            tx = conn.transaction()
            await tx.start()
            await conn.execute("INSERT INTO t (body) VALUES ($1)", "discarded")
            await tx.rollback()
            return await bodies(), await conn.fetchval("SELECT max(offset) FROM t")
        finally:
            await conn.close()
            await other.close()

    assert run(body()) == (["a", "b", "c", "d"], 3)


def test_executemany_is_one_transaction(sluice):
    """executemany pipelines one Bind/Execute per row and a single Sync, which
    PostgreSQL runs as one implicit transaction: a row that fails (here NOT
    NULL, 23502) appends none of the others, before or after it."""
    async def body():
        conn = await asyncpg.connect(**connect_kwargs(sluice))
        other = await asyncpg.connect(**connect_kwargs(sluice))
        try:
            await conn.execute("CREATE STREAM many (body text NOT NULL, n bigint)")
            insert = "INSERT INTO many (body, n) VALUES ($1, $2)"

            async def rows():
                return [tuple(r) for r in
                        await other.fetch("SELECT offset, body FROM many ORDER BY offset")]

            await conn.executemany(insert, [("k0", 0), ("k1", 1), ("k2", 2)])
            assert await rows() == [(0, "k0"), (1, "k1"), (2, "k2")]

            with pytest.raises(asyncpg.NotNullViolationError) as info:
                await conn.executemany(insert, [("u0", 10), ("u1", 11), (None, 12), ("u3", 13)])
            assert info.value.sqlstate == "23502"
            assert not conn.is_in_transaction()
            assert await rows() == [(0, "k0"), (1, "k1"), (2, "k2")]

            # A longer batch failing on its last row.
            with pytest.raises(asyncpg.NotNullViolationError):
                await conn.executemany(insert, [(f"x{i}", i) for i in range(200)] + [(None, -1)])
            assert await rows() == [(0, "k0"), (1, "k1"), (2, "k2")]

            # The connection is usable and offsets stay gapless.
            assert await conn.fetchval(insert + " RETURNING offset", "after", 3) == 3
            assert await rows() == [(0, "k0"), (1, "k1"), (2, "k2"), (3, "after")]
        finally:
            await conn.close()
            await other.close()

    run(body())


def test_pool_acquire_release(sluice):
    """Each release runs the reset query; the connection must come back
    usable, with the session state it had at connect."""
    async def body():
        pool = await asyncpg.create_pool(min_size=1, max_size=2, **connect_kwargs(sluice))
        try:
            async with pool.acquire() as conn:
                await conn.execute("CREATE STREAM p (n integer)")
                default_tz = await conn.fetchval("SHOW TimeZone")
            for n in range(6):
                async with pool.acquire() as conn:
                    await conn.execute("SET TIME ZONE 'Asia/Tokyo'")
                    await conn.execute("INSERT INTO p (n) VALUES ($1)", n)
                    assert await conn.fetchval("SELECT count(*) FROM p") == n + 1
            # Two at once: the pool grows to max_size.
            first = await pool.acquire()
            second = await pool.acquire()
            try:
                assert first is not second
                counts = await asyncio.gather(first.fetchval("SELECT count(*) FROM p"),
                                              second.fetchval("SELECT sum(n) FROM p"))
                assert counts == [6, 15]
                zones = {await first.fetchval("SHOW TimeZone"),
                         await second.fetchval("SHOW TimeZone")}
                assert zones == {default_tz}, "RESET ALL on release restores settings"
            finally:
                await pool.release(first)
                await pool.release(second)
            assert pool.get_size() == 2
            assert pool.get_idle_size() == 2
            # A released connection that was inside a transaction is rolled back.
            conn = await pool.acquire()
            tx = conn.transaction()
            await tx.start()
            await conn.execute("INSERT INTO p (n) VALUES ($1)", 100)
            await pool.release(conn)
            async with pool.acquire() as conn:
                assert not conn.is_in_transaction()
                return await conn.fetchval("SELECT count(*) FROM p WHERE n = $1", 100)
        finally:
            await asyncio.wait_for(pool.close(), TIMEOUT)

    assert run(body()) == 0
