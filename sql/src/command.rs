//! The replicated command: what a session proposes to Raft and every
//! replica applies.
//!
//! A [`Command`] is a list of operations applied atomically: a single
//! statement outside a transaction block is a one-op command, a committed
//! block is one command with all its writes. Rows travel as Arrow IPC bytes
//! exactly as they will be stored, so applying never re-encodes them.
//! Commands are prost messages (no .proto build step: the schema is here).

use bytes::Bytes;
use prost::Message;

use crate::error::{Error, Result};

#[derive(Clone, PartialEq, Message)]
pub struct Command {
    /// Commit time proposed by the leader (µs since the epoch); the applied
    /// `ts` is the max of this and the stream's previous `ts`.
    #[prost(int64, tag = "1")]
    pub ts_micros: i64,
    #[prost(message, repeated, tag = "2")]
    pub ops: Vec<Op>,
    /// Snapshot index the transaction read tables at (0: no reads).
    #[prost(uint64, tag = "3")]
    pub snapshot: u64,
    /// What the transaction read from tables: validated at apply, so a
    /// commit whose reads changed since `snapshot` fails with 40001.
    #[prost(message, repeated, tag = "4")]
    pub reads: Vec<TableRead>,
}

/// One read of a table: a key, or (no key) the whole table.
#[derive(Clone, PartialEq, Message)]
pub struct TableRead {
    #[prost(uint64, tag = "1")]
    pub table_id: u64,
    #[prost(bytes = "vec", optional, tag = "2")]
    pub key: Option<Vec<u8>>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Op {
    #[prost(
        oneof = "op::Kind",
        tags = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14"
    )]
    pub kind: Option<op::Kind>,
}

pub mod op {
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Kind {
        #[prost(message, tag = "1")]
        CreateStream(super::CreateStream),
        #[prost(message, tag = "2")]
        DropRelation(super::DropRelation),
        #[prost(message, tag = "3")]
        Append(super::Append),
        #[prost(message, tag = "4")]
        Truncate(super::Truncate),
        #[prost(message, tag = "5")]
        CreateTable(super::CreateTable),
        #[prost(message, tag = "6")]
        TableWrite(super::TableWrite),
        #[prost(message, tag = "7")]
        RoleChange(super::RoleChange),
        #[prost(message, tag = "8")]
        AlterStream(super::AlterStream),
        #[prost(message, tag = "9")]
        CreateView(super::CreateView),
        #[prost(message, tag = "10")]
        CreateIndex(super::CreateIndex),
        #[prost(message, tag = "11")]
        DropIndex(super::DropIndex),
        #[prost(message, tag = "12")]
        CopyChunk(super::CopyChunk),
        #[prost(message, tag = "13")]
        CopyCommit(super::CopyCommit),
        #[prost(message, tag = "14")]
        CopyAbort(super::CopyAbort),
    }
}

#[derive(Clone, PartialEq, Message)]
pub struct CreateStream {
    #[prost(string, tag = "1")]
    pub name: String,
    /// JSON of the columns and options (a `StreamDef` without its id).
    #[prost(string, tag = "2")]
    pub definition_json: String,
    #[prost(bool, tag = "3")]
    pub if_not_exists: bool,
    /// The creating role, which will own it; empty: a superuser outside the roles.
    #[prost(string, tag = "4")]
    pub owner: String,
}

#[derive(Clone, PartialEq, Message)]
pub struct CreateTable {
    #[prost(string, tag = "1")]
    pub name: String,
    /// JSON of a `TableDef` without its id and OID.
    #[prost(string, tag = "2")]
    pub definition_json: String,
    #[prost(bool, tag = "3")]
    pub if_not_exists: bool,
    /// The creating role, which will own it; empty: a superuser outside the roles.
    #[prost(string, tag = "4")]
    pub owner: String,
}

/// A change to roles and privileges (see [`crate::roles`]).
#[derive(Clone, PartialEq, Message)]
pub struct RoleChange {
    /// JSON of a `roles::RoleChange` (passwords already verifiers).
    #[prost(string, tag = "1")]
    pub change_json: String,
}

/// One row change of a table (see `table::write_kind`).
#[derive(Clone, PartialEq, Message)]
pub struct TableWrite {
    #[prost(string, tag = "1")]
    pub table: String,
    #[prost(uint64, tag = "2")]
    pub table_id: u64,
    #[prost(int32, tag = "3")]
    pub kind: i32,
    /// Encoded primary key (or hidden row id).
    #[prost(bytes = "vec", tag = "4")]
    pub key: Vec<u8>,
    /// Encoded row (empty for a delete).
    #[prost(bytes = "vec", tag = "5")]
    pub row: Vec<u8>,
}

