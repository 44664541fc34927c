//! Property tests for the decoders that read what a crash, a disk or a peer can corrupt: the
//! Raft log's segment and metadata files ([`Wal::open`]) and the cluster transport's frames
//! ([`read_frame`], and the real listener of [`TcpTransport`]).
//!
//! WAL: a valid log is written once per template; every case copies its files into a fresh
//! directory, damages them (bit flips, truncation, zeroed ranges, garbage appended, record
//! header fields overwritten, a file deleted or duplicated under another name) and reopens it.
//! Transport: random byte streams and mutated streams of valid frames. Promised: no panic, no
//! case longer than [`CASE_LIMIT`], no allocation beyond a small multiple of the input, and
//! either a clean error or what was written: a log state that existed, the frames that were
//! sent.
//!
//! `SLUICE_FUZZ_CASES` sets the cases per property (default [`DEFAULT_CASES`]);
//! `SLUICE_FUZZ_SEED` the seed. See `docs/fuzzing.md`.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::pin::Pin;
use std::sync::{Mutex, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{TestCaseError, TestRunner};
use prost::Message as _;
use raft::eraftpb::{Entry, HardState, SnapshotMetadata};
use sluice_consensus::transport::{
    read_frame, Body, Envelope, Forward, ForwardReply, Inbound, PeerSecurity, TcpTransport,
};
use sluice_consensus::wal::Wal;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt, ReadBuf};
use tokio::sync::mpsc;

#[path = "../../storage/tests/harness/mod.rs"]
mod harness;
use harness::*;

/// What the transport may hold for a frame before its bytes arrive.
const FRAME_INITIAL_CAPACITY: usize = 64 << 10;

fn fail(what: &str) -> impl FnOnce(sluice_consensus::Error) -> TestCaseError + '_ {
    move |e| TestCaseError::fail(format!("{what}: {e}"))
}

// ---------------------------------------------------------------------------------------------
// The Raft log: valid logs to damage.

fn entry(index: u64, term: u64) -> Entry {
    Entry {
        index,
        term,
        data: format!("command {index}@{term}").into_bytes().into(),
        ..Default::default()
    }
}

fn hard_state(term: u64, commit: u64) -> HardState {
    HardState {
        term,
        vote: 1,
        commit,
        ..Default::default()
    }
}

fn meta(index: u64, term: u64) -> SnapshotMetadata {
    let mut m = SnapshotMetadata {
        index,
        term,
        ..Default::default()
    };
    m.mut_conf_state().voters = vec![1, 2, 3];
    m
}

/// A WAL directory as it was at a crash, and every state its log went through.
struct WalTemplate {
    /// Files by name (segments and `wal.meta`), in name order.
    files: Vec<(String, Vec<u8>)>,
    /// Record start positions per file, for damage aimed at record headers.
    records: Vec<Vec<usize>>,
    /// The log and HardState after each record written, in order.
    states: Vec<(Vec<Entry>, HardState)>,
    /// Every entry and HardState ever written, and every compaction point saved.
    entries: HashSet<(u64, u64, Vec<u8>)>,
    hard_states: Vec<HardState>,
    metas: Vec<SnapshotMetadata>,
    segment_bytes: u64,
}

/// Records what a [`Wal`] is asked to write, as the log states replay can reach.
struct Writer {
    wal: Wal,
    log: Vec<Entry>,
    hs: HardState,
    t: WalTemplate,
}

impl Writer {
    fn append(&mut self, entries: &[Entry], hs: Option<HardState>) {
        self.wal.append(entries, hs.as_ref()).expect("append");
        for e in entries {
            self.log.retain(|x| x.index < e.index);
            self.log.push(e.clone());
            self.t.entries.insert((e.index, e.term, e.data.to_vec()));
            self.t.states.push((self.log.clone(), self.hs.clone()));
        }
        if let Some(hs) = hs {
            self.hs = hs.clone();
            self.t.hard_states.push(hs);
            self.t.states.push((self.log.clone(), self.hs.clone()));
        }
    }

    fn compact(&mut self, index: u64, term: u64) {
        self.wal.compact(meta(index, term)).expect("compact");
        self.t.metas.push(meta(index, term));
    }
}

