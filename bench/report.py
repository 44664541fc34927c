"""Turn one benchmark run's JSONL into tables, plots and bench/README.md.

    python bench/report.py bench/results/<stamp>.jsonl [--quick] [--readme PATH]

`bench/run.sh` calls this at the end of a run. The script owns everything
derived from a run's `<stamp>.jsonl` (one JSON object per line, each with a
"workload" field, as printed by `sluice-bench`):

- `<stamp>.md` beside the JSONL: every workload's full table, all points of
  both targets;
- `<stamp>-latency.png`: append latency by percentile on a "nines" x axis
  (p50 ... p99.9999) and a log-scale y axis in ms, one line per target and
  label of the `latency` workload plus one per `tail_latency` run;
- `<stamp>-throughput.png`: acknowledged rows/s by connection count (log2
  x axis) of the single-row INSERT sweep, Sluice and PostgreSQL;
- the README (default `bench/README.md`): `bench/README.head.md`, which is
  hand-written and never touched here, followed by a generated section
  "## Latest results" with the machine, links, the plots, one summary table
  against the targets, and the disk's physical limits.

The `pgbench` records (one per pgbench run: script, connections, target,
run, tps, latency_ms, failed, and `error` with a null tps when pgbench
failed) are paired by run number, run k of Sluice with run k of
PostgreSQL; per (script, connections) the median of those per-run ratios
is the figure of record (see `pgbench_points`). They give a section of
`<stamp>.md`, the summary rows of issue 25's pgbench targets (literal and
expression at 1 connection ≥ 1x, at 64 connections ≥ 2x), and a client
check in `<stamp>.md`: whether sluice-bench's own PostgreSQL reference (the
`sweep` at 64 connections) is within 10% of what pgbench gets from
PostgreSQL with the `parameter` script at 64 connections; if sluice-bench
gets less, its client limited PostgreSQL and the reference ratios at that
point are not valid.

The `compression` records (issue 23: one per target and `compression`
setting — none, lz4, zstd — with the size on disk and logical, load, COPY
TO and aggregate figures, and `error` with null figures when a phase
failed) and the `compression_cat` records (`cat` of each setting's segment
files) give a "Compression" table in `<stamp>.md` and in the README, and
the summary row of issue 23's bar: Sluice's COPY TO of compressed history
(lz4 and zstd) at least 2x PostgreSQL's COPY TO of the same rows, read in
the same round (see `CompressionRound`).

Nothing else is read or written. Unknown workloads are ignored, and a
workload missing from the run shows as "not measured" rather than failing,
so a partial run (e.g. without PostgreSQL) still gets a report.
Depends only on matplotlib.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import statistics
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter  # noqa: E402

BENCH_DIR = Path(__file__).resolve().parent
PG_NAME = "PostgreSQL 15"
NOT_MEASURED = "not measured"
DASH = "—"
MIB = 1024 * 1024
GIB = 1024 * MIB

# percentiles on the latency plot's x axis, as "nines"
NINES_TICKS = ["p50", "p90", "p99", "p99.9", "p99.99", "p99.999", "p99.9999"]
# message sizes and tail fan-outs the run is expected to measure
EXPECTED_SIZES = [256, 1024, 5120, 1048576]
EXPECTED_TAILS = [1, 4, 16]
INGEST_METHODS = ["multi-row INSERT", "COPY FROM"]
# pgbench scripts run by bench/run.sh, in the order of the tables
PGBENCH_SCRIPTS = ["literal", "expression", "parameter", "literal+hog"]
# issue 25's CPU-contention point: the literal script at 64 connections with a
# busy loop taking one core; Sluice ÷ PG must stay within this fraction of the quiet ratio
HOG_SCRIPT, HOG_CONNECTIONS, HOG_TOLERANCE = "literal+hog", 64, 0.20
# issue 25's pgbench targets: script, connections, median Sluice ÷ PG at least, as written
PGBENCH_TARGETS = [
    ("literal", 1, 1.0, "≥ 1.0x"),
    ("expression", 1, 1.0, "≥ 1.0x"),
    ("literal", 64, 2.0, "≥ 2x"),
    ("expression", 64, 2.0, "≥ 2x"),
]
# sluice-bench's PostgreSQL reference counts as valid within this fraction of pgbench's
CLIENT_CHECK_TOLERANCE = 0.10
# the `compression` settings bench/run.sh measures, in table order, and the
# compressed ones, each held to issue 23's bar: COPY TO ≥ 2x PostgreSQL's
COMPRESSION_SETTINGS = ["none", "lz4", "zstd"]
COMPRESSED_SETTINGS = ["lz4", "zstd"]
COMPRESSED_SCAN_BAR = 2.0

Record = dict[str, Any]


# ---------------------------------------------------------------- loading


class Run:
    """The records of one run, grouped by workload."""

    KNOWN = {
        "machine", "sweep", "latency", "tail_latency", "stalled_tail",
        "ingest", "load", "scan", "aggregate", "disk", "cat", "pgbench", "wide_history",
        "compression", "compression_cat",
    }

    def __init__(self, records: Iterable[Record]):
        self.by_workload: dict[str, list[Record]] = defaultdict(list)
        self.ignored: dict[str, int] = defaultdict(int)
        for r in records:
            w = r.get("workload")
            if w in self.KNOWN:
                self.by_workload[w].append(r)
            else:
                self.ignored[str(w)] += 1

    def all(self, workload: str, **match: Any) -> list[Record]:
        """Records of `workload` whose fields equal every `match` value."""
        return [
            r for r in self.by_workload.get(workload, [])
            if all(r.get(k) == v for k, v in match.items())
        ]

    def one(self, workload: str, **match: Any) -> Record | None:
        """The last matching record (a repeated point supersedes the earlier)."""
        found = self.all(workload, **match)
        return found[-1] if found else None

    @property
    def machine(self) -> Record:
        return self.one("machine") or {}


def load_jsonl(path: Path) -> list[Record]:
    """Objects from a JSONL file; tolerates `JSON ` prefixes, arrays of
    objects (older runs) and blank lines; warns about unparsable lines."""
    records: list[Record] = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        line = line.strip()
        if line.startswith("JSON "):
            line = line[5:]
        if not line:
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as e:
            warn(f"{path}:{n}: not JSON ({e}); skipped")
            continue
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, dict):
                records.append(item)
    return records


def warn(msg: str) -> None:
    print(f"report.py: {msg}", file=sys.stderr)


# ------------------------------------------------------------- formatting


def num(v: Any) -> float | None:
    """A finite float, or None for null / missing / non-numeric."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v) if math.isfinite(v) else None


def fmt_int(v: Any) -> str:
    v = num(v)
    return DASH if v is None else f"{v:,.0f}"


def fmt_rows(v: Any) -> str:
    v = num(v)
    return DASH if v is None else f"{v:,.0f} rows/s"


def fmt_mib(v: Any) -> str:
    v = num(v)
    return DASH if v is None else f"{v:,.1f} MiB/s"


def fmt_ms(us: Any) -> str:
    us = num(us)
    return DASH if us is None else f"{us / 1000:.2f}"


def fmt_secs(v: Any) -> str:
    v = num(v)
    return DASH if v is None else f"{v:.3g} s" if v < 100 else f"{v:,.0f} s"


def fmt_ratio(v: Any, suffix: str = "") -> str:
    v = num(v)
    return DASH if v is None else f"{v:.2f}x{suffix}"


def fmt_pct(v: Any) -> str:
    v = num(v)
    return DASH if v is None else f"{v * 100:.0f}%"


def fmt_size(b: Any) -> str:
    b = num(b)
    if b is None:
        return DASH
    for unit, scale in (("MiB", MIB), ("KiB", 1024)):
        if b >= scale and b % scale == 0:
            return f"{b / scale:.0f} {unit}"
    return f"{b:.0f} B"


def fmt_gib(b: Any) -> str:
    b = num(b)
    return DASH if b is None else f"{b / GIB:.2f} GiB"


def fmt_bytes(b: Any) -> str:
    """MiB below a GiB, GiB from there."""
    b = num(b)
    if b is None:
        return DASH
    return f"{b / GIB:.2f} GiB" if b >= GIB else f"{b / MIB:,.1f} MiB"


def plural(n: Any, word: str) -> str:
    """plural(1, "connection") -> "1 connection"; plural(8, "connection") -> "8 connections"."""
    return f"{fmt_int(n)} {word}" + ("" if num(n) == 1 else "s")


