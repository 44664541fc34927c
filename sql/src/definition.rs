//! What a stream or a table is: the definitions the state machine
//! replicates and checkpoints (serde), and the names of the system columns.
//!
//! A definition is plain data, fixed when the relation is created and
//! identified by the Raft index of the creating command (`id`, unique
//! forever) and its PostgreSQL OID. Every module that needs a relation's
//! shape imports it from here; the live objects built from a definition
//! (a [`Stream`](crate::catalog::Stream) with its log, a
//! [`Table`](crate::table::Table) with its schema) live in the modules above.
//! A stream's SQL schema is `offset`, `ts`, then its user columns; only the
//! user columns are stored.

use std::sync::Arc;

use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use serde::{Deserialize, Serialize};

use crate::error::{sqlstate, Error, Result};
use crate::types::ColumnType;

/// Name of the system offset column.
pub const OFFSET_COLUMN: &str = "offset";
/// Name of the system commit-time column.
pub const TS_COLUMN: &str = "ts";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ColumnDef {
    pub name: String,
    pub ty: ColumnType,
    pub not_null: bool,
    /// A stream column's constant default, as text its type's input reads
    /// (`ALTER STREAM ... ADD COLUMN ... DEFAULT`): what rows written before
    /// the column existed, and INSERTs that omit it, read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default: Option<String>,
}

impl ColumnDef {
    /// Refuse a column no primary key, UNIQUE constraint or index can hold: `json` has
    /// no equality (42704, as in PostgreSQL); arrays are not supported in keys (0A000).
    pub fn check_key_column(&self) -> Result<()> {
        match self.ty {
            ColumnType::Json => Err(Error::new(
                sqlstate::UNDEFINED_OBJECT,
                "data type json has no default operator class for access method \"btree\"",
            )),
            ColumnType::Array(_) => Err(Error::unsupported(format!(
                "column \"{}\" is of type {}: primary keys, UNIQUE constraints and indexes on array columns are not supported",
                self.name,
                self.ty.sql_name()
            ))),
            _ => Ok(()),
        }
    }
}

/// `WITH (...)` options of a stream.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamOptions {
    pub retention_ms: Option<u64>,
    pub retention_bytes: Option<u64>,
    pub dedup_key: Option<String>,
    pub dedup_window_ms: Option<u64>,
    pub segment_bytes: Option<u64>,
    /// How appends are compressed (absent from catalogs written before: the default).
    #[serde(default)]
    pub compression: Compression,
    /// Retention keeps what a consumer registered in `consumer_offsets` has not processed.
    #[serde(default)]
    pub retain_for_consumers: bool,
}

/// Arrow IPC buffer compression of a stream's appended batches (`WITH (compression = ...)`;
/// see [`crate::ipc`]). Changing it changes how later appends are written; every frame is
/// read whatever it was written with.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Compression {
    None,
    #[default]
    Lz4,
    Zstd,
}

impl Compression {
    pub fn parse(text: &str) -> Option<Compression> {
        match text.to_ascii_lowercase().as_str() {
            "none" => Some(Compression::None),
            "lz4" => Some(Compression::Lz4),
            "zstd" => Some(Compression::Zstd),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Compression::None => "none",
            Compression::Lz4 => "lz4",
            Compression::Zstd => "zstd",
        }
    }

