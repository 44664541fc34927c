"""The Prometheus endpoint (`--metrics-listen`), scraped with `curl` as a monitoring
system would, and parsed with the Prometheus client library's own text parser: stream
shape, counters, the Raft role and each consumer's lag after it commits an offset."""

import re
import socket
import subprocess

import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import SluiceServer

# One sample line of the text format 0.0.4: name, optional labels, a value.
SAMPLE = re.compile(
    r'^[a-zA-Z_:][a-zA-Z0-9_:]*'
    r'(\{[a-zA-Z_][a-zA-Z0-9_]*="(\\.|[^"\\])*"(,[a-zA-Z_][a-zA-Z0-9_]*="(\\.|[^"\\])*")*\})?'
    r' [-+]?([0-9.]+([eE][-+]?[0-9]+)?|NaN|Inf)$'
)


@pytest.fixture
def server(tmp_path):
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    s = SluiceServer(data_dir, ["--metrics-listen", "127.0.0.1:0"])
    s.start()
    try:
        assert s.metrics_port, "the server did not print `metrics on HOST:PORT`"
        yield s
    finally:
        s.stop()


def curl(port, path="/metrics", *args):
    """Status line, headers and body of `curl -i`."""
    out = subprocess.run(
        ["curl", "-sS", "-i", "--max-time", "10", *args, f"http://127.0.0.1:{port}{path}"],
        capture_output=True, text=True, check=True,
    ).stdout
    head, _, body = out.partition("\n\n")  # text mode turned CRLF into LF
    return head, body


def scrape(port):
    head, body = curl(port)
    assert head.startswith("HTTP/1.1 200"), head
    assert "content-type: text/plain; version=0.0.4" in head.lower()
    for line in body.splitlines():
        assert line.startswith("# HELP ") or line.startswith("# TYPE ") or SAMPLE.match(line), line
    families = {f.name: f for f in text_string_to_metric_families(body)}
    assert families, body
    samples = {}
    for family in families.values():
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return families, samples


def test_metrics_show_streams_counters_and_consumer_lag(server):
    with server.connect(autocommit=True) as conn:
        conn.execute("CREATE STREAM orders (item text)")
        for i in range(10):
            conn.execute("INSERT INTO orders (item) VALUES (%s)", (f"i{i}",))
        last = conn.execute('SELECT max("offset") FROM orders').fetchone()[0]
        conn.execute(
            "INSERT INTO consumer_offsets (consumer, stream, \"offset\") VALUES ('billing', 'orders', %s)",
            (last - 4,),
        )

        families, samples = scrape(server.metrics_port)
        stream = (("stream", "orders"),)
        consumer = (("consumer", "billing"), ("stream", "orders"))
        assert samples[("sluice_stream_next_offset", stream)] == last + 1
        assert samples[("sluice_stream_segments", stream)] >= 1
        assert samples[("sluice_consumer_offset", consumer)] == last - 4
        assert samples[("sluice_consumer_lag", consumer)] == 4
        assert samples[("sluice_appended_rows_total", ())] >= 10
        assert samples[("sluice_raft_leader", ())] == 1
        assert families["sluice_appended_rows"].type == "counter"
        assert families["sluice_consumer_lag"].type == "gauge"
        assert samples[("sluice_sessions", ())] >= 2  # this connection and the endpoint's
        assert samples[("sluice_retention_cuts_total", ())] == 0
        # the Raft node's histograms: every write waited for an fsync and an answer
        for name in ["sluice_log_fsync_seconds", "sluice_log_entries_per_fsync",
                     "sluice_commit_seconds"]:
            assert families[name].type == "histogram", name
            count = samples[(name + "_count", ())]
            assert count >= 1, name
            assert samples[(name + "_bucket", (("le", "+Inf"),))] == count, name
            bounds = sorted(
                (float(labels[0][1]), value) for (n, labels), value in samples.items()
                if n == name + "_bucket" and labels[0][1] != "+Inf"
            )
            assert [v for _, v in bounds] == sorted(v for _, v in bounds), name  # cumulative
            assert samples[(name + "_sum", ())] > 0, name
        assert samples[("sluice_commit_seconds_count", ())] >= 12
        # every checkpoint's time (it holds up the Raft node's thread)
        assert families["sluice_checkpoint_seconds"].type == "histogram"
        assert samples[("sluice_checkpoint_seconds_count", ())] == samples[("sluice_checkpoints_total", ())]

        # the consumer catches up; more rows arrive
        conn.execute(
            "UPDATE consumer_offsets SET \"offset\" = %s WHERE consumer = 'billing' AND stream = 'orders'",
            (last,),
        )
        _, samples = scrape(server.metrics_port)
        assert samples[("sluice_consumer_lag", consumer)] == 0
        conn.execute("INSERT INTO orders (item) VALUES ('late'), ('later')")
        _, samples = scrape(server.metrics_port)
        assert samples[("sluice_consumer_lag", consumer)] == 2