def ratio(a: Any, b: Any) -> float | None:
    a, b = num(a), num(b)
    return None if a is None or b is None or b == 0 else a / b


def pretty_target(t: Any) -> str:
    return {"sluice": "Sluice", "postgres": PG_NAME}.get(t, str(t))


def percentiles(rec: Record | None) -> dict[str, float]:
    """{"p99": microseconds, ...} from a record's percentiles_us pairs."""
    out: dict[str, float] = {}
    for pair in (rec or {}).get("percentiles_us") or []:
        if isinstance(pair, (list, tuple)) and len(pair) == 2 and num(pair[1]) is not None:
            out[str(pair[0])] = float(pair[1])
    return out


def quantile(label: str) -> float | None:
    """"p99.9" -> 99.9"""
    try:
        q = float(label.lstrip("p"))
    except ValueError:
        return None
    return q if 0 < q < 100 else None


def nines(q: float) -> float:
    """The plot's x for percentile q: p90 -> 1, p99 -> 2, p99.9 -> 3, ..."""
    return -math.log10(1 - q / 100)


def percentile_labels(recs: Iterable[Record]) -> list[str]:
    """The union of the records' percentile labels, in increasing order."""
    labels = {p for r in recs for p in percentiles(r) if quantile(p) is not None}
    return sorted(labels, key=lambda p: quantile(p) or 0)


def md_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


# -------------------------------------------------------- results file (md)


def sweep_table(recs: list[Record]) -> str:
    """Sluice and PostgreSQL side by side per (size, connections)."""
    points: dict[tuple[float, float], dict[str, Record]] = defaultdict(dict)
    for r in recs:
        points[(num(r.get("size")) or 0, num(r.get("connections")) or 0)][r.get("target")] = r
    with_pg = any("postgres" in by for by in points.values())
    rows = []
    for (size, conns), by in sorted(points.items()):
        s, p = by.get("sluice"), by.get("postgres")
        row = [
            fmt_size(size), fmt_int(conns),
            fmt_int(s and s.get("rows_per_sec")), fmt_mib(s and s.get("mib_per_sec")).removesuffix(" MiB/s"),
            f"{num(s.get('rows_per_fsync')):.1f}" if s and num(s.get("rows_per_fsync")) is not None else DASH,
        ]
        if with_pg:
            row += [
                fmt_int(p and p.get("rows_per_sec")), fmt_mib(p and p.get("mib_per_sec")).removesuffix(" MiB/s"),
                fmt_ratio(ratio(s and s.get("rows_per_sec"), p and p.get("rows_per_sec"))),
            ]
        rows.append(row)
    header = ["size", "connections", "Sluice rows/s", "Sluice MiB/s", "rows/fsync"]
    if with_pg:
        header += [f"{PG_NAME} rows/s", f"{PG_NAME} MiB/s", "Sluice ÷ PG"]
    return md_table(header, rows)


def latency_table(recs: list[Record], lead: Callable[[Record], list[str]], lead_header: list[str]) -> str:
    labels = percentile_labels(recs)
    rows = []
    for r in recs:
        ps = percentiles(r)
        rows.append(lead(r) + [fmt_ms(ps.get(p)) for p in labels] + [fmt_ms(r.get("max_us"))])
    return md_table(lead_header + [f"{p} ms" for p in labels] + ["max ms"], rows)


def sweep_section_title(label: str) -> str:
    return {
        "fsync+2ms": "Group commit with a slow log disk (each fsync +2 ms), single-row INSERT",
        "sluice": "Single-row INSERT throughput by connections (closed loop, acknowledged rows)",
        "postgres": "Single-row INSERT throughput by connections (closed loop, acknowledged rows)",
        "size": "Message sizes: single-row INSERT throughput by row size",
    }.get(label, f"Single-row INSERT sweep `{label}`")


def results_markdown(run: Run, stamp: str, summary: str, limits: str, compression: str) -> str:
    m = run.machine
    out = [f"# Sluice vs {PG_NAME} — benchmark results ({stamp})", "", machine_line(m), ""]
    out += ["## Summary", "", summary, "", "## Physical limits", "", limits, ""]

    def section(title: str, body: str, note: str = "") -> None:
        out.extend([f"## {title}", ""] + ([note, ""] if note else []) + [body, ""])

    disk = run.all("disk")
    if disk:
        section(
            "Disk: fdatasync after a 4 KiB append, and sequential write",
            latency_table(disk, lambda r: [str(r.get("dir", DASH)), fmt_int(r.get("fdatasync_count"))],
                          ["directory", "fdatasyncs"])
            + "\n\n"
            + md_table(["directory", "bytes written", "sequential write + fdatasync"],
                       [[str(r.get("dir", DASH)), fmt_gib(r.get("seq_write_bytes")),
                         fmt_mib(r.get("seq_write_mib_per_sec"))] for r in disk]),
        )

    # sweeps: one section per label, sluice/postgres merged into one table
    by_label: dict[str, list[Record]] = defaultdict(list)
    for r in run.all("sweep"):
        label = r.get("label")
        if label == "one":
            continue
        by_label["sluice" if label in ("sluice", "postgres") else str(label)].append(r)
    for label, recs in by_label.items():
        section(sweep_section_title(label), sweep_table(recs))
    pairs = one_connection_pairs(run)
    if pairs:
        section(
            "One connection, single-row INSERT 1 KiB: alternating runs",
            one_connection_table(pairs),
            "Sluice and PostgreSQL take turns (Sluice first in each pair), so both meet the disk in the "
            "same moments; at one connection each row waits for its own fdatasync, and this VM's fsync "
            "time drifts within minutes. The target row uses the median ratio of the pairs.",
        )
    points = pgbench_points(run)
    if points:
        section(
            "pgbench: single-row INSERT with the standard client (alternating runs)",
            pgbench_table(points) + pgbench_notes(points) + "\n\n" + client_check(run, points),
            "`pgbench -n -M prepared -j 2 -c <connections> -T <seconds> -f <script>`, each script one "
            "single-row INSERT per transaction: `literal` = `VALUES ('<1000 x>')`, `expression` = "
            "`VALUES (repeat('x', 1000))`, `parameter` = a random bigint `:n` and the literal. In PostgreSQL "
            "the table has a `bigserial` key and a `timestamptz DEFAULT now()` column, in Sluice it is a "
            "stream. Sluice and PostgreSQL take turns (Sluice first); the ratio is the median over runs of "
            "Sluice's tps ÷ PostgreSQL's in the same run number, the tps columns the median of each side.",
        )

    lat = run.all("latency")
    if lat:
        section(
            "Append latency, open loop at a fixed rate (coordinated-omission corrected)",
            latency_table(
                lat,
                lambda r: [pretty_target(r.get("target")), str(r.get("label", DASH)), fmt_size(r.get("size")),
                           fmt_int(r.get("connections")), f"{fmt_int(r.get('rate'))}/s",
                           fmt_int(r.get("acknowledged")), fmt_int(r.get("errors"))],
                ["target", "label", "size", "connections", "rate", "acknowledged", "errors"],
            ),
        )

    tails = sorted(run.all("tail_latency"), key=lambda r: num(r.get("tails")) or 0)
    if tails:
        section(
            "Tail latency: commit acknowledged → row received by each COPY tail",
            latency_table(
                tails,
                lambda r: [fmt_int(r.get("tails")), f"{fmt_int(r.get('rate'))}/s", fmt_int(r.get("rows"))],
                ["tails", "rate", "rows received"],
            ),
        )

    stalled = run.all("stalled_tail")
    if stalled:
        section(
            "A COPY tail that stops reading while rows are appended",
            md_table(
                ["rows", "connections", "no tail", "stalled tail", "ratio", "server RSS before → after"],
                [[fmt_int(r.get("rows")), fmt_int(r.get("connections")),
                  fmt_rows(r.get("baseline_rows_per_sec")), fmt_rows(r.get("stalled_rows_per_sec")),
                  fmt_ratio(r.get("ratio")), rss(r)] for r in stalled],
            ),
        )

    ingest = sorted(run.all("ingest"), key=lambda r: (str(r.get("method")), str(r.get("target"))))
    if ingest:
        section(
            "Bulk ingest (closed loop, acknowledged batches)",
            md_table(
                ["method", "target", "size", "connections", "batch rows", "seconds", "rows", "data",
                 "rows/s", "MiB/s"],
                [[str(r.get("method", DASH)), pretty_target(r.get("target")), fmt_size(r.get("size")),
                  fmt_int(r.get("connections")), fmt_int(r.get("batch_rows")), fmt_secs(r.get("seconds")),
                  fmt_int(r.get("rows")), fmt_gib(r.get("bytes")), fmt_int(r.get("rows_per_sec")),
                  fmt_mib(r.get("mib_per_sec")).removesuffix(" MiB/s")] for r in ingest],
            ),
        )

    loads = run.all("load")
    if loads:
        section(
            "Loading the history tables (COPY FROM)",
            md_table(
                ["target", "table", "rows", "row size", "seconds", "MiB/s"],
                [[pretty_target(r.get("target")), str(r.get("table", DASH)), fmt_int(r.get("rows")),
                  fmt_size(r.get("size")), fmt_secs(r.get("seconds")),
                  fmt_mib(r.get("mib_per_sec")).removesuffix(" MiB/s")] for r in loads],
            ),
        )

    scans, cats = run.all("scan"), run.all("cat")
    if scans or cats:
        body = md_table(
            ["target", "query", "rows", "data", "seconds", "MiB/s"],
            [[pretty_target(r.get("target")), f"`{r.get('query', '')}`", fmt_int(r.get("rows")),
              fmt_gib(r.get("bytes")), fmt_secs(r.get("seconds")),
              fmt_mib(r.get("mib_per_sec")).removesuffix(" MiB/s")] for r in scans],
        ) if scans else NOT_MEASURED
        if cats:
            body += "\n\nThe physical limit: `cat` of Sluice's segment files, warm like the scan.\n\n" + md_table(
                ["files", "data", "seconds", "MiB/s"],
                [[fmt_int(r.get("files")), fmt_gib(r.get("bytes")), fmt_secs(r.get("seconds")),
                  fmt_mib(r.get("mib_per_sec")).removesuffix(" MiB/s")] for r in cats],
            )
        section("History scan (whole table out through COPY, best of runs)", body)

    aggs = run.all("aggregate")
    if aggs:
        section(
            "Aggregate (GROUP BY over the history table)",
            md_table(
                ["target", "rows", "groups", "runs", "best", "median", "query"],
                [[pretty_target(r.get("target")), fmt_int(r.get("rows")), fmt_int(r.get("groups")),
                  fmt_int(r.get("runs")), fmt_secs(r.get("seconds_best")), fmt_secs(r.get("seconds_median")),
                  f"`{r.get('query', '')}`"] for r in aggs],
            ),
        )

    if run.all("compression") or run.all("compression_cat"):
        section("Compression: the same event rows per `compression` setting (issue 23)",
                compression + "\n\n" + guarded("compression details", compression_details, run),
                COMPRESSION_NOTE)

    if run.ignored:
        out += ["Ignored records of unknown workloads: "
                + ", ".join(f"`{w}` ({n})" for w, n in sorted(run.ignored.items())) + ".", ""]
    return "\n".join(out).rstrip() + "\n"


