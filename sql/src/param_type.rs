//! The type of a statement's parameter as the wire sees it: a column type, or a
//! one-dimensional array of one — what Describe announces (by OID) and what Bind decodes
//! (text through the types' input functions, binary through their `recv` formats; arrays
//! through [`crate::types::arrays`] and [`crate::binary::decode_array`]).

use arrow::datatypes::{DataType, Field};
use datafusion::scalar::ScalarValue;

use crate::error::Result;
use crate::types::ColumnType;

/// The type of a statement's parameter: a column type, or a one-dimensional array of one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParamType {
    Scalar(ColumnType),
    /// An array of `elem`, announced to clients as `oid` (`elem`'s array type, or 1028 for
    /// `oid[]`, whose elements are taken as integers, as Sluice's catalogs hold OIDs).
    Array {
        elem: ColumnType,
        oid: u32,
    },
}

/// `oid[]`: what clients' catalog queries bind (asyncpg's type introspection).
const OID_ARRAY: u32 = 1028;

impl ParamType {
    /// An array of `elem`, as its own array type.
    pub fn array(elem: ColumnType) -> ParamType {
        ParamType::Array {
            elem,
            oid: elem.array_oid(),
        }
    }

    /// `oid[]`.
    pub fn oid_array() -> ParamType {
        ParamType::Array {
            elem: ColumnType::Int4,
            oid: OID_ARRAY,
        }
    }

    pub fn oid(self) -> u32 {
        match self {
            ParamType::Scalar(t) => t.oid(),
            ParamType::Array { oid, .. } => oid,
        }
    }

    /// The parameter type of a column type (an array column's is an array).
    pub fn of_type(t: ColumnType) -> ParamType {
        match t.element() {
            Some(elem) => ParamType::array(elem),
            None => ParamType::Scalar(t),
        }
    }

    /// The type an OID names, if Sluice has it.
    pub fn of_oid(o: u32) -> Option<ParamType> {
        if o == OID_ARRAY {
            return Some(ParamType::oid_array());
        }
        ColumnType::of_oid(o).map(ParamType::of_type)
    }

    /// The parameter type of an Arrow field: a list is an array of its item's type.
    pub fn of_field(field: &Field) -> Option<ParamType> {
        match field.data_type() {
            DataType::List(_) | DataType::LargeList(_) => ColumnType::of_field(field)
                .filter(|t| t.element().is_some())
                .map(ParamType::of_type),
            _ => ColumnType::of_field(field).map(ParamType::Scalar),
        }
    }

    /// Parse PostgreSQL text input for this type.
    pub fn parse_text(self, s: &str) -> Result<ScalarValue> {
        match self {
            ParamType::Scalar(t) => t.parse_text(s),
            ParamType::Array { elem, .. } => crate::types::arrays::parse_text(elem, s),
        }
    }

    /// Decode PostgreSQL's binary form of this type.
    pub fn decode_binary(self, b: &[u8]) -> Result<ScalarValue> {
        match self {
            ParamType::Scalar(t) => crate::binary::decode(t, b),
            ParamType::Array { elem, .. } => crate::binary::decode_array(elem, b),
        }
    }

    /// A null of this type.
    pub fn null(self) -> ScalarValue {
        let ty = match self {
            ParamType::Scalar(t) => t.arrow_type(),
            ParamType::Array { elem, .. } => DataType::List(std::sync::Arc::new(
                Field::new_list_field(elem.arrow_type(), true),
            )),
        };
        ScalarValue::try_from(ty).unwrap_or(ScalarValue::Null)
    }
}