/// `ALTER STREAM`: new options, a new name, an added or a renamed column for the stream
/// `stream_id` (refused when `name` is no longer that stream: dropped, or dropped and created
/// again). An empty `options_json` leaves the options as they are (see `alter.rs`).
#[derive(Clone, PartialEq, Message)]
pub struct AlterStream {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(uint64, tag = "2")]
    pub stream_id: u64,
    /// JSON of the stream's whole new `StreamOptions`.
    #[prost(string, tag = "3")]
    pub options_json: String,
    /// Empty: the name stays.
    #[prost(string, tag = "4")]
    pub new_name: String,
    /// JSON of a `ColumnDef` to add at the end (its default already checked text); empty:
    /// none.
    #[prost(string, tag = "5")]
    pub add_column_json: String,
    /// With `add_column_json`: a column of that name already there is no error.
    #[prost(bool, tag = "6")]
    pub if_not_exists: bool,
    /// A column to rename to `rename_column_to`; empty: none.
    #[prost(string, tag = "7")]
    pub rename_column: String,
    #[prost(string, tag = "8")]
    pub rename_column_to: String,
}

/// Drops a stream or a table of that name (`view`: a view, and only a view).
#[derive(Clone, PartialEq, Message)]
pub struct DropRelation {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(bool, tag = "2")]
    pub if_exists: bool,
    /// Views that read it (and views over those) are dropped too; without it they make the
    /// drop fail (2BP01).
    #[prost(bool, tag = "3")]
    pub cascade: bool,
    #[prost(bool, tag = "4")]
    pub view: bool,
}

/// `CREATE [OR REPLACE] VIEW`: apply checks that the relations it reads exist and that it
/// reads no view that reads it.
#[derive(Clone, PartialEq, Message)]
pub struct CreateView {
    #[prost(string, tag = "1")]
    pub name: String,
    /// JSON of a `ViewDef` without its id and OID.
    #[prost(string, tag = "2")]
    pub definition_json: String,
    #[prost(bool, tag = "3")]
    pub or_replace: bool,
    /// The creating role, which will own it; empty: a superuser outside the roles.
    #[prost(string, tag = "4")]
    pub owner: String,
}

/// `CREATE [UNIQUE] INDEX name ON table (columns)`: the state machine builds the index from
/// the table's rows as the command leaves them (a duplicate fails a UNIQUE one, 23505) and
/// keeps it with every later write.
#[derive(Clone, PartialEq, Message)]
pub struct CreateIndex {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub table: String,
    /// Id of the table the session planned against (a local id: created earlier in the
    /// command; see `Append::stream_id`).
    #[prost(uint64, tag = "3")]
    pub table_id: u64,
    #[prost(string, repeated, tag = "4")]
    pub columns: Vec<String>,
    #[prost(bool, tag = "5")]
    pub unique: bool,
    #[prost(bool, tag = "6")]
    pub if_not_exists: bool,
    /// The index of a `UNIQUE` constraint (see `IndexDef::constraint`).
    #[prost(bool, tag = "7")]
    pub constraint: bool,
    /// Each column's `indoption` (see `IndexDef::options`; empty: all ascending).
    #[prost(uint32, repeated, tag = "8")]
    pub options: Vec<u32>,
}

/// `DROP INDEX name`: its entries go with the table's next checkpoint.
#[derive(Clone, PartialEq, Message)]
pub struct DropIndex {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(bool, tag = "2")]
    pub if_exists: bool,
}

#[derive(Clone, PartialEq, Message)]
pub struct Append {
    #[prost(string, tag = "1")]
    pub stream: String,
    /// Id of the stream the rows were planned against; 0 or a local id
    /// (`block_catalog::LOCAL_ID_BASE` + op position) means "created earlier
    /// in this same command". A mismatch means the stream was dropped (and
    /// maybe re-created) meanwhile: the append fails.
    #[prost(uint64, tag = "2")]
    pub stream_id: u64,
    /// Arrow IPC stream bytes holding one record batch of user columns (decoded from a
    /// Raft entry by [`Command::decode_shared`]: a slice of the entry, not a copy).
    #[prost(bytes = "bytes", tag = "3")]
    pub ipc: Bytes,
    #[prost(uint32, tag = "4")]
    pub rows: u32,
    /// `ipc`'s length with its compressed buffers counted uncompressed, as the proposer
    /// encoded it (`sluice_storage::frame::logical_len`), so that applying does not parse
    /// the bytes again; 0: not given (computed when applied).
    #[prost(uint64, tag = "5")]
    pub logical_len: u64,
}

