//! The `pg_catalog` schema: the relations that describe Sluice's objects
//! are built here from the live catalog on every query; everything else
//! (pg_type, pg_proc, pg_am, pg_range, empty pg_index/pg_constraint/...)
//! is `datafusion-pg-catalog`'s static PostgreSQL data.

use async_trait::async_trait;
use datafusion::catalog::SchemaProvider;
use datafusion::datasource::TableProvider;
use datafusion::error::{DataFusionError, Result as DFResult};
use datafusion_pg_catalog::pg_catalog::catalog_info::CatalogInfo;
use datafusion_pg_catalog::pg_catalog::context::{PgCatalogContextProvider, Role};
use datafusion_pg_catalog::pg_catalog::oid_field::kind;
use datafusion_pg_catalog::pg_catalog::{
    PgCatalogSchemaProvider, PgCatalogStaticTables, PG_CATALOG_TABLES,
};

use super::*;
use crate::settings::SslInfo;

/// Relations built here rather than taken from the crate.
const OWN: &[&str] = &[
    "pg_namespace",
    "pg_class",
    "pg_attribute",
    "pg_attrdef",
    "pg_database",
    "pg_tables",
    "pg_views",
    "pg_stat_user_tables",
    "pg_settings",
    "pg_user",
    "pg_roles",
    "pg_authid",
    "pg_auth_members",
    "pg_index",
    "pg_indexes",
    "pg_constraint",
    "pg_stat_ssl",
];

#[derive(Debug)]
pub(super) struct PgCatalog {
    engine: Weak<dyn CatalogSource>,
    vars: SharedVars,
    inner: PgCatalogSchemaProvider<NoCatalogs, NoRoles>,
}

impl PgCatalog {
    pub(super) fn new(
        engine: Weak<dyn CatalogSource>,
        static_tables: Arc<PgCatalogStaticTables>,
        vars: SharedVars,
    ) -> PgCatalog {
        let inner = PgCatalogSchemaProvider::try_new(NoCatalogs, static_tables, NoRoles)
            .unwrap_or_else(|_| unreachable!("PgCatalogSchemaProvider::try_new does not fail"));
        PgCatalog {
            engine,
            vars,
            inner,
        }
    }

    fn own_table(&self, name: &str) -> DFResult<Option<Arc<dyn TableProvider>>> {
        let engine = self
            .engine
            .upgrade()
            .ok_or_else(|| DataFusionError::Execution("server is shutting down".into()))?;
        let rels = relations(&*engine);
        let vars = self.vars.read();
        let who = super::roles::Who::new(&*engine, &vars);
        let t = match name {
            "pg_namespace" => pg_namespace(),
            "pg_class" => pg_class(&rels, &who),
            "pg_attribute" => pg_attribute(&rels),
            "pg_attrdef" => pg_attrdef(&rels),
            "pg_database" => pg_database(&vars.database),
            "pg_tables" => pg_tables(&rels, &who),
            "pg_views" => pg_views(&rels, &who),
            "pg_stat_user_tables" => pg_stat_user_tables(&rels),
            "pg_settings" => pg_settings(&vars.settings),
            "pg_user" => super::roles::pg_user(&who),
            "pg_roles" => super::roles::pg_roles(&who),
            "pg_authid" => super::roles::pg_authid(&who),
            "pg_auth_members" => super::roles::pg_auth_members(&who),
            "pg_index" => pg_index(&rels),
            "pg_indexes" => pg_indexes(&rels),
            "pg_constraint" => pg_constraint(&rels),
            "pg_stat_ssl" => pg_stat_ssl(vars.pid, vars.ssl.as_ref()),
            _ => return Ok(None),
        };
        t.map(Some)
    }
}

#[async_trait]
impl SchemaProvider for PgCatalog {
    fn table_names(&self) -> Vec<String> {
        let mut names: Vec<String> = PG_CATALOG_TABLES.iter().map(|s| s.to_string()).collect();
        for own in OWN {
            if !names.iter().any(|n| n == own) {
                names.push(own.to_string());
            }
        }
        names
    }

