//! System catalogs: `pg_catalog` and `information_schema` as PostgreSQL
//! clients' introspection queries expect them.
//!
//! Static catalog data (pg_type, pg_proc, pg_am, pg_range, ...), most
//! catalog functions (format_type, pg_get_expr, has_*_privilege,
//! quote_ident, ...) and the SQL rewrites that let DataFusion plan client
//! queries (`'t'::regclass`, `OPERATOR(pg_catalog.~)`, `COLLATE`) come from
//! `datafusion-pg-catalog`. The relations that describe Sluice's own objects
//! — pg_namespace, pg_class, pg_attribute, pg_database, pg_tables,
//! pg_stat_user_tables and information_schema — are built here from the
//! catalog, so they show streams with their system columns, SQL types (with
//! typmods) and NOT NULL, under OIDs that the state machine assigned at
//! CREATE and that therefore survive restarts.
//!
//! Invariant: every relation listed is queryable under the (schema, name)
//! it is listed with, and its columns are listed exactly as `SELECT *`
//! returns them, in that order.

pub mod client_sql;
mod decorrelate;
mod format_type;
mod information_schema;
mod pg_catalog;
mod pg_functions;
mod rewrite;
mod roles;
mod text_arrays;

use std::sync::{Arc, Weak};

use arrow::array::{new_empty_array, ArrayRef, RecordBatch};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::catalog::SchemaProvider;
use datafusion::common::ScalarValue;
use datafusion::datasource::{MemTable, TableProvider};
use datafusion::error::Result as DFResult;
use datafusion::execution::context::SessionContext;
use datafusion_pg_catalog::pg_catalog::PgCatalogStaticTables;

use crate::catalog::Catalog;
use crate::definition::{INDOPTION_DESC, INDOPTION_NULLS_FIRST};
use crate::settings::SharedVars;
use crate::types::ColumnType;
use pg_functions::quote_ident;

/// Fixed namespace OIDs (PostgreSQL's own, so static rows join back).
pub const NAMESPACE_PUBLIC: i32 = 2200;
const NAMESPACE_PG_CATALOG: i32 = 11;
const NAMESPACE_INFORMATION_SCHEMA: i32 = 13183;
/// OID of the one database and of its owner role.
const DATABASE_OID: i32 = 5;
const OWNER_OID: i32 = 10;

/// What the catalogs describe: the streams and tables, and Sluice's system
/// views in `public`. The engine provides it; the catalogs hold it weakly (a
/// session's context does not keep the engine alive) and so never import the
/// engine.
pub trait CatalogSource: Send + Sync {
    fn catalog(&self) -> &Catalog;
    /// The bootstrap superuser's name.
    fn superuser(&self) -> &str;
    /// Sluice's system views in `public`, with their schemas.
    fn system_views(&self) -> Vec<(&'static str, SchemaRef)>;
}

/// What every session's catalogs share: the static PostgreSQL catalog
/// tables, decoded once.
pub struct SystemCatalog {
    static_tables: Arc<PgCatalogStaticTables>,
    /// pg_type's typname → oid, for `to_regtype`.
    type_oids: Arc<std::collections::HashMap<String, i32>>,
}

impl std::fmt::Debug for SystemCatalog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SystemCatalog").finish_non_exhaustive()
    }
}

impl SystemCatalog {
    pub fn new() -> crate::Result<SystemCatalog> {
        let static_tables = PgCatalogStaticTables::try_new()
            .map_err(|e| crate::Error::internal(format!("loading pg_catalog tables: {e}")))?;
        Ok(SystemCatalog {
            type_oids: Arc::new(pg_functions::type_oids(&static_tables)),
            static_tables: Arc::new(static_tables),
        })
    }

    /// Register `pg_catalog`, `information_schema` and the catalog functions
    /// in a session's context, under its DataFusion catalog `catalog_name`.
    pub fn install(
        &self,
        ctx: &SessionContext,
        catalog_name: &str,
        engine: Weak<dyn CatalogSource>,
        vars: SharedVars,
    ) {
        let pg: Arc<dyn SchemaProvider> = Arc::new(pg_catalog::PgCatalog::new(
            engine.clone(),
            self.static_tables.clone(),
            vars.clone(),
        ));
        let info: Arc<dyn SchemaProvider> = Arc::new(information_schema::InformationSchema::new(
            engine.clone(),
            vars.clone(),
        ));
        if let Some(catalog) = ctx.catalog(catalog_name) {
            let _ = catalog.register_schema("pg_catalog", pg);
            let _ = catalog.register_schema("information_schema", info);
        }
        pg_functions::register(ctx, &self.static_tables, &self.type_oids, engine, vars);
    }
}

