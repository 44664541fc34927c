"""Transactions over tables and streams with psycopg 3, under concurrency.

Sluice gives every transaction serializable behaviour with optimistic
validation: a conflict is reported by COMMIT with SQLSTATE 40001
(psycopg.errors.SerializationFailure), not by the statement that read or
wrote, and the client retries the whole transaction. A statement outside a
transaction block that meets a conflict is retried by the server, so it
never returns 40001.

- bank transfers: 8 connections move money between 10 accounts, reading
  balances and writing back client-computed values; money is neither
  created nor lost, and every committed transfer is reflected exactly;
- a counter incremented 200 times by 8 connections, in explicit blocks
  (retrying on 40001) and as autocommit statements (never 40001);
- one block appending to two streams and upserting tables: ROLLBACK shows
  nothing, COMMIT shows everything to other connections;
- a duplicate key is a UniqueViolation and the connection keeps working.
"""

import random
import threading
import time
from decimal import Decimal

import pytest
from psycopg import errors
from psycopg.pq import TransactionStatus

THREADS = 8
ACCOUNTS = 10
INITIAL_BALANCE = 1000
TRANSFERS_PER_THREAD = 40
TRANSFER_RETRIES = 50      # per transfer
INCREMENTS_PER_THREAD = 25
COUNTER_RETRIES = 200      # per increment: all threads fight over one row
THREAD_DEADLINE = 40       # seconds for all threads of one test to finish


class GaveUp(Exception):
    """A transaction still failed with 40001 after its retry budget."""


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.commit_retries = 0      # 40001 reported by COMMIT
        self.statement_40001 = []    # 40001 reported by any other statement

    def retried(self, where, err):
        with self.lock:
            if where == "COMMIT":
                self.commit_retries += 1
            else:
                self.statement_40001.append(f"{where}: {err}")


def backoff(rng, attempt):
    time.sleep(rng.uniform(0, min(0.02, 0.0005 * 2 ** min(attempt, 6))))


def in_transaction(conn, body, rng, stats, retries):
    """Runs `body(conn)` between explicit BEGIN and COMMIT on an autocommit
    connection and returns its result, retrying the whole block on 40001."""
    for attempt in range(retries + 1):
        conn.execute("BEGIN")
        try:
            result = body(conn)
        except errors.SerializationFailure as err:
            # The contract says this never happens; count it and retry anyway
            # so the invariants below are still checked.
            stats.retried("statement", err)
            conn.execute("ROLLBACK")
            backoff(rng, attempt)
            continue
        except BaseException:
            if conn.info.transaction_status != TransactionStatus.IDLE:
                conn.execute("ROLLBACK")
            raise
        try:
            conn.execute("COMMIT")
        except errors.SerializationFailure as err:
            stats.retried("COMMIT", err)
            status = conn.info.transaction_status
            assert status == TransactionStatus.IDLE, \
                f"a COMMIT that failed with 40001 must end the block, session is {status.name}"
            backoff(rng, attempt)
            continue
        return result
    raise GaveUp(f"still 40001 after {retries} retries")


def run_threads(sluice, worker, deadline=THREAD_DEADLINE):
    """Runs `worker(index, conn, stop)` in THREADS threads, each on its own
    autocommit connection, started together; fails the test if any thread
    raises or they are not all done within `deadline` seconds."""
    failures = []
    stop = threading.Event()
    barrier = threading.Barrier(THREADS)

    def run(index):
        try:
            with sluice.connect(autocommit=True) as conn:
                barrier.wait(timeout=30)
                worker(index, conn, stop)
        except BaseException as err:  # noqa: BLE001 - reported below
            failures.append(f"thread {index}: {type(err).__name__}: {err}")
            stop.set()
            barrier.abort()

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(THREADS)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(max(0.0, started + deadline - time.monotonic()))
    stop.set()
    stuck = [i for i, thread in enumerate(threads) if thread.is_alive()]
    if stuck:
        pytest.fail(f"threads {stuck} still running after {deadline}s; failures so far: {failures}")
    assert not failures, "\n".join(failures)
    return time.monotonic() - started


