"""Alembic (on SQLAlchemy 2, with psycopg 3 and with psycopg2) against a real
sluice server: `alembic upgrade` and `alembic downgrade` run through
`alembic.command` from a script directory written to tmp_path, with the
`env.py` of Alembic's generic template (one transaction around the whole run;
Alembic's PostgreSQL dialect assumes transactional DDL). The migrations
create, drop and index a table with `op.create_table`, `op.create_index`
(plain and `unique=True`), `op.bulk_insert`, `op.drop_index`, `op.drop_table`.

- a migration in one transaction creates a table, a plain index and a unique
  index and loads rows: after it, alembic_version holds the revision,
  pg_indexes lists both indexes with their definitions, pg_index / pg_class
  show them with their unique flags, the unique index rejects a duplicate
  (23505 naming the index) and EXPLAIN picks each index for an equality;
- a migration that fails part-way (a UNIQUE index over duplicate rows it
  loaded itself: 23505) leaves nothing behind: no table, no index, not even
  alembic_version; the corrected migration then runs with the same names;
- a migration that drops both indexes and then fails (42703), and a downgrade
  that drops the indexes and the table and then fails (42P01), leave the
  table, its rows, its indexes (uniqueness still enforced) and the recorded
  revision as they were;
- SQLAlchemy's inspector `get_indexes` (what Alembic's autogenerate compares)
  reflects both indexes with their columns and unique flags (pg_index.indkey /
  indclass / indoption are int2vector / oidvector, read as `1 2`).

Each test writes its own script directories and runs on a fresh server.
"""

import textwrap

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.config import Config

# The online half of Alembic's generic template (`alembic init`).
ENV_PY = """\
from sqlalchemy import engine_from_config, pool

from alembic import context

config = context.config

connectable = engine_from_config(
    config.get_section(config.config_ini_section, {}),
    prefix="sqlalchemy.",
    poolclass=pool.NullPool,
)

with connectable.connect() as connection:
    context.configure(connection=connection, target_metadata=None)

    with context.begin_transaction():
        context.run_migrations()
"""

REVISION_HEADER = """\
import sqlalchemy as sa
from alembic import op

revision = {revision!r}
down_revision = {down_revision!r}

users = sa.table("users", sa.column("id", sa.Integer), sa.column("email", sa.String),
                 sa.column("name", sa.Text))
"""

# The users table and its plain index, the start of both upgrades below.
CREATE_TABLE_AND_INDEX = """\
    op.create_table(
        "users",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("email", sa.String(100), nullable=False),
        sa.Column("name", sa.Text),
    )
    op.create_index("ix_users_name", "users", ["name"])
"""

CREATE_USERS = """\
def upgrade():
""" + CREATE_TABLE_AND_INDEX + """\
    op.create_index("ux_users_email", "users", ["email"], unique=True)
    op.bulk_insert(users, [
        {"id": 1, "email": "ann@example.com", "name": "ann"},
        {"id": 2, "email": "bob@example.com", "name": "bob"},
        {"id": 3, "email": "cid@example.com", "name": "ann"},
    ])
"""

DOWNGRADE_USERS = """\
def downgrade():
    op.drop_index("ux_users_email", table_name="users")
    op.drop_index("ix_users_name", table_name="users")
    op.drop_table("users")
"""

# A downgrade that drops everything, then a table that is not there: 42P01.
DOWNGRADE_USERS_FAILING = """\
def downgrade():
    op.drop_index("ux_users_email", table_name="users")
    op.drop_index("ix_users_name", table_name="users")
    op.drop_table("users")
    op.drop_table("users_archive")
"""

# The unique index comes after the rows, two of which share an address: 23505.
CREATE_USERS_DUPLICATES = """\
def upgrade():
""" + CREATE_TABLE_AND_INDEX + """\
    op.bulk_insert(users, [
        {"id": 1, "email": "ann@example.com", "name": "ann"},
        {"id": 2, "email": "bob@example.com", "name": "bob"},
        {"id": 3, "email": "ann@example.com", "name": "ann again"},
    ])
    op.create_index("ux_users_email", "users", ["email"], unique=True)
"""