def rss(r: Record) -> str:
    before, after = num(r.get("rss_before_kib")), num(r.get("rss_after_kib"))
    if before is None or after is None:
        return NOT_MEASURED
    return f"{before / 1024:,.1f} → {after / 1024:,.1f} MiB"


def machine_line(m: Record) -> str:
    if not m:
        return f"Machine: {NOT_MEASURED}."
    return (
        f"Machine: {m.get('cores', '?')} cores, {m.get('ram_gib', '?')} GiB RAM, {m.get('kernel', '?')}, "
        f"data disk {m.get('disk', '?')}; run started {m.get('date', '?')}."
        + AUTOGROUP_NOTE.get(m.get("autogroup"), "")
    )


# The kernel's autogroup scheduling shares the CPU between sessions first: every PostgreSQL
# backend calls setsid (a session, so an autogroup, of its own), Sluice is one process in one
# session, and the CPU-contention point's hog is a session too.
AUTOGROUP_NOTE = {
    1: (" The kernel's autogroup scheduling was on: the CPU is shared between sessions first, and "
        "every PostgreSQL backend is a session of its own (it calls setsid) while Sluice is one "
        "process in one session, so under the CPU hog 64 PostgreSQL backends weigh 64 shares "
        "against the hog's one, Sluice one."),
    0: " The kernel's autogroup scheduling was off (the CPU is shared between threads).",
}


# ------------------------------------------------------------ compression


COMPRESSION_NOTE = (
    "Each setting loads the same event rows (a customer of 100, an amount, a JSON-like payload of about "
    "1 KiB drawn from small vocabularies: repetitive, never a constant) into a fresh Sluice, a stream "
    "`WITH (compression = '<setting>')`, with COPY FROM (1,000 rows per statement, one appended batch; 4 "
    "connections). Bytes on disk, logical bytes (uncompressed Arrow) and their ratio are "
    "`sluice_streams`' `bytes`, `logical_bytes` and `compression_ratio`. COPY TO is `COPY (SELECT * FROM "
    "events_<setting>) TO STDOUT`, best of 2, read by the history scan's lean client; the aggregate is "
    "`SELECT customer, count(*), sum(amount) ... GROUP BY customer`, median of 3. "
    f"{PG_NAME} holds the same rows once, in a table with a `bigserial` key and a `ts` column (rows this "
    "size stay under TOAST's 2 KiB threshold, so it stores them uncompressed; its load includes `VACUUM "
    "ANALYZE`), and runs `COPY events TO STDOUT` and the same aggregate right after each Sluice setting: "
    f"\"vs {PG_NAME} COPY TO\" is Sluice's rows/s ÷ {PG_NAME}'s in the same round, and the "
    f"{PG_NAME} row shows the median of its rounds."
)


@dataclass
class CompressionRound:
    """One `compression` setting: Sluice's stream, PostgreSQL's table read
    right after it, and the `cat` of the stream's segment files."""

    setting: str
    sluice: Record | None
    postgres: Record | None
    cat: Record | None

    def scan_ratio(self) -> float | None:
        """Sluice's COPY TO rows/s ÷ PostgreSQL's in the same round (the
        same rows: rows/s, not MiB/s, whose text differs by a column)."""
        return ratio(self.sluice and self.sluice.get("scan_rows_per_sec"),
                     self.postgres and self.postgres.get("scan_rows_per_sec"))


def compression_rounds(run: Run) -> list[CompressionRound]:
    """The expected settings in order, then any other the run recorded."""
    seen = {r.get("setting") for r in run.all("compression") + run.all("compression_cat")}
    extra = sorted(x for x in seen if isinstance(x, str) and x not in COMPRESSION_SETTINGS)
    return [CompressionRound(s, run.one("compression", target="sluice", setting=s),
                             run.one("compression", target="postgres", setting=s),
                             run.one("compression_cat", setting=s))
            for s in COMPRESSION_SETTINGS + extra]


def compression_table(run: Run) -> str:
    """The table of the README and `<stamp>.md`: one row per setting, one
    for PostgreSQL, then the failures and inconsistencies as notes."""
    if not run.all("compression"):
        return NOT_MEASURED
    rounds = compression_rounds(run)
    rows = []
    for rd in rounds:
        s = rd.sluice
        if s is None:
            rows.append([f"`{rd.setting}`", NOT_MEASURED] + [DASH] * 7)
            continue
        rows.append([
            f"`{rd.setting}`", fmt_int(s.get("rows")), fmt_bytes(s.get("bytes")),
            fmt_bytes(s.get("logical_bytes")), fmt_ratio(s.get("compression_ratio")),
            fmt_secs(s.get("load_seconds")), fmt_int(s.get("scan_rows_per_sec")),
            fmt_ratio(rd.scan_ratio()), fmt_secs(s.get("aggregate_seconds_median")),
        ])
    pgs = [rd.postgres for rd in rounds if rd.postgres is not None]
    if pgs:
        loaded = next((p for p in pgs if p.get("loaded")), pgs[0])
        scans = [v for p in pgs if (v := num(p.get("scan_rows_per_sec"))) is not None]
        aggs = [v for p in pgs if (v := num(p.get("aggregate_seconds_median"))) is not None]
        rows.append([
            f"{PG_NAME} table", fmt_int(loaded.get("rows")), fmt_bytes(loaded.get("bytes")), DASH, DASH,
            fmt_secs(loaded.get("load_seconds")),
            fmt_int(statistics.median(scans)) if scans else DASH, DASH,
            fmt_secs(statistics.median(aggs)) if aggs else DASH,
        ])
    header = ["compression", "rows", "bytes on disk", "logical bytes", "ratio", "load", "COPY TO rows/s",
              f"vs {PG_NAME} COPY TO", "aggregate (median)"]
    return md_table(header, rows) + compression_notes(rounds)