def test_request_time_counts_every_request_once(server):
    """`sluice_request_seconds`: one observation per request a client finishes — a simple
    Query, an extended-protocol exchange up to its Sync, a COPY FROM up to its CopyDone, a
    statement that fails — and none for the scrape itself (it reads through no connection)."""
    def count():
        _, samples = scrape(server.metrics_port)
        return samples[("sluice_request_seconds_count", ())]

    with server.connect(autocommit=True) as conn:
        conn.execute("CREATE STREAM req (n bigint)")
        before = count()
        assert count() == before
        for i in range(5):  # psycopg: Parse/Bind/Describe/Execute/Sync
            conn.execute("INSERT INTO req (n) VALUES (%s)", (i,))
        conn.pgconn.exec_(b"SELECT 1")  # a simple Query
        with conn.cursor().copy("COPY req (n) FROM STDIN") as copy:
            copy.write_row((9,))
        with pytest.raises(Exception):
            conn.execute("SELECT * FROM no_such_stream")
        assert count() == before + 8
        families, samples = scrape(server.metrics_port)
        assert families["sluice_request_seconds"].type == "histogram"
        assert samples[("sluice_request_seconds_bucket", (("le", "+Inf"),))] == before + 8
        assert samples[("sluice_request_seconds_sum", ())] > 0


def test_stream_and_consumer_names_are_escaped_as_label_values(server):
    with server.connect(autocommit=True) as conn:
        conn.execute('CREATE STREAM "we ird" (v int)')
        conn.execute('INSERT INTO "we ird" (v) VALUES (1)')
        conn.execute(
            "INSERT INTO consumer_offsets (consumer, stream, \"offset\") "
            "VALUES (E'a\"b\\\\c\\nd', 'we ird', 0)"
        )
    _, samples = scrape(server.metrics_port)
    assert samples[("sluice_stream_next_offset", (("stream", 'we ird'),))] >= 1
    assert (("sluice_consumer_lag", (("consumer", 'a"b\\c\nd'), ("stream", 'we ird')))
            in samples)


def test_other_paths_methods_and_bad_requests_are_refused(server):
    port = server.metrics_port
    head, _ = curl(port, "/")
    assert head.startswith("HTTP/1.1 404"), head
    head, _ = curl(port, "/metrics", "-X", "POST")
    assert head.startswith("HTTP/1.1 405"), head
    head, body = curl(port, "/metrics", "-I")
    assert head.startswith("HTTP/1.1 200"), head
    # garbage and an oversized head get an answer or a closed socket, never a hang
    for request in [b"\x00\x01garbage\r\n\r\n", b"GET /metrics HTTP/1.1\r\nX: " + b"a" * 20000]:
        with socket.create_connection(("127.0.0.1", port), timeout=15) as s:
            try:
                s.sendall(request)
                s.shutdown(socket.SHUT_WR)
            except OSError:
                pass  # the server answered and closed before reading it all
            answer = b""
            try:
                while chunk := s.recv(4096):
                    answer += chunk
            except ConnectionResetError:
                pass  # closed with the rest of the request unread
            assert answer == b"" or answer.startswith((b"HTTP/1.1 400", b"HTTP/1.1 431")), answer[:80]
    # and it still serves
    scrape(port)


def test_the_grafana_dashboard_queries_only_served_metrics(server):
    """examples/grafana-dashboard.json: every metric a panel queries is one the endpoint
    serves (a renamed metric would leave a panel empty without this)."""
    import json
    import pathlib

    with server.connect(autocommit=True) as conn:
        conn.execute("CREATE STREAM orders (item text)")
        conn.execute("INSERT INTO orders (item) VALUES ('a')")
        conn.execute("INSERT INTO consumer_offsets VALUES ('billing', 'orders', 0)")
    families, samples = scrape(server.metrics_port)
    # a family with no sample here (peer lag, on a single node) is still served
    served = {name for name, _ in samples} | set(families)
    path = pathlib.Path(__file__).resolve().parents[2] / "examples" / "grafana-dashboard.json"
    dashboard = json.loads(path.read_text())
    queried = set()
    for panel in dashboard["panels"]:
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            queried.update(re.findall(r"\b(?:sluice|process)_[a-z0-9_]+", target["expr"]))
    assert len(queried) >= 15, queried
    missing = sorted(queried - served)
    assert not missing, f"the dashboard queries metrics the endpoint does not serve: {missing}"