# Drops both indexes, then indexes a column that does not exist: 42703.
REINDEX_USERS_FAILING = """\
def upgrade():
    op.drop_index("ix_users_name", table_name="users")
    op.drop_index("ux_users_email", table_name="users")
    op.create_index("ux_users_tenant_email", "users", ["tenant", "email"], unique=True)
"""

NO_DOWNGRADE = """\
def downgrade():
    pass
"""

USERS_ROWS = [(1, "ann@example.com", "ann"), (2, "bob@example.com", "bob"),
              (3, "cid@example.com", "ann")]
USERS_INDEXES = {
    "users_pkey": "CREATE UNIQUE INDEX users_pkey ON public.users USING btree (id)",
    "ix_users_name": "CREATE INDEX ix_users_name ON public.users USING btree (name)",
    "ux_users_email": "CREATE UNIQUE INDEX ux_users_email ON public.users USING btree (email)",
}


def migrations(engine, directory, revisions):
    """An Alembic config for a script directory written to `directory`:
    the generic env.py and one versions/ file per (revision, body) pair,
    each revision following the one before it."""
    versions = directory / "versions"
    versions.mkdir(parents=True)
    (directory / "env.py").write_text(ENV_PY)
    down = None
    for revision, body in revisions:
        source = REVISION_HEADER.format(revision=revision, down_revision=down)
        (versions / f"{revision}.py").write_text(source + "\n\n" + textwrap.dedent(body))
        down = revision
    url = engine.url.update_query_dict({"connect_timeout": "10"})
    config = Config()
    config.set_main_option("script_location", str(directory))
    config.set_main_option("sqlalchemy.url", url.render_as_string(hide_password=False))
    return config


def sqlstate(orig):
    """The SQLSTATE of a DBAPI error from psycopg 3 or psycopg2."""
    return getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None)


def indexes(engine, table):
    """{index name: definition} as pg_indexes shows them for `table`."""
    with engine.connect() as connection:
        rows = connection.execute(sa.text(
            "SELECT indexname, indexdef FROM pg_indexes"
            " WHERE schemaname = 'public' AND tablename = :t"), {"t": table})
        return dict(rows.fetchall())


def index_relations(engine, names):
    """How many pg_class rows (of any kind) carry one of `names`."""
    with engine.connect() as connection:
        return connection.scalar(
            sa.text("SELECT count(*) FROM pg_class WHERE relname IN :names")
            .bindparams(sa.bindparam("names", expanding=True)), {"names": list(names)})


def version(engine):
    with engine.connect() as connection:
        return connection.execute(sa.text("SELECT version_num FROM alembic_version")).fetchall()


def users(engine):
    with engine.connect() as connection:
        return [tuple(r) for r in connection.execute(
            sa.text("SELECT id, email, name FROM users ORDER BY id"))]


def explain(engine, sql):
    with engine.connect() as connection:
        return "\n".join(str(plan) for _, plan in connection.execute(sa.text("EXPLAIN " + sql)))


def assert_email_is_unique(engine):
    """A second row with an existing address is refused by ux_users_email."""
    with pytest.raises(sa.exc.IntegrityError) as err:
        with engine.begin() as connection:
            connection.execute(sa.text("INSERT INTO users (id, email, name) VALUES (:i, :e, :n)"),
                               {"i": 9, "e": "bob@example.com", "n": "impostor"})
    assert sqlstate(err.value.orig) == "23505"
    assert 'duplicate key value violates unique constraint "ux_users_email"' in str(err.value.orig)


def test_upgrade_creates_table_with_index_and_unique_index(engine, tmp_path):
    config = migrations(engine, tmp_path / "scripts", [("0001", CREATE_USERS + DOWNGRADE_USERS)])
    command.upgrade(config, "head")

    assert version(engine) == [("0001",)]
    assert sa.inspect(engine).has_table("users")
    assert users(engine) == USERS_ROWS
    assert indexes(engine, "users") == USERS_INDEXES
    with engine.connect() as connection:
        flags = connection.execute(sa.text(
            "SELECT c.relname, c.relkind, i.indisunique, i.indisprimary"
            " FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
            " JOIN pg_class t ON t.oid = i.indrelid"
            " WHERE t.relname = 'users' ORDER BY c.relname")).fetchall()
    assert [tuple(r) for r in flags] == [("ix_users_name", "i", False, False),
                                         ("users_pkey", "i", True, True),
                                         ("ux_users_email", "i", True, False)]

    assert_email_is_unique(engine)
    # the plain index allows repeats (two rows already share a name)
    with engine.begin() as connection:
        connection.execute(sa.text("INSERT INTO users VALUES (4, 'dee@example.com', 'ann')"))
    assert len(users(engine)) == 4

    assert "IndexScan: index=ux_users_email" in \
        explain(engine, "SELECT * FROM users WHERE email = 'bob@example.com'")
    assert "IndexScan: index=ix_users_name" in \
        explain(engine, "SELECT * FROM users WHERE name = 'ann'")


