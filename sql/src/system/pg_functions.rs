//! Catalog and session functions clients call: the crate's set
//! (format_type, pg_get_expr, has_*_privilege, quote_ident, ...) plus the
//! ones that need Sluice's session or catalog (current_database,
//! current_setting/set_config, to_regtype/to_regclass, pg_get_userbyid,
//! *_description). Its analyzer rules include [`crate::arithmetic`]'s.

use std::collections::HashMap;

use arrow::array::{Array, AsArray, Int32Array, StringArray};
use datafusion::error::DataFusionError;
use datafusion::logical_expr::{
    ColumnarValue, ScalarFunctionImplementation, ScalarUDF, Signature, SimpleScalarUDF,
    TypeSignature, Volatility,
};
use datafusion_pg_catalog::pg_catalog as crate_fns;
use datafusion_pg_catalog::pg_catalog::PgCatalogStaticTables;

use super::*;

pub(super) fn register(
    ctx: &SessionContext,
    static_tables: &PgCatalogStaticTables,
    type_oids: &Arc<HashMap<String, i32>>,
    engine: Weak<dyn CatalogSource>,
    vars: SharedVars,
) {
    use crate_fns::{array_bounds_udf, format_type, has_privilege_udf, quote_ident_udf};
    for udf in [
        crate_fns::create_current_schema_udf(),
        crate_fns::create_current_schemas_udf(),
        crate_fns::create_pg_table_is_visible(),
        super::format_type::udf(format_type::create_format_type_udf()),
        pg_get_expr(),
        crate_fns::create_pg_get_partkeydef_udf(),
        crate_fns::create_pg_relation_is_publishable_udf(),
        crate_fns::create_pg_get_statisticsobjdef_columns_udf(),
        crate_fns::create_pg_stat_get_numscans(),
        crate_fns::create_pg_get_partition_ancestors_udf(),
        quote_ident_udf::create_quote_ident_udf(),
        quote_ident_udf::create_parse_ident_udf(),
        array_bounds_udf::create_array_upper_udf(),
        array_bounds_udf::create_array_lower_udf(),
    ] {
        ctx.register_udf(udf);
    }
    // has_table_privilege, has_any_column_privilege and has_schema_privilege answer from
    // the roles (system::roles)
    for name in [
        "has_database_privilege",
        "has_column_privilege",
        "has_function_privilege",
        "has_sequence_privilege",
    ] {
        ctx.register_udf(has_privilege_udf::create_has_privilege_udf(name));
    }
    ctx.register_udtf("pg_get_keywords", static_tables.pg_get_keywords.clone());
    {
        // oid-alias type names (regclass, ...) and untyped 't'/'f' compared
        // with booleans, in one rebuild of the session state
        use datafusion::execution::session_state::SessionStateBuilder;
        let mut rules: Vec<Arc<dyn datafusion::optimizer::AnalyzerRule + Send + Sync>> = vec![
            Arc::new(super::rewrite::BoolLiterals),
            Arc::new(super::text_arrays::TextArrays),
        ];
        rules.extend(datafusion::optimizer::Analyzer::new().rules);
        rules.push(Arc::new(crate::arithmetic::CheckedArithmetic));
        let state = ctx.state_ref();
        let existing = state.read().clone();
        let new_state = SessionStateBuilder::new_from_existing(existing)
            .with_type_planner(Arc::new(crate_fns::oid_type_planner::PgOidTypePlanner))
            .with_analyzer_rules(rules)
            .build();
        *state.write() = new_state;
    }
    crate_fns::generate_series_arg_coercion::CoerceIntArgsToBigInt::widen(ctx);
    ctx.register_udaf(crate::arithmetic::checked_sum());

    for udf in catalog_functions(type_oids) {
        ctx.register_udf(udf);
    }
    for udf in session_functions(vars, engine, type_oids.clone()) {
        ctx.register_udf(udf);
    }
}