    /// Arrow's codec for it.
    pub fn arrow(self) -> Option<arrow::ipc::CompressionType> {
        match self {
            Compression::None => None,
            Compression::Lz4 => Some(arrow::ipc::CompressionType::LZ4_FRAME),
            Compression::Zstd => Some(arrow::ipc::CompressionType::ZSTD),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamDef {
    /// Raft index of the command that created the stream: unique forever,
    /// so a dropped and re-created stream is never confused with the old one.
    pub id: u64,
    /// PostgreSQL OID of the relation (pg_class.oid), assigned from the
    /// state machine's counter when the stream is created.
    #[serde(default)]
    pub oid: u32,
    pub name: String,
    pub columns: Vec<ColumnDef>,
    pub options: StreamOptions,
}

impl StreamDef {
    /// Schema of the stored batches: the user columns only.
    pub fn user_schema(&self) -> SchemaRef {
        Arc::new(Schema::new(
            self.columns
                .iter()
                .map(|c| c.ty.field(&c.name, !c.not_null))
                .collect::<Vec<_>>(),
        ))
    }

    /// Schema seen by SQL: `offset`, `ts`, then the user columns. The system
    /// columns are nullable in Arrow only so that DataFusion can plan an
    /// INSERT that leaves them out; they are never null when read.
    pub fn full_schema(&self) -> SchemaRef {
        let mut fields = vec![
            ColumnType::Int8.field(OFFSET_COLUMN, true),
            ColumnType::Timestamptz.field(TS_COLUMN, true),
        ];
        fields.extend(
            self.columns
                .iter()
                .map(|c| c.ty.field(&c.name, !c.not_null)),
        );
        Arc::new(Schema::new(fields))
    }

    pub fn column(&self, name: &str) -> Option<&ColumnDef> {
        self.columns.iter().find(|c| c.name == name)
    }
}

/// Arrow type of the `ts` column.
pub fn ts_type() -> DataType {
    DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()))
}

/// Field list helper used by providers: the offset column as a non-null field.
pub fn offset_field() -> Field {
    ColumnType::Int8.field(OFFSET_COLUMN, true)
}

/// Id of the built-in `consumer_offsets` table (stream and table ids are
/// derived from Raft indexes and are always larger).
pub const CONSUMER_OFFSETS_ID: u64 = 1;
pub const CONSUMER_OFFSETS: &str = "consumer_offsets";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TableDef {
    /// Like stream ids: from the creating Raft index, unique forever.
    pub id: u64,
    pub oid: u32,
    pub name: String,
    pub columns: Vec<ColumnDef>,
    /// Positions of the primary-key columns; empty: a hidden row id.
    pub primary_key: Vec<usize>,
    /// OID of the primary key's index (`<name>_pkey`), 0 without a key.
    #[serde(default)]
    pub index_oid: u32,
    /// The primary key's constraint (and index) name when `CREATE TABLE` gave one
    /// (`CONSTRAINT name PRIMARY KEY`); else `<name>_pkey`.
    #[serde(default)]
    pub key_name: Option<String>,
    /// Secondary indexes (`CREATE INDEX`), in creation order.
    #[serde(default)]
    pub indexes: Vec<IndexDef>,
}

/// `pg_index.indoption` bit: the column is `DESC`.
pub const INDOPTION_DESC: u32 = 1;
/// `pg_index.indoption` bit: the column's NULLs come first.
pub const INDOPTION_NULLS_FIRST: u32 = 2;

/// A secondary index of a table: its entries live in the table store under `id`, one per
/// row, keyed by the indexed values then the row's key (see `table::index`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IndexDef {
    /// From the creating op, like table ids: never another table's or index's.
    pub id: u64,
    pub oid: u32,
    pub name: String,
    /// Positions of the indexed columns in the table.
    pub columns: Vec<usize>,
    /// Each column's `pg_index.indoption` as `CREATE INDEX` wrote it ([`INDOPTION_DESC`],
    /// [`INDOPTION_NULLS_FIRST`]; empty: all ascending, NULLs last). Entries are always kept
    /// ascending with NULLs last: a B-tree serves lookups and ranges in either direction, and
    /// no plan reads an index for its order, so the options are what the catalogs show.
    #[serde(default)]
    pub options: Vec<u32>,
    /// No two rows with the same non-NULL values (23505).
    pub unique: bool,
    /// The index of a `UNIQUE` constraint of `CREATE TABLE` (in `pg_constraint`; `DROP
    /// INDEX` refuses it, as in PostgreSQL).
    #[serde(default)]
    pub constraint: bool,
}

impl TableDef {
    pub fn consumer_offsets() -> TableDef {
        let col = |name: &str, ty| ColumnDef {
            name: name.into(),
            ty,
            not_null: true,
            default: None,
        };
        TableDef {
            id: CONSUMER_OFFSETS_ID,
            oid: 16383,
            name: CONSUMER_OFFSETS.into(),
            columns: vec![
                col("consumer", ColumnType::Text),
                col("stream", ColumnType::Text),
                col("offset", ColumnType::Int8),
            ],
            primary_key: vec![0, 1],
            index_oid: 16382,
            key_name: None,
            indexes: Vec::new(),
        }
    }
}

/// A view: a stored query, the columns it had when it was created and the relations it reads
/// (see [`crate::views`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ViewDef {
    /// Like stream ids: from the creating Raft index, unique forever.
    pub id: u64,
    pub oid: u32,
    pub name: String,
    /// The query as the session parsed it, printed back (what `pg_get_viewdef` shows).
    pub query: String,
    /// Output columns: names as PostgreSQL gives them (or as `CREATE VIEW v (a, b)` lists
    /// them) and types; never NOT NULL, never a default.
    pub columns: Vec<ColumnDef>,
    /// The streams, tables and views the query reads, by name.
    pub depends_on: Vec<String>,
}

/// A view in the catalog: its definition and its query, parsed once (by
/// [`crate::views::parse`]).
#[derive(Debug)]
pub struct View {
    pub def: ViewDef,
    pub query: Box<datafusion::sql::sqlparser::ast::Query>,
}

impl View {
    pub fn name(&self) -> &str {
        &self.def.name
    }
}