def test_bank_transfers_keep_the_total(sluice, conn, record_property):
    conn.execute("CREATE TABLE accounts (id int PRIMARY KEY, balance bigint NOT NULL)")
    conn.execute("INSERT INTO accounts VALUES " + ", ".join(["(%s, %s)"] * ACCOUNTS),
                 [v for i in range(1, ACCOUNTS + 1) for v in (i, INITIAL_BALANCE)])
    assert conn.execute("SELECT count(*), sum(balance) FROM accounts").fetchone() == \
        (ACCOUNTS, ACCOUNTS * INITIAL_BALANCE)

    stats = Stats()
    lock = threading.Lock()
    completed = [0]
    moved = [0]
    deltas = {i: 0 for i in range(1, ACCOUNTS + 1)}  # from committed transfers only

    def transfer(src, dst, amount):
        def body(c):
            src_balance = c.execute("SELECT balance FROM accounts WHERE id = %s", (src,)).fetchone()[0]
            dst_balance = c.execute("SELECT balance FROM accounts WHERE id = %s", (dst,)).fetchone()[0]
            if src_balance < amount:
                return False
            # Client-computed values: a lost update would change the total.
            c.execute("UPDATE accounts SET balance = %s WHERE id = %s", (src_balance - amount, src))
            c.execute("UPDATE accounts SET balance = %s WHERE id = %s", (dst_balance + amount, dst))
            return True
        return body

    def worker(index, c, stop):
        rng = random.Random(1000 + index)
        for _ in range(TRANSFERS_PER_THREAD):
            if stop.is_set():
                return
            src, dst = rng.sample(range(1, ACCOUNTS + 1), 2)
            amount = rng.randint(1, 400)
            did_move = in_transaction(c, transfer(src, dst, amount), rng, stats, TRANSFER_RETRIES)
            with lock:
                completed[0] += 1
                if did_move:
                    moved[0] += 1
                    deltas[src] -= amount
                    deltas[dst] += amount

    elapsed = run_threads(sluice, worker)
    retries = stats.commit_retries + len(stats.statement_40001)
    print(f"bank transfer: {retries} retries of 40001")
    print(f"bank transfer: {completed[0]} transfers ({moved[0]} moved money) in {elapsed:.1f}s")
    record_property("serialization_retries", retries)
    record_property("transfers_moved", moved[0])

    rows = dict(conn.execute("SELECT id, balance FROM accounts ORDER BY id").fetchall())
    assert sum(rows.values()) == ACCOUNTS * INITIAL_BALANCE, f"money created or lost: {rows}"
    assert all(balance >= 0 for balance in rows.values()), f"negative balance: {rows}"
    assert completed[0] == THREADS * TRANSFERS_PER_THREAD
    assert moved[0] > 0
    expected = {i: INITIAL_BALANCE + d for i, d in deltas.items()}
    assert rows == expected, "balances differ from the committed transfers"
    assert conn.execute("SELECT sum(balance) FROM accounts").fetchone() == (ACCOUNTS * INITIAL_BALANCE,)
    assert not stats.statement_40001, \
        f"40001 must be reported by COMMIT only, got: {stats.statement_40001[:3]}"


@pytest.mark.parametrize("mode", ["explicit-blocks", "autocommit"])
def test_concurrent_counter(sluice, conn, mode, record_property):
    conn.execute("CREATE TABLE counters (id int PRIMARY KEY, n bigint NOT NULL)")
    conn.execute("INSERT INTO counters VALUES (1, 0), (2, 0)")
    stats = Stats()
    done = [0]
    lock = threading.Lock()

    def increment(c):
        c.execute("UPDATE counters SET n = n + 1 WHERE id = 1")

    def worker(index, c, stop):
        rng = random.Random(2000 + index)
        for _ in range(INCREMENTS_PER_THREAD):
            if stop.is_set():
                return
            if mode == "autocommit":
                # The server retries conflicts itself: never a 40001 here.
                c.execute("UPDATE counters SET n = n + 1 WHERE id = 1")
            else:
                in_transaction(c, increment, rng, stats, COUNTER_RETRIES)
            with lock:
                done[0] += 1

    elapsed = run_threads(sluice, worker)
    total = THREADS * INCREMENTS_PER_THREAD
    print(f"counter ({mode}): {total} increments, {stats.commit_retries} retries of 40001 "
          f"in {elapsed:.1f}s")
    record_property("serialization_retries", stats.commit_retries)
    assert done[0] == total
    assert conn.execute("SELECT id, n FROM counters ORDER BY id").fetchall() == [(1, total), (2, 0)]
    assert not stats.statement_40001, \
        f"40001 must be reported by COMMIT only, got: {stats.statement_40001[:3]}"


