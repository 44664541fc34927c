//! The compression workload (issue 23): one stream per `compression`
//! setting, holding the same event rows, loaded with COPY FROM like the
//! history table ([`bulk::copy_rows`]); then its size on disk against its
//! logical size (uncompressed Arrow) from `sluice_streams`, the whole
//! stream out through `COPY ... TO STDOUT` with the scan's lean client
//! ([`bulk::fastest_copy_out`]), and the history GROUP BY
//! ([`bulk::timed_aggregate`]). Against PostgreSQL the same rows go into a
//! table (a `bigserial` key and a `ts` column, as everywhere in the bench)
//! and the same reads run: `run.sh` loads it once and reads it again beside
//! each Sluice setting (`--skip-load`), so every setting has its reference
//! measured next to it.
//!
//! The rows are a pure function of the row number, so every stream and the
//! table hold the same data: a customer of 100 (`c0` .. `c99`), an amount
//! in cents, and a JSON-like event of about `size` bytes drawn from small
//! vocabularies by a generator seeded with the row number — repetitive like
//! real events, never a constant, so the ratio is one real data could see.
//!
//! A failed phase is written into the point's `error` and leaves its
//! fields null; the phases after it still run, unless the load failed
//! (nothing to measure). The point itself is always printed.

use std::fmt::Write;
use std::time::Instant;

use serde::Serialize;
use tokio_postgres::Client;

use crate::bulk::{self, MIB};
use crate::{connect, err, Common, Target};

/// Customers of the event rows: the GROUP BY has this many groups.
const CUSTOMERS: u64 = 100;

/// The stream option `compression`.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum Codec {
    None,
    Lz4,
    Zstd,
}

impl Codec {
    fn name(self) -> &'static str {
        match self {
            Codec::None => "none",
            Codec::Lz4 => "lz4",
            Codec::Zstd => "zstd",
        }
    }
}

/// How to run one point.
pub struct Options {
    /// The stream's `compression` (on PostgreSQL: the round's label only).
    pub codec: Codec,
    pub rows: u64,
    pub connections: usize,
    /// Rows per COPY FROM statement: one appended batch.
    pub batch: u64,
    /// Read an already loaded table (PostgreSQL's second and third rounds).
    pub skip_load: bool,
    pub scan_runs: usize,
    pub aggregate_runs: usize,
}

#[derive(Serialize)]
pub struct CompressionPoint {
    workload: &'static str,
    target: Target,
    /// The `compression` setting of this round (of the stream, on Sluice).
    setting: &'static str,
    table: String,
    rows: u64,
    size: usize,
    batch_rows: u64,
    /// Whether this point loaded the rows (false: it read a loaded table).
    loaded: bool,
    load_seconds: Option<f64>,
    /// COPY text sent by the load.
    load_bytes: Option<u64>,
    load_mib_per_sec: Option<f64>,
    /// On disk: `sluice_streams.bytes`, or `pg_total_relation_size`.
    bytes: Option<i64>,
    /// Sluice: `sluice_streams.logical_bytes` (uncompressed Arrow).
    logical_bytes: Option<i64>,
    /// Sluice: `sluice_streams.compression_ratio` (logical ÷ on disk).
    compression_ratio: Option<f64>,
    /// Sluice: `sluice_streams.compression`, to check the option took.
    reported_compression: Option<String>,
    scan_query: String,
    scan_rows: Option<u64>,
    scan_bytes: Option<u64>,
    scan_seconds: Option<f64>,
    scan_rows_per_sec: Option<f64>,
    scan_mib_per_sec: Option<f64>,
    aggregate_query: String,
    aggregate_rows: Option<u64>,
    aggregate_groups: Option<u64>,
    aggregate_runs: usize,
    aggregate_seconds_best: Option<f64>,
    aggregate_seconds_median: Option<f64>,
    /// What failed, phase by phase ("load: ...; scan: ..."); null if nothing.
    error: Option<String>,
}

