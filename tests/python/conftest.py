"""Fixtures that start a real `sluice` server for the psycopg tests.

The binary is `$SLUICE_BIN`, else `$CARGO_TARGET_DIR/debug/sluice`, else the
workspace's `target/debug/sluice` (build it with `cargo build --bins`). Each
test gets a fresh server on a temporary data directory and a random port.
"""

import os
import pathlib
import queue
import re
import subprocess
import sys
import threading

import psycopg
import pytest

STARTUP_TIMEOUT = 60
SHUTDOWN_TIMEOUT = 30
LISTENING = re.compile(r"listening on (\[[0-9a-fA-F:]+\]|[0-9.]+):(\d+)")
METRICS = re.compile(r"metrics on (\[[0-9a-fA-F:]+\]|[0-9.]+):(\d+)")
WORKSPACE = pathlib.Path(__file__).resolve().parents[2]


def sluice_binary() -> pathlib.Path:
    if os.environ.get("SLUICE_BIN"):
        return pathlib.Path(os.environ["SLUICE_BIN"])
    target = pathlib.Path(os.environ.get("CARGO_TARGET_DIR", WORKSPACE / "target"))
    if not target.is_absolute():
        target = WORKSPACE / target
    binary = target / "debug" / "sluice"
    if not binary.is_file():
        pytest.fail(f"no sluice binary at {binary}: run `cargo build --bins` or set SLUICE_BIN")
    return binary


class SluiceServer:
    """A `sluice serve` process; its output is echoed to stderr."""

    def __init__(self, data_dir: pathlib.Path, extra_args=()):
        self.data_dir = data_dir
        self.extra_args = list(extra_args)
        self.process = None
        self.port = None
        self.metrics_port = None

    def start(self) -> None:
        self.process = subprocess.Popen(
            [str(sluice_binary()), "serve", "--data-dir", str(self.data_dir),
             "--listen", "127.0.0.1:0", *self.extra_args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env={**os.environ, "NO_COLOR": "1"},
            text=True,
        )
        ports: "queue.Queue[int | None]" = queue.Queue()
        threading.Thread(target=self._forward, args=(ports,), daemon=True).start()
        try:
            self.port = ports.get(timeout=STARTUP_TIMEOUT)
        except queue.Empty:
            self.port = None
        if self.port is None:
            self.stop()
            pytest.fail("sluice did not print `listening on HOST:PORT` "
                        f"within {STARTUP_TIMEOUT}s (exit status {self.process.poll()})")

    def _forward(self, ports: "queue.Queue[int | None]") -> None:
        announced = False
        for line in self.process.stdout:
            sys.stderr.write(f"[sluice] {line}")
            metrics = METRICS.search(line)
            if metrics:
                self.metrics_port = int(metrics.group(2))
            match = LISTENING.search(line)
            if match and not announced:
                announced = True
                ports.put(int(match.group(2)))
        if not announced:
            ports.put(None)  # stdout closed: the process is gone

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=SHUTDOWN_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    @property
    def conninfo(self) -> str:
        return f"host=127.0.0.1 port={self.port} user=sluice dbname=sluice connect_timeout=10"

    def connect(self, **kwargs) -> psycopg.Connection:
        return psycopg.connect(self.conninfo, **kwargs)


@pytest.fixture
def sluice(tmp_path):
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    server = SluiceServer(data_dir)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(params=["psycopg", "psycopg2"])
def engine(request, sluice):
    """A SQLAlchemy engine on the server, once per PostgreSQL driver."""
    import sqlalchemy as sa
    from sqlalchemy.pool import NullPool

    engine = sa.create_engine(
        f"postgresql+{request.param}://sluice@127.0.0.1:{sluice.port}/sluice",
        connect_args={"connect_timeout": 10}, poolclass=NullPool)
    try:
        yield engine
    finally:
        engine.dispose()


@pytest.fixture
def conn(sluice):
    """An autocommit connection: each statement commits on its own."""
    with sluice.connect(autocommit=True) as connection:
        yield connection
