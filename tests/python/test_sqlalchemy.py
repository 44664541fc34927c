"""SQLAlchemy 2 (with psycopg 3 and with psycopg2) and pandas against a real
sluice server: dialect initialisation on connect, the inspector (table names,
columns, has_table, reflection), Core select/insert on a stream, read_sql."""

from datetime import datetime
from decimal import Decimal

import pandas as pd
import pytest
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

ORDERS_DDL = "CREATE STREAM orders (customer text NOT NULL, amount numeric(12,2), note text)"
ORDERS = [("ann", Decimal("1.50"), None), ("bob", Decimal("2.00"), "gift"),
          ("cid", None, "no amount")]


@pytest.fixture
def orders(conn):
    """The `orders` stream with three rows, written with psycopg 3."""
    conn.execute(ORDERS_DDL)
    with conn.cursor() as cur:
        cur.executemany("INSERT INTO orders (customer, amount, note) VALUES (%s, %s, %s)", ORDERS)
    return "orders"


def orders_table(metadata=None):
    """`orders` declared by hand, as an application would without reflection."""
    return sa.Table(
        "orders", metadata or sa.MetaData(),
        sa.Column("offset", sa.BigInteger, nullable=False),
        sa.Column("ts", sa.DateTime(timezone=True), nullable=False),
        sa.Column("customer", sa.Text, nullable=False),
        sa.Column("amount", sa.Numeric(12, 2)),
        sa.Column("note", sa.Text),
    )


def test_connect(engine):
    """connect() runs the dialect's first-connect queries (version(),
    current_schema(), standard_conforming_strings, isolation level, ...)."""
    with engine.connect() as connection:
        assert connection.scalar(sa.text("SELECT 1")) == 1
        assert engine.dialect.server_version_info >= (10,)
        assert engine.dialect.default_schema_name == "public"
        assert connection.get_isolation_level() in (
            "READ COMMITTED", "REPEATABLE READ", "SERIALIZABLE")


def test_inspector_table_names(engine, orders):
    inspector = sa.inspect(engine)
    assert "public" in inspector.get_schema_names()
    assert orders in inspector.get_table_names()
    assert orders in inspector.get_table_names(schema="public")
    assert orders not in inspector.get_view_names()


def test_inspector_get_columns(engine, orders):
    columns = sa.inspect(engine).get_columns(orders)
    assert [c["name"] for c in columns] == ["offset", "ts", "customer", "amount", "note"]
    by_name = {c["name"]: c for c in columns}

    assert isinstance(by_name["offset"]["type"], sa.BigInteger)
    assert isinstance(by_name["ts"]["type"], sa.DateTime)
    assert by_name["ts"]["type"].timezone is True
    assert isinstance(by_name["customer"]["type"], sa.Text)
    assert isinstance(by_name["amount"]["type"], sa.Numeric)
    assert (by_name["amount"]["type"].precision, by_name["amount"]["type"].scale) == (12, 2)
    assert isinstance(by_name["note"]["type"], sa.Text)

    assert [c["nullable"] for c in columns] == [False, False, False, True, True]
    for name in ("customer", "amount", "note"):
        assert by_name[name]["default"] is None


def test_inspector_has_table(engine, orders):
    inspector = sa.inspect(engine)
    assert inspector.has_table(orders)
    assert inspector.has_table(orders, schema="public")
    assert not inspector.has_table("no_such_stream")


def test_reflect_table(engine, orders):
    """Table(..., autoload_with=engine) reflects columns, keys, indexes and
    comments; the reflected table is then usable in queries."""
    table = sa.Table(orders, sa.MetaData(), autoload_with=engine)
    assert list(table.columns.keys()) == ["offset", "ts", "customer", "amount", "note"]
    assert [c.nullable for c in table.columns] == [False, False, False, True, True]
    assert list(table.primary_key.columns) == []
    with engine.connect() as connection:
        rows = connection.execute(
            sa.select(table.c.customer).where(table.c.offset >= 1).order_by(table.c.offset)).all()
    assert rows == [("bob",), ("cid",)]