/// One point: load (unless `skip_load`), sizes, scan, aggregate.
pub async fn point(common: Common, o: Options) -> CompressionPoint {
    let t = common.table.clone();
    let mut p = CompressionPoint {
        workload: "compression",
        target: common.target,
        setting: o.codec.name(),
        table: t.clone(),
        rows: o.rows,
        size: common.size,
        batch_rows: o.batch,
        loaded: false,
        load_seconds: None,
        load_bytes: None,
        load_mib_per_sec: None,
        bytes: None,
        logical_bytes: None,
        compression_ratio: None,
        reported_compression: None,
        scan_query: bulk::copy_out_query(common.target, &t),
        scan_rows: None,
        scan_bytes: None,
        scan_seconds: None,
        scan_rows_per_sec: None,
        scan_mib_per_sec: None,
        aggregate_query: bulk::aggregate_query(&t),
        aggregate_rows: None,
        aggregate_groups: None,
        aggregate_runs: 0,
        aggregate_seconds_best: None,
        aggregate_seconds_median: None,
        error: None,
    };
    let who = format!("{:?} {}", common.target, o.codec.name());
    let mut errors = Vec::new();

    if !o.skip_load {
        let start = Instant::now();
        match load(&common, &o).await {
            Ok(sent) => {
                let secs = start.elapsed().as_secs_f64();
                eprintln!("{who:>16} load {} rows: {secs:.1} s", o.rows);
                p.loaded = true;
                p.load_seconds = Some(secs);
                p.load_bytes = Some(sent);
                p.load_mib_per_sec = Some(sent as f64 / MIB / secs);
            }
            Err(e) => {
                eprintln!("{who:>16} load failed: {e}");
                p.error = Some(format!("load: {e}"));
                return p;
            }
        }
    }

    match connect(&common.url).await {
        Ok(client) => {
            if let Err(e) = sizes(&client, common.target, &t, &mut p).await {
                errors.push(format!("size: {e}"));
            }
        }
        Err(e) => errors.push(format!("size: {e}")),
    }

    match bulk::fastest_copy_out(&common.url, &p.scan_query, o.scan_runs).await {
        Ok((secs, bytes, rows)) => {
            eprintln!(
                "{who:>16} scan {rows} rows, {:.0} MiB: {secs:.2} s",
                bytes as f64 / MIB
            );
            p.scan_seconds = Some(secs);
            p.scan_bytes = Some(bytes);
            p.scan_rows = Some(rows);
            p.scan_rows_per_sec = Some(rows as f64 / secs);
            p.scan_mib_per_sec = Some(bytes as f64 / MIB / secs);
        }
        Err(e) => errors.push(format!("scan: {e}")),
    }

    let aggregated = match connect(&common.url).await {
        Ok(client) => bulk::timed_aggregate(&client, &p.aggregate_query, o.aggregate_runs).await,
        Err(e) => Err(e),
    };
    match aggregated {
        Ok((times, rows, groups)) => {
            let median = times[times.len() / 2];
            eprintln!("{who:>16} aggregate over {rows} rows: median {median:.3} s");
            p.aggregate_rows = Some(rows);
            p.aggregate_groups = Some(groups);
            p.aggregate_runs = times.len();
            p.aggregate_seconds_best = Some(times[0]);
            p.aggregate_seconds_median = Some(median);
        }
        Err(e) => errors.push(format!("aggregate: {e}")),
    }

    if !errors.is_empty() {
        for e in &errors {
            eprintln!("{who:>16} {e}");
        }
        p.error = Some(errors.join("; "));
    }
    p
}