def compression_notes(rounds: list[CompressionRound]) -> str:
    """Failed phases, rows that did not come back, and a stream whose
    reported compression is not the one it was created with."""
    out = []
    for rd in rounds:
        for target, rec in (("sluice", rd.sluice), ("postgres", rd.postgres)):
            if rec is None:
                continue
            who = f"`{rd.setting}`, {pretty_target(target)}"
            error = rec.get("error")
            if error:
                error = str(error).replace("`", "'")
                out.append(f"- {who}: failed: `{error[:300] + ('...' if len(error) > 300 else '')}`")
            rows = num(rec.get("rows"))
            for what, key in (("COPY TO read", "scan_rows"), ("the aggregate counted", "aggregate_rows")):
                got = num(rec.get(key))
                if rows is not None and got is not None and got != rows:
                    out.append(f"- {who}: {what} {fmt_int(got)} rows of {fmt_int(rows)} loaded")
        reported = rd.sluice.get("reported_compression") if rd.sluice else None
        if isinstance(reported, str) and reported.lower() != rd.setting:
            out.append(f"- `{rd.setting}`: the stream was created `WITH (compression = '{rd.setting}')` but "
                       f"`sluice_streams` reports `{reported}`")
    return "\n\n" + "\n".join(out) if out else ""


def compression_details(run: Run) -> str:
    """Every point of both targets, with MiB/s and the segment files' `cat`."""
    rows = []
    for rd in compression_rounds(run):
        for target, rec in (("sluice", rd.sluice), ("postgres", rd.postgres)):
            if rec is None:
                continue
            cat = rd.cat if target == "sluice" else None
            rows.append([
                f"`{rd.setting}`", pretty_target(target),
                ("yes" if rec.get("loaded") else "no (read the loaded table)") if "loaded" in rec else DASH,
                f"{fmt_secs(rec.get('load_seconds'))}, {fmt_mib(rec.get('load_mib_per_sec'))}"
                if num(rec.get("load_seconds")) is not None else DASH,
                fmt_secs(rec.get("scan_seconds")), fmt_int(rec.get("scan_rows_per_sec")),
                fmt_mib(rec.get("scan_mib_per_sec")).removesuffix(" MiB/s"), fmt_bytes(rec.get("scan_bytes")),
                f"{fmt_secs(rec.get('aggregate_seconds_best'))} / {fmt_secs(rec.get('aggregate_seconds_median'))}"
                if num(rec.get("aggregate_seconds_median")) is not None else DASH,
                f"{fmt_bytes(cat.get('bytes'))} in {plural(cat.get('files'), 'file')}, {fmt_mib(cat.get('mib_per_sec'))}"
                if cat else DASH,
            ])
    return md_table(["compression", "target", "loaded here", "load", "COPY TO (best)", "COPY TO rows/s",
                     "COPY TO MiB/s", "COPY text out", "aggregate best / median",
                     "segment files: `cat`, warm"], rows)


def guarded(name: str, build: Callable[[Run], str], run: Run) -> str:
    """build(run), or "not measured" if a malformed record breaks it."""
    try:
        return build(run)
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        warn(f"{name}: {type(e).__name__}: {e}")
        return f"{NOT_MEASURED} (malformed record)"


def rows_compression(run: Run) -> list[Row]:
    """Issue 23's bar: COPY TO of compressed history (each compressed
    setting) at least COMPRESSED_SCAN_BAR times PostgreSQL's COPY TO."""
    rounds = [rd for rd in compression_rounds(run) if rd.setting in COMPRESSED_SETTINGS]
    shape = next((rd.sluice or rd.postgres for rd in rounds if rd.sluice or rd.postgres), None)
    what = f", {fmt_int(shape.get('rows'))} event rows of ~1 KiB" if shape else ""
    ratios = [(rd.setting, rd.scan_ratio()) for rd in rounds]
    measured = [r for _, r in ratios if r is not None]
    # a "compressed" stream that sluice_streams shows was not compressed
    # does not count for the bar (a shortfall still fails it)
    stored_plain = [rd.setting for rd in rounds
                    if rd.sluice and (cr := num(rd.sluice.get("compression_ratio"))) is not None and cr < 1.05]
    ok = (False if any(r < COMPRESSED_SCAN_BAR for r in measured)
          else None if len(measured) < len(rounds) or stored_plain else True)
    if stored_plain:
        what += f" (**{', '.join(stored_plain)} stored uncompressed**: ratio below 1.05x)"

    def side(pick: Callable[[CompressionRound], Record | None]) -> str:
        parts = [f"{rd.setting} {fmt_rows(rec.get('scan_rows_per_sec'))}"
                 for rd in rounds if (rec := pick(rd)) is not None]
        return ", ".join(parts) if parts else NOT_MEASURED

    return [Row(f"compressed history scan ({', '.join(COMPRESSED_SETTINGS)}): COPY TO{what}",
                side(lambda rd: rd.sluice), side(lambda rd: rd.postgres),
                ", ".join(f"{setting} {fmt_ratio(r)}" for setting, r in ratios),
                f"≥ {COMPRESSED_SCAN_BAR:g}x each", met(ok))]


# ---------------------------------------------------------- summary table


@dataclass
class Row:
    workload: str
    sluice: str = DASH
    pg: str = DASH
    ratio: str = ""
    target: str = DASH
    met: str = DASH

    def cells(self) -> list[str]:
        return [self.workload, self.sluice, self.pg, self.ratio, self.target, self.met]


def met(ok: bool | None) -> str:
    return NOT_MEASURED if ok is None else "yes" if ok else "**no**"


def at_least(value: float | None, bound: float) -> bool | None:
    return None if value is None else value >= bound


def or_missing(rec: Record | None, text: Callable[[Record], str]) -> str:
    return NOT_MEASURED if rec is None else text(rec)


def rows_insert_64(run: Run) -> list[Row]:
    s = run.one("sweep", label="sluice", size=1024, connections=64)
    p = run.one("sweep", label="postgres", size=1024, connections=64)
    r = ratio(s and s.get("rows_per_sec"), p and p.get("rows_per_sec"))
    return [Row(
        "single-row INSERT 1 KiB, 64 connections",
        or_missing(s, lambda x: fmt_rows(x.get("rows_per_sec"))),
        or_missing(p, lambda x: fmt_rows(x.get("rows_per_sec"))),
        fmt_ratio(r), "≥ 2x", met(at_least(r, 2.0)),
    )]


def rows_group_commit(run: Run) -> list[Row]:
    def at_128(label: str) -> tuple[Record | None, float | None, str]:
        sweep = [r for r in run.all("sweep", label=label, size=1024) if num(r.get("rows_per_sec")) is not None]
        rec = run.one("sweep", label=label, size=1024, connections=128)
        if rec is None or not sweep:
            return rec, None, NOT_MEASURED
        best = max(sweep, key=lambda r: num(r.get("rows_per_sec")) or 0)
        frac = ratio(rec.get("rows_per_sec"), best.get("rows_per_sec"))
        return rec, frac, (
            f"{fmt_rows(rec.get('rows_per_sec'))} ({fmt_pct(frac)} of best, "
            f"{fmt_int(best.get('rows_per_sec'))} at {fmt_int(best.get('connections'))})"
        )

    _, s_frac, s_text = at_128("sluice")
    _, _, p_text = at_128("postgres")
    pairs = one_connection_pairs(run)
    if pairs:
        # the median of alternating runs (see one_connection_table)
        r1 = statistics.median(r for _, _, r in pairs)
        s_text1 = f"{fmt_rows(statistics.median(s for s, _, _ in pairs))} median of {len(pairs)}"
        p_text1 = f"{fmt_rows(statistics.median(p for _, p, _ in pairs))} median of {len(pairs)}"
        what = "single-row INSERT 1 KiB, 1 connection (alternating runs, median ratio)"
    else:
        s1 = run.one("sweep", label="sluice", size=1024, connections=1)
        p1 = run.one("sweep", label="postgres", size=1024, connections=1)
        r1 = ratio(s1 and s1.get("rows_per_sec"), p1 and p1.get("rows_per_sec"))
        s_text1 = or_missing(s1, lambda x: fmt_rows(x.get("rows_per_sec")))
        p_text1 = or_missing(p1, lambda x: fmt_rows(x.get("rows_per_sec")))
        what = "single-row INSERT 1 KiB, 1 connection"
    return [
        Row("group commit: single-row INSERT 1 KiB, 128 connections vs best of the sweep",
            s_text, p_text, fmt_pct(s_frac) + " of best" if s_frac is not None else DASH,
            "≥ 90% of best", met(at_least(s_frac, 0.9))),
        Row(what, s_text1, p_text1, fmt_ratio(r1), "≥ 0.67 (within 1.5x)",
            # within 1.5x of PostgreSQL: sluice/pg ≥ 1/1.5
            met(at_least(r1, 1 / 1.5 - 1e-9))),
    ]