def test_core_select_where_offset(engine, orders):
    table = orders_table()
    with engine.connect() as connection:
        rows = connection.execute(
            sa.select(table.c.offset, table.c.customer, table.c.amount, table.c.note)
            .where(table.c.offset > 0)
            .order_by(table.c.offset)).all()
        assert [tuple(r) for r in rows] == [(1, "bob", Decimal("2.00"), "gift"),
                                            (2, "cid", None, "no amount")]

        one = connection.execute(
            sa.select(table).where(table.c.offset == sa.bindparam("o")), {"o": 0}).one()
        assert (one.offset, one.customer, one.amount, one.note) == (0, "ann", Decimal("1.50"), None)
        assert isinstance(one.ts, datetime) and one.ts.tzinfo is not None

        ranged = connection.execute(
            sa.select(table.c.customer)
            .where(table.c.offset.between(0, 1), table.c.amount.is_not(None))
            .order_by(table.c.offset.desc())).scalars().all()
        assert ranged == ["bob", "ann"]

        total = connection.execute(
            sa.select(sa.func.count(), sa.func.sum(table.c.amount))
            .where(table.c.customer.in_(["ann", "bob", "zed"]))).one()
        assert tuple(total) == (2, Decimal("3.50"))


def test_core_insert_in_transaction(engine, orders):
    table = orders_table()
    with engine.begin() as connection:
        connection.execute(sa.insert(table).values(customer="dee", amount=Decimal("4")))
        connection.execute(sa.insert(table), [{"customer": "eve", "amount": None, "note": "x"},
                                              {"customer": "fay", "amount": Decimal("6.25"),
                                               "note": None}])
    with engine.connect() as connection:
        trans = connection.begin()
        connection.execute(sa.insert(table).values(customer="rolled back"))
        trans.rollback()
        rows = connection.execute(
            sa.select(table.c.offset, table.c.customer).where(table.c.offset >= 3)
            .order_by(table.c.offset)).all()
    assert [tuple(r) for r in rows] == [(3, "dee"), (4, "eve"), (5, "fay")]


def test_pandas_read_sql(engine, orders):
    with engine.connect() as connection:
        df = pd.read_sql(sa.text("SELECT * FROM orders ORDER BY offset"), connection)
    assert df.shape == (3, 5)
    assert list(df.columns) == ["offset", "ts", "customer", "amount", "note"]
    assert df["offset"].tolist() == [0, 1, 2]
    assert str(df["offset"].dtype) == "int64"
    assert df["customer"].tolist() == ["ann", "bob", "cid"]
    amounts = df["amount"].tolist()  # Decimal coerced to float; NULL to NaN
    assert amounts[:2] == [1.5, 2.0] and pd.isna(amounts[2])
    assert df["note"].isna().tolist() == [True, False, False]
    assert df["note"].tolist()[1:] == ["gift", "no amount"]
    assert isinstance(df["ts"].dtype, pd.DatetimeTZDtype)
    assert df["ts"].is_monotonic_increasing


def test_pandas_read_sql_with_params(engine, orders):
    df = pd.read_sql(sa.text("SELECT offset, customer FROM orders WHERE offset >= :o"), engine,
                     params={"o": 1})
    assert df.shape == (2, 2)
    assert sorted(df["customer"].tolist()) == ["bob", "cid"]


def test_pandas_read_sql_table(engine, orders):
    """read_sql_table reflects the table first."""
    df = pd.read_sql_table(orders, engine)
    assert df.shape == (3, 5)
    assert list(df.columns) == ["offset", "ts", "customer", "amount", "note"]
    assert sorted(df["customer"].tolist()) == ["ann", "bob", "cid"]


def test_tables_create_all_reflect_and_orm(engine):
    """A table with a primary key: metadata.create_all (CREATE TABLE in a
    transaction), the inspector's primary key, Core insert/update, and the
    ORM's get/update/insert/delete unit of work (psycopg 3 sends DEALLOCATE
    ALL after the schema changes)."""
    from sqlalchemy.orm import Session, declarative_base

    md = sa.MetaData()
    accounts = sa.Table(
        "accounts", md,
        sa.Column("region", sa.Text, primary_key=True),
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("balance", sa.BigInteger, nullable=False),
    )
    md.create_all(engine)
    inspector = sa.inspect(engine)
    assert inspector.has_table("accounts")
    pk = inspector.get_pk_constraint("accounts")
    assert pk["name"] == "accounts_pkey"
    assert pk["constrained_columns"] == ["region", "id"]
    assert [c["name"] for c in inspector.get_columns("accounts")] == ["region", "id", "balance"]

    with engine.begin() as connection:
        connection.execute(accounts.insert(), [
            {"region": "eu", "id": 1, "balance": 5},
            {"region": "eu", "id": 2, "balance": 7},
            {"region": "us", "id": 1, "balance": 9},
        ])
        connection.execute(accounts.update()
                           .where(accounts.c.region == "eu", accounts.c.id == 1)
                           .values(balance=accounts.c.balance + 1))
    with engine.connect() as connection:
        rows = connection.execute(
            sa.select(accounts.c.region, accounts.c.id, accounts.c.balance)
            .order_by(accounts.c.region, accounts.c.id)).fetchall()
    assert [tuple(r) for r in rows] == [("eu", 1, 6), ("eu", 2, 7), ("us", 1, 9)]

    Base = declarative_base()

    class Account(Base):
        __table__ = sa.Table("accounts", sa.MetaData(), autoload_with=engine)

    with Session(engine) as session:
        account = session.get(Account, ("eu", 2))
        assert account.balance == 7
        account.balance = 100
        session.add(Account(region="us", id=2, balance=1))
        session.commit()
        session.delete(session.get(Account, ("eu", 1)))
        session.commit()
        got = [(a.region, a.id, a.balance)
               for a in session.query(Account).order_by(Account.region, Account.id)]
    assert got == [("eu", 2, 100), ("us", 1, 9), ("us", 2, 1)]

    # a duplicate key is an IntegrityError and the session recovers
    with Session(engine) as session:
        session.add(Account(region="us", id=2, balance=0))
        with pytest.raises(sa.exc.IntegrityError) as err:
            session.commit()
        assert err.value.orig.pgcode == "23505" if hasattr(err.value.orig, "pgcode") \
            else err.value.orig.sqlstate == "23505"
        session.rollback()
        assert session.query(Account).count() == 3