    async fn table(&self, name: &str) -> DFResult<Option<Arc<dyn TableProvider>>> {
        let name = name.to_ascii_lowercase();
        if OWN.contains(&name.as_str()) {
            return self.own_table(&name);
        }
        self.inner.table(&name).await
    }

    fn table_exist(&self, name: &str) -> bool {
        let name = name.to_ascii_lowercase();
        OWN.contains(&name.as_str()) || self.inner.table_exist(&name)
    }
}

fn pg_namespace() -> DFResult<Arc<dyn TableProvider>> {
    let mut t = TableBuilder::new(vec![
        oid("oid", kind::OID),
        text("nspname"),
        oid("nspowner", kind::OID),
        text_array("nspacl"),
    ]);
    for (oid, name) in namespaces() {
        t.row(vec![i4(oid), s(name), i4(OWNER_OID), null_array()]);
    }
    t.build()
}

fn pg_class(rels: &[Relation], who: &super::roles::Who) -> DFResult<Arc<dyn TableProvider>> {
    let mut t = TableBuilder::new(vec![
        oid("oid", kind::OID),
        text("relname"),
        oid("relnamespace", kind::REGNAMESPACE),
        oid("reltype", kind::REGTYPE),
        oid("reloftype", kind::REGTYPE),
        oid("relowner", kind::OID),
        oid("relam", kind::OID),
        oid("relfilenode", kind::OID),
        oid("reltablespace", kind::OID),
        int4("relpages"),
        float("reltuples"),
        int4("relallvisible"),
        oid("reltoastrelid", kind::REGCLASS),
        boolean("relhasindex"),
        boolean("relisshared"),
        text("relpersistence"),
        text("relkind"),
        int2("relnatts"),
        int2("relchecks"),
        boolean("relhasrules"),
        boolean("relhastriggers"),
        boolean("relhassubclass"),
        boolean("relrowsecurity"),
        boolean("relforcerowsecurity"),
        boolean("relispopulated"),
        text("relreplident"),
        boolean("relispartition"),
        oid("relrewrite", kind::REGCLASS),
        int4("relfrozenxid"),
        int4("relminmxid"),
        text_array("relacl"),
        text_array("reloptions"),
        text("relpartbound"),
    ]);
    for r in rels {
        let table = r.kind == "r";
        t.row(vec![
            i4(r.oid),
            s(&r.name),
            i4(r.namespace),
            i4(0),
            i4(0),
            i4(if table {
                who.owner_oid(&r.name)
            } else {
                OWNER_OID
            }),
            i4(if table { 2 } else { 0 }),
            i4(if table { r.oid } else { 0 }),
            i4(0),
            i4(0),
            ScalarValue::Float32(Some(if table { r.rows as f32 } else { -1.0 })),
            i4(0),
            i4(0),
            b(!r.indexes().is_empty()),
            b(false),
            s("p"),
            s(r.kind),
            i2(r.columns.len() as i16),
            i2(0),
            b(!table),
            b(false),
            b(false),
            b(false),
            b(false),
            b(true),
            s(if table { "d" } else { "n" }),
            b(false),
            i4(0),
            i4(0),
            i4(0),
            if table {
                who.acl(&r.name)
            } else {
                null_array()
            },
            null_array(),
            null_s(),
        ]);
        for x in r.indexes() {
            t.row(index_row(r, &x, who.owner_oid(&r.name)));
        }
    }
    t.build()
}