def one_connection_pairs(run: Run) -> list[tuple[float, float, float]]:
    """(Sluice rows/s, PostgreSQL rows/s, ratio) of each alternating pair of
    one-connection runs (label `one`, Sluice first in each pair)."""
    s = [num(r.get("rows_per_sec")) for r in run.all("sweep", label="one", target="sluice")]
    p = [num(r.get("rows_per_sec")) for r in run.all("sweep", label="one", target="postgres")]
    return [(a, b, a / b) for a, b in zip(s, p) if a is not None and b]


def one_connection_table(pairs: list[tuple[float, float, float]]) -> str:
    rows = [[str(i + 1), fmt_int(a), fmt_int(b), fmt_ratio(r)] for i, (a, b, r) in enumerate(pairs)]
    rows.append(["median", fmt_int(statistics.median(a for a, _, _ in pairs)),
                 fmt_int(statistics.median(b for _, b, _ in pairs)),
                 fmt_ratio(statistics.median(r for _, _, r in pairs))])
    return md_table(["run", "Sluice rows/s", f"{PG_NAME} rows/s", "Sluice ÷ PG"], rows)


@dataclass
class PgbenchPoint:
    """The pgbench runs of one (script, connections) point: tps by run
    number of each target (measured runs only), and the failed runs."""

    script: str
    connections: int
    tps: dict[str, dict[int, float]]
    errors: list[tuple[str, int, str]]  # (target, run, error)
    failed: dict[tuple[str, int], int]  # (target, run) -> failed transactions reported by pgbench

    @property
    def failed_txns(self) -> int:
        return sum(self.failed.values())

    def median_tps(self, target: str) -> float | None:
        runs = self.tps.get(target) or {}
        return statistics.median(runs.values()) if runs else None

    def ratios(self) -> list[float]:
        """Sluice tps ÷ PostgreSQL tps of each run number measured on both sides."""
        s, p = self.tps.get("sluice") or {}, self.tps.get("postgres") or {}
        return [s[k] / p[k] for k in sorted(s) if p.get(k)]

    def median_ratio(self) -> float | None:
        rs = self.ratios()
        return statistics.median(rs) if rs else None

    def any_error(self, target: str) -> bool:
        return any(t == target for t, _, _ in self.errors)


@functools.cache  # read by the summary and by the results file: warn once
def pgbench_points(run: Run) -> dict[tuple[str, int], PgbenchPoint]:
    """The `pgbench` records grouped by (script, connections), in the order
    of PGBENCH_SCRIPTS then connections. A record without a run number
    counts as the next run of its target; a repeated run number supersedes
    the earlier record."""
    points: dict[tuple[str, int], PgbenchPoint] = {}
    seen: dict[tuple[str, int, str], int] = defaultdict(int)
    for r in run.all("pgbench"):
        script, conns, target = r.get("script"), num(r.get("connections")), r.get("target")
        if not isinstance(script, str) or conns is None or target not in ("sluice", "postgres"):
            warn(f"pgbench record without script, connections or target: {r}")
            continue
        key = (script, int(conns))
        point = points.setdefault(key, PgbenchPoint(script, int(conns), {"sluice": {}, "postgres": {}}, [], {}))
        seen[key + (target,)] += 1
        n = num(r.get("run"))
        k = int(n) if n is not None else seen[key + (target,)]
        tps = num(r.get("tps"))
        point.errors = [e for e in point.errors if (e[0], e[1]) != (target, k)]
        if tps is None:
            point.tps[target].pop(k, None)
            point.errors.append((target, k, str(r.get("error") or "no tps")))
        else:
            point.tps[target][k] = tps
        point.failed[(target, k)] = int(num(r.get("failed")) or 0)

    def order(key: tuple[str, int]) -> tuple[int, str, int]:
        script, conns = key
        known = script in PGBENCH_SCRIPTS
        return (PGBENCH_SCRIPTS.index(script) if known else len(PGBENCH_SCRIPTS), script, conns)

    return {k: points[k] for k in sorted(points, key=order)}


def pgbench_table(points: dict[tuple[str, int], PgbenchPoint]) -> str:
    rows = []
    for p in points.values():
        runs = str(len(p.ratios()))
        if p.errors:
            runs += f" ({len(p.errors)} failed)"
        rows.append([f"`{p.script}`", fmt_int(p.connections), fmt_int(p.median_tps("sluice")),
                     fmt_int(p.median_tps("postgres")), fmt_ratio(p.median_ratio()), runs])
    return md_table(["script", "connections", "Sluice tps (median)", f"{PG_NAME} tps (median)",
                     "median Sluice ÷ PG", "runs"], rows)


def pgbench_notes(points: dict[tuple[str, int], PgbenchPoint]) -> str:
    """Failed runs and failed transactions, if any, as text after the table."""
    out = []
    for p in points.values():
        for target, k, error in p.errors:
            error = error.replace("`", "'")
            out.append(f"- `{p.script}`, {plural(p.connections, 'connection')}, {pretty_target(target)} "
                       f"run {k}: pgbench failed: `{error}`")
        if p.failed_txns:
            out.append(f"- `{p.script}`, {plural(p.connections, 'connection')}: "
                       f"{fmt_int(p.failed_txns)} failed transactions reported by pgbench")
    return "\n\n" + "\n".join(out) if out else ""


def client_check(run: Run, points: dict[tuple[str, int], PgbenchPoint]) -> str:
    """Is sluice-bench's PostgreSQL reference at 64 connections (the sweep,
    1 KiB rows) within CLIENT_CHECK_TOLERANCE of pgbench's (`parameter`,
    64 connections, median)? If sluice-bench gets less out of PostgreSQL,
    its client was the limit and the reference ratios there are not valid."""
    head = ("**Client check** (sluice-bench's own client against pgbench, "
            f"{PG_NAME}, single-row INSERT, 64 connections): ")
    sweep = run.one("sweep", label="postgres", size=1024, connections=64)
    point = points.get(("parameter", 64))
    sb = num(sweep and sweep.get("rows_per_sec"))
    pgb = point.median_tps("postgres") if point else None
    if point is None or sb is None or not pgb:
        missing = [what for what, v in (("sluice-bench's sweep", sb), ("pgbench `parameter`", pgb)) if not v]
        return head + f"{NOT_MEASURED} (no {' and no '.join(missing)} at 64 connections)."
    dev = sb / pgb - 1
    figures = (f"sluice-bench's sweep {fmt_rows(sb)} vs pgbench `parameter` {fmt_int(pgb)} tps "
               f"(median of {len(point.tps['postgres'])}): {dev * 100:+.0f}%")
    if abs(dev) <= CLIENT_CHECK_TOLERANCE:
        return head + figures + (f", within {fmt_pct(CLIENT_CHECK_TOLERANCE)}: sluice-bench's {PG_NAME} "
                                 "reference at 64 connections is valid.")
    if dev < 0:
        return head + figures + (f", not within {fmt_pct(CLIENT_CHECK_TOLERANCE)}: the client limited "
                                 f"{PG_NAME}, so sluice-bench's reference ratios at 64 connections (Sluice ÷ "
                                 f"{PG_NAME} of the sweep, and the summary's \"single-row INSERT 1 KiB, 64 "
                                 "connections\" row) are not valid.")
    return head + figures + (f", not within {fmt_pct(CLIENT_CHECK_TOLERANCE)}, but above: sluice-bench's client "
                             f"did not hold {PG_NAME} back; pgbench (its client on the same cores, or its "
                             "statement) is the slower one here.")


def rows_pgbench(run: Run) -> list[Row]:
    points = pgbench_points(run)
    out = []
    for script, conns, bound, target_text in PGBENCH_TARGETS:
        p = points.get((script, conns))
        r = p.median_ratio() if p else None
        out.append(Row(f"pgbench {script}, {plural(conns, 'connection')}",
                       pgbench_tps_text(p, "sluice"), pgbench_tps_text(p, "postgres"),
                       fmt_ratio(r), target_text, met(at_least(r, bound))))
    return out