pub(super) fn udf(
    name: &str,
    signature: TypeSignature,
    ret: DataType,
    volatility: Volatility,
    f: impl Fn(&[ArrayRef], usize) -> DFResult<ArrayRef> + Send + Sync + 'static,
) -> ScalarUDF {
    let fun: ScalarFunctionImplementation = Arc::new(move |args: &[ColumnarValue]| {
        let rows = args
            .iter()
            .find_map(|a| match a {
                ColumnarValue::Array(a) => Some(a.len()),
                ColumnarValue::Scalar(_) => None,
            })
            .unwrap_or(1);
        let arrays = args
            .iter()
            .map(|a| a.to_array(rows))
            .collect::<DFResult<Vec<_>>>()?;
        let out = f(&arrays, rows)?;
        Ok(
            if rows == 1 && args.iter().all(|a| matches!(a, ColumnarValue::Scalar(_))) {
                ColumnarValue::Scalar(ScalarValue::try_from_array(&out, 0)?)
            } else {
                ColumnarValue::Array(out)
            },
        )
    });
    ScalarUDF::from(SimpleScalarUDF::new_with_signature(
        name,
        Signature::new(signature, volatility),
        ret,
        fun,
    ))
}

/// `pg_get_expr(expr, relation [, pretty])`: the expression's text. The catalogs keep text
/// where PostgreSQL keeps a node tree (`pg_attrdef.adbin`), so it is given back as it is.
fn pg_get_expr() -> ScalarUDF {
    let signature = TypeSignature::OneOf(vec![TypeSignature::Any(2), TypeSignature::Any(3)]);
    udf(
        "pg_get_expr",
        signature,
        DataType::Utf8,
        Volatility::Stable,
        |args, _| Ok(arrow::compute::cast(&args[0], &DataType::Utf8)?),
    )
}

/// A function whose answer is NULL for everything Sluice has.
fn always_null(name: &str, signature: TypeSignature) -> ScalarUDF {
    udf(
        name,
        signature,
        DataType::Utf8,
        Volatility::Stable,
        |_, rows| Ok(arrow::array::new_null_array(&DataType::Utf8, rows)),
    )
}

/// A `pg_*_is_visible(oid)` that is true for every object.
fn visible(name: &str) -> ScalarUDF {
    udf(
        name,
        TypeSignature::Any(1),
        DataType::Boolean,
        Volatility::Stable,
        |args, rows| {
            Ok(Arc::new(arrow::array::BooleanArray::from_iter(
                (0..rows).map(|r| args[0].is_valid(r).then_some(true)),
            )))
        },
    )
}

/// Text values of argument `i` (after casting to text).
pub(super) fn texts(args: &[ArrayRef], i: usize) -> DFResult<Vec<Option<String>>> {
    let a = arrow::compute::cast(&args[i], &DataType::Utf8)?;
    let a = a.as_string::<i32>();
    Ok((0..a.len())
        .map(|r| a.is_valid(r).then(|| a.value(r).to_string()))
        .collect())
}

/// Functions that read the session's settings and identity or the
/// engine's catalog.
fn session_functions(
    vars: SharedVars,
    engine: Weak<dyn CatalogSource>,
    type_oids: Arc<HashMap<String, i32>>,
) -> Vec<ScalarUDF> {
    let mut out = identity_functions(&vars);
    out.extend(setting_functions(&vars));
    out.extend(relation_functions(&engine, type_oids));
    out.extend(super::roles::functions(&vars, &engine));
    out.extend(text_functions());
    out
}

/// `current_database`, `current_user` and its synonyms.
fn identity_functions(vars: &SharedVars) -> Vec<ScalarUDF> {
    let mut out = Vec::new();
    let v = vars.clone();
    out.push(udf(
        "current_database",
        TypeSignature::Nullary,
        DataType::Utf8,
        Volatility::Stable,
        move |_, rows| {
            let db = v.read().database.clone();
            Ok(Arc::new(StringArray::from(vec![db; rows])))
        },
    ));
    for name in ["session_user", "current_user", "user"] {
        let v = vars.clone();
        out.push(udf(
            name,
            TypeSignature::Nullary,
            DataType::Utf8,
            Volatility::Stable,
            move |_, rows| {
                let u = v.read().user.clone();
                Ok(Arc::new(StringArray::from(vec![u; rows])))
            },
        ));
    }
    out
}