/// The pg_class row of a relation's index (a btree, as PostgreSQL's would be), owned by the
/// relation's owner.
fn index_row(r: &Relation, x: &RelIndex, owner: i32) -> Vec<ScalarValue> {
    vec![
        i4(x.oid),
        s(&x.name),
        i4(r.namespace),
        i4(0),
        i4(0),
        i4(owner),
        i4(BTREE_AM_OID),
        i4(x.oid),
        i4(0),
        i4(0),
        ScalarValue::Float32(Some(0.0)),
        i4(0),
        i4(0),
        b(false),
        b(false),
        s("p"),
        s("i"),
        i2(x.columns.len() as i16),
        i2(0),
        b(false),
        b(false),
        b(false),
        b(false),
        b(false),
        b(true),
        s("n"),
        b(false),
        i4(0),
        i4(0),
        i4(0),
        null_array(),
        null_array(),
        null_s(),
    ]
}

/// pg_am's btree.
const BTREE_AM_OID: i32 = 403;

fn pg_attribute(rels: &[Relation]) -> DFResult<Arc<dyn TableProvider>> {
    let mut t = TableBuilder::new(vec![
        oid("attrelid", kind::REGCLASS),
        text("attname"),
        oid("atttypid", kind::REGTYPE),
        int2("attstattarget"),
        int2("attlen"),
        int2("attnum"),
        int4("attndims"),
        int4("attcacheoff"),
        int4("atttypmod"),
        boolean("attbyval"),
        text("attalign"),
        text("attstorage"),
        text("attcompression"),
        boolean("attnotnull"),
        boolean("atthasdef"),
        boolean("atthasmissing"),
        text("attidentity"),
        text("attgenerated"),
        boolean("attisdropped"),
        boolean("attislocal"),
        int4("attinhcount"),
        oid("attcollation", kind::OID),
        text_array("attacl"),
        text_array("attoptions"),
        text_array("attfdwoptions"),
        text("attmissingval"),
    ]);
    for r in rels {
        for (i, c) in r.columns.iter().enumerate() {
            let (len, byval, align, storage) = type_layout(&c.ty);
            t.row(vec![
                i4(r.oid),
                s(&c.name),
                i4(c.ty.oid() as i32),
                i2(-1),
                i2(len),
                i2(i as i16 + 1),
                i4(i32::from(c.ty.element().is_some())),
                i4(-1),
                i4(c.ty.typmod()),
                b(byval),
                s(align),
                s(storage),
                s(""),
                b(c.not_null),
                b(c.default.is_some()),
                b(false),
                s(""),
                s(""),
                b(false),
                b(true),
                i4(0),
                i4(type_collation(&c.ty)),
                null_array(),
                null_array(),
                null_array(),
                null_s(),
            ]);
        }
    }
    t.build()
}

/// Column defaults. `adbin` holds the expression's text (PostgreSQL keeps a node tree
/// there), which `pg_get_expr` gives back as it is: what psql's `\d` and ORMs read.
fn pg_attrdef(rels: &[Relation]) -> DFResult<Arc<dyn TableProvider>> {
    let mut t = TableBuilder::new(vec![
        oid("oid", kind::OID),
        oid("adrelid", kind::REGCLASS),
        int2("adnum"),
        text("adbin"),
    ]);
    for r in rels {
        for (i, c) in r.columns.iter().enumerate() {
            if let Some(default) = &c.default {
                let attnum = i as i16 + 1;
                // derived, like the key constraint's: not stored
                let oid = (r.oid & 0x7_ffff) << 11 | i32::from(attnum) | 1 << 30;
                t.row(vec![i4(oid), i4(r.oid), i2(attnum), s(default)]);
            }
        }
    }
    t.build()
}

fn pg_database(name: &str) -> DFResult<Arc<dyn TableProvider>> {
    let mut t = TableBuilder::new(vec![
        oid("oid", kind::OID),
        text("datname"),
        oid("datdba", kind::OID),
        int4("encoding"),
        text("datlocprovider"),
        boolean("datistemplate"),
        boolean("datallowconn"),
        int4("datconnlimit"),
        int4("datfrozenxid"),
        int4("datminmxid"),
        oid("dattablespace", kind::OID),
        text("datcollate"),
        text("datctype"),
        text("daticulocale"),
        text("daticurules"),
        text("datcollversion"),
        text_array("datacl"),
    ]);
    t.row(vec![
        i4(DATABASE_OID),
        s(name),
        i4(OWNER_OID),
        i4(6), // UTF8
        s("c"),
        b(false),
        b(true),
        i4(-1),
        i4(0),
        i4(1),
        i4(1663),
        s("C"),
        s("C"),
        null_s(),
        null_s(),
        null_s(),
        null_array(),
    ]);
    t.build()
}

