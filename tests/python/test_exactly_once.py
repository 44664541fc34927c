"""Exactly-once processing under crashes (examples/consumer.py).

50,000 rows go into a stream; the example consumer keeps per-customer
totals and its offset in one transaction per batch. While it runs, the
consumer is SIGKILLed at random moments (at least 10 times, restarted each
time) and the server is SIGKILLed and restarted on the same port (at least
twice), checkpointing every 50 entries so recovery replays onto
checkpointed tables. At the end every total equals the sum computed from
the stream (by Sluice and by this test) — no row lost, none counted twice.

Also: the idempotent producer example resending every row gets each row
appended exactly once.
"""

import pathlib
import random
import signal
import subprocess
import sys
import time
from collections import defaultdict
from decimal import Decimal

import psycopg
import pytest

from conftest import SluiceServer

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"
ROWS = 50_000
CUSTOMERS = [f"c{i:02}" for i in range(20)]
DEADLINE = 300


class PinnedServer(SluiceServer):
    """A server restarted on the port it first got, so clients can reconnect."""

    def __init__(self, data_dir, extra):
        super().__init__(data_dir)
        self.extra = extra

    def start(self):
        listen = f"127.0.0.1:{self.port}" if self.port else "127.0.0.1:0"
        self.process = subprocess.Popen(
            [str(_binary()), "serve", "--data-dir", str(self.data_dir), "--listen", listen, *self.extra],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        import queue
        import threading
        ports = queue.Queue()
        threading.Thread(target=self._forward, args=(ports,), daemon=True).start()
        port = ports.get(timeout=60)
        assert port is not None, "sluice did not start"
        self.port = port

    def kill(self):
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=30)


def _binary():
    from conftest import sluice_binary
    return sluice_binary()


def start_consumer(server):
    return subprocess.Popen(
        [sys.executable, str(EXAMPLES / "consumer.py"), "--dsn", server.conninfo,
         "--name", "billing", "--stream", "orders", "--table", "totals",
         "--batch", "700", "--wait-ms", "200", "--until-offset", str(ROWS - 1)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_exactly_once_under_crashes(tmp_path):
    server = PinnedServer(tmp_path / "data", ["--checkpoint-entries", "50"])
    (tmp_path / "data").mkdir()
    server.start()
    rng = random.Random(42)
    expected = defaultdict(Decimal)
    try:
        with server.connect(autocommit=True) as conn:
            conn.execute("CREATE STREAM orders (customer text NOT NULL, amount numeric(12,2))")
            with conn.cursor() as cur:
                for start in range(0, ROWS, 1000):
                    rows = []
                    for _ in range(1000):
                        customer = rng.choice(CUSTOMERS)
                        amount = Decimal(rng.randint(1, 100_000)) / 100
                        expected[customer] += amount
                        rows.append((customer, amount))
                    cur.executemany("INSERT INTO orders VALUES (%s, %s)", rows)
        deadline = time.monotonic() + DEADLINE
        consumer = start_consumer(server)
        consumer_kills = server_kills = 0
        # interleave: kill the consumer often, the server twice (after the
        # 4th and the 8th consumer kill)
        while consumer.poll() is None:
            assert time.monotonic() < deadline, "consumer did not finish in time"
            time.sleep(rng.uniform(0.2, 1.2))
            if consumer.poll() is not None:
                break
            if consumer_kills < 12:
                consumer.kill()
                consumer.wait(timeout=30)
                consumer_kills += 1
                if consumer_kills in (4, 8):
                    server.kill()
                    server_kills += 1
                    time.sleep(rng.uniform(0.1, 0.5))
                    server.start()
                consumer = start_consumer(server)
            elif server_kills < 2:
                server.kill()
                server_kills += 1
                server.start()
        out = consumer.stdout.read()
        assert consumer.returncode == 0, f"consumer failed:\n{out[-3000:]}"
        assert consumer_kills >= 10, f"only {consumer_kills} consumer kills (it finished too fast)"
        assert server_kills >= 2
        with server.connect(autocommit=True) as conn:
            totals = dict(conn.execute("SELECT customer, total FROM totals").fetchall())
            by_sluice = dict(conn.execute(
                "SELECT customer, sum(amount) FROM orders GROUP BY customer").fetchall())
            position = conn.execute(
                "SELECT \"offset\" FROM consumer_offsets WHERE consumer = 'billing' AND stream = 'orders'"
            ).fetchone()[0]
        assert position == ROWS - 1
        assert set(totals) == set(expected)
        for customer, total in expected.items():
            assert totals[customer] == total, f"{customer}: consumer {totals[customer]}, stream {total}"
            assert by_sluice[customer] == total
        print(f"exactly-once: {consumer_kills} consumer kills, {server_kills} server kills, "
              f"{ROWS} rows, totals match")
    finally:
        server.stop()


def test_idempotent_producer_resends(sluice):
    """Every row sent twice (a simulated lost acknowledgement) is appended
    once; both sends report the same offset."""
    out = subprocess.run(
        [sys.executable, str(EXAMPLES / "producer.py"), "--dsn", sluice.conninfo,
         "--count", "50", "--resend-each"],
        capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = [l for l in out.stdout.splitlines() if "resent" in l]
    assert len(lines) == 50
    for line in lines:
        first = line.split("-> offset ")[1].split(",")[0]
        again = line.rsplit("-> offset ", 1)[1]
        assert first == again, line
    with sluice.connect(autocommit=True) as conn:
        rows = conn.execute("SELECT order_id, count(*) FROM orders GROUP BY order_id").fetchall()
        assert len(rows) == 50 and all(n == 1 for _, n in rows)
        assert conn.execute("SELECT max(\"offset\") FROM orders").fetchone()[0] == 49