/// `current_setting` and `set_config`.
fn setting_functions(vars: &SharedVars) -> Vec<ScalarUDF> {
    let mut out = Vec::new();
    let v = vars.clone();
    out.push(udf(
        "current_setting",
        TypeSignature::OneOf(vec![
            TypeSignature::Exact(vec![DataType::Utf8]),
            TypeSignature::Exact(vec![DataType::Utf8, DataType::Boolean]),
        ]),
        DataType::Utf8,
        Volatility::Stable,
        move |args, _| {
            let names = texts(args, 0)?;
            let missing_ok = args.len() > 1 && {
                let flags = args[1].as_boolean();
                !flags.is_empty() && flags.is_valid(0) && flags.value(0)
            };
            let vars = v.read();
            let mut values = Vec::with_capacity(names.len());
            for n in names {
                let Some(n) = n else {
                    values.push(None);
                    continue;
                };
                match vars.settings.get(&crate::settings::canonical_setting(&n)) {
                    Some(value) => values.push(Some(value.clone())),
                    None if missing_ok => values.push(None),
                    None => {
                        return Err(DataFusionError::External(Box::new(crate::Error::new(
                            crate::error::sqlstate::UNDEFINED_OBJECT,
                            format!("unrecognized configuration parameter \"{n}\""),
                        ))))
                    }
                }
            }
            Ok(Arc::new(StringArray::from(values)))
        },
    ));
    let v = vars.clone();
    out.push(udf(
        "set_config",
        TypeSignature::Exact(vec![DataType::Utf8, DataType::Utf8, DataType::Boolean]),
        DataType::Utf8,
        Volatility::Volatile,
        move |args, _| {
            let names = texts(args, 0)?;
            let values = texts(args, 1)?;
            let mut vars = v.write();
            for (n, val) in names.iter().zip(&values) {
                if let (Some(n), Some(val)) = (n, val) {
                    let name = crate::settings::canonical_setting(n);
                    crate::settings::validate_setting(&name, val)
                        .and_then(|()| crate::settings::check_may_set(&name, &vars))
                        .map_err(|e| DataFusionError::External(Box::new(e)))?;
                    vars.settings.insert(name, val.clone());
                }
            }
            Ok(Arc::new(StringArray::from(values)))
        },
    ));
    out
}

/// Lookups of relations and types: `to_regtype`, `to_regclass`,
/// `pg_get_indexdef`, `pg_get_constraintdef`, the `pg_*_size` family.
/// `sluice_column_default(relation, attnum)`: a column's default as pg_attrdef holds it
/// (psql's `\d`, through client_sql's FRAGMENTS).
fn column_default(e: Weak<dyn CatalogSource>) -> ScalarUDF {
    udf(
        "sluice_column_default",
        TypeSignature::Any(2),
        DataType::Utf8,
        Volatility::Stable,
        move |args, _| {
            let rels = e.upgrade().map(|e| relations(&*e)).unwrap_or_default();
            let (oids, attnums) = (texts(args, 0)?, texts(args, 1)?);
            Ok(Arc::new(StringArray::from_iter(
                oids.iter().zip(&attnums).map(|(oid, attnum)| {
                    let oid: i32 = oid.as_deref()?.parse().ok()?;
                    let attnum: usize = attnum.as_deref()?.parse().ok()?;
                    let r = rels.iter().find(|r| r.oid == oid)?;
                    r.columns.get(attnum.checked_sub(1)?)?.default.clone()
                }),
            )))
        },
    )
}