def test_inspector_get_indexes_after_upgrade(engine, tmp_path):
    config = migrations(engine, tmp_path / "scripts", [("0001", CREATE_USERS + DOWNGRADE_USERS)])
    command.upgrade(config, "head")
    reflected = sa.inspect(engine).get_indexes("users")
    assert [(ix["name"], ix["column_names"], ix["unique"]) for ix in reflected] == [
        ("ix_users_name", ["name"], False), ("ux_users_email", ["email"], True)]


def test_failing_upgrade_rolls_back_fully(engine, tmp_path):
    broken = migrations(engine, tmp_path / "broken",
                        [("0001", CREATE_USERS_DUPLICATES + DOWNGRADE_USERS)])
    with pytest.raises(sa.exc.IntegrityError) as err:
        command.upgrade(broken, "head")
    assert sqlstate(err.value.orig) == "23505"
    assert 'could not create unique index "ux_users_email"' in str(err.value.orig)

    # nothing of the run is left: table, indexes, version table
    inspector = sa.inspect(engine)
    assert not inspector.has_table("users")
    assert not inspector.has_table("alembic_version")
    assert indexes(engine, "users") == {}
    assert index_relations(engine, ["users_pkey", "ix_users_name", "ux_users_email"]) == 0
    with engine.connect() as connection:
        with pytest.raises(sa.exc.ProgrammingError) as err:
            connection.execute(sa.text("SELECT * FROM users"))
    assert sqlstate(err.value.orig) == "42P01"

    # the corrected migration runs with the same names
    fixed = migrations(engine, tmp_path / "fixed", [("0001", CREATE_USERS + DOWNGRADE_USERS)])
    command.upgrade(fixed, "head")
    assert version(engine) == [("0001",)]
    assert users(engine) == USERS_ROWS
    assert indexes(engine, "users") == USERS_INDEXES
    assert_email_is_unique(engine)


def test_failing_upgrade_keeps_dropped_indexes(engine, tmp_path):
    config = migrations(engine, tmp_path / "scripts", [
        ("0001", CREATE_USERS + DOWNGRADE_USERS),
        ("0002", REINDEX_USERS_FAILING + NO_DOWNGRADE),
    ])
    command.upgrade(config, "0001")
    with pytest.raises(sa.exc.ProgrammingError) as err:
        command.upgrade(config, "head")
    assert sqlstate(err.value.orig) == "42703"

    assert version(engine) == [("0001",)]
    assert indexes(engine, "users") == USERS_INDEXES
    assert index_relations(engine, ["ux_users_tenant_email"]) == 0
    assert users(engine) == USERS_ROWS
    assert_email_is_unique(engine)
    assert "IndexScan: index=ix_users_name" in \
        explain(engine, "SELECT * FROM users WHERE name = 'ann'")


def test_failing_downgrade_keeps_table_and_indexes(engine, tmp_path):
    config = migrations(engine, tmp_path / "scripts",
                        [("0001", CREATE_USERS + DOWNGRADE_USERS_FAILING)])
    command.upgrade(config, "head")
    with pytest.raises(sa.exc.ProgrammingError) as err:
        command.downgrade(config, "base")
    assert sqlstate(err.value.orig) == "42P01"

    assert version(engine) == [("0001",)]
    assert sa.inspect(engine).has_table("users")
    assert users(engine) == USERS_ROWS
    assert indexes(engine, "users") == USERS_INDEXES
    assert_email_is_unique(engine)