def test_block_spanning_streams_and_tables(sluice, conn):
    conn.execute("CREATE STREAM invoices (customer text NOT NULL, amount numeric(12,2))")
    conn.execute("CREATE STREAM audit (note text)")
    conn.execute("CREATE TABLE totals (customer text PRIMARY KEY, total numeric(12,2) NOT NULL)")
    conn.execute("INSERT INTO totals VALUES ('ann', 5)")

    def state(c):
        return {
            "invoices": c.execute("SELECT customer, amount FROM invoices ORDER BY offset").fetchall(),
            "audit": c.execute("SELECT note FROM audit ORDER BY offset").fetchall(),
            "totals": c.execute("SELECT customer, total FROM totals ORDER BY customer").fetchall(),
            "offsets": c.execute(
                "SELECT consumer, stream, \"offset\" FROM consumer_offsets "
                "WHERE consumer = 'billing' ORDER BY stream").fetchall(),
        }

    before = state(conn)
    assert before == {"invoices": [], "audit": [], "totals": [("ann", Decimal("5.00"))], "offsets": []}

    def write_block(c):
        c.execute("INSERT INTO invoices VALUES (%s, %s), (%s, %s)", ("ann", Decimal("10"), "bob", Decimal("2.5")))
        c.execute("INSERT INTO audit VALUES (%s)", ("two invoices",))
        c.execute("INSERT INTO totals VALUES ('ann', 10), ('bob', 2.5) "
                  "ON CONFLICT (customer) DO UPDATE SET total = totals.total + excluded.total")
        c.execute("INSERT INTO consumer_offsets VALUES ('billing', 'invoices', 1) "
                  "ON CONFLICT (consumer, stream) DO UPDATE SET \"offset\" = excluded.\"offset\"")

    committed = {
        "invoices": [("ann", Decimal("10.00")), ("bob", Decimal("2.50"))],
        "audit": [("two invoices",)],
        "totals": [("ann", Decimal("15.00")), ("bob", Decimal("2.50"))],
        "offsets": [("billing", "invoices", 1)],
    }

    with sluice.connect(autocommit=True) as writer:
        # Rolled back: nothing visible, to anyone.
        writer.execute("BEGIN")
        write_block(writer)
        assert state(writer) == committed, "the block reads its own writes"
        assert state(conn) == before, "another session sees nothing before COMMIT"
        writer.execute("ROLLBACK")
        assert state(writer) == before
        assert state(conn) == before

        # Committed: everything visible, to everyone.
        writer.execute("BEGIN")
        write_block(writer)
        assert state(conn) == before
        writer.execute("COMMIT")
        assert state(writer) == committed

    assert state(conn) == committed
    with sluice.connect() as fresh:
        assert state(fresh) == committed
    # The rolled-back appends consumed no offsets.
    assert conn.execute("SELECT offset FROM invoices ORDER BY offset").fetchall() == [(0,), (1,)]
    assert conn.execute("SELECT offset FROM audit").fetchall() == [(0,)]

    # The same through psycopg's own transaction handling.
    with sluice.connect() as tx:  # not autocommit: psycopg sends BEGIN
        tx.execute("INSERT INTO audit VALUES ('discarded')")
        tx.execute("UPDATE totals SET total = 0")
        tx.rollback()
        with tx.transaction():
            tx.execute("INSERT INTO audit VALUES ('kept')")
            tx.execute("DELETE FROM totals WHERE customer = 'bob'")
    assert conn.execute("SELECT note FROM audit ORDER BY offset").fetchall() == [("two invoices",), ("kept",)]
    assert conn.execute("SELECT customer, total FROM totals").fetchall() == [("ann", Decimal("15.00"))]