def test_unique_columns_indexes_and_a_named_key_reflect(engine):
    """`unique=True` (a UNIQUE constraint in CREATE TABLE), `index=True` (CREATE INDEX), a
    named primary key: create_all makes them in one transaction, the inspector reflects
    them as PostgreSQL's would, and the constraint refuses a duplicate (IntegrityError)."""
    md = sa.MetaData()
    users = sa.Table(
        "users_u", md,
        sa.Column("id", sa.Integer, autoincrement=False),
        sa.Column("email", sa.Text, unique=True),
        sa.Column("team", sa.Text, index=True),
        sa.Column("a", sa.Integer),
        sa.Column("b", sa.Integer),
        sa.PrimaryKeyConstraint("id", name="users_u_pk"),
        sa.UniqueConstraint("a", "b", name="users_u_ab"),
    )
    md.create_all(engine)
    inspector = sa.inspect(engine)
    assert inspector.get_pk_constraint("users_u")["name"] == "users_u_pk"
    uniques = sorted((u["name"], u["column_names"])
                     for u in inspector.get_unique_constraints("users_u"))
    assert uniques == [("users_u_ab", ["a", "b"]), ("users_u_email_key", ["email"])]
    indexes = [(i["name"], i["column_names"], i["unique"])
               for i in inspector.get_indexes("users_u")]
    assert ("ix_users_u_team", ["team"], False) in indexes
    with engine.begin() as connection:
        connection.execute(users.insert(), [
            {"id": 1, "email": "a@x", "team": "red", "a": 1, "b": 1},
            {"id": 2, "email": None, "team": "red", "a": 1, "b": 2},
        ])
    with pytest.raises(sa.exc.IntegrityError) as err:
        with engine.begin() as connection:
            connection.execute(users.insert(), {"id": 3, "email": "a@x", "team": "x"})
    assert "users_u_email_key" in str(err.value.orig)
    with engine.connect() as connection:
        rows = connection.execute(sa.select(users.c.id).where(users.c.team == "red")
                                  .order_by(users.c.id)).fetchall()
    assert [r[0] for r in rows] == [1, 2]


def test_upsert_on_a_unique_column(engine):
    """postgresql.insert(...).on_conflict_do_update(index_elements=["email"]) and
    on_conflict_do_nothing(constraint=...) arbitrate on a UNIQUE column that is not the
    primary key, as ORMs' upserts do (42P10 before)."""
    md = sa.MetaData()
    users = sa.Table(
        "users_up", md,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("email", sa.Text, unique=True),
        sa.Column("visits", sa.Integer, nullable=False),
    )
    md.create_all(engine)
    with engine.begin() as connection:
        connection.execute(users.insert(), [{"id": 1, "email": "a@x", "visits": 1}])
    upsert = postgresql.insert(users)
    upsert = upsert.on_conflict_do_update(
        index_elements=["email"], set_={"visits": users.c.visits + upsert.excluded.visits})
    with engine.begin() as connection:
        connection.execute(upsert, [{"id": 7, "email": "a@x", "visits": 5},
                                    {"id": 8, "email": "b@x", "visits": 2}])
        connection.execute(
            postgresql.insert(users).on_conflict_do_nothing(constraint="users_up_email_key"),
            {"id": 9, "email": "b@x", "visits": 100})
    with engine.connect() as connection:
        rows = connection.execute(sa.select(users).order_by(users.c.id)).fetchall()
    assert [tuple(r) for r in rows] == [(1, "a@x", 6), (8, "b@x", 2)]


