//! The `information_schema` views BI tools and ORMs read, built from the
//! live catalog with PostgreSQL's type names (DataFusion's own
//! information_schema reports Arrow types, which no client understands).

use async_trait::async_trait;
use datafusion::catalog::SchemaProvider;
use datafusion::datasource::TableProvider;
use datafusion::error::{DataFusionError, Result as DFResult};

use super::*;

const VIEWS: &[&str] = &[
    "schemata",
    "tables",
    "columns",
    "views",
    "table_constraints",
    "key_column_usage",
    "referential_constraints",
    "constraint_column_usage",
    "routines",
    "parameters",
    "table_privileges",
    "character_sets",
];

#[derive(Debug)]
pub(super) struct InformationSchema {
    engine: Weak<dyn CatalogSource>,
    vars: SharedVars,
}

impl InformationSchema {
    pub(super) fn new(engine: Weak<dyn CatalogSource>, vars: SharedVars) -> InformationSchema {
        InformationSchema { engine, vars }
    }
}

#[async_trait]
impl SchemaProvider for InformationSchema {
    fn table_names(&self) -> Vec<String> {
        VIEWS.iter().map(|v| v.to_string()).collect()
    }

    async fn table(&self, name: &str) -> DFResult<Option<Arc<dyn TableProvider>>> {
        let name = name.to_ascii_lowercase();
        if !VIEWS.contains(&name.as_str()) {
            return Ok(None);
        }
        let engine = self
            .engine
            .upgrade()
            .ok_or_else(|| DataFusionError::Execution("server is shutting down".into()))?;
        let rels = relations(&*engine);
        let (db, user) = {
            let v = self.vars.read();
            (v.database.clone(), v.user.clone())
        };
        let t = match name.as_str() {
            "schemata" => schemata(&db, &user),
            "tables" => tables(&db, &rels),
            "columns" => columns(&db, &rels),
            "views" => views(&db, &rels),
            "table_privileges" => {
                let who = super::roles::Who::new(&*engine, &self.vars.read());
                super::roles::table_privileges(&who, &db, &rels)
            }
            "character_sets" => character_sets(&db),
            "table_constraints" => table_constraints(&db, &rels),
            "key_column_usage" | "constraint_column_usage" => {
                key_columns(name.as_str(), &db, &rels)
            }
            other => empty(other),
        };
        t.map(Some)
    }

    fn table_exist(&self, name: &str) -> bool {
        VIEWS.contains(&name.to_ascii_lowercase().as_str())
    }
}

fn schemata(db: &str, user: &str) -> DFResult<Arc<dyn TableProvider>> {
    let mut t = TableBuilder::new(text_fields(&[
        "catalog_name",
        "schema_name",
        "schema_owner",
        "default_character_set_catalog",
        "default_character_set_schema",
        "default_character_set_name",
        "sql_path",
    ]));
    for (_, name) in namespaces() {
        t.row(vec![
            s(db),
            s(name),
            s(user),
            null_s(),
            null_s(),
            null_s(),
            null_s(),
        ]);
    }
    t.build()
}

fn tables(db: &str, rels: &[Relation]) -> DFResult<Arc<dyn TableProvider>> {
    let mut t = TableBuilder::new(text_fields(&[
        "table_catalog",
        "table_schema",
        "table_name",
        "table_type",
        "self_referencing_column_name",
        "reference_generation",
        "user_defined_type_catalog",
        "user_defined_type_schema",
        "user_defined_type_name",
        "is_insertable_into",
        "is_typed",
        "commit_action",
    ]));
    for r in rels {
        let table = r.kind == "r";
        t.row(vec![
            s(db),
            s(r.schema),
            s(&r.name),
            s(if table { "BASE TABLE" } else { "VIEW" }),
            null_s(),
            null_s(),
            null_s(),
            null_s(),
            null_s(),
            s(if table { "YES" } else { "NO" }),
            s("NO"),
            null_s(),
        ]);
    }
    t.build()
}

/// information_schema's spelling of a type: its SQL name without typmod (`ARRAY` for
/// every array type; `udt_name` names which).
fn data_type(ty: &ColumnType) -> String {
    match ty {
        ColumnType::Array(_) => return "ARRAY".into(),
        ColumnType::Numeric(_) => ColumnType::Numeric(None),
        ColumnType::Varchar(_) => ColumnType::Varchar(None),
        t => *t,
    }
    .sql_name()
}