/// Runs `script` against a fresh WAL and captures the directory it leaves behind.
fn wal_template(segment_bytes: u64, script: impl FnOnce(&mut Writer)) -> WalTemplate {
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut wal, _) = Wal::open(dir.path(), segment_bytes).expect("open");
    wal.save_meta(meta(0, 0)).expect("save_meta");
    let t = WalTemplate {
        files: Vec::new(),
        records: Vec::new(),
        states: vec![(Vec::new(), HardState::default())],
        entries: HashSet::new(),
        hard_states: vec![HardState::default()],
        metas: vec![meta(0, 0)],
        segment_bytes,
    };
    let mut w = Writer {
        wal,
        log: Vec::new(),
        hs: HardState::default(),
        t,
    };
    script(&mut w);
    w.wal.sync().expect("sync");
    let Writer { wal, mut t, .. } = w;
    drop(wal); // waits for any zero-fill in progress
    let mut names: Vec<_> = std::fs::read_dir(dir.path())
        .expect("list")
        .map(|d| d.expect("dirent").file_name().into_string().expect("utf-8"))
        .collect();
    names.sort();
    for name in names {
        let bytes = std::fs::read(dir.path().join(&name)).expect("read");
        t.records.push(record_positions(&bytes));
        t.files.push((name, bytes));
    }
    t
}

/// Start positions of the records `[len u32][crc u32][kind u8][payload]` in a valid file.
fn record_positions(bytes: &[u8]) -> Vec<usize> {
    let mut out = Vec::new();
    let mut pos = 0;
    while pos + 9 <= bytes.len() {
        if bytes[pos..pos + 9].iter().all(|b| *b == 0) {
            break; // preallocated zeros
        }
        let len = u32::from_le_bytes([bytes[pos], bytes[pos + 1], bytes[pos + 2], bytes[pos + 3]]);
        out.push(pos);
        pos += 9 + len as usize;
    }
    out
}

fn wal_templates() -> &'static [WalTemplate] {
    static TEMPLATES: OnceLock<Vec<WalTemplate>> = OnceLock::new();
    TEMPLATES.get_or_init(|| {
        vec![
            // Group commits rolling over small segments.
            wal_template(256, |w| {
                for i in 1..=12 {
                    w.append(&[entry(i, 1)], Some(hard_state(1, i - 1)));
                }
            }),
            // A new leader overwrites the tail; then compaction deletes old segments.
            wal_template(300, |w| {
                let batch: Vec<_> = (1..=6).map(|i| entry(i, 1)).collect();
                w.append(&batch, Some(hard_state(1, 3)));
                let batch: Vec<_> = (5..=9).map(|i| entry(i, 2)).collect();
                w.append(&batch, Some(hard_state(2, 4)));
                w.append(&[], Some(hard_state(2, 8)));
                w.compact(6, 2);
                w.append(&[entry(10, 2), entry(11, 2)], Some(hard_state(2, 9)));
            }),
            // One big segment with a zero-filled (preallocated) tail.
            wal_template(300 << 10, |w| {
                for i in 1..=8 {
                    w.append(&[entry(i, 3)], Some(hard_state(3, i)));
                }
            }),
        ]
    })
}

// ---------------------------------------------------------------------------------------------
// Damage to files.

#[derive(Debug, Clone)]
enum Damage {
    FlipBit {
        file: usize,
        at: usize,
        bit: u8,
    },
    Truncate {
        file: usize,
        at: usize,
    },
    Zero {
        file: usize,
        at: usize,
        len: usize,
    },
    Garbage {
        file: usize,
        bytes: Vec<u8>,
    },
    /// Overwrites the length (`word` 0) or checksum (1) of a record's header with `value`.
    HeaderWord {
        file: usize,
        record: usize,
        word: usize,
        value: u32,
    },
    Delete {
        file: usize,
    },
    /// Copies a file under the name of a segment starting at `first_index`.
    Duplicate {
        file: usize,
        first_index: u64,
    },
}

fn interesting_u32() -> impl Strategy<Value = u32> {
    prop_oneof![
        any::<u32>(),
        0..256u32,
        Just(u32::MAX),
        (u32::MAX - 64)..=u32::MAX,
        Just(1 << 30),
    ]
}

