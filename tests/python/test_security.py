"""Python drivers log in with SCRAM-SHA-256 over verified TLS: psycopg 3 and psycopg2
(libpq, with channel binding required), asyncpg (its own SCRAM, with an ssl context
that verifies the server) and SQLAlchemy on psycopg. Each checks pg_stat_ssl says the
session is encrypted, and that a wrong password is 28P01."""

import asyncio
import pathlib
import ssl
import subprocess

import asyncpg
import psycopg
import psycopg2
import pytest
import sqlalchemy

from conftest import WORKSPACE, SluiceServer

PASSWORD = "correct horse"
TIMEOUT = 30
ENCRYPTED = "SELECT ssl, version FROM pg_stat_ssl WHERE pid = pg_backend_pid()"


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    directory = tmp_path_factory.mktemp("certs")
    subprocess.run(["bash", str(WORKSPACE / "tests/fixtures/tls/make-certs.sh"), str(directory)],
                   check=True, timeout=60)
    return directory


@pytest.fixture
def secure(tmp_path, certs):
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    server = SluiceServer(data_dir, ["--password", PASSWORD,
                                     "--tls-cert", str(certs / "server.pem"),
                                     "--tls-key", str(certs / "server.key")])
    server.start()
    try:
        yield server
    finally:
        server.stop()


def libpq_conninfo(server, certs, password=PASSWORD):
    return (f"host=127.0.0.1 port={server.port} user=sluice dbname=sluice connect_timeout=10 "
            f"sslmode=verify-full sslrootcert={certs / 'ca.pem'} channel_binding=require "
            f"password='{password}'")


def test_psycopg_scram_with_channel_binding_over_verified_tls(secure, certs):
    with psycopg.connect(libpq_conninfo(secure, certs), autocommit=True) as conn:
        assert conn.execute(ENCRYPTED).fetchone() == (True, "TLSv1.3")
        conn.execute("CREATE STREAM s (v int)")
        conn.execute("INSERT INTO s (v) VALUES (1)")
        assert conn.execute("SELECT v FROM s").fetchall() == [(1,)]
    with pytest.raises(psycopg.OperationalError) as err:
        psycopg.connect(libpq_conninfo(secure, certs, password="wrong"))
    assert "password authentication failed" in str(err.value)


def test_psycopg2_scram_with_channel_binding_over_verified_tls(secure, certs):
    conn = psycopg2.connect(libpq_conninfo(secure, certs))
    try:
        cur = conn.cursor()
        cur.execute(ENCRYPTED)
        assert cur.fetchone() == (True, "TLSv1.3")
    finally:
        conn.close()


def test_asyncpg_scram_over_verified_tls(secure, certs):
    context = ssl.create_default_context(cafile=str(certs / "ca.pem"))

    async def body():
        conn = await asyncpg.connect(host="127.0.0.1", port=secure.port, user="sluice",
                                     database="sluice", password=PASSWORD, ssl=context,
                                     timeout=TIMEOUT)
        try:
            row = await conn.fetchrow(ENCRYPTED)
            assert (row["ssl"], row["version"]) == (True, "TLSv1.3")
        finally:
            await conn.close()
        with pytest.raises(asyncpg.InvalidPasswordError):
            await asyncpg.connect(host="127.0.0.1", port=secure.port, user="sluice",
                                  database="sluice", password="wrong", ssl=context,
                                  timeout=TIMEOUT)

    asyncio.run(asyncio.wait_for(body(), TIMEOUT * 2))


def test_sqlalchemy_scram_over_verified_tls(secure, certs):
    url = sqlalchemy.engine.URL.create(
        "postgresql+psycopg", username="sluice", password=PASSWORD, host="127.0.0.1",
        port=secure.port, database="sluice",
        query={"sslmode": "verify-full", "sslrootcert": str(certs / "ca.pem"),
               "channel_binding": "require"})
    engine = sqlalchemy.create_engine(url)
    try:
        with engine.connect() as conn:
            row = conn.execute(sqlalchemy.text(ENCRYPTED)).one()
            assert tuple(row) == (True, "TLSv1.3")
    finally:
        engine.dispose()