def array_table(metadata):
    """A table with array columns, as an application declares it."""
    return sa.Table(
        "tagged", metadata,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("tags", sa.ARRAY(sa.Text)),
        sa.Column("scores", postgresql.ARRAY(sa.Integer)),
        sa.Column("big", postgresql.ARRAY(sa.BigInteger)),
        sa.Column("flags", sa.ARRAY(sa.Boolean)),
    )


ARRAY_ROWS = [
    {"id": 1, "tags": ["a", "b c", None, '"q"', "", "NULL", "back\\slash", "{x}"],
     "scores": [1, None, -2147483648], "big": [2**63 - 1, None], "flags": [True, None, False]},
    {"id": 2, "tags": [], "scores": [], "big": [], "flags": []},
    {"id": 3, "tags": None, "scores": None, "big": None, "flags": None},
    {"id": 4, "tags": ["only"], "scores": [7], "big": [-1], "flags": [False]},
]


def test_array_columns_create_all_round_trip_and_reflect(engine):
    """sa.ARRAY / postgresql.ARRAY columns: create_all makes text[], integer[],
    bigint[] and boolean[] columns; lists go in (psycopg 3 as array
    parameters, psycopg2 as ARRAY[...] literals) and come back equal; the
    inspector reports an ARRAY of the right item type, and the reflected table
    reads the same rows."""
    md = sa.MetaData()
    tagged = array_table(md)
    md.create_all(engine)
    with engine.begin() as connection:
        connection.execute(tagged.insert(), ARRAY_ROWS)
        connection.execute(tagged.update().where(tagged.c.id == 4)
                           .values(tags=["new", None], scores=None))
    updated = [dict(r) for r in ARRAY_ROWS]
    updated[3].update(tags=["new", None], scores=None)
    with engine.connect() as connection:
        rows = connection.execute(sa.select(tagged).order_by(tagged.c.id)).mappings().all()
        assert [dict(r) for r in rows] == updated

    columns = sa.inspect(engine).get_columns("tagged")
    assert [c["name"] for c in columns] == ["id", "tags", "scores", "big", "flags"]
    by_name = {c["name"]: c for c in columns}
    for name, item in (("tags", sa.Text), ("scores", sa.Integer), ("big", sa.BigInteger),
                       ("flags", sa.Boolean)):
        reflected = by_name[name]["type"]
        assert isinstance(reflected, postgresql.ARRAY), (name, reflected)
        assert isinstance(reflected.item_type, item), (name, reflected.item_type)
        assert by_name[name]["nullable"] is True
    assert not isinstance(by_name["id"]["type"], sa.ARRAY)
    assert isinstance(by_name["scores"]["type"].item_type, sa.Integer)
    assert not isinstance(by_name["scores"]["type"].item_type, sa.BigInteger)

    reflected = sa.Table("tagged", sa.MetaData(), autoload_with=engine)
    with engine.connect() as connection:
        rows = connection.execute(sa.select(reflected).order_by(reflected.c.id)).mappings().all()
    assert [dict(r) for r in rows] == updated


def test_array_column_item_type_modifiers_reflect(engine):
    """numeric(6,2)[] and varchar(20)[] reflect with their item type's
    precision/scale and length, as format_type() reports them in PostgreSQL
    ("numeric(6,2)[]", "character varying(20)[]")."""
    md = sa.MetaData()
    priced = sa.Table(
        "priced", md,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("prices", sa.ARRAY(sa.Numeric(6, 2))),
        sa.Column("names", sa.ARRAY(sa.String(20))),
    )
    md.create_all(engine)
    with engine.begin() as connection:
        connection.execute(priced.insert(), [
            {"id": 1, "prices": [Decimal("1.5"), None, Decimal("-9999.99")], "names": ["a b", None]},
            {"id": 2, "prices": [], "names": []},
        ])
    with engine.connect() as connection:
        rows = connection.execute(sa.select(priced).order_by(priced.c.id)).all()
    assert [(r.id, [None if p is None else str(p) for p in r.prices], r.names) for r in rows] == [
        (1, ["1.50", None, "-9999.99"], ["a b", None]), (2, [], [])]

    by_name = {c["name"]: c["type"] for c in sa.inspect(engine).get_columns("priced")}
    assert isinstance(by_name["prices"], postgresql.ARRAY)
    assert isinstance(by_name["prices"].item_type, sa.Numeric)
    assert (by_name["prices"].item_type.precision, by_name["prices"].item_type.scale) == (6, 2)
    assert isinstance(by_name["names"], postgresql.ARRAY)
    assert isinstance(by_name["names"].item_type, sa.String)
    assert by_name["names"].item_type.length == 20