fn damage() -> impl Strategy<Value = Damage> {
    let file = 0..16usize;
    let at = prop_oneof![0..4096usize, any::<usize>()];
    prop_oneof![
        4 => (file.clone(), at.clone(), 0..8u8).prop_map(|(file, at, bit)| Damage::FlipBit { file, at, bit }),
        2 => (file.clone(), at.clone()).prop_map(|(file, at)| Damage::Truncate { file, at }),
        2 => (file.clone(), at, 1..256usize).prop_map(|(file, at, len)| Damage::Zero { file, at, len }),
        1 => (file.clone(), proptest::collection::vec(any::<u8>(), 1..128)).prop_map(|(file, bytes)| Damage::Garbage { file, bytes }),
        3 => (file.clone(), 0..32usize, 0..2usize, interesting_u32()).prop_map(|(file, record, word, value)| Damage::HeaderWord { file, record, word, value }),
        1 => file.clone().prop_map(|file| Damage::Delete { file }),
        1 => (file, prop_oneof![0..16u64, any::<u64>()]).prop_map(|(file, first_index)| Damage::Duplicate { file, first_index }),
    ]
}

/// The files of `t` with `damage` applied in order.
fn damaged(t: &WalTemplate, damage: &[Damage]) -> Vec<(String, Vec<u8>)> {
    let mut files = t.files.clone();
    for d in damage {
        if files.is_empty() {
            break;
        }
        let n = files.len();
        match d {
            Damage::FlipBit { file, at, bit } => {
                let bytes = &mut files[file % n].1;
                if !bytes.is_empty() {
                    let at = at % bytes.len();
                    bytes[at] ^= 1 << bit;
                }
            }
            Damage::Truncate { file, at } => {
                let bytes = &mut files[file % n].1;
                let at = at % (bytes.len() + 1);
                bytes.truncate(at);
            }
            Damage::Zero { file, at, len } => {
                let bytes = &mut files[file % n].1;
                let start = at % (bytes.len() + 1);
                let end = (start + len).min(bytes.len());
                bytes[start..end].fill(0);
            }
            Damage::Garbage { file, bytes } => files[file % n].1.extend_from_slice(bytes),
            Damage::HeaderWord {
                file,
                record,
                word,
                value,
            } => {
                let i = file % n;
                let Some(positions) = t.records.get(i).filter(|p| !p.is_empty()) else {
                    continue;
                };
                let at = positions[record % positions.len()] + 4 * word;
                let bytes = &mut files[i].1;
                if at + 4 <= bytes.len() {
                    bytes[at..at + 4].copy_from_slice(&value.to_le_bytes());
                }
            }
            Damage::Delete { file } => {
                files.remove(file % n);
            }
            Damage::Duplicate { file, first_index } => {
                let copy = files[file % n].1.clone();
                let name = format!("{first_index:020}.wal");
                files.retain(|(n, _)| *n != name);
                files.push((name, copy));
                files.sort();
            }
        }
    }
    files
}

fn write_files(dir: &Path, files: &[(String, Vec<u8>)]) {
    for (name, bytes) in files {
        std::fs::write(dir.join(name), bytes).expect("write");
    }
}

// ---------------------------------------------------------------------------------------------
// The Raft log: properties.

