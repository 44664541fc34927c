//! The `typed` stream: one column of every supported type, sample rows as
//! Rust values, and how PostgreSQL prints each sample as text.

use chrono::{DateTime, NaiveDate, NaiveDateTime, Utc};
use rust_decimal::Decimal;
use serde_json::json;
use tokio_postgres::types::ToSql;
use tokio_postgres::Row;
use uuid::Uuid;

pub const TYPED_DDL: &str = "CREATE STREAM typed (flag boolean, i2 smallint, i4 integer, \
    i8 bigint, f4 real, f8 double precision, num numeric(10,3), txt text, vc varchar(5), \
    bin bytea, tstz timestamptz, tsp timestamp, day date, doc json, docb jsonb, id uuid)";
pub const TYPED_COLUMNS: &str =
    "flag, i2, i4, i8, f4, f8, num, txt, vc, bin, tstz, tsp, day, doc, docb, id";

/// One row of `typed`, as Rust values.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Typed {
    pub flag: Option<bool>,
    pub i2: Option<i16>,
    pub i4: Option<i32>,
    pub i8: Option<i64>,
    pub f4: Option<f32>,
    pub f8: Option<f64>,
    pub num: Option<Decimal>,
    pub txt: Option<String>,
    pub vc: Option<String>,
    pub bin: Option<Vec<u8>>,
    pub tstz: Option<DateTime<Utc>>,
    pub tsp: Option<NaiveDateTime>,
    pub day: Option<NaiveDate>,
    pub doc: Option<serde_json::Value>,
    pub docb: Option<serde_json::Value>,
    pub id: Option<Uuid>,
}

impl Typed {
    pub fn params(&self) -> [&(dyn ToSql + Sync); 16] {
        [
            &self.flag, &self.i2, &self.i4, &self.i8, &self.f4, &self.f8, &self.num, &self.txt,
            &self.vc, &self.bin, &self.tstz, &self.tsp, &self.day, &self.doc, &self.docb, &self.id,
        ]
    }

    pub fn from_row(row: &Row) -> Typed {
        Typed {
            flag: row.get("flag"),
            i2: row.get("i2"),
            i4: row.get("i4"),
            i8: row.get("i8"),
            f4: row.get("f4"),
            f8: row.get("f8"),
            num: row.get("num"),
            txt: row.get("txt"),
            vc: row.get("vc"),
            bin: row.get("bin"),
            tstz: row.get("tstz"),
            tsp: row.get("tsp"),
            day: row.get("day"),
            doc: row.get("doc"),
            docb: row.get("docb"),
            id: row.get("id"),
        }
    }
}

fn date(y: i32, m: u32, d: u32) -> NaiveDate {
    NaiveDate::from_ymd_opt(y, m, d).expect("valid date")
}

fn datetime(day: NaiveDate, h: u32, mi: u32, s: u32, micro: u32) -> NaiveDateTime {
    day.and_hms_micro_opt(h, mi, s, micro).expect("valid time")
}

fn uuid(text: &str) -> Uuid {
    Uuid::parse_str(text).expect("valid uuid")
}

/// Sample rows and how PostgreSQL prints each of them as text.
pub fn samples() -> Vec<(Typed, [Option<&'static str>; 16])> {
    let full = Typed {
        flag: Some(true),
        i2: Some(12),
        i4: Some(345),
        i8: Some(6_789_012_345),
        f4: Some(1.5),
        f8: Some(2.25),
        num: Some(Decimal::new(125, 1)),
        txt: Some("hello world".into()),
        vc: Some("abc".into()),
        bin: Some(vec![0xde, 0xad, 0xbe, 0xef]),
        tstz: Some(datetime(date(2024, 1, 2), 3, 4, 5, 123_456).and_utc()),
        tsp: Some(datetime(date(2024, 1, 2), 3, 4, 5, 0)),
        day: Some(date(2024, 2, 29)),
        doc: Some(json!({"a": [1, 2]})),
        docb: Some(json!({"b": 2, "a": 1})),
        id: Some(uuid("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11")),
    };
    let full_text = [
        "t",
        "12",
        "345",
        "6789012345",
        "1.5",
        "2.25",
        "12.500",
        "hello world",
        "abc",
        "\\xdeadbeef",
        "2024-01-02 03:04:05.123456+00",
        "2024-01-02 03:04:05",
        "2024-02-29",
        r#"{"a":[1,2]}"#,
        r#"{"a": 1, "b": 2}"#,
        "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
    ]
    .map(Some);
    let edges = Typed {
        flag: Some(false),
        i2: Some(i16::MIN),
        i4: Some(i32::MIN),
        i8: Some(i64::MAX),
        f4: Some(-0.25),
        f8: Some(0.1),
        num: Some(Decimal::new(-1, 3)),
        txt: Some(String::new()),
        vc: Some("abcde".into()),
        bin: Some(Vec::new()),
        tstz: Some(DateTime::UNIX_EPOCH),
        tsp: Some(datetime(date(1999, 12, 31), 23, 59, 59, 500_000)),
        day: Some(date(1970, 1, 1)),
        doc: Some(json!([])),
        docb: Some(json!({"nested": {"k": null}, "arr": [true, false]})),
        id: Some(Uuid::nil()),
    };
    let edges_text = [
        "f",
        "-32768",
        "-2147483648",
        "9223372036854775807",
        "-0.25",
        "0.1",
        "-0.001",
        "",
        "abcde",
        "\\x",
        "1970-01-01 00:00:00+00",
        "1999-12-31 23:59:59.5",
        "1970-01-01",
        "[]",
        r#"{"arr": [true, false], "nested": {"k": null}}"#,
        "00000000-0000-0000-0000-000000000000",
    ]
    .map(Some);
    vec![
        (full, full_text),
        (Typed::default(), [None; 16]),
        (edges, edges_text),
    ]
}