/// Creates the stream (with the option) or the table, and appends the rows.
async fn load(common: &Common, o: &Options) -> Result<u64, String> {
    let t = &common.table;
    let ddl = match common.target {
        Target::Sluice => format!(
            "DROP STREAM IF EXISTS {t}; CREATE STREAM {t} (customer text NOT NULL, amount bigint NOT NULL, payload text NOT NULL) WITH (compression = '{}')",
            o.codec.name()
        ),
        Target::Postgres => format!(
            "DROP TABLE IF EXISTS {t}; CREATE TABLE {t} (id bigserial PRIMARY KEY, ts timestamptz NOT NULL DEFAULT now(), customer text NOT NULL, amount bigint NOT NULL, payload text NOT NULL)"
        ),
    };
    let client = connect(&common.url).await?;
    client
        .batch_execute(&ddl)
        .await
        .map_err(|e| format!("{ddl}: {e}"))?;
    let size = common.size;
    let sent = bulk::copy_rows(
        &common.url,
        t,
        "customer, amount, payload",
        o.rows,
        o.connections,
        o.batch,
        move |i: u64, out: &mut String| event_row(i, size, out),
    )
    .await?;
    bulk::settle(&client, common.target, t).await?;
    Ok(sent)
}

/// Size on disk, and on Sluice the logical size, ratio and option as
/// `sluice_streams` reports them.
async fn sizes(
    client: &Client,
    target: Target,
    t: &str,
    p: &mut CompressionPoint,
) -> Result<(), String> {
    match target {
        Target::Sluice => {
            let full = format!(
                "SELECT bytes, logical_bytes, compression_ratio, compression FROM sluice_streams WHERE name = '{t}'"
            );
            match client.query_opt(&full, &[]).await {
                Ok(Some(row)) => {
                    p.bytes = row.try_get(0).map_err(err)?;
                    p.logical_bytes = row.try_get(1).map_err(err)?;
                    p.compression_ratio = row.try_get(2).map_err(err)?;
                    p.reported_compression = row.try_get(3).map_err(err)?;
                    Ok(())
                }
                Ok(None) => Err(format!("no stream {t} in sluice_streams")),
                Err(e) => {
                    // without the compression columns, still the size on disk
                    let bare = format!("SELECT bytes FROM sluice_streams WHERE name = '{t}'");
                    if let Ok(Some(row)) = client.query_opt(&bare, &[]).await {
                        p.bytes = row.try_get(0).map_err(err)?;
                    }
                    Err(format!("{full}: {e}"))
                }
            }
        }
        Target::Postgres => {
            let row = client
                .query_one(&format!("SELECT pg_total_relation_size('{t}')"), &[])
                .await
                .map_err(err)?;
            p.bytes = row.try_get(0).map_err(err)?;
            Ok(())
        }
    }
}

/// One event row as COPY text (`customer \t amount \t payload \n`), a pure
/// function of `i`. The payload is JSON text of at least `size` bytes (a
/// few more: the last word and the closing brace), without tabs,
/// newlines or backslashes, so COPY's text format takes it as it is.
fn event_row(i: u64, size: usize, out: &mut String) {
    let mut rng = SplitMix(i);
    let customer = rng.below(CUSTOMERS);
    let amount = 100 + rng.below(50_000);
    let _ = write!(out, "c{customer}\t{amount}\t");
    let start = out.len();
    let day = 1 + (i / 500_000) % 28;
    let secs = (i / 8) % 86_400;
    let _ = write!(
        out,
        "{{\"event_id\":\"{:016x}\",\"type\":\"{}\",\"customer\":\"c{customer}\",\
         \"at\":\"2026-11-{day:02}T{:02}:{:02}:{:02}.{:03}Z\",\"channel\":\"{}\",\
         \"currency\":\"{}\",\"amount_cents\":{amount},\"items\":[",
        rng.next_u64(),
        rng.pick(EVENT_TYPES),
        secs / 3600,
        secs / 60 % 60,
        secs % 60,
        rng.below(1000),
        rng.pick(CHANNELS),
        rng.pick(CURRENCIES),
    );
    // items fill about half the event, a free-text note the rest
    let mut items = 0;
    while items == 0 || out.len() - start < size / 2 {
        if items > 0 {
            out.push(',');
        }
        let _ = write!(
            out,
            "{{\"sku\":\"SKU-{:05}\",\"name\":\"{} {} {}\",\"qty\":{},\"unit_price_cents\":{}}}",
            rng.below(20_000),
            rng.pick(ADJECTIVES),
            rng.pick(COLOURS),
            rng.pick(PRODUCTS),
            1 + rng.below(4),
            99 + rng.below(20_000),
        );
        items += 1;
    }
    let _ = write!(
        out,
        "],\"shipping\":{{\"method\":\"{}\",\"city\":\"{}\",\"zip\":\"{:05}\"}},\
         \"tags\":[\"{}\",\"{}\"],\"note\":\"",
        rng.pick(SHIPPING),
        rng.pick(CITIES),
        rng.below(100_000),
        rng.pick(TAGS),
        rng.pick(TAGS),
    );
    let mut first = true;
    while out.len() - start + 2 < size {
        if !first {
            out.push(' ');
        }
        out.push_str(rng.pick(WORDS));
        first = false;
    }
    out.push_str("\"}\n");
}

