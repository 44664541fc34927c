"""Tailing streams with psycopg 3: COPY-out tails, named server-side cursors,
LISTEN notifications per committed row, and NOTIFY / pg_notify between
connections. Every wait is bounded: a watchdog cancels a query that hangs."""

import json
import queue
import threading
import time
from contextlib import contextmanager

import psycopg
import pytest
from psycopg import errors

ARRIVAL = 10  # seconds one expected row or notification may take


@contextmanager
def watchdog(conn, seconds, what):
    """Cancel `conn`'s running query if the block takes longer than `seconds`."""
    fired = threading.Event()

    def fire():
        fired.set()
        conn.cancel()

    timer = threading.Timer(seconds, fire)
    timer.start()
    try:
        yield
    except errors.QueryCanceled:
        if fired.is_set():
            pytest.fail(f"{what}: timed out after {seconds}s")
        raise
    finally:
        timer.cancel()
    if fired.is_set():
        pytest.fail(f"{what}: timed out after {seconds}s")


def make_orders(conn, rows):
    conn.execute("CREATE STREAM orders (customer text NOT NULL, amount numeric(12,2))")
    for i in range(rows):
        conn.execute("INSERT INTO orders VALUES (%s, %s)", (f"c{i}", i))


class Inserter(threading.Thread):
    """Inserts one row per request from its own connection; each request is
    a customer name, and the offset comes back on `acks`."""

    def __init__(self, sluice):
        super().__init__(daemon=True)
        self.conn = sluice.connect(autocommit=True)
        self.requests: "queue.Queue[str | None]" = queue.Queue()
        self.acks: "queue.Queue[int | BaseException]" = queue.Queue()

    def run(self):
        try:
            while (customer := self.requests.get(timeout=60)) is not None:
                row = self.conn.execute(
                    "INSERT INTO orders VALUES (%s, 1) RETURNING offset", (customer,)).fetchone()
                self.acks.put(row[0])
        except BaseException as e:  # noqa: BLE001 - handed to the test thread
            self.acks.put(e)
        finally:
            self.conn.close()

    def insert(self, customer, delay=0.0):
        """Ask for an insert (after `delay` seconds, without blocking)."""
        if delay:
            threading.Timer(delay, self.requests.put, (customer,)).start()
        else:
            self.requests.put(customer)

    def ack(self):
        got = self.acks.get(timeout=ARRIVAL)
        if isinstance(got, BaseException):
            raise got
        return got

    def stop(self):
        self.requests.put(None)
        self.join(timeout=ARRIVAL)


@pytest.fixture
def inserter(sluice):
    thread = Inserter(sluice)
    thread.start()
    yield thread
    thread.stop()


def test_copy_tail_receives_rows_as_they_commit(conn, inserter):
    make_orders(conn, 4)
    got = []
    with watchdog(conn, 60, "COPY tail"):
        with conn.cursor() as cur:
            sql = "COPY (SELECT offset, customer FROM orders WHERE offset > 1 LIMIT 5) TO STDOUT"
            with cur.copy(sql) as copy:
                for row in copy.rows():
                    got.append(row)
                    if 2 <= len(got) < 5:
                        # Ask for the next row only now: each one must be
                        # delivered as it commits, not at the end.
                        inserter.insert(f"new{len(got)}", delay=0.2)
    assert got == [("2", "c2"), ("3", "c3"), ("4", "new2"), ("5", "new3"), ("6", "new4")]
    assert [inserter.ack() for _ in range(3)] == [4, 5, 6]
    assert conn.execute("SELECT 1").fetchone() == (1,)


def test_copy_tail_cancel(sluice, conn, inserter):
    make_orders(conn, 2)
    got = []
    with pytest.raises(errors.QueryCanceled):
        with watchdog(conn, 60, "COPY tail before cancel"):
            with conn.cursor() as cur:
                with cur.copy("COPY (SELECT offset, customer FROM orders WHERE offset >= 0) "
                              "TO STDOUT WITH (FORMAT csv)") as copy:
                    for chunk in copy:
                        got.extend(bytes(chunk).decode().splitlines())
                        if len(got) == 2:
                            inserter.insert("late")
                        if len(got) == 3:
                            conn.cancel()
    assert got == ["0,c0", "1,c1", "2,late"]
    assert conn.execute("SELECT count(*) FROM orders").fetchone() == (3,)


