"""asyncpg against a real sluice server: extended protocol only, binary
parameters and results for every column, SQLSTATEs, transactions, and a pool
whose release resets the connection with
`SELECT pg_advisory_unlock_all(); CLOSE ALL; UNLISTEN *; RESET ALL;`."""

import asyncio
import json
from datetime import datetime
from decimal import Decimal

import asyncpg
import pytest
from typed_rows import (COLUMNS, EDGES_BACK, FULL_BACK, NULLS, TYPED_DDL, UTC, edges,
                        full)

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
