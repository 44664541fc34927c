//! Views in a session: `CREATE [OR REPLACE] VIEW` (the query planned once for its columns
//! and the relations it reads), the expansion every planned statement passes through (see
//! [`crate::views`]), and the refusal to write through a view.

use sqlparser::ast::{Query, Statement};

use super::naming::pg_column_names;
use super::{dml, insert_target, Output, Session};
use crate::command::{op, CreateView};
use crate::definition::{ColumnDef, ViewDef};
use crate::error::{sqlstate, Error, Result};
use crate::statement::{sqlparser, Parsed};
use crate::types::ColumnType;

impl Session {
    /// Replaces the views `stmt` names with their queries.
    pub(super) fn expand_views(&self, stmt: &mut Statement) -> Result<()> {
        let catalog = &self.engine.catalog;
        if !self.block.has_views(catalog) {
            return Ok(());
        }
        crate::views::expand(stmt, &|n| self.block.view(n, catalog))
    }

    /// `CREATE [OR REPLACE] VIEW`: the query is planned here (an error in it is the
    /// statement's), its columns named as a SELECT of it would name them (`columns` renames
    /// the first ones), and the definition proposed; apply checks the names again.
    pub(super) async fn create_view(
        &mut self,
        name: &str,
        columns: &[String],
        query: &Query,
        or_replace: bool,
    ) -> Result<Output> {
        let stmt = Statement::Query(Box::new(query.clone()));
        let plan = self.plan(&stmt).await?;
        if !plan.get_parameter_types()?.is_empty() {
            return Err(Error::new(
                sqlstate::UNDEFINED_PARAMETER_REFERENCE,
                "a view's query cannot have parameters ($1, ...)",
            ));
        }
        let schema = pg_column_names(&stmt, plan.schema().as_arrow());
        if columns.len() > schema.fields().len() {
            return Err(Error::syntax(
                "CREATE VIEW specifies more column names than columns",
            ));
        }
        let mut defs: Vec<ColumnDef> = Vec::with_capacity(schema.fields().len());
        for (i, f) in schema.fields().iter().enumerate() {
            let name = columns.get(i).unwrap_or(f.name()).clone();
            if defs.iter().any(|c| c.name == name) {
                return Err(Error::new(
                    sqlstate::DUPLICATE_COLUMN,
                    format!("column \"{name}\" specified more than once"),
                ));
            }
            defs.push(ColumnDef {
                name,
                // only catalogs read it: a type Sluice cannot store shows as text
                ty: ColumnType::of_arrow(f.data_type()).unwrap_or(ColumnType::Text),
                not_null: false,
                default: None,
            });
        }
        let catalog = &self.engine.catalog;
        let def = ViewDef {
            id: 0,
            oid: 0,
            name: name.to_string(),
            query: query.to_string(),
            columns: defs,
            depends_on: crate::views::relations_read(query)
                .into_iter()
                .filter(|n| self.block.exists(n, catalog))
                .collect(),
        };
        let kind = op::Kind::CreateView(CreateView {
            name: name.to_string(),
            definition_json: super::ddl::definition_json(&def)?,
            or_replace,
            owner: self.owner_name(),
        });
        self.run_ddl(vec![kind], "CREATE VIEW").await
    }

    /// A write whose target is a view is refused (views are read-only).
    pub(super) fn refuse_write_to_view(&self, p: &Parsed) -> Result<()> {
        let catalog = &self.engine.catalog;
        if !self.block.has_views(catalog) {
            return Ok(());
        }
        let (verb, target) = match p {
            Parsed::Insert(ins) => ("insert into", insert_target(ins)?),
            Parsed::CopyFrom(c) => ("copy to", c.stream.clone()),
            Parsed::Delete(d) => ("delete from", dml::delete_target(d)?.0),
            Parsed::Update(u) => match dml::update_target(&u.table.relation) {
                Ok((name, _)) => ("update", name),
                // not a plain name: UPDATE refuses it itself
                Err(_) => return Ok(()),
            },
            _ => return Ok(()),
        };
        if self.block.view(&target, catalog).is_none() {
            return Ok(());
        }
        Err(
            Error::unsupported(format!("cannot {verb} view \"{target}\"")).with_detail(
                "Views are read-only in Sluice: write to the streams and tables under it.",
            ),
        )
    }
}