/// Reopens damaged logs: a clean error, or a log state that was written, which then takes
/// appends that survive another reopen.
#[test]
fn fuzz_wal_open() {
    let _serial = serial();
    let strategy = (
        0..wal_templates().len(),
        proptest::collection::vec(damage(), 0..4),
    );
    TestRunner::new(config(cases()))
        .run(&strategy, |(which, damage)| {
            timed(|| {
                let t = &wal_templates()[which];
                let files = damaged(t, &damage);
                let dir = scratch_dir();
                write_files(dir.path(), &files);
                let on_disk: usize = files.iter().map(|(_, b)| b.len()).sum();
                let opened = within_budget(2 * on_disk + ALLOC_SLACK, || {
                    Wal::open(dir.path(), t.segment_bytes)
                });
                let Ok((wal, rec)) = opened else {
                    return Ok(());
                };
                let compacted = rec.meta.as_ref().map_or(0, |m| m.index);
                if let Some(meta) = &rec.meta {
                    prop_assert!(t.metas.contains(meta), "unknown metadata {meta:?}");
                }
                prop_assert!(t.hard_states.contains(&rec.hard_state));
                for (i, e) in rec.entries.iter().enumerate() {
                    prop_assert_eq!(e.index, compacted + 1 + i as u64, "log not contiguous");
                    prop_assert!(
                        t.entries.contains(&(e.index, e.term, e.data.to_vec())),
                        "entry {} was never written",
                        e.index
                    );
                }
                let duplicated = damage.iter().any(|d| matches!(d, Damage::Duplicate { .. }));
                if !duplicated {
                    // Replaying a prefix of the records reaches a log the log once was. (Not
                    // always with the HardState of that moment: a deleted segment followed by
                    // one whose entries are all torn off goes unnoticed; see docs/fuzzing.md.)
                    let reached = t.states.iter().any(|(log, _)| {
                        let log: Vec<_> = log.iter().filter(|e| e.index > compacted).collect();
                        log.len() == rec.entries.len()
                            && log.iter().zip(&rec.entries).all(|(a, b)| *a == b)
                    });
                    prop_assert!(reached, "recovered a log state that never existed");
                }
                // The recovered log takes appends, and a reopen finds them.
                let last = rec.entries.last().map_or(compacted, |e| e.index);
                let next = entry(last + 1, rec.hard_state.term.max(7));
                let hs = hard_state(rec.hard_state.term.max(7), last);
                let mut wal = wal;
                if rec.meta.is_none() {
                    // What `LogStore::open` does with a directory that has no metadata.
                    wal.save_meta(meta(0, 0)).map_err(fail("bootstrap"))?;
                }
                wal.append(std::slice::from_ref(&next), Some(&hs))
                    .map_err(fail("append after recovery"))?;
                wal.sync().map_err(fail("sync after recovery"))?;
                drop(wal);
                let (_wal, again) =
                    Wal::open(dir.path(), t.segment_bytes).map_err(fail("reopen after append"))?;
                prop_assert_eq!(again.entries.last(), Some(&next));
                prop_assert_eq!(again.hard_state, hs);
                Ok(())
            })
        })
        .expect("property");
}

// ---------------------------------------------------------------------------------------------
// The transport: frames.

fn envelope() -> impl Strategy<Value = Envelope> {
    let bytes = proptest::collection::vec(any::<u8>(), 0..64);
    let body = prop_oneof![
        bytes.clone().prop_map(Body::Raft),
        (
            any::<u64>(),
            bytes,
            any::<bool>(),
            any::<u64>(),
            any::<u32>()
        )
            .prop_map(|(tag, command, conf_change, term, attempt)| Body::Forward(
                Forward {
                    tag,
                    command,
                    conf_change,
                    term,
                    attempt,
                }
            )),
        (
            any::<u64>(),
            ".{0,16}",
            any::<u64>(),
            any::<u64>(),
            any::<u32>()
        )
            .prop_map(|(tag, error, index, term, attempt)| {
                Body::ForwardReply(ForwardReply {
                    tag,
                    error,
                    index,
                    term,
                    attempt,
                })
            }),
    ];
    (any::<u64>(), proptest::option::of(body)).prop_map(|(from, body)| Envelope { from, body })
}

fn frame(env: &Envelope) -> Vec<u8> {
    let body = env.encode_to_vec();
    let mut out = (body.len() as u32).to_be_bytes().to_vec();
    out.extend_from_slice(&body);
    out
}

#[derive(Debug, Clone)]
enum StreamDamage {
    FlipBit {
        at: usize,
        bit: u8,
    },
    Truncate {
        at: usize,
    },
    Insert {
        at: usize,
        bytes: Vec<u8>,
    },
    /// Overwrites 4 bytes (a length prefix, if aimed well) with `value`, big endian.
    Word {
        at: usize,
        value: u32,
    },
}