/// A relation as the catalogs describe it.
#[derive(Debug, Clone)]
pub(crate) struct Relation {
    pub oid: i32,
    pub schema: &'static str,
    pub namespace: i32,
    pub name: String,
    /// `r` (stream or table) or `v` (a view, Sluice's or a user's).
    pub kind: &'static str,
    pub columns: Vec<RelColumn>,
    /// Row count estimate (exact for streams, -1 unknown for tables).
    pub rows: i64,
    /// Primary key: attribute numbers (1-based) and the index's OID.
    pub key: Vec<i16>,
    /// The primary key's constraint name, when `CREATE TABLE` gave one.
    pub key_name: Option<String>,
    pub index_oid: i32,
    /// Secondary indexes (`CREATE INDEX`) of a table.
    pub secondary: Vec<RelIndex>,
    /// A user view's query (`pg_get_viewdef`); `None` for everything else.
    pub definition: Option<String>,
}

/// An index as the catalogs describe it: a primary key's or a secondary one.
#[derive(Debug, Clone)]
pub(crate) struct RelIndex {
    pub oid: i32,
    pub name: String,
    /// Attribute numbers (1-based) of the indexed columns.
    pub columns: Vec<i16>,
    /// Each column's `indoption` (empty: all 0).
    pub options: Vec<u32>,
    pub unique: bool,
    pub primary: bool,
    /// The index of a UNIQUE constraint (`pg_constraint` lists it, as a primary key's).
    pub constraint: bool,
}

impl RelIndex {
    /// Column `i`'s `indoption`.
    pub fn option(&self, i: usize) -> u32 {
        self.options.get(i).copied().unwrap_or(0)
    }

    /// The index of a constraint: a primary key or a UNIQUE constraint.
    pub fn is_constraint(&self) -> bool {
        self.primary || self.constraint
    }

    /// OID of its constraint (derived: it is not stored).
    pub fn constraint_oid(&self) -> i32 {
        self.oid | 1 << 30
    }

    /// `p` or `u`, as `pg_constraint.contype`.
    pub fn contype(&self) -> &'static str {
        if self.primary {
            "p"
        } else {
            "u"
        }
    }
}

impl Relation {
    /// Name of the primary key's index and constraint (`CONSTRAINT name PRIMARY KEY`, else
    /// `<table>_pkey`).
    pub fn pkey_name(&self) -> String {
        self.key_name
            .clone()
            .unwrap_or_else(|| format!("{}_pkey", self.name))
    }

    /// Every index: the primary key's first, then the secondary ones.
    pub fn indexes(&self) -> Vec<RelIndex> {
        let mut out = Vec::with_capacity(1 + self.secondary.len());
        if !self.key.is_empty() {
            out.push(RelIndex {
                oid: self.index_oid,
                name: self.pkey_name(),
                columns: self.key.clone(),
                options: Vec::new(),
                unique: true,
                primary: true,
                constraint: true,
            });
        }
        out.extend(self.secondary.iter().cloned());
        out
    }