/// splitmix64: a small, seedable generator; the row number is the seed.
struct SplitMix(u64);

impl SplitMix {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    fn pick(&mut self, items: &[&'static str]) -> &'static str {
        items[self.below(items.len() as u64) as usize]
    }
}

const EVENT_TYPES: &[&str] = &[
    "order_placed",
    "order_paid",
    "order_shipped",
    "order_delivered",
    "order_returned",
    "cart_updated",
];
const CHANNELS: &[&str] = &["web", "ios", "android", "store", "partner"];
const CURRENCIES: &[&str] = &["EUR", "USD", "GBP", "CHF"];
const SHIPPING: &[&str] = &["standard", "express", "pickup", "same_day"];
const ADJECTIVES: &[&str] = &[
    "classic",
    "slim",
    "organic",
    "vintage",
    "compact",
    "deluxe",
    "light",
    "heavy",
    "soft",
    "waterproof",
    "wireless",
    "recycled",
    "large",
    "small",
    "premium",
    "basic",
];
const COLOURS: &[&str] = &[
    "red", "blue", "green", "black", "white", "grey", "navy", "olive", "sand", "teal", "coral",
    "plum",
];
const PRODUCTS: &[&str] = &[
    "shirt",
    "jacket",
    "backpack",
    "lamp",
    "kettle",
    "headphones",
    "notebook",
    "mug",
    "chair",
    "blanket",
    "sneakers",
    "umbrella",
    "charger",
    "bottle",
    "scarf",
    "desk",
    "pillow",
    "watch",
    "wallet",
    "speaker",
];
const CITIES: &[&str] = &[
    "Lyon", "Berlin", "Madrid", "Lisbon", "Dublin", "Vienna", "Oslo", "Turin", "Ghent", "Porto",
    "Bristol", "Leeds", "Zurich", "Krakow", "Tallinn", "Seville",
];
const TAGS: &[&str] = &[
    "gift",
    "repeat",
    "promo",
    "first_order",
    "vip",
    "bulk",
    "sale",
    "loyalty",
    "b2b",
    "priority",
];
const WORDS: &[&str] = &[
    "please",
    "leave",
    "the",
    "parcel",
    "at",
    "door",
    "with",
    "neighbour",
    "call",
    "before",
    "delivery",
    "ring",
    "bell",
    "twice",
    "back",
    "entrance",
    "side",
    "gate",
    "code",
    "is",
    "on",
    "floor",
    "second",
    "third",
    "left",
    "right",
    "office",
    "reception",
    "hours",
    "after",
    "noon",
    "morning",
    "weekend",
    "only",
    "fragile",
    "handle",
    "care",
    "wrap",
    "as",
    "a",
    "present",
    "no",
    "invoice",
    "in",
    "box",
    "customer",
    "asked",
    "for",
    "exchange",
    "size",
    "colour",
    "missing",
    "item",
    "previous",
    "order",
    "thanks",
    "quick",
    "service",
    "again",
    "if",
    "not",
    "home",
    "garage",
    "mailbox",
];