/// A byte stream a peer (or a stranger) might send: random bytes, or valid frames, damaged.
fn stream() -> impl Strategy<Value = Vec<u8>> {
    let damage = prop_oneof![
        (any::<usize>(), 0..8u8).prop_map(|(at, bit)| StreamDamage::FlipBit { at, bit }),
        any::<usize>().prop_map(|at| StreamDamage::Truncate { at }),
        (
            any::<usize>(),
            proptest::collection::vec(any::<u8>(), 1..16)
        )
            .prop_map(|(at, bytes)| StreamDamage::Insert { at, bytes }),
        (any::<usize>(), interesting_u32())
            .prop_map(|(at, value)| StreamDamage::Word { at, value }),
    ];
    let frames = (
        proptest::collection::vec(envelope(), 0..6),
        proptest::collection::vec(damage, 0..3),
    )
        .prop_map(|(envs, damage)| {
            let mut bytes: Vec<u8> = envs.iter().flat_map(frame).collect();
            let starts: Vec<usize> = envs
                .iter()
                .scan(0, |at, e| {
                    let start = *at;
                    *at += frame(e).len();
                    Some(start)
                })
                .collect();
            for d in damage {
                let n = bytes.len().max(1);
                match d {
                    StreamDamage::FlipBit { at, bit } => {
                        if !bytes.is_empty() {
                            bytes[at % n] ^= 1 << bit;
                        }
                    }
                    StreamDamage::Truncate { at } => bytes.truncate(at % (n + 1)),
                    StreamDamage::Insert { at, bytes: b } => {
                        let at = at % (bytes.len() + 1);
                        bytes.splice(at..at, b);
                    }
                    StreamDamage::Word { at, value } => {
                        // Half the time aim at a frame's length prefix.
                        let at = match starts.get(at % (2 * starts.len().max(1))) {
                            Some(start) => *start,
                            None => at % n,
                        };
                        if at + 4 <= bytes.len() {
                            bytes[at..at + 4].copy_from_slice(&value.to_be_bytes());
                        }
                    }
                }
            }
            bytes
        });
    prop_oneof![
        1 => proptest::collection::vec(any::<u8>(), 0..256),
        1 => (interesting_u32(), proptest::collection::vec(any::<u8>(), 0..64)).prop_map(|(len, rest)| {
            let mut out = len.to_be_bytes().to_vec();
            out.extend(rest);
            out
        }),
        4 => frames,
    ]
}

/// What a correct reader makes of `bytes`: the envelopes of the leading frames that are
/// complete, within `max_frame` and decodable.
fn model(bytes: &[u8], max_frame: usize) -> Vec<Envelope> {
    let mut out = Vec::new();
    let mut rest = bytes;
    while rest.len() >= 4 {
        let len = u32::from_be_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
        if len > max_frame || rest.len() - 4 < len {
            break;
        }
        match Envelope::decode(&rest[4..4 + len]) {
            Ok(env) => out.push(env),
            Err(_) => break,
        }
        rest = &rest[4 + len..];
    }
    out
}

/// Hands out at most `chunk` bytes per read, as a socket may.
struct Trickle<'a> {
    bytes: &'a [u8],
    chunk: usize,
}

impl AsyncRead for Trickle<'_> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let bytes = self.bytes;
        let n = self.chunk.min(bytes.len()).min(buf.remaining());
        buf.put_slice(&bytes[..n]);
        self.bytes = &bytes[n..];
        Poll::Ready(Ok(()))
    }
}

fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime")
    })
}

/// `read_frame` over arbitrary streams, delivered in arbitrary chunks: exactly the frames a
/// correct reader finds, then a clean error; the buffer never outgrows what arrived.
#[test]
fn fuzz_transport_read_frame() {
    let _serial = serial();
    let max_frame = prop_oneof![Just(1usize << 30), Just(1 << 20), 0..512usize];
    let strategy = (stream(), max_frame, 1..64usize);
    TestRunner::new(config(cases()))
        .run(&strategy, |(bytes, max_frame, chunk)| {
            timed(|| {
                let expected = model(&bytes, max_frame);
                let mut reader = Trickle {
                    bytes: &bytes,
                    chunk,
                };
                let mut buf = Vec::new();
                let mut got = Vec::new();
                let bound = FRAME_INITIAL_CAPACITY.max(2 * bytes.len() + 64);
                let err = within_budget(4 * bound + ALLOC_SLACK, || {
                    runtime().block_on(async {
                        loop {
                            match read_frame(&mut reader, &mut buf, max_frame).await {
                                Ok(env) => got.push(env),
                                Err(e) => return e,
                            }
                            if buf.capacity() > bound {
                                return std::io::Error::other("buffer outgrew the input");
                            }
                        }
                    })
                });
                prop_assert!(buf.capacity() <= bound, "buffer of {}", buf.capacity());
                prop_assert_ne!(err.kind(), std::io::ErrorKind::Other, "{}", err);
                prop_assert_eq!(got, expected);
                Ok(())
            })
        })
        .expect("property");
}