def test_returning_offset_inside_a_transaction(sluice, conn):
    """RETURNING offset on a stream inside a transaction answers NULL (offsets are
    assigned at COMMIT); after COMMIT sluice_last_offsets() has them, also through a
    prepared statement psycopg reuses."""
    conn.execute("CREATE STREAM ret_events (kind text NOT NULL)")
    conn.execute("INSERT INTO ret_events VALUES ('earlier')")
    # autocommit: transaction() is BEGIN ... COMMIT (otherwise, after a query, a savepoint)
    with sluice.connect(autocommit=True) as tx:
        last = "SELECT stream, \"offset\" FROM sluice_last_offsets() ORDER BY n"
        for round_ in range(3):
            with tx.transaction():
                got = [
                    tx.execute("INSERT INTO ret_events VALUES (%s) RETURNING offset, kind",
                               (f"r{round_}-{i}",), prepare=True).fetchone()
                    for i in range(2)
                ]
                assert got == [(None, f"r{round_}-0"), (None, f"r{round_}-1")]
            first = 1 + 2 * round_
            assert tx.execute(last, prepare=True).fetchall() == [
                ("ret_events", first), ("ret_events", first + 1)]
        # a rolled-back transaction appended nothing
        with pytest.raises(RuntimeError):
            with tx.transaction():
                tx.execute("INSERT INTO ret_events VALUES ('never') RETURNING offset")
                raise RuntimeError("roll back")
        assert tx.execute(last, prepare=True).fetchall() == []
    rows = conn.execute("SELECT offset, kind FROM ret_events ORDER BY offset").fetchall()
    assert [k for _, k in rows] == ["earlier", "r0-0", "r0-1", "r1-0", "r1-1", "r2-0", "r2-1"]
    assert [o for o, _ in rows] == list(range(7))


def test_duplicate_key_keeps_the_connection_working(sluice, conn):
    conn.execute("CREATE TABLE users (id int PRIMARY KEY, name text NOT NULL)")
    conn.execute("INSERT INTO users VALUES (%s, %s), (%s, %s)", (1, "ann", 2, "bob"))

    with pytest.raises(errors.UniqueViolation) as info:
        conn.execute("INSERT INTO users VALUES (%s, %s)", (1, "dup"))
    assert info.value.sqlstate == "23505"
    assert 'duplicate key value violates unique constraint "users_pkey"' in str(info.value)

    with pytest.raises(errors.UniqueViolation):
        conn.execute("UPDATE users SET id = 1 WHERE id = 2")

    # Repeated failures, also once psycopg has prepared the statement.
    for attempt in range(8):
        with pytest.raises(errors.UniqueViolation):
            conn.execute("INSERT INTO users VALUES (%s, %s)", (2, f"dup{attempt}"))
    with pytest.raises(errors.NotNullViolation):
        conn.execute("INSERT INTO users VALUES (%s, %s)", (3, None))

    conn.execute("INSERT INTO users VALUES (%s, %s)", (3, "cid"))
    assert conn.execute("SELECT id, name FROM users ORDER BY id").fetchall() == \
        [(1, "ann"), (2, "bob"), (3, "cid")]

    # Inside a block the error aborts it; after ROLLBACK the connection works.
    with sluice.connect() as tx:  # not autocommit: psycopg sends BEGIN
        tx.execute("INSERT INTO users VALUES (4, 'dee')")
        with pytest.raises(errors.UniqueViolation):
            tx.execute("INSERT INTO users VALUES (1, 'dup')")
        assert tx.info.transaction_status == TransactionStatus.INERROR
        with pytest.raises(errors.InFailedSqlTransaction):
            tx.execute("SELECT 1")
        tx.rollback()
        tx.execute("INSERT INTO users VALUES (5, 'eve')")
        tx.commit()
        assert tx.execute("SELECT count(*) FROM users").fetchone() == (4,)
        tx.rollback()

    assert conn.execute("SELECT id, name FROM users ORDER BY id").fetchall() == \
        [(1, "ann"), (2, "bob"), (3, "cid"), (5, "eve")]
