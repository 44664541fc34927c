//! The relations a transaction block created, altered or dropped, as the block's own
//! statements see them before COMMIT.
//!
//! DDL inside a block (BEGIN, or a pipeline's implicit block) is buffered with the block's
//! writes: its ops commit in the block's one command, all or nothing, and ROLLBACK forgets
//! them. Until then a [`BlockCatalog`] answers for every name the block's DDL touched:
//! - a table or stream created in the block is read and written under a *local id*,
//!   [`LOCAL_ID_BASE`] + the position of its `Create*` op in the block; the block's
//!   writes carry that id and the state machine resolves it to the relation the command
//!   created (`apply::plan_table_writes`, `apply::check_target`). A new stream's handle
//!   has an empty log of its own in a temporary directory (removed when the block ends):
//!   the block's appends are read from the block, as for any stream;
//! - a view created or replaced in the block expands to its new query;
//! - a dropped relation (and, under CASCADE, the views over it) is gone;
//! - an altered stream shows its new definition over the same log.
//!
//! A stream created in the block cannot be altered in it, nor written when it has a
//! `dedup_key` (0A000: both need the committed stream). A block creates at most
//! [`MAX_NEW_STREAMS`] streams (54000), each holding an open log file until it ends.
//!
//! Invariant: the catalog is a function of the block's ops — recorded op by op as DDL
//! runs, and rebuilt from the ops that remain after ROLLBACK TO — so it never disagrees
//! with what COMMIT will propose. Names it does not know are the shared catalog's.

use std::collections::BTreeMap;
use std::sync::Arc;

use parking_lot::Mutex;
use sluice_storage::StreamLog;

use crate::catalog::{Catalog, Stream};
use crate::command::{op, Op};
use crate::definition::{StreamDef, TableDef, View, ViewDef};
use crate::error::{Error, Result};
use crate::table::Table;

/// Streams one block may create: each holds an open (empty) log file until the block ends.
pub const MAX_NEW_STREAMS: usize = 32;

/// Ids at and above this name tables created in the open block (op position added).
/// Real ids (`index * 1024 + op + 1`) and dedup ids (high bit) never reach it.
pub const LOCAL_ID_BASE: u64 = 1 << 62;

/// What the block made of a name.
#[derive(Debug, Clone)]
pub enum Local {
    /// A stream the block altered (the same log under its new definition).
    Stream(Arc<Stream>),
    /// A stream the block created, under its local id.
    NewStream(Arc<NewStream>),
    /// A table the block created, under its local id.
    Table(Arc<Table>),
    /// A view the block created or replaced.
    View(Arc<View>),
}

/// A stream created in the block: its handle over an empty log in a temporary directory.
#[derive(Debug)]
pub struct NewStream {
    pub stream: Arc<Stream>,
    _dir: tempfile::TempDir,
}

/// One session's block-local catalog (shared with its DataFusion schema provider).
#[derive(Debug, Default)]
pub struct BlockCatalog {
    /// name -> `Some`: what the block made of it; `None`: dropped in the block.
    names: Mutex<BTreeMap<String, Option<Local>>>,
}

/// 0A000 for what a stream created in the open block cannot do yet (`what`: "altered").
pub fn new_stream_error(name: &str, what: &str) -> Error {
    Error::unsupported(format!(
        "stream \"{name}\" was created in this transaction block: it can be {what} once the block commits"
    ))
}

impl BlockCatalog {
    /// Forget the block's DDL (the block ended).
    pub fn reset(&self) {
        self.names.lock().clear();
    }

    /// `None`: the block did not touch `name`; `Some(None)`: it dropped it.
    pub fn lookup(&self, name: &str) -> Option<Option<Local>> {
        let names = self.names.lock();
        if names.is_empty() {
            return None;
        }
        names.get(name).cloned()
    }

    /// Whether `name` names a relation, as the block sees it.
    pub fn exists(&self, name: &str, global: &Catalog) -> bool {
        match self.lookup(name) {
            Some(local) => local.is_some(),
            None => global.exists(name),
        }
    }

    /// The table called `name`, as the block sees it.
    pub fn table(&self, name: &str, global: &Catalog) -> Option<Arc<Table>> {
        match self.lookup(name) {
            Some(Some(Local::Table(t))) => Some(t),
            Some(_) => None,
            None => global.table(name),
        }
    }

    /// The view called `name`, as the block sees it.
    pub fn view(&self, name: &str, global: &Catalog) -> Option<Arc<View>> {
        match self.lookup(name) {
            Some(Some(Local::View(v))) => Some(v),
            Some(_) => None,
            None => global.view(name),
        }
    }

    /// The stream called `name`, as the block sees it.
    pub fn stream(&self, name: &str, global: &Catalog) -> Option<Arc<Stream>> {
        match self.lookup(name) {
            Some(Some(Local::Stream(s))) => Some(s),
            Some(Some(Local::NewStream(n))) => Some(n.stream.clone()),
            Some(_) => None,
            None => global.get(name),
        }
    }