/// The same streams sent to a real [`TcpTransport`] listener over loopback: it delivers the
/// frames a correct reader finds and closes the connection, and nothing panics.
#[test]
fn fuzz_transport_tcp() {
    let _serial = serial();
    const MAX_FRAME: usize = 1 << 20;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (tx, rx) = mpsc::channel(1024);
    let rx = Mutex::new(rx);
    let _transport = TcpTransport::start(
        1,
        listener,
        &BTreeMap::new(),
        tx,
        MAX_FRAME,
        PeerSecurity::default(),
        runtime().handle().clone(),
    )
    .expect("start");
    // A connection per case: fewer of them, so that loopback ports are not exhausted.
    let cases = env("SLUICE_FUZZ_TCP_CASES").unwrap_or(cases().min(20_000));
    TestRunner::new(config(cases))
        .run(&stream(), |bytes| {
            timed(|| {
                let expected = model(&bytes, MAX_FRAME);
                runtime().block_on(async {
                    let mut socket = tokio::net::TcpStream::connect(addr).await.expect("connect");
                    // The server may hang up before it has read everything: not an error here.
                    let _ = socket.write_all(&bytes).await;
                    let _ = socket.shutdown().await;
                    // The server closes once it stops reading: after the last frame it sent on.
                    let mut rest = Vec::new();
                    let closed = tokio::time::timeout(CASE_LIMIT, socket.read_to_end(&mut rest));
                    prop_assert!(closed.await.is_ok(), "server kept the connection open");
                    let mut got = Vec::new();
                    let mut rx = rx.lock().unwrap_or_else(|e| e.into_inner());
                    while let Ok(inbound) = rx.try_recv() {
                        match inbound {
                            Inbound::Envelope(env) => got.push(env),
                            other => return Err(TestCaseError::fail(format!("{other:?}"))),
                        }
                    }
                    prop_assert_eq!(got, expected);
                    Ok(())
                })
            })
        })
        .expect("property");
}

/// A bare length prefix announcing a 1 GiB frame allocates nothing for it, whether the peer
/// then hangs up or stalls. (The reader used to size its buffer to the announced length first:
/// 1 GiB per connection, for 4 bytes sent.)
#[test]
fn announced_length_is_not_allocated_before_the_bytes_arrive() {
    let _serial = serial();
    const GIB: usize = 1 << 30;
    let announce = (GIB as u32).to_be_bytes();

    // The peer hangs up after the length.
    let mut buf = Vec::new();
    let err = within_budget(1 << 20, || {
        runtime().block_on(read_frame(&mut &announce[..], &mut buf, GIB))
    })
    .expect_err("no frame");
    assert_eq!(err.kind(), std::io::ErrorKind::UnexpectedEof);
    assert!(
        buf.capacity() <= FRAME_INITIAL_CAPACITY,
        "{}",
        buf.capacity()
    );

    runtime().block_on(async {
        // The peer stalls after the length.
        let (mut client, mut server) = tokio::io::duplex(64);
        client.write_all(&announce).await.expect("write");
        let mut buf = Vec::new();
        let stalled = tokio::time::timeout(
            Duration::from_millis(100),
            read_frame(&mut server, &mut buf, GIB),
        );
        assert!(stalled.await.is_err(), "a stalled frame cannot complete");
        assert!(
            buf.capacity() <= FRAME_INITIAL_CAPACITY,
            "{}",
            buf.capacity()
        );
    });

    // Over real connections to the listener: eight stalled peers cost next to nothing.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (tx, _rx) = mpsc::channel(16);
    let _transport = TcpTransport::start(
        1,
        listener,
        &BTreeMap::new(),
        tx,
        GIB,
        PeerSecurity::default(),
        runtime().handle().clone(),
    )
    .expect("start");
    let before = ALLOC.allocated();
    let sockets: Vec<_> = runtime().block_on(async {
        let mut sockets = Vec::new();
        for _ in 0..8 {
            let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
            s.write_all(&announce).await.expect("write");
            sockets.push(s);
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        sockets
    });
    let grew = ALLOC.allocated().saturating_sub(before);
    drop(sockets);
    assert!(
        grew < 16 << 20,
        "8 stalled peers made the server allocate {grew} bytes"
    );
}
