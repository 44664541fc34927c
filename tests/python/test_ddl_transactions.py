"""DDL inside transaction blocks, as client libraries send it: the CREATE
TABLE (or DROP TABLE) in a block commits with the block's writes, or goes
with them when the block rolls back.

- psycopg 3: `with conn.transaction():` around CREATE TABLE and writes; an
  exception inside rolls all of it back (the table does not exist after),
  no exception commits it; a nested `conn.transaction()` (a savepoint)
  undoes only its own DDL; an SQL error in the block undoes the DDL before
  it;
- SQLAlchemy 2 (psycopg 3 and psycopg2): `metadata.create_all(conn)` inside
  `engine.begin()` (its checkfirst query runs in the block), then Core
  inserts; an exception inside leaves nothing (`has_table` is False after),
  none commits the table with its rows; `drop_all` in a block that rolls
  back leaves the table;
- asyncpg: `async with conn.transaction():` around CREATE TABLE and
  inserts (simple and extended protocol, executemany); an exception inside
  leaves nothing, none commits.

Each test uses its own table names and runs on a fresh server.
"""

import asyncio

import asyncpg
import pytest
import sqlalchemy as sa
from psycopg import errors
from psycopg.pq import TransactionStatus

TIMEOUT = 30  # seconds, for every asyncpg connect and whole asyncpg test body
USER = "sluice"
DATABASE = "sluice"


class Boom(Exception):
    """Raised inside a transaction block to make the client roll it back."""


def table_count(conn, name: str) -> int:
    """How many tables called `name` the catalog shows to psycopg `conn`."""
    return conn.execute(
        f"SELECT count(*) FROM information_schema.tables WHERE table_name = '{name}'"
    ).fetchone()[0]


# ---------------------------------------------------------------- psycopg 3

def test_psycopg_exception_rolls_back_create_table(conn):
    with pytest.raises(Boom):
        with conn.transaction():
            conn.execute("CREATE TABLE dt_py_gone (id int PRIMARY KEY, v text)")
            conn.execute("INSERT INTO dt_py_gone VALUES (%s, %s), (%s, %s)", (1, "a", 2, "b"))
            conn.execute("UPDATE dt_py_gone SET v = %s WHERE id = %s", ("B", 2))
            # the block sees its own table and rows
            assert conn.execute("SELECT id, v FROM dt_py_gone ORDER BY id").fetchall() == \
                [(1, "a"), (2, "B")]
            raise Boom()
    assert conn.info.transaction_status == TransactionStatus.IDLE
    assert table_count(conn, "dt_py_gone") == 0
    with pytest.raises(errors.UndefinedTable):
        conn.execute("SELECT * FROM dt_py_gone")
    # the name is free again
    conn.execute("CREATE TABLE dt_py_gone (other text)")
    assert conn.execute("SELECT count(*) FROM dt_py_gone").fetchone() == (0,)


def test_psycopg_transaction_commits_create_table(sluice, conn):
    with conn.transaction():
        conn.execute("CREATE TABLE dt_py_kept (id int PRIMARY KEY, v text)")
        with conn.cursor() as cur:
            cur.executemany("INSERT INTO dt_py_kept VALUES (%s, %s)", [(1, "a"), (2, "b"), (3, "c")])
        conn.execute("DELETE FROM dt_py_kept WHERE id = %s", (3,))
        assert conn.execute("SELECT count(*) FROM dt_py_kept").fetchone() == (2,)
        # another session sees nothing of the block before COMMIT
        with sluice.connect(autocommit=True) as other:
            assert table_count(other, "dt_py_kept") == 0
            with pytest.raises(errors.UndefinedTable):
                other.execute("SELECT * FROM dt_py_kept")
    with sluice.connect(autocommit=True) as other:
        assert table_count(other, "dt_py_kept") == 1
        assert other.execute("SELECT id, v FROM dt_py_kept ORDER BY id").fetchall() == \
            [(1, "a"), (2, "b")]
        # an ordinary table now, its key included
        with pytest.raises(errors.UniqueViolation):
            other.execute("INSERT INTO dt_py_kept VALUES (1, 'dup')")


def test_psycopg_savepoint_undoes_only_its_own_ddl(conn):
    with conn.transaction():
        conn.execute("CREATE TABLE dt_py_outer (id int PRIMARY KEY)")
        conn.execute("INSERT INTO dt_py_outer VALUES (1)")
        with pytest.raises(Boom):
            with conn.transaction():  # SAVEPOINT ... ROLLBACK TO SAVEPOINT
                conn.execute("CREATE TABLE dt_py_inner (id int PRIMARY KEY)")
                conn.execute("INSERT INTO dt_py_inner VALUES (1)")
                conn.execute("DROP TABLE dt_py_outer")
                with pytest.raises(errors.UndefinedTable):
                    with conn.transaction():  # a savepoint around the expected error
                        conn.execute("SELECT * FROM dt_py_outer")
                raise Boom()
        # the DROP is undone, the outer table and its row are back
        assert conn.execute("SELECT id FROM dt_py_outer").fetchall() == [(1,)]
        with conn.transaction():  # a released savepoint keeps its DDL
            conn.execute("CREATE TABLE dt_py_released (v text)")
            conn.execute("INSERT INTO dt_py_released VALUES ('kept')")
    assert conn.info.transaction_status == TransactionStatus.IDLE
    assert table_count(conn, "dt_py_outer") == 1
    assert table_count(conn, "dt_py_inner") == 0
    assert conn.execute("SELECT id FROM dt_py_outer").fetchall() == [(1,)]
    assert conn.execute("SELECT v FROM dt_py_released").fetchall() == [("kept",)]