fn relation_functions(
    engine: &Weak<dyn CatalogSource>,
    type_oids: Arc<HashMap<String, i32>>,
) -> Vec<ScalarUDF> {
    let mut out = Vec::new();
    out.push(udf(
        "to_regtype",
        TypeSignature::Exact(vec![DataType::Utf8]),
        DataType::Int32,
        Volatility::Stable,
        move |args, _| {
            let names = texts(args, 0)?;
            Ok(Arc::new(Int32Array::from_iter(names.iter().map(|n| {
                n.as_deref().and_then(|n| regtype(&type_oids, n))
            }))))
        },
    ));
    let e = engine.clone();
    out.push(udf(
        "to_regclass",
        TypeSignature::Exact(vec![DataType::Utf8]),
        DataType::Int32,
        Volatility::Stable,
        move |args, _| {
            let names = texts(args, 0)?;
            let rels = e.upgrade().map(|e| relations(&*e)).unwrap_or_default();
            Ok(Arc::new(Int32Array::from_iter(names.iter().map(|n| {
                let n = n.as_deref()?;
                let (schema, name) = split_qualified(n);
                rels.iter()
                    .find(|r| r.name == name && schema.is_none_or(|s| s == r.schema))
                    .map(|r| r.oid)
            }))))
        },
    ));
    let e = engine.clone();
    out.push(udf(
        "pg_get_viewdef",
        TypeSignature::OneOf(vec![TypeSignature::Any(1), TypeSignature::Any(2)]),
        DataType::Utf8,
        Volatility::Stable,
        move |args, _| {
            let rels = e.upgrade().map(|e| relations(&*e)).unwrap_or_default();
            let by_name = matches!(args[0].data_type(), DataType::Utf8 | DataType::LargeUtf8);
            let keys = texts(args, 0)?;
            Ok(Arc::new(StringArray::from_iter(keys.iter().map(|k| {
                let k = k.as_deref()?;
                let r = if by_name {
                    let (schema, name) = split_qualified(k);
                    rels.iter()
                        .find(|r| r.name == name && schema.is_none_or(|s| s == r.schema))
                } else {
                    let oid: i32 = k.parse().ok()?;
                    rels.iter().find(|r| r.oid == oid)
                };
                r?.definition.clone()
            }))))
        },
    ));
    out.push(column_default(engine.clone()));
    // Constraints: primary keys and UNIQUE; indexes: theirs and CREATE INDEX's.
    for (name, index) in [("pg_get_indexdef", true), ("pg_get_constraintdef", false)] {
        let e = engine.clone();
        out.push(udf(
            name,
            TypeSignature::OneOf(vec![
                TypeSignature::Any(1),
                TypeSignature::Any(2),
                TypeSignature::Any(3),
            ]),
            DataType::Utf8,
            Volatility::Stable,
            move |args, _| {
                let oids = arrow::compute::cast(&args[0], &DataType::Int64)?;
                let oids = oids.as_primitive::<arrow::datatypes::Int64Type>();
                let defs = e
                    .upgrade()
                    .map(|e| key_definitions(&*e, index))
                    .unwrap_or_default();
                Ok(Arc::new(StringArray::from_iter(
                    oids.iter().map(|o| o.and_then(|o| defs.get(&o).cloned())),
                )))
            },
        ));
    }
    for name in [
        "pg_relation_size",
        "pg_total_relation_size",
        "pg_table_size",
    ] {
        let e = engine.clone();
        out.push(udf(
            name,
            TypeSignature::OneOf(vec![TypeSignature::Any(1), TypeSignature::Any(2)]),
            DataType::Int64,
            Volatility::Volatile,
            move |args, _| {
                let oids = arrow::compute::cast(&args[0], &DataType::Int64)?;
                let oids = oids.as_primitive::<arrow::datatypes::Int64Type>();
                let sizes: HashMap<i64, i64> = e
                    .upgrade()
                    .map(|e| {
                        e.catalog()
                            .list()
                            .iter()
                            .map(|s| (s.def.oid as i64, s.log.size_bytes() as i64))
                            .collect()
                    })
                    .unwrap_or_default();
                Ok(Arc::new(arrow::array::Int64Array::from_iter(
                    oids.iter()
                        .map(|o| o.map(|o| sizes.get(&o).copied().unwrap_or(0))),
                )))
            },
        ));
    }
    out
}

/// Definitions by OID: of every index (`CREATE [UNIQUE] INDEX ...`), or of every
/// constraint (`PRIMARY KEY (...)`, `UNIQUE (...)`).
fn key_definitions(e: &dyn CatalogSource, index: bool) -> HashMap<i64, String> {
    let mut out = HashMap::new();
    for r in super::relations(e) {
        if index {
            for x in r.indexes() {
                out.insert(x.oid as i64, r.index_definition(&x));
            }
        } else {
            for x in r.indexes().into_iter().filter(RelIndex::is_constraint) {
                out.insert(x.constraint_oid() as i64, r.constraint_definition(&x));
            }
        }
    }
    out
}