/// Rows of a COPY FROM too large for one command, staged on every replica until its
/// `CopyCommit` makes them visible at once (see `apply/copies.rs`).
#[derive(Clone, PartialEq, Message)]
pub struct CopyChunk {
    /// The staged copy this continues; 0 starts one (its id is this entry's Raft index).
    #[prost(uint64, tag = "1")]
    pub copy_id: u64,
    #[prost(string, tag = "2")]
    pub stream: String,
    /// Id of the stream the rows were planned against (see [`Append::stream_id`]).
    #[prost(uint64, tag = "3")]
    pub stream_id: u64,
    /// Arrow IPC stream bytes holding one record batch of user columns (as [`Append::ipc`]).
    #[prost(bytes = "bytes", tag = "4")]
    pub ipc: Bytes,
    #[prost(uint32, tag = "5")]
    pub rows: u32,
    /// The copy is dropped when a command is applied this long after its last chunk (by
    /// the commands' proposed times) and no commit came: a client or node gone mid-COPY.
    #[prost(uint64, tag = "6")]
    pub idle_timeout_ms: u64,
}

/// Moves a staged copy's rows into its stream, visible together, and ends the copy.
#[derive(Clone, PartialEq, Message)]
pub struct CopyCommit {
    #[prost(uint64, tag = "1")]
    pub copy_id: u64,
    #[prost(string, tag = "2")]
    pub stream: String,
    #[prost(uint64, tag = "3")]
    pub stream_id: u64,
}

/// Drops a staged copy (a COPY that failed half-way or was cancelled).
#[derive(Clone, PartialEq, Message)]
pub struct CopyAbort {
    #[prost(uint64, tag = "1")]
    pub copy_id: u64,
}

#[derive(Clone, PartialEq, Message)]
pub struct Truncate {
    #[prost(string, tag = "1")]
    pub stream: String,
    #[prost(uint64, tag = "2")]
    pub stream_id: u64,
    /// Offsets below this are removed.
    #[prost(uint64, tag = "3")]
    pub before: u64,
}

impl Command {
    pub fn encode_bytes(&self) -> Vec<u8> {
        self.encode_to_vec()
    }

    /// Decodes a command held in shared bytes (a Raft entry's data): its payloads
    /// ([`Append::ipc`], [`CopyChunk::ipc`]) are slices of `bytes`, not copies.
    pub fn decode_shared(bytes: Bytes) -> Result<Command> {
        Command::decode(bytes).map_err(|e| Error::internal(format!("undecodable command: {e}")))
    }
}

/// What applying one op did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpOutcome {
    Created {
        existed: bool,
    },
    Dropped {
        existed: bool,
    },
    Appended {
        stream: String,
        base_offset: u64,
        rows: u32,
        ts_micros: i64,
        /// For streams with a `dedup_key`: (offset, ts) of every input row,
        /// the original's for a duplicate. Empty otherwise (rows got
        /// `base_offset..base_offset+rows` at `ts_micros`).
        row_offsets: Vec<(u64, i64)>,
    },
    Truncated {
        first_offset: u64,
    },
    /// A table row was written.
    Written,
    /// Roles or privileges changed.
    RolesChanged,
    /// A stream's options or name changed.
    Altered,
    /// Rows were staged in the copy `copy_id` (see [`CopyChunk`]).
    CopyStaged {
        copy_id: u64,
    },
    /// A staged copy was dropped.
    CopyAborted,
}

/// The state machine's answer to a command: deterministic failures are
/// errors here; non-deterministic ones stop the node instead.
pub type CommandResult = Result<Vec<OpOutcome>>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        let c = Command {
            ts_micros: 42,
            ops: vec![Op {
                kind: Some(op::Kind::Append(Append {
                    stream: "s".into(),
                    stream_id: 7,
                    ipc: Bytes::from_static(&[1, 2, 3]),
                    rows: 3,
                    logical_len: 3,
                })),
            }],
            snapshot: 3,
            reads: vec![TableRead {
                table_id: 9,
                key: Some(vec![1]),
            }],
        };
        // the payload comes back as a slice of the entry's bytes, not a copy
        let entry = Bytes::from(c.encode_bytes());
        let shared = Command::decode_shared(entry.clone()).unwrap();
        assert_eq!(shared, c);
        let Some(op::Kind::Append(a)) = &shared.ops[0].kind else {
            panic!("not an append: {shared:?}");
        };
        let within = entry.as_ptr_range();
        assert!(within.contains(&a.ipc.as_ptr()), "the payload was copied");
        assert!(Command::decode_shared(Bytes::from_static(&[0xff, 0xff, 0xff])).is_err());
    }
}