def rows_cpu_hog(run: Run) -> list[Row]:
    """Acceptance 5: under a CPU hog on one core, Sluice's ratio to PostgreSQL
    (pgbench literal, 64 connections) drops by at most HOG_TOLERANCE of the quiet ratio."""
    points = pgbench_points(run)
    quiet, hog = points.get(("literal", HOG_CONNECTIONS)), points.get((HOG_SCRIPT, HOG_CONNECTIONS))
    rq = quiet.median_ratio() if quiet else None
    rh = hog.median_ratio() if hog else None
    change = f"{fmt_ratio(rh)} vs {fmt_ratio(rq)} quiet" + (f" ({(rh / rq - 1) * 100:+.0f}%)" if rh and rq else "")
    ok = None if rh is None or rq is None else rh >= (1 - HOG_TOLERANCE) * rq
    return [Row(f"pgbench literal, {HOG_CONNECTIONS} connections, a CPU hog on one core",
                pgbench_tps_text(hog, "sluice"), pgbench_tps_text(hog, "postgres"), change,
                f"ratio ≥ {fmt_pct(1 - HOG_TOLERANCE)} of the quiet one", met(ok))]


def pgbench_tps_text(p: PgbenchPoint | None, target: str) -> str:
    if p is None:
        return NOT_MEASURED
    tps = p.median_tps(target)
    if tps is None:
        return NOT_MEASURED + (" (pgbench failed)" if p.any_error(target) else "")
    return f"{fmt_int(tps)} tps, median of {len(p.tps[target])}"


def rows_ingest(run: Run) -> list[Row]:
    out = []
    for method in INGEST_METHODS:
        s = run.one("ingest", method=method, target="sluice")
        p = run.one("ingest", method=method, target="postgres")
        shape = s or p
        what = (f", {fmt_size(shape.get('size'))} rows, batches of {fmt_int(shape.get('batch_rows'))}, "
                f"{plural(shape.get('connections'), 'connection')}") if shape else ""
        r = ratio(s and s.get("mib_per_sec"), p and p.get("mib_per_sec"))

        def text(x: Record) -> str:
            return f"{fmt_mib(x.get('mib_per_sec'))} ({fmt_rows(x.get('rows_per_sec'))})"

        out.append(Row(f"bulk ingest, {method}{what}", or_missing(s, text), or_missing(p, text),
                       fmt_ratio(r), "≥ 2x", met(at_least(r, 2.0))))
    return out


def rows_scan(run: Run) -> list[Row]:
    s, p = run.one("scan", target="sluice"), run.one("scan", target="postgres")
    r = ratio(s and s.get("mib_per_sec"), p and p.get("mib_per_sec"))

    def text(x: Record) -> str:
        return f"{fmt_mib(x.get('mib_per_sec'))} ({fmt_int(x.get('rows'))} rows, {fmt_gib(x.get('bytes'))})"

    return [Row("history scan: whole table out through COPY", or_missing(s, text), or_missing(p, text),
                fmt_ratio(r), "≥ 2x", met(at_least(r, 2.0)))]


def rows_aggregate(run: Run) -> list[Row]:
    s, p = run.one("aggregate", target="sluice"), run.one("aggregate", target="postgres")
    shape = s or p
    what = f" over {fmt_int(shape.get('rows'))} rows" if shape else ""
    # how many times faster Sluice is: PostgreSQL's time over Sluice's
    r = ratio(p and p.get("seconds_median"), s and s.get("seconds_median"))

    def text(x: Record) -> str:
        return f"{fmt_secs(x.get('seconds_median'))} median"

    return [Row(f"aggregate: GROUP BY customer{what}", or_missing(s, text), or_missing(p, text),
                fmt_ratio(r, " faster"), "≥ 5x", met(at_least(r, 5.0)))]


# issue 25's wide-history point (bench/wide_history.sh): query, what it is, and
# PostgreSQL's seconds ÷ Sluice's at least (None: measured, no target)
WIDE_QUERIES = [
    ("load", "load, 20 psql `\\copy` (median of 3 alternating loads)", 2.0),
    ("copy", "`COPY (SELECT * FROM h) TO STDOUT`", None),
    ("group", "GROUP BY customer, count(*), sum(amount)", 5.0),
    ("filter", "count(*) WHERE customer = 'c7'", 2.0),
]


def rows_wide(run: Run) -> list[Row]:
    out = []
    b = run.one("wide_history", query="bulk")
    if b:
        s, p = b.get("sluice_seconds"), b.get("postgres_seconds")
        x = ratio(p, s)
        hwm = b.get("sluice_peak_rss_mib")
        ok = at_least(x, 2.0)
        if ok is not None and hwm is not None:
            ok = ok and hwm < 512
        gib = (b.get("bytes") or 0) / (1 << 30)
        out.append(Row(f"one psql `\\copy` of {gib:.2f} GiB ({fmt_int(b.get('rows'))} rows); "
                       "a bad row at 90% leaves nothing (both)",
                       fmt_secs(s) + f"; peak RSS {fmt_int(hwm)} MiB", fmt_secs(p),
                       fmt_ratio(x, " faster"), "≥ 2x, RSS < 512 MiB", met(ok)))
    for query, what, bound in WIDE_QUERIES:
        r = run.one("wide_history", query=query)
        shape = f" ({fmt_int(r.get('rows'))} rows of ~1 KiB, psql)" if r else ""
        s, p = (r.get("sluice_seconds"), r.get("postgres_seconds")) if r else (None, None)
        x = ratio(p, s)
        rss_text = f"; RSS {fmt_int(r.get('sluice_rss_mib'))} MiB" if r and query == "load" else ""
        out.append(Row(f"wide history{shape}: {what}", fmt_secs(s) + rss_text, fmt_secs(p),
                       fmt_ratio(x, " faster"), f"≥ {bound:g}x" if bound else DASH,
                       met(at_least(x, bound)) if bound else DASH))
    return out


def median_latency(recs: list[Record]) -> Record | None:
    """The median of each percentile over a label's alternating latency runs
    (one record as `percentiles` reads it), or None without runs."""
    if not recs:
        return None
    per = [percentiles(r) for r in recs]
    keys = [k for k in per[0] if all(k in p for p in per)]
    maxes = [m for r in recs if (m := num(r.get("max_us"))) is not None]
    return {**recs[-1], "runs": len(recs),
            "percentiles_us": [[k, statistics.median(p[k] for p in per)] for k in keys],
            "max_us": max(maxes) if maxes else None}


def server_side(recs: list[Record], key: str) -> dict[str, float] | None:
    """What Sluice saw during its latency runs (`server` in a record: bucket upper bounds
    in µs, None for the +Inf bucket, as infinity here): the median of each quantile over the
    runs, and the largest max; None when no run has it."""
    per = []
    for r in recs:
        pairs = (r.get("server") or {}).get(key) or []
        d = {str(k): (math.inf if v is None else float(v)) for k, v in pairs if num(v) is not None or v is None}
        if d:
            per.append(d)
    if not per:
        return None
    keys = [k for k in per[0] if all(k in d for d in per)]
    return {k: (max if k == "max" else statistics.median)(d[k] for d in per) for k in keys}


def bounds_text(b: dict[str, float]) -> str:
    def one(us: float | None) -> str:
        return DASH if us is None else "> last bucket" if math.isinf(us) else f"≤ {us / 1000:.2f}"
    return f"{one(b.get('p99'))} / {one(b.get('p99.99'))} / {one(b.get('max'))} ms"