    /// Whether the block created the stream called `name`.
    pub fn is_new_stream(&self, name: &str) -> bool {
        matches!(self.lookup(name), Some(Some(Local::NewStream(_))))
    }

    /// Whether any view is visible to the block.
    pub fn has_views(&self, global: &Catalog) -> bool {
        global.has_views()
            || self
                .names
                .lock()
                .values()
                .any(|l| matches!(l, Some(Local::View(_))))
    }

    /// Names the block added (`true`) or removed (`false`), for listings.
    pub fn changes(&self) -> Vec<(String, bool)> {
        self.names
            .lock()
            .iter()
            .map(|(n, l)| (n.clone(), l.is_some()))
            .collect()
    }

    /// Rebuild from the block's ops (after ROLLBACK TO).
    pub fn rebuild(&self, ops: &[Op], global: &Catalog) -> Result<()> {
        self.reset();
        for (i, o) in ops.iter().enumerate() {
            self.record(i, o, global)?;
        }
        Ok(())
    }

    /// The block's op at position `i` ran: what it created, altered or dropped shows.
    pub fn record(&self, i: usize, o: &Op, global: &Catalog) -> Result<()> {
        match &o.kind {
            Some(op::Kind::CreateTable(c)) => {
                let mut def: TableDef = parse_json(&c.definition_json)?;
                def.id = LOCAL_ID_BASE + i as u64;
                def.name = c.name.clone();
                self.set(&c.name, Some(Local::Table(Arc::new(Table::new(def)))));
            }
            Some(op::Kind::CreateStream(c)) => {
                let new_streams = self
                    .names
                    .lock()
                    .values()
                    .filter(|l| matches!(l, Some(Local::NewStream(_))))
                    .count();
                if new_streams >= MAX_NEW_STREAMS {
                    return Err(Error::new(
                        crate::error::sqlstate::PROGRAM_LIMIT_EXCEEDED,
                        format!("a transaction block may create at most {MAX_NEW_STREAMS} streams"),
                    ));
                }
                let mut def: StreamDef = parse_json(&c.definition_json)?;
                def.id = LOCAL_ID_BASE + i as u64;
                def.name = c.name.clone();
                let dir = tempfile::Builder::new()
                    .prefix("sluice-block-stream-")
                    .tempdir()
                    .map_err(|e| Error::io(format!("a block's new stream: {e}")))?;
                let log = StreamLog::create(&dir.path().join("log"), Default::default())?;
                let stream = Arc::new(Stream::new(def, Arc::new(log)));
                let new = NewStream { stream, _dir: dir };
                self.set(&c.name, Some(Local::NewStream(Arc::new(new))));
            }
            Some(op::Kind::CreateView(c)) => {
                let mut def: ViewDef = parse_json(&c.definition_json)?;
                def.name = c.name.clone();
                let view = crate::views::parse(def)?;
                self.set(&c.name, Some(Local::View(Arc::new(view))));
            }
            Some(op::Kind::DropRelation(d)) => {
                if d.cascade {
                    for v in self.dependents(&d.name, global) {
                        self.set(&v, None);
                    }
                }
                self.set(&d.name, None);
            }
            Some(op::Kind::AlterStream(a)) => {
                let Some(stream) = self.stream(&a.name, global) else {
                    return Err(Error::undefined_table(&a.name));
                };
                let def = crate::alter::new_definition(&stream, a)?;
                let altered = Some(Local::Stream(Arc::new(stream.altered(def))));
                if !a.new_name.is_empty() && a.new_name != a.name {
                    self.set(&a.name, None);
                    self.set(&a.new_name, altered);
                } else {
                    self.set(&a.name, altered);
                }
            }
            _ => {}
        }
        Ok(())
    }

    fn set(&self, name: &str, local: Option<Local>) {
        self.names.lock().insert(name.to_string(), local);
    }

    /// The views over `name` (and over those), as the block sees them.
    pub fn dependents(&self, name: &str, global: &Catalog) -> Vec<String> {
        let mut found: Vec<String> = Vec::new();
        let mut todo = vec![name.to_string()];
        while let Some(n) = todo.pop() {
            let mut over: Vec<String> = global
                .dependents(&n)
                .into_iter()
                .filter(|v| self.lookup(v).is_none())
                .collect();
            over.extend(self.names.lock().values().filter_map(|l| match l {
                Some(Local::View(v)) if v.def.depends_on.contains(&n) => Some(v.def.name.clone()),
                _ => None,
            }));
            for v in over {
                if !found.contains(&v) && v != name {
                    found.push(v.clone());
                    todo.push(v);
                }
            }
        }
        found
    }
}

fn parse_json<T: serde::de::DeserializeOwned>(json: &str) -> Result<T> {
    serde_json::from_str(json).map_err(|e| Error::internal(format!("bad definition: {e}")))
}