/// Functions of text and values: descriptions (always NULL),
/// `pg_encoding_to_char`, `format`, `pg_expandarray_struct`,
/// `pg_is_in_recovery`.
fn text_functions() -> Vec<ScalarUDF> {
    let mut out = Vec::new();
    // Sluice keeps no comments: every description is NULL.
    for name in ["obj_description", "col_description", "shobj_description"] {
        out.push(always_null(
            name,
            TypeSignature::OneOf(vec![TypeSignature::Any(1), TypeSignature::Any(2)]),
        ));
    }
    // PostgreSQL's version 4 UUID, as text (a uuid column takes it as it is)
    out.push(udf(
        "gen_random_uuid",
        TypeSignature::Nullary,
        DataType::Utf8,
        Volatility::Volatile,
        |_, rows| {
            use rand::RngCore;
            let mut rng = rand::thread_rng();
            Ok(Arc::new(StringArray::from_iter_values((0..rows).map(
                |_| {
                    let mut b = [0u8; 16];
                    rng.fill_bytes(&mut b);
                    b[6] = (b[6] & 0x0f) | 0x40;
                    b[8] = (b[8] & 0x3f) | 0x80;
                    uuid::Uuid::from_bytes(b).hyphenated().to_string()
                },
            ))))
        },
    ));
    out.push(udf(
        "pg_encoding_to_char",
        TypeSignature::Exact(vec![DataType::Int32]),
        DataType::Utf8,
        Volatility::Immutable,
        |args, _| {
            let ids = args[0].as_primitive::<arrow::datatypes::Int32Type>();
            Ok(Arc::new(StringArray::from_iter(ids.iter().map(|id| {
                id.map(|id| match id {
                    0 => "SQL_ASCII",
                    6 => "UTF8",
                    _ => "",
                })
            }))))
        },
    ));
    out.push(udf(
        "format",
        TypeSignature::VariadicAny,
        DataType::Utf8,
        Volatility::Stable,
        |args, rows| {
            let cols = (0..args.len())
                .map(|i| texts(args, i))
                .collect::<DFResult<Vec<_>>>()?;
            let mut out = Vec::with_capacity(rows);
            for r in 0..rows {
                let Some(fmt) = &cols[0][r] else {
                    out.push(None);
                    continue;
                };
                let values: Vec<Option<&str>> = cols[1..].iter().map(|c| c[r].as_deref()).collect();
                out.push(Some(format_pg(fmt, &values)?));
            }
            Ok(Arc::new(StringArray::from(out)))
        },
    ));
    out.push(udf(
        "pg_expandarray_struct",
        TypeSignature::Exact(vec![int2_array("").data_type().clone()]),
        expandarray_type(),
        Volatility::Immutable,
        |args, _| expand_array(&args[0]),
    ));
    out.push(udf(
        "pg_is_in_recovery",
        TypeSignature::Nullary,
        DataType::Boolean,
        Volatility::Stable,
        |_, rows| {
            Ok(Arc::new(arrow::array::BooleanArray::from(vec![
                false;
                rows
            ])))
        },
    ));
    out
}