def rows_latency(run: Run) -> list[Row]:
    sluice_runs = run.all("latency", label="sluice", size=1024)
    s = median_latency(sluice_runs)
    p = median_latency(run.all("latency", label="postgres", size=1024))
    f = median_latency(run.all("latency", label="floor", size=1024))
    shape = s or p
    rate = f" @ {fmt_int(shape.get('rate'))}/s" if shape else ""
    runs = f", median of {s['runs']} alternating runs" if s and s["runs"] > 1 else ""

    def text(x: Record) -> str:
        ps = percentiles(x)
        return f"{fmt_ms(ps.get('p99'))} / {fmt_ms(ps.get('p99.99'))} ms"

    ok = None
    if s:
        ps = percentiles(s)
        if "p99" in ps and "p99.99" in ps:
            ok = ps["p99"] <= 2000 and ps["p99.99"] <= 10000
    t = run.one("tail_latency", tails=1)
    t99 = percentiles(t).get("p99")
    rows = [
        Row(f"append latency 1 KiB{rate}: p99 / p99.99{runs}", or_missing(s, text), or_missing(p, text),
            "", "p99 ≤ 2 ms, p99.99 ≤ 10 ms (Sluice)", met(ok)),
    ]
    if f:
        rows.append(Row(f"the disk's floor{rate}: an ideal group-commit log (pwrite + fdatasync of "
                        "every request due, no server), p99 / p99.99", text(f), DASH, "", DASH, DASH))
    fsync = server_side(sluice_runs, "fsync_le_us")
    if fsync:
        rows.append(Row("during those Sluice runs, its own Raft-log fdatasync (histogram bucket "
                        "bounds, median of runs; max of runs): p99 / p99.99 / max",
                        bounds_text(fsync), DASH, "", DASH, DASH))
    commit = server_side(sluice_runs, "commit_le_us")
    if commit:
        checkpoint = server_side(sluice_runs, "checkpoint_le_us")
        during = (f" (checkpoints meanwhile, on the same thread: max ≤ {fmt_ms(checkpoint['max'])} ms)"
                  if checkpoint and "max" in checkpoint and not math.isinf(checkpoint["max"]) else "")
        rows.append(Row("… and its commit, sent to the Raft node → answered (queue, log write, "
                        "fdatasync, apply): p99 / p99.99 / max", bounds_text(commit) + during,
                        DASH, "", DASH, DASH))
    request = server_side(sluice_runs, "request_le_us")
    if request:
        rows.append(Row("… and its time for each request, first message read → ReadyForQuery written "
                        "(the commit plus the connection's work): p99 / p99.99 / max",
                        bounds_text(request), DASH, "", DASH, DASH))
    if fsync and request and s and p:
        # the alternative to p99.99 ≤ 10 ms: the disk's own tail is the floor — the
        # server's slowest requests are no slower than waiting out the fsync under way and
        # then its own (twice the fsync p99.99) — and PostgreSQL's tail is as long
        f, r = fsync.get("p99.99"), request.get("p99.99")
        sp, pp = percentiles(s).get("p99.99"), percentiles(p).get("p99.99")
        floor_ok = None
        if None not in (f, r, sp, pp):
            floor_ok = not math.isinf(f) and r <= 2 * f and pp >= 0.9 * sp
        rows.append(Row("the tail's floor (the alternative to p99.99 ≤ 10 ms): Sluice's request "
                        "p99.99 ≤ twice its fdatasync p99.99, and PostgreSQL's append p99.99 ≥ 90% "
                        "of Sluice's",
                        f"request ≤ {fmt_ms(r)} vs fdatasync ≤ {fmt_ms(f)} ms; append {fmt_ms(sp)} ms",
                        f"append {fmt_ms(pp)} ms", "", "both", met(floor_ok)))
    rows.append(Row("tail latency, commit → received by 1 COPY tail: p99",
                    or_missing(t, lambda x: f"{fmt_ms(t99)} ms"), DASH, "", "p99 ≤ 2 ms",
                    met(None if t99 is None else t99 <= 2000)))
    return rows


def rows_sizes(run: Run) -> list[Row]:
    recs = run.all("sweep", label="size")
    sizes = sorted({int(num(r.get("size")) or 0) for r in recs} | set(EXPECTED_SIZES))
    out = []
    for size in sizes:
        s = run.one("sweep", label="size", size=size, target="sluice")
        p = run.one("sweep", label="size", size=size, target="postgres")
        conns = (s or p or {}).get("connections")
        what = f", {plural(conns, 'connection')}" if conns is not None else ""

        def text(x: Record) -> str:
            return f"{fmt_rows(x.get('rows_per_sec'))}, {fmt_mib(x.get('mib_per_sec'))}"

        out.append(Row(f"message size {fmt_size(size)}{what}", or_missing(s, text), or_missing(p, text),
                       fmt_ratio(ratio(s and s.get("rows_per_sec"), p and p.get("rows_per_sec")))))
    return out


def rows_fanout(run: Run) -> list[Row]:
    tails = sorted({int(num(r.get("tails")) or 0) for r in run.all("tail_latency")} | set(EXPECTED_TAILS))
    out = []
    for n in tails:
        t = run.one("tail_latency", tails=n)
        ps = percentiles(t)
        out.append(Row(f"tail fan-out, {plural(n, 'tail')}: p50 / p99",
                       or_missing(t, lambda x: f"{fmt_ms(ps.get('p50'))} / {fmt_ms(ps.get('p99'))} ms")))
    return out


def rows_slow_fsync(run: Run) -> list[Row]:
    recs = sorted(run.all("sweep", label="fsync+2ms", target="sluice"), key=lambda r: num(r.get("connections")) or 0)
    if not recs:
        return [Row("group commit, log fsync +2 ms", NOT_MEASURED)]
    first = num(recs[0].get("rows_per_sec"))
    out = []
    for r in recs:
        rpf = num(r.get("rows_per_fsync"))
        speedup = ratio(r.get("rows_per_sec"), first)
        out.append(Row(
            f"group commit, log fsync +2 ms, {fmt_size(r.get('size'))}, {plural(r.get('connections'), 'connection')}",
            fmt_rows(r.get("rows_per_sec")) + (f" ({rpf:.1f} rows/fsync)" if rpf is not None else ""),
            DASH,
            fmt_ratio(speedup, f" vs {fmt_int(recs[0].get('connections'))}") if r is not recs[0] else "",
        ))
    return out


def rows_stalled(run: Run) -> list[Row]:
    s = run.one("stalled_tail")
    what = f" {fmt_int(s.get('rows'))} rows ({plural(s.get('connections'), 'connection')})" if s else ""
    return [Row(
        f"stalled COPY tail while appending{what}",
        or_missing(s, lambda x: f"{fmt_rows(x.get('stalled_rows_per_sec'))} vs "
                                f"{fmt_int(x.get('baseline_rows_per_sec'))} without; RSS {rss(x)}"),
        DASH, fmt_ratio(s and s.get("ratio")),
    )]


SUMMARY_SECTIONS: list[tuple[str, Callable[[Run], list[Row]]]] = [
    ("single-row INSERT 1 KiB, 64 connections", rows_insert_64),
    ("group commit", rows_group_commit),
    ("pgbench", rows_pgbench),
    ("CPU contention", rows_cpu_hog),
    ("bulk ingest", rows_ingest),
    ("history scan", rows_scan),
    ("compressed history scan", rows_compression),
    ("aggregate", rows_aggregate),
    ("wide history", rows_wide),
    ("append latency", rows_latency),
    # listed without a target
    ("message sizes", rows_sizes),
    ("tail fan-out", rows_fanout),
    ("group commit, log fsync +2 ms", rows_slow_fsync),
    ("stalled tail", rows_stalled),
]


def summary_table(run: Run) -> str:
    rows: list[Row] = []
    for name, build in SUMMARY_SECTIONS:
        try:
            rows += build(run)
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            # a malformed record must not cost the rest of the report
            warn(f"summary row '{name}': {type(e).__name__}: {e}")
            rows.append(Row(name, f"{NOT_MEASURED} (malformed record)"))
    return md_table(["workload", "Sluice", PG_NAME, "ratio", "target", "met?"], [r.cells() for r in rows])


def limits_table(run: Run) -> str:
    disk, cat = run.one("disk"), run.one("cat")
    ps = percentiles(disk)
    seq = num(disk and disk.get("seq_write_mib_per_sec"))
    cat_mib = num(cat and cat.get("mib_per_sec"))

    def share(rec: Record | None, limit: float | None, what: str) -> str:
        if rec is None:
            return NOT_MEASURED
        frac = ratio(rec.get("mib_per_sec"), limit)
        return f"{what} {fmt_mib(rec.get('mib_per_sec'))} = {fmt_pct(frac)}" if frac is not None else \
            f"{what} {fmt_mib(rec.get('mib_per_sec'))}"

    rows = [
        ["fdatasync after a 4 KiB append"
         + (f" ({fmt_int(disk.get('fdatasync_count'))} samples)" if disk else "") + ": p50 / p99 / p99.9",
         NOT_MEASURED if not ps else
         f"{fmt_ms(ps.get('p50'))} / {fmt_ms(ps.get('p99'))} / {fmt_ms(ps.get('p99.9'))} ms",
         DASH, DASH],
        ["sequential write"
         + (f" of {fmt_gib(disk.get('seq_write_bytes'))} + one fdatasync" if disk else ""),
         NOT_MEASURED if seq is None else fmt_mib(seq),
         share(run.one("ingest", method="COPY FROM", target="sluice"), seq, "COPY FROM ingest"),
         share(run.one("ingest", method="COPY FROM", target="postgres"), seq, "COPY FROM ingest")],
        ["`cat` of Sluice's segment files"
         + (f" ({fmt_int(cat.get('files'))} files, {fmt_gib(cat.get('bytes'))}, warm)" if cat else ""),
         NOT_MEASURED if cat_mib is None else fmt_mib(cat_mib),
         share(run.one("scan", target="sluice"), cat_mib, "history scan"),
         share(run.one("scan", target="postgres"), cat_mib, "history scan")],
    ]
    return md_table(["physical limit of the data disk", "measured", "Sluice: fraction of the limit",
                     f"{PG_NAME}: fraction of the limit"], rows)