def test_named_cursor_receives_rows_inserted_later(sluice, inserter):
    with sluice.connect(autocommit=True) as conn:
        make_orders(conn, 3)
        conn.execute("SET tail_wait = '5s'")
        with watchdog(conn, 60, "named cursor"), conn.transaction():
            with conn.cursor(name="c") as cur:
                cur.itersize = 2
                cur.execute("SELECT offset, customer FROM orders WHERE offset > %s", (0,))
                assert [d.name for d in cur.description] == ["offset", "customer"]
                assert cur.fetchmany(5) == [(1, "c1"), (2, "c2")]
                for i in range(3, 6):
                    inserter.insert(f"new{i}", delay=0.2)
                    assert inserter.ack() == i
                got = []
                deadline = time.monotonic() + ARRIVAL
                while len(got) < 3 and time.monotonic() < deadline:
                    got.extend(cur.fetchmany(2))
                assert got == [(3, "new3"), (4, "new4"), (5, "new5")]

                # Iteration (FETCH FORWARD itersize) waits for new rows too.
                inserter.insert("new6", delay=0.3)
                it = iter(cur)
                assert next(it) == (6, "new6")


def test_named_cursor_tail_wait_returns_empty(sluice):
    with sluice.connect(autocommit=True) as conn:
        make_orders(conn, 1)
        conn.execute("SET tail_wait = '300ms'")
        with watchdog(conn, 30, "idle cursor"), conn.transaction():
            with conn.cursor(name="idle") as cur:
                cur.execute("SELECT offset, customer FROM orders WHERE offset >= 1")
                assert cur.fetchmany(3) == []


def test_listen_one_notification_per_row(sluice, conn):
    conn.execute("CREATE STREAM orders (customer text NOT NULL, amount numeric(12,2))")
    conn.execute("INSERT INTO orders VALUES ('before', 0)")
    conn.execute("LISTEN orders")

    def write():
        with sluice.connect(autocommit=True) as writer:
            time.sleep(0.3)
            writer.execute("INSERT INTO orders VALUES ('ann', 1.5), ('bob', NULL)")
            writer.execute("INSERT INTO orders VALUES (%s, %s)", ("cy", 3))
            with writer.transaction():
                writer.execute("INSERT INTO orders VALUES ('dee', 4)")
            with pytest.raises(errors.NotNullViolation), writer.transaction():
                writer.execute("INSERT INTO orders VALUES ('rolled', 5)")
                writer.execute("INSERT INTO orders VALUES (NULL, 6)")
            writer.execute("INSERT INTO orders VALUES ('eve', 7)")

    thread = threading.Thread(target=write, daemon=True)
    thread.start()
    notes = list(conn.notifies(timeout=ARRIVAL, stop_after=5))
    thread.join(timeout=ARRIVAL)
    # Nothing more arrives (the rolled-back row must not).
    extra = list(conn.notifies(timeout=0.7))
    assert extra == [], f"unexpected notifications: {extra}"

    assert [n.channel for n in notes] == ["orders"] * 5
    payloads = [json.loads(n.payload) for n in notes]
    assert [p["offset"] for p in payloads] == [1, 2, 3, 4, 5]
    assert [p["customer"] for p in payloads] == ["ann", "bob", "cy", "dee", "eve"]
    assert payloads[1]["amount"] is None
    assert all(isinstance(p["ts"], str) and p["ts"] for p in payloads)


def test_notify_and_pg_notify_between_connections(sluice, conn):
    conn.execute("LISTEN jobs")
    with sluice.connect(autocommit=True) as other:
        other.execute("NOTIFY jobs, 'one'")
        other.execute("SELECT pg_notify(%s, %s)", ("jobs", "two"))
        other.execute("SELECT pg_notify('elsewhere', 'ignored')")
        notes = list(conn.notifies(timeout=ARRIVAL, stop_after=2))
        assert [(n.channel, n.payload) for n in notes] == [("jobs", "one"), ("jobs", "two")]

        with other.transaction():
            other.execute("NOTIFY jobs, 'three'")
            other.execute("SELECT pg_notify('jobs', 'four')")
            # Not delivered before the notifier commits.
            assert list(conn.notifies(timeout=0.7)) == []
        notes = list(conn.notifies(timeout=ARRIVAL, stop_after=2))
        assert [n.payload for n in notes] == ["three", "four"]

        with pytest.raises(errors.DivisionByZero), other.transaction():
            other.execute("NOTIFY jobs, 'rolled back'")
            other.execute("SELECT 1 / 0")
        other.execute("NOTIFY jobs, 'after rollback'")
        notes = list(conn.notifies(timeout=ARRIVAL, stop_after=1))
        assert [n.payload for n in notes] == ["after rollback"]

    conn.execute("UNLISTEN *")
    with sluice.connect(autocommit=True) as other:
        other.execute("NOTIFY jobs, 'after unlisten'")
    assert list(conn.notifies(timeout=0.7)) == []