fn pg_tables(rels: &[Relation], who: &super::roles::Who) -> DFResult<Arc<dyn TableProvider>> {
    let mut t = TableBuilder::new(vec![
        text("schemaname"),
        text("tablename"),
        text("tableowner"),
        text("tablespace"),
        boolean("hasindexes"),
        boolean("hasrules"),
        boolean("hastriggers"),
        boolean("rowsecurity"),
    ]);
    for r in rels.iter().filter(|r| r.kind == "r") {
        t.row(vec![
            s(r.schema),
            s(&r.name),
            s(who.owner_name(&r.name)),
            null_s(),
            b(!r.indexes().is_empty()),
            b(false),
            b(false),
            b(false),
        ]);
    }
    t.build()
}

/// Every view in `public`: the users' (with their query) and Sluice's own.
fn pg_views(rels: &[Relation], who: &super::roles::Who) -> DFResult<Arc<dyn TableProvider>> {
    let mut t = TableBuilder::new(text_fields(&[
        "schemaname",
        "viewname",
        "viewowner",
        "definition",
    ]));
    for r in rels.iter().filter(|r| r.kind == "v") {
        t.row(vec![
            s(r.schema),
            s(&r.name),
            s(who.owner_name(&r.name)),
            r.definition.as_deref().map_or_else(null_s, s),
        ]);
    }
    t.build()
}

fn pg_stat_user_tables(rels: &[Relation]) -> DFResult<Arc<dyn TableProvider>> {
    let counters = [
        "seq_scan",
        "seq_tup_read",
        "idx_scan",
        "idx_tup_fetch",
        "n_tup_ins",
        "n_tup_upd",
        "n_tup_del",
        "n_tup_hot_upd",
        "n_live_tup",
        "n_dead_tup",
        "n_mod_since_analyze",
        "n_ins_since_vacuum",
    ];
    let mut fields = vec![oid("relid", kind::OID), text("schemaname"), text("relname")];
    fields.extend(counters.iter().map(|c| int8(c)));
    fields.extend(
        [
            "last_vacuum",
            "last_autovacuum",
            "last_analyze",
            "last_autoanalyze",
        ]
        .iter()
        .map(|n| timestamptz(n)),
    );
    fields.extend(
        [
            "vacuum_count",
            "autovacuum_count",
            "analyze_count",
            "autoanalyze_count",
        ]
        .iter()
        .map(|c| int8(c)),
    );
    let mut t = TableBuilder::new(fields);
    for r in rels.iter().filter(|r| r.kind == "r") {
        let mut row = vec![i4(r.oid), s(r.schema), s(&r.name)];
        row.extend(counters.iter().map(|c| match *c {
            "n_tup_ins" | "n_live_tup" | "n_ins_since_vacuum" => i8v(r.rows),
            _ => i8v(0),
        }));
        row.extend((0..4).map(|_| ScalarValue::TimestampMicrosecond(None, Some("UTC".into()))));
        row.extend((0..4).map(|_| i8v(0)));
        t.row(row);
    }
    t.build()
}

fn pg_settings(
    settings: &std::collections::BTreeMap<String, String>,
) -> DFResult<Arc<dyn TableProvider>> {
    let names = [
        "name",
        "setting",
        "unit",
        "category",
        "short_desc",
        "extra_desc",
        "context",
        "vartype",
        "source",
        "min_val",
        "max_val",
    ];
    let mut fields = text_fields(&names);
    fields.extend([
        text_array("enumvals"),
        text("boot_val"),
        text("reset_val"),
        text("sourcefile"),
        int4("sourceline"),
        boolean("pending_restart"),
    ]);
    let mut t = TableBuilder::new(fields);
    for (name, value) in settings {
        t.row(vec![
            s(name),
            s(value),
            null_s(),
            s("Sluice"),
            s(""),
            null_s(),
            s("user"),
            s("string"),
            s("session"),
            null_s(),
            null_s(),
            null_array(),
            s(value),
            s(value),
            null_s(),
            null_i4(),
            b(false),
        ]);
    }
    t.build()
}