# ------------------------------------------------------------------ plots


def empty_plot(ax: Any, what: str) -> None:
    ax.text(0.5, 0.5, f"{what}: {NOT_MEASURED}", ha="center", va="center", transform=ax.transAxes)
    ax.set_xticks([])
    ax.set_yticks([])


def series_name(r: Record) -> str:
    target, label = r.get("target"), r.get("label")
    name = pretty_target(target)
    return name if label in (None, target) else f"{name} ({label})"


def plot_latency(run: Run, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(9, 5.5))
    lines = []  # (name, record, style)
    # one line per label: the median of each percentile over its runs
    for label in dict.fromkeys(r.get("label") for r in run.all("latency")):
        m = median_latency(run.all("latency", label=label))
        runs = f", median of {m['runs']} runs" if m and m["runs"] > 1 else ""
        lines.append((series_name(m) + runs, m, "-"))
    for r in sorted(run.all("tail_latency"), key=lambda r: num(r.get("tails")) or 0):
        n = r.get("tails")
        lines.append((f"tail, {plural(n, 'tail')}", r, "--"))
    plotted = False
    for name, r, style in lines:
        pts = sorted((nines(q), us / 1000) for p, us in percentiles(r).items()
                     if (q := quantile(p)) is not None and us > 0)
        if not pts:
            continue
        mx = num(r.get("max_us"))
        label = name + (f", max {mx / 1000:.2f} ms" if mx is not None else "")
        ax.plot([x for x, _ in pts], [y for _, y in pts], style, marker="o", markersize=4,
                linewidth=2 if style == "-" else 1.3, label=label)
        plotted = True
    if not plotted:
        empty_plot(ax, "append latency")
    else:
        if run.all("latency", target="sluice"):
            ax.plot([nines(99), nines(99.99)], [2, 10], linestyle="none", marker="_", markersize=22,
                    markeredgewidth=2.5, color="crimson", label="Sluice target (p99 2 ms, p99.99 10 ms)")
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set_xticks([nines(quantile(p)) for p in NINES_TICKS], NINES_TICKS)
        ax.set_xlim(nines(50) - 0.15, nines(99.9999) + 0.15)
        ax.set_xlabel("percentile")
        ax.set_ylabel("latency (ms, log scale)")
        ax.grid(True, which="major", alpha=0.35)
        ax.legend(fontsize=8, loc="upper left")
    rate = next((r.get("rate") for r in run.all("latency") if r.get("rate") is not None), None)
    ax.set_title("Append latency by percentile"
                 + (f" @ {fmt_int(rate)} rows/s" if rate is not None else "")
                 + "\n(open loop, coordinated-omission corrected; dashed: commit → received by COPY tails)",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_throughput(run: Run, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(9, 5.5))
    series: dict[tuple[str, Any], list[Record]] = defaultdict(list)
    for label in ("sluice", "postgres"):
        for r in run.all("sweep", label=label):
            if num(r.get("connections")) and num(r.get("rows_per_sec")) is not None:
                series[(label, r.get("size"))].append(r)
    sizes = {size for _, size in series}
    conns: set[int] = set()
    for (label, size), recs in series.items():
        recs.sort(key=lambda r: num(r.get("connections")) or 0)
        xs = [num(r.get("connections")) for r in recs]
        ys = [num(r.get("rows_per_sec")) for r in recs]
        conns.update(int(x) for x in xs if x)
        name = pretty_target(recs[0].get("target")) + (f", {fmt_size(size)}" if len(sizes) > 1 else "")
        ax.plot(xs, ys, marker="o", label=name)
    if not series:
        empty_plot(ax, "single-row INSERT sweep")
    else:
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted(conns), [str(c) for c in sorted(conns)])
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_ylim(bottom=0)
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
        ax.set_xlabel("connections (log2)")
        ax.set_ylabel("acknowledged rows/s")
        ax.grid(True, alpha=0.35)
        ax.legend(loc="upper left")
    size = next(iter(sizes)) if len(sizes) == 1 else None
    ax.set_title("Single-row INSERT throughput by connections"
                 + (f", {fmt_size(size)} rows" if size is not None else "")
                 + " (closed loop, synchronous commit)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ----------------------------------------------------------------- README


def readme_section(run: Run, quick: bool, results_md: Path, pngs: list[tuple[str, Path]],
                   readme: Path, jsonl: Path, summary: str, limits: str, compression: str) -> str:
    m = run.machine
    date = str(m.get("date") or "")[:10] or stamp_date(jsonl.stem)

    def rel(p: Path) -> str:
        return Path(os.path.relpath(p.resolve(), readme.resolve().parent)).as_posix()

    out = [
        f"<!-- generated by bench/report.py from {rel(jsonl)}; edit README.head.md instead -->",
        f"## Latest results ({date}, {'`--quick`' if quick else 'full'})",
        "",
        machine_line(m) + " One run on one machine: read the ratios, not the absolutes.",
        "",
        f"All points of every workload: [`{rel(results_md)}`]({rel(results_md)}).",
        "",
    ]
    for alt, png in pngs:
        out += [f"![{alt}]({rel(png)})", ""]
    out += [summary, "", "### Physical limits", "", limits, ""]
    out += ["### Compression (issue 23)", "",
            "The same ~1 KiB event rows in a stream per `compression` setting, each in a fresh Sluice, and "
            f"once in a {PG_NAME} table read right after each; \"vs {PG_NAME} COPY TO\" is the ratio of "
            f"rows/s in the same round. How they are measured, and every point: [`{rel(results_md)}`]"
            f"({rel(results_md)}).", "", compression, ""]
    return "\n".join(out)


def stamp_date(stamp: str) -> str:
    """"2026-11-24T164000Z" -> "2026-11-24"; anything else -> "unknown date"."""
    head = stamp[:10]
    return head if len(head) == 10 and head[4] == "-" and head[7] == "-" else "unknown date"


# ------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("jsonl", type=Path, help="bench/results/<stamp>.jsonl")
    ap.add_argument("--quick", action="store_true", help="the run was bench/run.sh --quick")
    ap.add_argument("--readme", type=Path, default=BENCH_DIR / "README.md",
                    help="README to regenerate (default: bench/README.md)")
    ap.add_argument("--head", type=Path, default=BENCH_DIR / "README.head.md",
                    help="hand-written top of the README (default: bench/README.head.md)")
    args = ap.parse_args(argv)

    run = Run(load_jsonl(args.jsonl))
    for w, n in sorted(run.ignored.items()):
        warn(f"ignored {n} record(s) of unknown workload {w!r}")
    quick = args.quick or bool(run.machine.get("quick"))
    if "quick" in run.machine and bool(run.machine["quick"]) != args.quick:
        warn(f"--quick is {args.quick} but the machine record says quick={run.machine['quick']}; "
             f"reporting as {'--quick' if quick else 'full'}")

    base = args.jsonl.with_suffix("")
    results_md = base.with_name(base.name + ".md")
    latency_png = base.with_name(base.name + "-latency.png")
    throughput_png = base.with_name(base.name + "-throughput.png")

    summary, limits = summary_table(run), limits_table(run)
    compression = guarded("compression table", compression_table, run)
    results_md.write_text(results_markdown(run, base.name, summary, limits, compression))
    plot_latency(run, latency_png)
    plot_throughput(run, throughput_png)

    if not args.head.is_file():
        warn(f"{args.head} not found: {args.readme} left as it is")
        return 1
    section = readme_section(
        run, quick, results_md,
        [("append latency by percentile", latency_png), ("single-row INSERT rows/s by connections", throughput_png)],
        args.readme, args.jsonl, summary, limits, compression,
    )
    args.readme.write_text(args.head.read_text().rstrip() + "\n\n" + section)
    print(f"report.py: wrote {results_md}, {latency_png}, {throughput_png}, {args.readme}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