def test_psycopg_error_in_block_undoes_its_ddl(conn):
    conn.execute("CREATE TABLE dt_py_taken (id int)")
    with pytest.raises(errors.DuplicateTable):
        with conn.transaction():
            conn.execute("CREATE TABLE dt_py_first (id int)")
            conn.execute("INSERT INTO dt_py_first VALUES (1)")
            conn.execute("CREATE TABLE dt_py_taken (id int)")
    assert conn.info.transaction_status == TransactionStatus.IDLE
    assert table_count(conn, "dt_py_first") == 0
    assert table_count(conn, "dt_py_taken") == 1


# ---------------------------------------------------------------- SQLAlchemy

ITEMS = [{"id": 1, "name": "ann"}, {"id": 2, "name": "bob"}, {"id": 3, "name": "cid"}]


def items_table(name):
    """A table with an application-supplied integer key (no SERIAL: no
    sequence) and a varchar column."""
    metadata = sa.MetaData()
    table = sa.Table(
        name, metadata,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("name", sa.String(32)),
    )
    return metadata, table


def sqlstate(orig):
    """The SQLSTATE of a DBAPI error from psycopg 3 or psycopg2."""
    return getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None)


def test_sqlalchemy_exception_rolls_back_create_all(engine):
    metadata, items = items_table("dt_sa_gone")
    with pytest.raises(Boom):
        with engine.begin() as connection:
            metadata.create_all(connection)  # checkfirst: has_table, then CREATE TABLE
            connection.execute(items.insert(), ITEMS)
            assert connection.scalar(sa.select(sa.func.count()).select_from(items)) == 3
            raise Boom()
    assert not sa.inspect(engine).has_table("dt_sa_gone")
    with engine.connect() as connection:
        with pytest.raises(sa.exc.ProgrammingError) as err:
            connection.execute(sa.select(items))
        assert sqlstate(err.value.orig) == "42P01"


def test_sqlalchemy_begin_commits_create_all(engine):
    metadata, items = items_table("dt_sa_kept")
    with engine.begin() as connection:
        metadata.create_all(connection)
        connection.execute(items.insert(), ITEMS)
        connection.execute(items.update().where(items.c.id == 2).values(name="BOB"))
    inspector = sa.inspect(engine)
    assert inspector.has_table("dt_sa_kept")
    assert [c["name"] for c in inspector.get_columns("dt_sa_kept")] == ["id", "name"]
    with engine.connect() as connection:
        rows = connection.execute(
            sa.select(items.c.id, items.c.name).order_by(items.c.id)).fetchall()
    assert [tuple(r) for r in rows] == [(1, "ann"), (2, "BOB"), (3, "cid")]

    # checkfirst sees the committed table: a second create_all creates nothing
    metadata.create_all(engine)

    # drop_all in a block that fails leaves the table and its rows
    with pytest.raises(Boom):
        with engine.begin() as connection:
            metadata.drop_all(connection)
            raise Boom()
    assert sa.inspect(engine).has_table("dt_sa_kept")
    with engine.connect() as connection:
        assert connection.scalar(sa.select(sa.func.count()).select_from(items)) == 3


# ---------------------------------------------------------------- asyncpg

def connect_kwargs(sluice):
    return dict(host="127.0.0.1", port=sluice.port, user=USER, database=DATABASE,
                timeout=TIMEOUT, command_timeout=TIMEOUT)


def run(coro):
    async def bounded():
        return await asyncio.wait_for(coro, TIMEOUT)
    return asyncio.run(bounded())


async def async_table_count(conn, name: str) -> int:
    return await conn.fetchval(
        f"SELECT count(*) FROM information_schema.tables WHERE table_name = '{name}'")


def test_asyncpg_exception_rolls_back_create_table(sluice):
    async def body():
        conn = await asyncpg.connect(**connect_kwargs(sluice))
        try:
            with pytest.raises(Boom):
                async with conn.transaction():
                    await conn.execute("CREATE TABLE dt_apg_gone (id int PRIMARY KEY, v text)")
                    await conn.execute("INSERT INTO dt_apg_gone VALUES ($1, $2)", 1, "a")
                    await conn.executemany("INSERT INTO dt_apg_gone VALUES ($1, $2)",
                                           [(2, "b"), (3, "c")])
                    assert await conn.fetchval("SELECT count(*) FROM dt_apg_gone") == 3
                    raise Boom()
            assert not conn.is_in_transaction()
            assert await async_table_count(conn, "dt_apg_gone") == 0
            with pytest.raises(asyncpg.exceptions.UndefinedTableError):
                await conn.fetch("SELECT id, v FROM dt_apg_gone")
        finally:
            await conn.close()
    run(body())


def test_asyncpg_transaction_commits_create_table(sluice):
    async def body():
        conn = await asyncpg.connect(**connect_kwargs(sluice))
        other = await asyncpg.connect(**connect_kwargs(sluice))
        try:
            async with conn.transaction():
                await conn.execute("CREATE TABLE dt_apg_kept (id int PRIMARY KEY, v text)")
                await conn.executemany("INSERT INTO dt_apg_kept VALUES ($1, $2)",
                                       [(1, "a"), (2, "b")])
                await conn.execute("UPDATE dt_apg_kept SET v = $1 WHERE id = $2", "B", 2)
                assert await async_table_count(other, "dt_apg_kept") == 0
            rows = await other.fetch("SELECT id, v FROM dt_apg_kept ORDER BY id")
            assert [tuple(r) for r in rows] == [(1, "a"), (2, "B")]
            assert await async_table_count(other, "dt_apg_kept") == 1
        finally:
            await other.close()
            await conn.close()
    run(body())