/// Functions over catalog data that need no session.
fn catalog_functions(type_oids: &Arc<HashMap<String, i32>>) -> Vec<ScalarUDF> {
    let names: Arc<HashMap<i32, String>> =
        Arc::new(type_oids.iter().map(|(n, o)| (*o, n.clone())).collect());
    let text_list = text_array("").data_type().clone();
    vec![
        // Sluice takes no advisory locks, so there are none to release.
        always_null("pg_advisory_unlock_all", TypeSignature::Nullary),
        // Sluice has only the default collation, and every type is in
        // pg_catalog, which is always on the path.
        visible("pg_collation_is_visible"),
        visible("pg_type_is_visible"),
        udf(
            "json_build_object",
            TypeSignature::VariadicAny,
            DataType::Utf8,
            Volatility::Stable,
            json_build_object,
        ),
        // No column is backed by a sequence.
        always_null("pg_get_serial_sequence", TypeSignature::Any(2)),
        // views are expanded by Sluice, not by rules: there are none to show
        always_null(
            "pg_get_ruledef",
            TypeSignature::OneOf(vec![TypeSignature::Any(1), TypeSignature::Any(2)]),
        ),
        udf(
            "pg_like_escape",
            TypeSignature::Exact(vec![DataType::Utf8, DataType::Utf8]),
            DataType::Utf8,
            Volatility::Immutable,
            |args, _| {
                let patterns = texts(args, 0)?;
                let escapes = texts(args, 1)?;
                Ok(Arc::new(StringArray::from_iter(
                    patterns.iter().zip(&escapes).map(|(p, e)| {
                        let p = p.as_deref()?;
                        Some(match e.as_deref().and_then(|e| e.chars().next()) {
                            Some(esc) => super::rewrite::like_to_backslash(p, esc),
                            None => p.to_string(),
                        })
                    }),
                )))
            },
        ),
        udf(
            "pg_array_in",
            TypeSignature::Exact(vec![DataType::Utf8]),
            text_list.clone(),
            Volatility::Immutable,
            |args, _| {
                let mut b = arrow::array::ListBuilder::new(arrow::array::StringBuilder::new());
                for v in texts(args, 0)? {
                    match v {
                        None => b.append_null(),
                        Some(v) => {
                            for e in crate::types::arrays::parse_text_elements(&v)
                                .map_err(|e| DataFusionError::External(Box::new(e)))?
                            {
                                b.values().append_option(e);
                            }
                            b.append(true);
                        }
                    }
                }
                Ok(Arc::new(b.finish()))
            },
        ),
        udf(
            "pg_arg_type_names",
            TypeSignature::Any(1),
            text_list,
            Volatility::Stable,
            move |args, _| {
                let mut b = arrow::array::ListBuilder::new(arrow::array::StringBuilder::new());
                for v in texts(args, 0)? {
                    match v {
                        None => b.append_null(),
                        Some(v) => {
                            for oid in v
                                .split(|c: char| !c.is_ascii_digit())
                                .filter_map(|d| d.parse::<i32>().ok())
                            {
                                b.values().append_value(
                                    names.get(&oid).cloned().unwrap_or_else(|| oid.to_string()),
                                );
                            }
                            b.append(true);
                        }
                    }
                }
                Ok(Arc::new(b.finish()))
            },
        ),
    ]
}

/// `json_build_object(key, value, ...)`: one JSON object per row.
fn json_build_object(args: &[ArrayRef], rows: usize) -> DFResult<ArrayRef> {
    if !args.len().is_multiple_of(2) {
        return Err(DataFusionError::Execution(
            "argument list must have even number of elements".into(),
        ));
    }
    let mut out = Vec::with_capacity(rows);
    for r in 0..rows {
        let mut obj = serde_json::Map::new();
        for pair in args.chunks(2) {
            let key = ScalarValue::try_from_array(&pair[0], r)?;
            let value = ScalarValue::try_from_array(&pair[1], r)?;
            obj.insert(
                key.to_string(),
                if value.is_null() {
                    serde_json::Value::Null
                } else {
                    match value {
                        ScalarValue::Boolean(Some(b)) => serde_json::Value::Bool(b),
                        v if v.data_type().is_numeric() => serde_json::from_str(&v.to_string())
                            .unwrap_or(serde_json::Value::String(v.to_string())),
                        v => serde_json::Value::String(v.to_string()),
                    }
                },
            );
        }
        out.push(serde_json::Value::Object(obj).to_string());
    }
    Ok(Arc::new(StringArray::from(out)))
}

/// `List<Struct{x: int2, n: int4}>`: `_pg_expandarray`'s rows per array.
fn expandarray_type() -> DataType {
    DataType::List(Arc::new(Field::new(
        "item",
        DataType::Struct(expandarray_fields()),
        true,
    )))
}

fn expandarray_fields() -> arrow::datatypes::Fields {
    arrow::datatypes::Fields::from(vec![
        Field::new("x", DataType::Int16, true),
        Field::new("n", DataType::Int32, false),
    ])
}