/// (numeric_precision, numeric_precision_radix, numeric_scale, datetime_precision)
fn precision(ty: &ColumnType) -> [Option<i32>; 4] {
    match ty {
        ColumnType::Int2 => [Some(16), Some(2), Some(0), None],
        ColumnType::Int4 => [Some(32), Some(2), Some(0), None],
        ColumnType::Int8 => [Some(64), Some(2), Some(0), None],
        ColumnType::Float4 => [Some(24), Some(2), None, None],
        ColumnType::Float8 => [Some(53), Some(2), None, None],
        ColumnType::Numeric(Some((p, sc))) => [Some(*p as i32), Some(10), Some(*sc as i32), None],
        ColumnType::Numeric(None) => [None, Some(10), None, None],
        ColumnType::Timestamptz | ColumnType::Timestamp => [None, None, None, Some(6)],
        ColumnType::Date => [None, None, None, Some(0)],
        _ => [None; 4],
    }
}

fn columns(db: &str, rels: &[Relation]) -> DFResult<Arc<dyn TableProvider>> {
    let names = ["table_catalog", "table_schema", "table_name", "column_name"];
    let mut fields = text_fields(&names);
    fields.push(int4("ordinal_position"));
    fields.push(text("column_default"));
    fields.push(text("is_nullable"));
    fields.push(text("data_type"));
    fields.extend(
        [
            "character_maximum_length",
            "character_octet_length",
            "numeric_precision",
            "numeric_precision_radix",
            "numeric_scale",
            "datetime_precision",
        ]
        .iter()
        .map(|n| int4(n)),
    );
    fields.extend(text_fields(&[
        "interval_type",
        "interval_precision",
        "character_set_catalog",
        "character_set_schema",
        "character_set_name",
        "collation_catalog",
        "collation_schema",
        "collation_name",
        "domain_catalog",
        "domain_schema",
        "domain_name",
        "udt_catalog",
        "udt_schema",
        "udt_name",
        "scope_catalog",
        "scope_schema",
        "scope_name",
        "maximum_cardinality",
        "dtd_identifier",
        "is_self_referencing",
        "is_identity",
        "identity_generation",
        "identity_start",
        "identity_increment",
        "identity_maximum",
        "identity_minimum",
        "identity_cycle",
        "is_generated",
        "generation_expression",
        "is_updatable",
    ]));
    let mut t = TableBuilder::new(fields);
    for r in rels {
        for (i, c) in r.columns.iter().enumerate() {
            let char_len = match c.ty {
                ColumnType::Varchar(Some(n)) => Some(n as i32),
                _ => None,
            };
            let octet_len = match c.ty {
                ColumnType::Varchar(Some(n)) => Some(n as i32 * 4),
                ColumnType::Varchar(None) | ColumnType::Text => Some(1073741824),
                _ => None,
            };
            let [np, npr, ns, dp] = precision(&c.ty);
            let mut row = vec![
                s(db),
                s(r.schema),
                s(&r.name),
                s(&c.name),
                i4(i as i32 + 1),
                c.default.as_deref().map_or_else(null_s, s),
                s(if c.not_null { "NO" } else { "YES" }),
                s(data_type(&c.ty)),
            ];
            row.extend(
                [char_len, octet_len, np, npr, ns, dp]
                    .into_iter()
                    .map(ScalarValue::Int32),
            );
            row.extend([null_s(), null_s(), null_s(), null_s(), null_s()]);
            row.extend([null_s(), null_s(), null_s()]); // collation
            row.extend([null_s(), null_s(), null_s()]); // domain
            row.extend([s(db), s("pg_catalog"), s(c.ty.typname())]);
            row.extend([null_s(), null_s(), null_s(), null_s()]);
            row.push(s((i + 1).to_string()));
            row.extend([s("NO"), s("NO")]);
            row.extend([null_s(), null_s(), null_s(), null_s(), null_s(), s("NO")]);
            row.extend([s("NEVER"), null_s()]);
            row.push(s(if r.kind == "r" { "YES" } else { "NO" }));
            t.row(row);
        }
    }
    t.build()
}

fn views(db: &str, rels: &[Relation]) -> DFResult<Arc<dyn TableProvider>> {
    let mut t = TableBuilder::new(text_fields(&[
        "table_catalog",
        "table_schema",
        "table_name",
        "view_definition",
        "check_option",
        "is_updatable",
        "is_insertable_into",
        "is_trigger_updatable",
        "is_trigger_deletable",
        "is_trigger_insertable_into",
    ]));
    for r in rels.iter().filter(|r| r.kind == "v") {
        t.row(vec![
            s(db),
            s(r.schema),
            s(&r.name),
            s(r.definition.as_deref().unwrap_or("(Sluice system view)")),
            s("NONE"),
            s("NO"),
            s("NO"),
            s("NO"),
            s("NO"),
            s("NO"),
        ]);
    }
    t.build()
}

