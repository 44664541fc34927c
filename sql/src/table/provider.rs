//! DataFusion's view of a table, through the session's transaction.
//!
//! A scan reads the transaction's snapshot with its own writes on top and
//! records what it read: when the pushed-down filters fix every
//! primary-key column (`k = 1`, `a = 'x' AND b = 2`) it reads and records
//! that one key, otherwise the whole table. That granularity is what
//! commit-time validation checks, so transactions that touch different
//! keys by primary key never conflict.
//!
//! Otherwise, when they fix the leading columns of a secondary index (or bound
//! its first free column), it reads the index's range of entries and the rows
//! they point to ([`index::choose`]; EXPLAIN shows `IndexScan`), recording a
//! read of the whole table, as a full scan does.
//!
//! The keyed view (used to plan UPDATE and DELETE) adds the hidden
//! [`KEY_COLUMN`] with each row's stored key.

use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::{ArrayRef, BinaryArray, RecordBatch};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use async_trait::async_trait;
use datafusion::catalog::Session;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::datasource::memory::MemorySourceConfig;
use datafusion::datasource::{TableProvider, TableType};
use datafusion::error::{DataFusionError, Result as DFResult};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::{BinaryExpr, Expr, Operator, TableProviderFilterPushDown};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties, ReplaceChildrenOptions,
};
use datafusion::scalar::ScalarValue;

use super::store::TableStore;
use super::{codec, index, Table, TxnTables, KEY_COLUMN};
use crate::pushdown::{column_cmp, inexact_where};

/// The provider of one table in one session.
#[derive(Debug)]
pub struct TableScan {
    table: Arc<Table>,
    store: Arc<TableStore>,
    txn: Arc<TxnTables>,
    keyed: bool,
    schema: SchemaRef,
}

impl TableScan {
    pub fn new(
        table: Arc<Table>,
        store: Arc<TableStore>,
        txn: Arc<TxnTables>,
        keyed: bool,
    ) -> TableScan {
        let schema = if keyed {
            let mut fields: Vec<Field> = table
                .schema
                .fields()
                .iter()
                .map(|f| f.as_ref().clone())
                .collect();
            fields.push(Field::new(KEY_COLUMN, DataType::Binary, false));
            Arc::new(Schema::new(fields))
        } else {
            table.schema.clone()
        };
        TableScan {
            table,
            store,
            txn,
            keyed,
            schema,
        }
    }

    /// `column = literal` on a primary-key column.
    fn key_equality(&self, e: &Expr) -> Option<(usize, ScalarValue)> {
        let Expr::BinaryExpr(BinaryExpr { left, op, right }) = e else {
            return None;
        };
        let (col, Operator::Eq, lit) = column_cmp(left, *op, right)? else {
            return None;
        };
        let i = self.table.def.columns.iter().position(|c| c.name == col)?;
        if !self.table.def.primary_key.contains(&i) || lit.is_null() {
            return None;
        }
        let v = self.table.types[i].coerce(lit).ok()?;
        Some((i, v))
    }

    /// `column <op> literal` on a column some index starts with or continues.
    fn indexed_comparison(&self, e: &Expr) -> bool {
        let Expr::BinaryExpr(BinaryExpr { left, op, right }) = e else {
            return false;
        };
        let Some((col, _, _)) = column_cmp(left, *op, right) else {
            return false;
        };
        let Some(i) = self.table.def.columns.iter().position(|c| c.name == col) else {
            return false;
        };
        self.table
            .def
            .indexes
            .iter()
            .any(|x| x.columns.contains(&i))
    }

    /// The key all filters together pin, if they pin every key column.
    fn pinned_key(&self, filters: &[Expr]) -> Option<Vec<u8>> {
        if self.table.def.primary_key.is_empty() {
            return None;
        }
        let mut pinned: HashMap<usize, ScalarValue> = HashMap::new();
        for f in filters {
            for conjunct in datafusion::logical_expr::utils::split_conjunction(f) {
                if let Some((i, v)) = self.key_equality(conjunct) {
                    pinned.insert(i, v);
                }
            }
        }
        let vals: Option<Vec<&ScalarValue>> = self
            .table
            .def
            .primary_key
            .iter()
            .map(|i| pinned.get(i))
            .collect();
        codec::encode_key(&vals?).ok()
    }
}

#[async_trait]
impl TableProvider for TableScan {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    fn supports_filters_pushdown(
        &self,
        filters: &[&Expr],
    ) -> DFResult<Vec<TableProviderFilterPushDown>> {
        Ok(inexact_where(filters, |f| {
            datafusion::logical_expr::utils::split_conjunction(f)
                .iter()
                .all(|c| self.key_equality(c).is_some() || self.indexed_comparison(c))
        }))
    }

    async fn scan(
        &self,
        _state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        _limit: Option<usize>,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        let ext = |e: crate::error::Error| DataFusionError::External(Box::new(e));
        let mut used = None;
        let rows = match self.pinned_key(filters) {
            Some(key) => match self.txn.get(&self.store, &self.table, &key).map_err(ext)? {
                Some(row) => vec![(key, row)],
                None => vec![],
            },
            None => {
                let found = match index::choose(&self.table, filters) {
                    Some(lookup) => self
                        .txn
                        .index_scan(&self.store, &self.table, &lookup)
                        .map_err(ext)?
                        .map(|rows| (rows, lookup)),
                    None => None,
                };
                match found {
                    Some((rows, lookup)) => {
                        used = Some(lookup);
                        rows
                    }
                    None => self.txn.scan(&self.store, &self.table).map_err(ext)?,
                }
            }
        };
        let keys: Vec<Vec<u8>> = rows.iter().map(|(k, _)| k.clone()).collect();
        let values: Vec<Vec<ScalarValue>> = rows.into_iter().map(|(_, v)| v).collect();
        let mut columns: Vec<ArrayRef> =
            codec::rows_to_arrays(values, &self.table.types).map_err(ext)?;
        if self.keyed {
            columns.push(Arc::new(BinaryArray::from_iter_values(keys.iter())));
        }
        let batch = RecordBatch::try_new(self.schema.clone(), columns)?;
        let exec = MemorySourceConfig::try_new_exec(
            &[vec![batch]],
            self.schema.clone(),
            projection.cloned(),
        )?;
        Ok(match used {
            Some(lookup) => Arc::new(IndexScanExec {
                rows: exec,
                index: lookup.index.name,
                condition: lookup.condition,
            }),
            None => exec,
        })
    }
}

/// The rows an index lookup found, already read (a leaf: EXPLAIN shows which index and
/// what it looked up).
#[derive(Debug)]
struct IndexScanExec {
    rows: Arc<dyn ExecutionPlan>,
    index: String,
    condition: String,
}

impl DisplayAs for IndexScanExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "IndexScan: index={}, {}", self.index, self.condition)
    }
}

impl ExecutionPlan for IndexScanExec {
    fn name(&self) -> &str {
        "IndexScanExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        self.rows.properties()
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> DFResult<TreeNodeRecursion>,
    ) -> DFResult<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn replace_children(
        self: Arc<Self>,
        _children: Vec<Arc<dyn ExecutionPlan>>,
        _options: ReplaceChildrenOptions,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        Ok(self)
    }

    fn with_new_children(
        self: Arc<Self>,
        _children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        Ok(self)
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> DFResult<SendableRecordBatchStream> {
        self.rows.execute(partition, context)
    }
}
