//! criterion micro-benchmarks of the hot paths, one group each:
//!
//! - `batch`: Arrow IPC encode and decode of an appended batch (what a
//!   Raft entry carries and a segment frame stores);
//! - `segment`: appending frames to a stream log, and scanning them back;
//! - `apply`: applying a committed append command to the state machine;
//! - `wire`: encoding a record batch as PostgreSQL text DataRows.
//!
//! Batches are 100 rows of `(customer bigint, payload text)` with 1 KiB
//! payloads, the shape of the load generator's rows.
//!
//! `cargo bench -p sluice-bench --bench hot_paths`

use std::sync::Arc;

use arrow::array::{ArrayRef, Int64Array, StringArray, TimestampMicrosecondArray};
use arrow::datatypes::{DataType, Field, Schema, TimeUnit};
use arrow::record_batch::RecordBatch;
use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use pgwire::api::results::FieldFormat;
use sluice_server::encode::{field_infos, OutputContext, RowEncoder};
use sluice_sql::apply::{ApplyStats, Database};
use sluice_sql::catalog::Catalog;
use sluice_sql::command::{op, Append, Command, CreateStream, Op};
use sluice_sql::definition::{ColumnDef, StreamDef, StreamOptions};
use sluice_sql::ipc::{decode_ipc, encode_ipc};
use sluice_sql::types::ColumnType;
use sluice_storage::stream_log::{StreamLog, StreamLogOptions};

const ROWS: usize = 100;
const PAYLOAD: usize = 1024;

fn user_batch() -> RecordBatch {
    let schema = Arc::new(Schema::new(vec![
        Field::new("customer", DataType::Int64, false),
        Field::new("payload", DataType::Utf8, false),
    ]));
    let customer: ArrayRef = Arc::new(Int64Array::from_iter_values(
        (0..ROWS as i64).map(|i| i % 1000),
    ));
    let body = "x".repeat(PAYLOAD);
    let payload: ArrayRef = Arc::new(StringArray::from_iter_values(
        (0..ROWS).map(|_| body.as_str()),
    ));
    RecordBatch::try_new(schema, vec![customer, payload]).expect("batch")
}

fn bytes_per_batch() -> u64 {
    (ROWS * (PAYLOAD + 8)) as u64
}

fn batch(c: &mut Criterion) {
    let b = user_batch();
    let ipc = encode_ipc(&b).expect("encode");
    let mut g = c.benchmark_group("batch");
    g.throughput(Throughput::Bytes(bytes_per_batch()));
    g.bench_function("ipc_encode_100x1KiB", |x| {
        x.iter(|| encode_ipc(&b).expect("encode"))
    });
    g.bench_function("ipc_decode_100x1KiB", |x| {
        x.iter(|| decode_ipc(&ipc).expect("decode"))
    });
    g.finish();
}

fn segment(c: &mut Criterion) {
    let ipc = encode_ipc(&user_batch()).expect("encode");
    let mut g = c.benchmark_group("segment");
    g.throughput(Throughput::Bytes(ipc.len() as u64));
    g.bench_function("append_frame_100x1KiB", |x| {
        x.iter_batched(
            || {
                let dir = tempfile::tempdir().expect("tempdir");
                let log = StreamLog::create(dir.path(), StreamLogOptions::default()).expect("log");
                (dir, log)
            },
            |(dir, log)| {
                for i in 0..64 {
                    log.append(&ipc, ROWS as u32, i).expect("append");
                }
                (dir, log)
            },
            BatchSize::PerIteration,
        )
    });
    let dir = tempfile::tempdir().expect("tempdir");
    let log = StreamLog::create(dir.path(), StreamLogOptions::default()).expect("log");
    for i in 0..64 {
        log.append(&ipc, ROWS as u32, i).expect("append");
    }
    log.sync().expect("sync");
    g.throughput(Throughput::Bytes(64 * ipc.len() as u64));
    g.bench_function("scan_64_frames", |x| {
        x.iter(|| {
            let mut rows = 0;
            for meta in log.batches(0, u64::MAX) {
                rows += log.read(&meta).expect("read").num_rows();
            }
            assert_eq!(rows, 64 * ROWS);
        })
    });
    g.finish();
}

/// A command as the node thread hands it over: a Raft entry's shared bytes.
fn command(ops: Vec<Op>, ts_micros: i64) -> bytes::Bytes {
    Command {
        ts_micros,
        ops,
        snapshot: 0,
        reads: vec![],
    }
    .encode_bytes()
    .into()
}

fn apply(c: &mut Criterion) {
    let def = StreamDef {
        id: 0,
        oid: 0,
        name: "s".into(),
        columns: vec![
            ColumnDef {
                name: "customer".into(),
                ty: ColumnType::Int8,
                not_null: true,
                default: None,
            },
            ColumnDef {
                name: "payload".into(),
                ty: ColumnType::Text,
                not_null: true,
                default: None,
            },
        ],
        options: StreamOptions::default(),
    };
    let create = Op {
        kind: Some(op::Kind::CreateStream(CreateStream {
            name: "s".into(),
            definition_json: serde_json::to_string(&def).expect("json"),
            if_not_exists: false,
            owner: String::new(),
        })),
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let catalog = Arc::new(Catalog::new());
    let mut db = Database::open(
        dir.path(),
        catalog.clone(),
        Arc::new(ApplyStats::default()),
        64 << 20,
    )
    .expect("open");
    use sluice_consensus::StateMachine;
    db.apply(1, &command(vec![create], 1))
        .expect("create")
        .expect("created");
    let stream_id = catalog.get("s").expect("stream").def.id;
    let append = Op {
        kind: Some(op::Kind::Append(Append {
            stream: "s".into(),
            stream_id,
            ipc: encode_ipc(&user_batch()).expect("encode").into(),
            rows: ROWS as u32,
            logical_len: 0,
        })),
    };
    let entry = command(vec![append], 2);
    let mut index = 1;
    let mut g = c.benchmark_group("apply");
    g.throughput(Throughput::Bytes(bytes_per_batch()));
    g.bench_function("append_command_100x1KiB", |x| {
        x.iter(|| {
            index += 1;
            db.apply(index, &entry).expect("apply").expect("applied")
        })
    });
    g.finish();
}

fn wire(c: &mut Criterion) {
    let user = user_batch();
    let schema = Arc::new(Schema::new(vec![
        Field::new("offset", DataType::Int64, false),
        Field::new(
            "ts",
            DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
            false,
        ),
        Field::new("customer", DataType::Int64, false),
        Field::new("payload", DataType::Utf8, false),
    ]));
    let offsets: ArrayRef = Arc::new(Int64Array::from_iter_values(0..ROWS as i64));
    let ts: ArrayRef = Arc::new(
        TimestampMicrosecondArray::from_iter_values(
            (0..ROWS as i64).map(|i| 1_700_000_000_000_000 + i),
        )
        .with_timezone("UTC"),
    );
    let full = RecordBatch::try_new(
        schema.clone(),
        vec![offsets, ts, user.column(0).clone(), user.column(1).clone()],
    )
    .expect("batch");
    let encoder = RowEncoder::new(
        &field_infos(&schema, |_| FieldFormat::Text),
        &schema,
        OutputContext::new("UTC"),
    );
    let mut g = c.benchmark_group("wire");
    g.throughput(Throughput::Bytes(bytes_per_batch()));
    g.bench_function("text_datarows_100x1KiB", |x| {
        x.iter(|| encoder.encode_batch(&full).expect("encode"))
    });
    g.finish();
}

criterion_group!(hot_paths, batch, segment, apply, wire);
criterion_main!(hot_paths);