    /// `a, "B"`: the quoted names of columns by attribute number.
    pub fn column_list(&self, attnums: &[i16]) -> String {
        attnums
            .iter()
            .map(|&k| quote_ident(&self.columns[k as usize - 1].name))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// `PRIMARY KEY (a)` / `UNIQUE (a, b)`, as `pg_get_constraintdef` shows a constraint.
    pub fn constraint_definition(&self, x: &RelIndex) -> String {
        let kind = if x.primary { "PRIMARY KEY" } else { "UNIQUE" };
        format!("{kind} ({})", self.column_list(&x.columns))
    }

    /// `CREATE [UNIQUE] INDEX ...` as `pg_get_indexdef` and `pg_indexes` show it.
    pub fn index_definition(&self, x: &RelIndex) -> String {
        let cols = x
            .columns
            .iter()
            .enumerate()
            .map(|(i, &k)| {
                let name = quote_ident(&self.columns[k as usize - 1].name);
                let desc = x.option(i) & INDOPTION_DESC != 0;
                let nulls_first = x.option(i) & INDOPTION_NULLS_FIRST != 0;
                match (desc, nulls_first) {
                    (true, true) => format!("{name} DESC"),
                    (true, false) => format!("{name} DESC NULLS LAST"),
                    (false, true) => format!("{name} NULLS FIRST"),
                    (false, false) => name,
                }
            })
            .collect::<Vec<_>>()
            .join(", ");
        format!(
            "CREATE {}INDEX {} ON {}.{} USING btree ({cols})",
            if x.unique { "UNIQUE " } else { "" },
            quote_ident(&x.name),
            self.schema,
            quote_ident(&self.name)
        )
    }
}

#[derive(Debug, Clone)]
pub(crate) struct RelColumn {
    pub name: String,
    pub ty: ColumnType,
    pub not_null: bool,
    /// The default as `information_schema.columns.column_default` shows it (`'eu'::text`).
    pub default: Option<String>,
}

/// A column default's text as PostgreSQL shows the expression: numbers bare, anything else
/// a quoted literal cast to the column's type (`'eu'::text`).
fn default_expression(text: &str, ty: ColumnType) -> String {
    match ty {
        ColumnType::Int2
        | ColumnType::Int4
        | ColumnType::Int8
        | ColumnType::Float4
        | ColumnType::Float8
        | ColumnType::Numeric(_) => text.to_string(),
        _ => format!("'{}'::{}", text.replace('\'', "''"), ty.sql_name()),
    }
}

/// Every relation in `public`: the streams, tables and views by name, then Sluice's system
/// views.
pub(crate) fn relations(engine: &dyn CatalogSource) -> Vec<Relation> {
    let mut out: Vec<Relation> = engine
        .catalog()
        .list()
        .iter()
        .map(|s| {
            let mut columns = vec![
                RelColumn {
                    name: crate::definition::OFFSET_COLUMN.into(),
                    ty: ColumnType::Int8,
                    not_null: true,
                    default: None,
                },
                RelColumn {
                    name: crate::definition::TS_COLUMN.into(),
                    ty: ColumnType::Timestamptz,
                    not_null: true,
                    default: None,
                },
            ];
            columns.extend(s.def.columns.iter().map(|c| RelColumn {
                name: c.name.clone(),
                ty: c.ty,
                not_null: c.not_null,
                default: c.default.as_deref().map(|d| default_expression(d, c.ty)),
            }));
            Relation {
                oid: s.def.oid as i32,
                schema: "public",
                namespace: NAMESPACE_PUBLIC,
                name: s.def.name.clone(),
                kind: "r",
                columns,
                rows: (s.log.next_offset() - s.log.first_offset()) as i64,
                key: vec![],
                key_name: None,
                index_oid: 0,
                secondary: vec![],
                definition: None,
            }
        })
        .collect();
    out.extend(engine.catalog().tables().iter().map(|t| {
        Relation {
            oid: t.def.oid as i32,
            schema: "public",
            namespace: NAMESPACE_PUBLIC,
            name: t.def.name.clone(),
            kind: "r",
            columns: t.def.columns.iter().map(rel_column).collect(),
            rows: -1,
            key: t.def.primary_key.iter().map(|&i| i as i16 + 1).collect(),
            key_name: t.def.key_name.clone(),
            index_oid: t.def.index_oid as i32,
            secondary: t
                .def
                .indexes
                .iter()
                .map(|x| RelIndex {
                    oid: x.oid as i32,
                    name: x.name.clone(),
                    columns: x.columns.iter().map(|&c| c as i16 + 1).collect(),
                    options: x.options.clone(),
                    unique: x.unique,
                    primary: false,
                    constraint: x.constraint,
                })
                .collect(),
            definition: None,
        }
    }));
    out.extend(engine.catalog().views().iter().map(|v| Relation {
        oid: v.def.oid as i32,
        schema: "public",
        namespace: NAMESPACE_PUBLIC,
        name: v.def.name.clone(),
        kind: "v",
        columns: v.def.columns.iter().map(rel_column).collect(),
        rows: 0,
        key: vec![],
        key_name: None,
        index_oid: 0,
        secondary: vec![],
        definition: Some(format!("{};", v.def.query)),
    }));
    out.sort_by(|a, b| a.name.cmp(&b.name));
    for (i, (name, schema)) in engine.system_views().into_iter().enumerate() {
        out.push(Relation {
            oid: 16000 + i as i32,
            schema: "public",
            namespace: NAMESPACE_PUBLIC,
            name: name.to_string(),
            kind: "v",
            columns: schema
                .fields()
                .iter()
                .map(|f| RelColumn {
                    name: f.name().clone(),
                    ty: ColumnType::of_arrow(f.data_type()).unwrap_or(ColumnType::Text),
                    not_null: !f.is_nullable(),
                    default: None,
                })
                .collect(),
            rows: 0,
            key: vec![],
            key_name: None,
            index_oid: 0,
            secondary: vec![],
            definition: None,
        });
    }
    out
}

/// A table's or view's column as the catalogs show it (a view's columns are never NOT NULL;
/// neither shows a default).
fn rel_column(c: &crate::definition::ColumnDef) -> RelColumn {
    RelColumn {
        name: c.name.clone(),
        ty: c.ty,
        not_null: c.not_null,
        default: None,
    }
}

/// Namespaces: (oid, name).
pub(crate) fn namespaces() -> [(i32, &'static str); 3] {
    [
        (NAMESPACE_PG_CATALOG, "pg_catalog"),
        (NAMESPACE_PUBLIC, "public"),
        (NAMESPACE_INFORMATION_SCHEMA, "information_schema"),
    ]
}

/// Column-at-a-time builder for small catalog tables.
pub(crate) struct TableBuilder {
    fields: Vec<Field>,
    columns: Vec<Vec<ScalarValue>>,
}

impl TableBuilder {
    pub fn new(fields: Vec<Field>) -> TableBuilder {
        let columns = fields.iter().map(|_| Vec::new()).collect();
        TableBuilder { fields, columns }
    }

    /// Append a row; values must be in field order and of the field's type.
    pub fn row(&mut self, values: Vec<ScalarValue>) {
        debug_assert_eq!(values.len(), self.fields.len());
        for (col, v) in self.columns.iter_mut().zip(values) {
            col.push(v);
        }
    }

    pub fn schema(&self) -> SchemaRef {
        Arc::new(Schema::new(self.fields.clone()))
    }

    pub fn build(self) -> DFResult<Arc<dyn TableProvider>> {
        let schema = self.schema();
        let mut arrays: Vec<ArrayRef> = Vec::with_capacity(self.fields.len());
        for (field, values) in self.fields.iter().zip(self.columns) {
            let array = if values.is_empty() {
                new_empty_array(field.data_type())
            } else {
                let a = ScalarValue::iter_to_array(values)?;
                if a.data_type() != field.data_type() {
                    arrow::compute::cast(&a, field.data_type())?
                } else {
                    a
                }
            };
            arrays.push(array);
        }
        let batch = RecordBatch::try_new(schema.clone(), arrays)?;
        Ok(Arc::new(MemTable::try_new(schema, vec![vec![batch]])?))
    }
}

/// Field constructors for catalog columns.
pub(crate) fn text(name: &str) -> Field {
    Field::new(name, DataType::Utf8, true)
}
/// Text columns, in order.
pub(crate) fn text_fields(names: &[&str]) -> Vec<Field> {
    names.iter().map(|n| text(n)).collect()
}
pub(crate) fn int4(name: &str) -> Field {
    Field::new(name, DataType::Int32, true)
}
pub(crate) fn int2(name: &str) -> Field {
    Field::new(name, DataType::Int16, true)
}
pub(crate) fn int8(name: &str) -> Field {
    Field::new(name, DataType::Int64, true)
}
pub(crate) fn boolean(name: &str) -> Field {
    Field::new(name, DataType::Boolean, true)
}
pub(crate) fn float(name: &str) -> Field {
    Field::new(name, DataType::Float32, true)
}
pub(crate) fn timestamptz(name: &str) -> Field {
    Field::new(
        name,
        DataType::Timestamp(arrow::datatypes::TimeUnit::Microsecond, Some("UTC".into())),
        true,
    )
}
pub(crate) fn text_array(name: &str) -> Field {
    Field::new(
        name,
        DataType::List(Arc::new(Field::new("item", DataType::Utf8, true))),
        true,
    )
}
pub(crate) fn int2_array(name: &str) -> Field {
    Field::new(
        name,
        DataType::List(Arc::new(Field::new("item", DataType::Int16, true))),
        true,
    )
}
pub(crate) fn oid_array(name: &str) -> Field {
    Field::new(
        name,
        DataType::List(Arc::new(Field::new("item", DataType::Int32, true))),
        true,
    )
}
/// PostgreSQL's `int2vector` (pg_index.indkey): an int2 list a client reads as `1 2`.
pub(crate) fn int2_vector(name: &str) -> Field {
    vector_field(int2_array(name), "int2vector")
}
/// PostgreSQL's `oidvector` (pg_index.indclass): an oid list a client reads as `0 0`.
pub(crate) fn oid_vector(name: &str) -> Field {
    vector_field(oid_array(name), "oidvector")
}
fn vector_field(f: Field, pg_type: &str) -> Field {
    f.with_metadata(
        [(crate::types::PG_TYPE_KEY.to_string(), pg_type.to_string())]
            .into_iter()
            .collect(),
    )
}
/// An oid-typed column (int4 carrying the alias kind the crate's rules read).
pub(crate) fn oid(name: &str, kind: &str) -> Field {
    datafusion_pg_catalog::pg_catalog::oid_field::oid_field(name, kind, true)
}

/// Value constructors.
pub(crate) fn s(v: impl Into<String>) -> ScalarValue {
    ScalarValue::Utf8(Some(v.into()))
}
pub(crate) fn null_s() -> ScalarValue {
    ScalarValue::Utf8(None)
}
pub(crate) fn i4(v: i32) -> ScalarValue {
    ScalarValue::Int32(Some(v))
}
pub(crate) fn null_i4() -> ScalarValue {
    ScalarValue::Int32(None)
}
pub(crate) fn i2(v: i16) -> ScalarValue {
    ScalarValue::Int16(Some(v))
}
pub(crate) fn i8v(v: i64) -> ScalarValue {
    ScalarValue::Int64(Some(v))
}
pub(crate) fn b(v: bool) -> ScalarValue {
    ScalarValue::Boolean(Some(v))
}
/// An int2[] value.
pub(crate) fn i2_list(values: &[i16]) -> ScalarValue {
    let items: Vec<ScalarValue> = values
        .iter()
        .map(|v| ScalarValue::Int16(Some(*v)))
        .collect();
    ScalarValue::List(ScalarValue::new_list_nullable(&items, &DataType::Int16))
}

/// An oid[] value.
pub(crate) fn oid_list(values: &[i32]) -> ScalarValue {
    let items: Vec<ScalarValue> = values
        .iter()
        .map(|v| ScalarValue::Int32(Some(*v)))
        .collect();
    ScalarValue::List(ScalarValue::new_list_nullable(&items, &DataType::Int32))
}

pub(crate) fn null_array() -> ScalarValue {
    ScalarValue::try_from(text_array("").data_type()).unwrap_or(ScalarValue::Null)
}

/// Storage facts about a column type: (typlen, typbyval, typalign, typstorage).
pub(crate) fn type_layout(ty: &ColumnType) -> (i16, bool, &'static str, &'static str) {
    match ty {
        ColumnType::Bool => (1, true, "c", "p"),
        ColumnType::Int2 => (2, true, "s", "p"),
        ColumnType::Int4 | ColumnType::Float4 | ColumnType::Date => (4, true, "i", "p"),
        ColumnType::Int8 | ColumnType::Float8 | ColumnType::Timestamptz | ColumnType::Timestamp => {
            (8, true, "d", "p")
        }
        ColumnType::Uuid => (16, false, "c", "p"),
        ColumnType::Numeric(_) => (-1, false, "i", "m"),
        ColumnType::Text
        | ColumnType::Varchar(_)
        | ColumnType::Bytea
        | ColumnType::Json
        | ColumnType::Jsonb => (-1, false, "i", "x"),
        ColumnType::Array(e) => (-1, false, type_layout(&e.column()).2, "x"),
    }
}

/// Collation OID of a column type (100 = "default" for text types).
pub(crate) fn type_collation(ty: &ColumnType) -> i32 {
    match ty {
        ColumnType::Text | ColumnType::Varchar(_) => 100,
        ColumnType::Array(e) => type_collation(&e.column()),
        _ => 0,
    }
}