/// The session's own connection: whether it is encrypted and how (PostgreSQL lists every
/// backend; a session here sees only its own).
fn pg_stat_ssl(pid: i32, ssl: Option<&SslInfo>) -> DFResult<Arc<dyn TableProvider>> {
    let mut t = TableBuilder::new(vec![
        int4("pid"),
        boolean("ssl"),
        text("version"),
        text("cipher"),
        int4("bits"),
        text("client_dn"),
        text("client_serial"),
        text("issuer_dn"),
    ]);
    let opt = |v: Option<&String>| v.map(|v| s(v.as_str())).unwrap_or_else(null_s);
    t.row(match ssl {
        Some(ssl) => vec![
            i4(pid),
            b(true),
            s(ssl.version.as_str()),
            s(ssl.cipher.as_str()),
            i4(ssl.bits),
            opt(ssl.client_dn.as_ref()),
            opt(ssl.client_serial.as_ref()),
            opt(ssl.issuer_dn.as_ref()),
        ],
        None => vec![
            i4(pid),
            b(false),
            null_s(),
            null_s(),
            null_i4(),
            null_s(),
            null_s(),
            null_s(),
        ],
    });
    t.build()
}

/// Every table's indexes: its primary key's and its secondary ones (streams have none);
/// typed like PostgreSQL's so client queries over `indkey` plan.
fn pg_index(rels: &[Relation]) -> DFResult<Arc<dyn TableProvider>> {
    let mut fields = vec![
        oid("indexrelid", kind::REGCLASS),
        oid("indrelid", kind::REGCLASS),
    ];
    fields.extend([int2("indnatts"), int2("indnkeyatts")]);
    fields.extend(
        [
            "indisunique",
            "indnullsnotdistinct",
            "indisprimary",
            "indisexclusion",
            "indimmediate",
            "indisclustered",
            "indisvalid",
            "indcheckxmin",
            "indisready",
            "indislive",
            "indisreplident",
        ]
        .iter()
        .map(|n| boolean(n)),
    );
    fields.extend([
        int2_vector("indkey"),
        oid_vector("indcollation"),
        oid_vector("indclass"),
        int2_vector("indoption"),
        text("indexprs"),
        text("indpred"),
    ]);
    let mut t = TableBuilder::new(fields);
    for r in rels {
        for x in r.indexes() {
            let n = x.columns.len() as i16;
            let collations: Vec<i32> = x
                .columns
                .iter()
                .map(|&k| type_collation(&r.columns[k as usize - 1].ty))
                .collect();
            let mut row = vec![i4(x.oid), i4(r.oid), i2(n), i2(n)];
            // unique, nulls not distinct, primary, exclusion, immediate,
            // clustered, valid, checkxmin, ready, live, replident
            for v in [
                x.unique, false, x.primary, false, true, false, true, false, true, true, false,
            ] {
                row.push(b(v));
            }
            row.extend([
                i2_list(&x.columns),
                oid_list(&collations),
                oid_list(&vec![0; x.columns.len()]),
                i2_list(
                    &(0..x.columns.len())
                        .map(|i| x.option(i) as i16)
                        .collect::<Vec<_>>(),
                ),
                null_s(),
                null_s(),
            ]);
            t.row(row);
        }
    }
    t.build()
}