fn character_sets(db: &str) -> DFResult<Arc<dyn TableProvider>> {
    let mut t = TableBuilder::new(text_fields(&[
        "character_set_catalog",
        "character_set_schema",
        "character_set_name",
        "character_repertoire",
        "form_of_use",
        "default_collate_catalog",
        "default_collate_schema",
        "default_collate_name",
    ]));
    t.row(vec![
        null_s(),
        null_s(),
        s("UTF8"),
        s("UCS"),
        s("UTF8"),
        s(db),
        s("pg_catalog"),
        s("C"),
    ]);
    t.build()
}

/// Primary keys and UNIQUE constraints of tables (streams have none).
fn table_constraints(db: &str, rels: &[Relation]) -> DFResult<Arc<dyn TableProvider>> {
    let mut t = empty_builder("table_constraints");
    for r in rels {
        for x in r.indexes().into_iter().filter(RelIndex::is_constraint) {
            t.row(vec![
                s(db),
                s(r.schema),
                s(&x.name),
                s(db),
                s(r.schema),
                s(&r.name),
                s(if x.primary { "PRIMARY KEY" } else { "UNIQUE" }),
                s("NO"),
                s("NO"),
                s("YES"),
                null_s(),
            ]);
        }
    }
    t.build()
}

/// Columns of primary keys and UNIQUE constraints, by `key_column_usage` or
/// `constraint_column_usage` (same facts, different column order).
fn key_columns(view: &str, db: &str, rels: &[Relation]) -> DFResult<Arc<dyn TableProvider>> {
    let mut t = empty_builder(view);
    let constraints = rels.iter().flat_map(|r| {
        r.indexes()
            .into_iter()
            .filter(RelIndex::is_constraint)
            .map(move |x| (r, x))
    });
    for (r, x) in constraints {
        for (pos, &k) in x.columns.iter().enumerate() {
            let col = &r.columns[k as usize - 1].name;
            t.row(if view == "key_column_usage" {
                vec![
                    s(db),
                    s(r.schema),
                    s(&x.name),
                    s(db),
                    s(r.schema),
                    s(&r.name),
                    s(col),
                    i4(pos as i32 + 1),
                    null_i4(),
                ]
            } else {
                vec![
                    s(db),
                    s(r.schema),
                    s(&r.name),
                    s(col),
                    s(db),
                    s(r.schema),
                    s(&x.name),
                ]
            });
        }
    }
    t.build()
}

/// Views that are empty: Sluice has no such objects.
fn empty(name: &str) -> DFResult<Arc<dyn TableProvider>> {
    empty_builder(name).build()
}

fn empty_builder(name: &str) -> TableBuilder {
    let cols: &[&str] = match name {
        "table_constraints" => &[
            "constraint_catalog",
            "constraint_schema",
            "constraint_name",
            "table_catalog",
            "table_schema",
            "table_name",
            "constraint_type",
            "is_deferrable",
            "initially_deferred",
            "enforced",
            "nulls_distinct",
        ],
        "key_column_usage" => &[
            "constraint_catalog",
            "constraint_schema",
            "constraint_name",
            "table_catalog",
            "table_schema",
            "table_name",
            "column_name",
            "ordinal_position",
            "position_in_unique_constraint",
        ],
        "referential_constraints" => &[
            "constraint_catalog",
            "constraint_schema",
            "constraint_name",
            "unique_constraint_catalog",
            "unique_constraint_schema",
            "unique_constraint_name",
            "match_option",
            "update_rule",
            "delete_rule",
        ],
        "constraint_column_usage" => &[
            "table_catalog",
            "table_schema",
            "table_name",
            "column_name",
            "constraint_catalog",
            "constraint_schema",
            "constraint_name",
        ],
        "routines" => &[
            "specific_catalog",
            "specific_schema",
            "specific_name",
            "routine_catalog",
            "routine_schema",
            "routine_name",
            "routine_type",
            "data_type",
            "type_udt_name",
            "external_language",
        ],
        "parameters" => &[
            "specific_catalog",
            "specific_schema",
            "specific_name",
            "ordinal_position",
            "parameter_mode",
            "parameter_name",
            "data_type",
            "udt_name",
        ],
        _ => &[],
    };
    let fields = cols
        .iter()
        .map(|c| {
            if matches!(*c, "ordinal_position" | "position_in_unique_constraint") {
                int4(c)
            } else {
                text(c)
            }
        })
        .collect();
    TableBuilder::new(fields)
}