/// Each array's elements paired with their 1-based subscripts.
fn expand_array(arrays: &ArrayRef) -> DFResult<ArrayRef> {
    let list = arrays.as_list::<i32>();
    let offsets = list.offsets();
    let mut n = Vec::with_capacity(list.values().len());
    for w in offsets.windows(2) {
        n.extend(1..=(w[1] - w[0]));
    }
    let values = list.values().slice(
        offsets[0] as usize,
        (offsets[offsets.len() - 1] - offsets[0]) as usize,
    );
    let structs = arrow::array::StructArray::try_new(
        expandarray_fields(),
        vec![values, Arc::new(Int32Array::from(n))],
        None,
    )?;
    let rebased = arrow::buffer::OffsetBuffer::new(
        offsets
            .iter()
            .map(|o| o - offsets[0])
            .collect::<Vec<_>>()
            .into(),
    );
    Ok(Arc::new(arrow::array::ListArray::try_new(
        Arc::new(Field::new(
            "item",
            DataType::Struct(expandarray_fields()),
            true,
        )),
        rebased,
        Arc::new(structs),
        list.nulls().cloned(),
    )?))
}

/// PostgreSQL's `format()`: `%s`, `%I` (identifier), `%L` (literal), `%%`.
fn format_pg(fmt: &str, values: &[Option<&str>]) -> DFResult<String> {
    let mut out = String::with_capacity(fmt.len());
    let mut next = values.iter();
    let mut chars = fmt.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let spec = chars.next();
        if spec == Some('%') {
            out.push('%');
            continue;
        }
        let value = next
            .next()
            .ok_or_else(|| DataFusionError::Execution("too few arguments for format()".into()))?;
        match (spec, value) {
            (Some('s'), v) => out.push_str(v.unwrap_or("")),
            (Some('I'), Some(v)) => out.push_str(&quote_ident(v)),
            (Some('I'), None) => {
                return Err(DataFusionError::Execution(
                    "null values cannot be formatted as an SQL identifier".into(),
                ))
            }
            (Some('L'), Some(v)) => out.push_str(&format!("'{}'", v.replace('\'', "''"))),
            (Some('L'), None) => out.push_str("NULL"),
            (other, _) => {
                return Err(DataFusionError::Execution(format!(
                    "unrecognized format() type specifier \"{}\"",
                    other.map(String::from).unwrap_or_default()
                )))
            }
        }
    }
    Ok(out)
}

/// An identifier as `quote_ident` writes it.
pub(super) fn quote_ident(v: &str) -> String {
    let plain = v
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c == '_')
        && v.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '$');
    if plain {
        v.to_string()
    } else {
        format!("\"{}\"", v.replace('"', "\"\""))
    }
}

/// `to_regtype`: a type name as SQL writes it, or a pg_type name.
fn regtype(type_oids: &HashMap<String, i32>, name: &str) -> Option<i32> {
    let name = name.trim();
    if let Some(elem) = name.strip_suffix("[]") {
        let elem_name = ColumnType::parse(elem)
            .ok()
            .map(|t| t.typname().to_string())
            .unwrap_or_else(|| elem.trim().to_string());
        return type_oids.get(&format!("_{elem_name}")).copied();
    }
    if let Ok(t) = ColumnType::parse(name) {
        return Some(t.oid() as i32);
    }
    let bare = name.trim_start_matches("pg_catalog.").trim_matches('"');
    type_oids.get(bare).copied()
}

/// `schema.name` or `name`, with double quotes removed.
fn split_qualified(n: &str) -> (Option<&str>, &str) {
    fn unq(s: &str) -> &str {
        s.trim().trim_matches('"')
    }
    match n.split_once('.') {
        Some((s, r)) => (Some(unq(s)), unq(r)),
        None => (None, unq(n)),
    }
}

/// typname → oid from the static pg_type table.
pub(super) fn type_oids(static_tables: &PgCatalogStaticTables) -> HashMap<String, i32> {
    let mut out = HashMap::new();
    for batch in static_tables.pg_type.data() {
        let (Some(names), Some(oids)) =
            (batch.column_by_name("typname"), batch.column_by_name("oid"))
        else {
            continue;
        };
        let (Ok(names), Ok(oids)) = (
            arrow::compute::cast(names, &DataType::Utf8),
            arrow::compute::cast(oids, &DataType::Int32),
        ) else {
            continue;
        };
        let names = names.as_string::<i32>();
        let oids = oids.as_primitive::<arrow::datatypes::Int32Type>();
        for i in 0..batch.num_rows() {
            if names.is_valid(i) && oids.is_valid(i) {
                out.insert(names.value(i).to_string(), oids.value(i));
            }
        }
    }
    out
}