/// Every index, as `CREATE INDEX` would make it.
fn pg_indexes(rels: &[Relation]) -> DFResult<Arc<dyn TableProvider>> {
    let mut t = TableBuilder::new(text_fields(&[
        "schemaname",
        "tablename",
        "indexname",
        "tablespace",
        "indexdef",
    ]));
    for r in rels {
        for x in r.indexes() {
            t.row(vec![
                s(r.schema),
                s(&r.name),
                s(&x.name),
                null_s(),
                s(r.index_definition(&x)),
            ]);
        }
    }
    t.build()
}

/// Primary keys and UNIQUE constraints (NOT NULL lives in pg_attribute, as in PostgreSQL 16);
/// typed like PostgreSQL's.
fn pg_constraint(rels: &[Relation]) -> DFResult<Arc<dyn TableProvider>> {
    let mut t = TableBuilder::new(vec![
        oid("oid", kind::OID),
        text("conname"),
        oid("connamespace", kind::REGNAMESPACE),
        text("contype"),
        boolean("condeferrable"),
        boolean("condeferred"),
        boolean("convalidated"),
        oid("conrelid", kind::REGCLASS),
        oid("contypid", kind::REGTYPE),
        oid("conindid", kind::REGCLASS),
        oid("conparentid", kind::OID),
        oid("confrelid", kind::REGCLASS),
        text("confupdtype"),
        text("confdeltype"),
        text("confmatchtype"),
        boolean("conislocal"),
        int4("coninhcount"),
        boolean("connoinherit"),
        int2_array("conkey"),
        int2_array("confkey"),
        oid_array("conpfeqop"),
        oid_array("conppeqop"),
        oid_array("conffeqop"),
        int2_array("confdelsetcols"),
        oid_array("conexclop"),
        text("conbin"),
    ]);
    let empty_oids =
        || ScalarValue::try_from(oid_array("").data_type()).unwrap_or(ScalarValue::Null);
    let empty_i2 =
        || ScalarValue::try_from(int2_array("").data_type()).unwrap_or(ScalarValue::Null);
    for r in rels {
        for x in r.indexes().into_iter().filter(RelIndex::is_constraint) {
            t.row(vec![
                i4(x.constraint_oid()),
                s(&x.name),
                i4(r.namespace),
                s(x.contype()),
                b(false),
                b(false),
                b(true),
                i4(r.oid),
                i4(0),
                i4(x.oid),
                i4(0),
                i4(0),
                s(" "),
                s(" "),
                s(" "),
                b(true),
                i4(0),
                b(true),
                i2_list(&x.columns),
                empty_i2(),
                empty_oids(),
                empty_oids(),
                empty_oids(),
                empty_i2(),
                empty_oids(),
                null_s(),
            ]);
        }
    }
    t.build()
}

/// The crate's dynamic tables are all replaced here, so it sees no catalogs.
#[derive(Debug, Clone)]
struct NoCatalogs;

#[async_trait]
impl CatalogInfo for NoCatalogs {
    async fn catalog_names(&self) -> DFResult<Vec<String>> {
        Ok(vec![])
    }
    async fn schema_names(&self, _: &str) -> DFResult<Option<Vec<String>>> {
        Ok(None)
    }
    async fn table_names(&self, _: &str, _: &str) -> DFResult<Option<Vec<String>>> {
        Ok(None)
    }
    async fn table_schema(&self, _: &str, _: &str, _: &str) -> DFResult<Option<SchemaRef>> {
        Ok(None)
    }
    async fn table_type(
        &self,
        _: &str,
        _: &str,
        _: &str,
    ) -> DFResult<Option<datafusion::datasource::TableType>> {
        Ok(None)
    }
}

/// The crate's source of roles: empty, since every relation that shows roles (pg_roles,
/// pg_authid, pg_auth_members, pg_user) is built from the replicated roles in
/// [`super::roles`].
#[derive(Debug, Clone)]
struct NoRoles;

#[async_trait]
impl PgCatalogContextProvider for NoRoles {
    async fn roles(&self) -> Vec<String> {
        Vec::new()
    }

    async fn role(&self, _: &str) -> Option<Role> {
        None
    }
}
