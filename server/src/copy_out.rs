//! COPY TO STDOUT: record batches into COPY text, CSV or binary data.
//!
//! One CopyData message per row, as PostgreSQL sends them (some clients
//! parse row by row). Field values use the same text and binary encoders
//! as query results, then the format's escaping or framing.

use arrow::array::RecordBatch;
use arrow::datatypes::Schema;
use bytes::{BufMut, BytesMut};
use sluice_sql::statement::CopyFormat;

use crate::encode::{
    column_encoding, encode_binary, encode_text, plain_text, ColumnEncoding, OutputContext,
};

pub const BINARY_HEADER: &[u8] = b"PGCOPY\n\xff\r\n\0";
/// Upper bound of the buffer reserved up front for one batch's rows.
const MAX_BATCH_PREALLOC: usize = 16 << 20;

pub struct CopyEncoder {
    format: CopyFormat,
    encodings: Vec<ColumnEncoding>,
    ctx: OutputContext,
    header_sent: bool,
}

impl CopyEncoder {
    pub fn new(schema: &Schema, format: CopyFormat, ctx: OutputContext) -> CopyEncoder {
        CopyEncoder {
            format,
            encodings: schema.fields().iter().map(|f| column_encoding(f)).collect(),
            ctx,
            header_sent: false,
        }
    }

    /// The wire format code: 0 text/CSV, 1 binary.
    pub fn format_code(&self) -> i8 {
        matches!(self.format, CopyFormat::Binary) as i8
    }

    /// A leading message the format needs before any row (CSV header, binary signature).
    pub fn header(&mut self, schema: &Schema) -> Option<BytesMut> {
        if self.header_sent {
            return None;
        }
        self.header_sent = true;
        match &self.format {
            CopyFormat::Binary => {
                let mut b = BytesMut::with_capacity(19);
                b.put_slice(BINARY_HEADER);
                b.put_i32(0);
                b.put_i32(0);
                Some(b)
            }
            CopyFormat::Csv {
                header: true,
                delimiter,
                quote,
                ..
            } => {
                let names: Vec<String> = schema
                    .fields()
                    .iter()
                    .map(|f| csv_quote(f.name(), *delimiter, *quote, "", false))
                    .collect();
                let mut b = BytesMut::new();
                b.put_slice(names.join(&delimiter.to_string()).as_bytes());
                b.put_u8(b'\n');
                Some(b)
            }
            _ => None,
        }
    }

    /// One buffer per row, all split off one allocation for the batch.
    pub fn encode_rows(&self, batch: &RecordBatch) -> Result<Vec<BytesMut>, String> {
        let n = batch.num_rows();
        let mut rows = Vec::with_capacity(n);
        // the bytes of the rows in this batch, not of the buffers a sliced batch shares
        let data: usize = batch
            .columns()
            .iter()
            .map(|c| c.to_data().get_slice_memory_size().unwrap_or(0))
            .sum();
        let estimate = data.min(MAX_BATCH_PREALLOC) + 16 * n;
        let mut out = BytesMut::with_capacity(estimate);
        let mut field = BytesMut::new();
        for r in 0..n {
            if matches!(self.format, CopyFormat::Binary) {
                out.put_i16(batch.num_columns() as i16);
            }
            for (c, enc) in self.encodings.iter().enumerate() {
                let col = batch.column(c);
                let null = col.is_null(r) || col.data_type().is_null();
                match &self.format {
                    CopyFormat::Binary => {
                        if null {
                            out.put_i32(-1);
                            continue;
                        }
                        field.clear();
                        match &enc.ty {
                            Some(ty) => {
                                encode_binary(col.as_ref(), r, ty, enc.trim_numeric, &mut field)?
                            }
                            None => field.put_slice(fallback_text(col.as_ref(), r)?.as_bytes()),
                        }
                        out.put_i32(field.len() as i32);
                        out.put_slice(&field);
                    }
                    CopyFormat::Text {
                        delimiter,
                        null: null_text,
                    } => {
                        if c > 0 {
                            put_char(&mut out, *delimiter);
                        }
                        if null {
                            out.put_slice(null_text.as_bytes());
                            continue;
                        }
                        // strings are escaped straight from the array
                        match enc
                            .ty
                            .as_ref()
                            .and_then(|ty| plain_text(col.as_ref(), r, ty))
                        {
                            Some(text) => escape_text(text.as_bytes(), *delimiter, &mut out),
                            None => {
                                self.text_into(col.as_ref(), r, enc, &mut field)?;
                                escape_text(&field, *delimiter, &mut out);
                            }
                        }
                    }
                    CopyFormat::Csv {
                        delimiter,
                        quote,
                        null: null_text,
                        ..
                    } => {
                        if c > 0 {
                            put_char(&mut out, *delimiter);
                        }
                        if null {
                            out.put_slice(null_text.as_bytes());
                            continue;
                        }
                        self.text_into(col.as_ref(), r, enc, &mut field)?;
                        let text = std::str::from_utf8(&field).map_err(|e| e.to_string())?;
                        out.put_slice(
                            csv_quote(text, *delimiter, *quote, null_text, true).as_bytes(),
                        );
                    }
                }
            }
            if !matches!(self.format, CopyFormat::Binary) {
                out.put_u8(b'\n');
            }
            rows.push(out.split());
        }
        Ok(rows)
    }

    /// A value's text form (before the format's escaping) into `buf`.
    fn text_into(
        &self,
        col: &dyn arrow::array::Array,
        r: usize,
        enc: &ColumnEncoding,
        buf: &mut BytesMut,
    ) -> Result<(), String> {
        buf.clear();
        match &enc.ty {
            Some(ty) => encode_text(col, r, ty, enc.trim_numeric, &self.ctx, buf),
            None => {
                buf.put_slice(fallback_text(col, r)?.as_bytes());
                Ok(())
            }
        }
    }
}

fn fallback_text(col: &dyn arrow::array::Array, r: usize) -> Result<String, String> {
    if let Some(text) = crate::encode::pg_array_text(col, r) {
        return Ok(text);
    }
    let f = arrow::util::display::ArrayFormatter::try_new(
        col,
        &arrow::util::display::FormatOptions::default(),
    )
    .map_err(|e| e.to_string())?;
    Ok(f.value(r).to_string())
}

fn put_char(out: &mut BytesMut, c: char) {
    let mut tmp = [0u8; 4];
    out.put_slice(c.encode_utf8(&mut tmp).as_bytes());
}

/// COPY text escaping as PostgreSQL does it: backslash, the delimiter and
/// the control characters with a backslash letter (`\b \f \n \r \t \v`).
/// Runs of bytes that need none are copied whole.
fn escape_text(text: &[u8], delimiter: char, out: &mut BytesMut) {
    let mut tmp = [0u8; 4];
    let delim = delimiter.encode_utf8(&mut tmp).as_bytes();
    // a branch-free pass (vectorized) first: most values need no escaping
    let lead = delim[0];
    let special = text.iter().fold(false, |acc, &b| {
        acc | (b == b'\\') | (b.wrapping_sub(0x08) < 6) | (b == lead)
    });
    if !special {
        out.put_slice(text);
        return;
    }
    let mut run = 0;
    let mut i = 0;
    while i < text.len() {
        let letter = match text[i] {
            b'\\' => b'\\',
            0x08 => b'b',
            0x0c => b'f',
            b'\n' => b'n',
            b'\r' => b'r',
            b'\t' => b't',
            0x0b => b'v',
            _ if text[i..].starts_with(delim) => {
                out.put_slice(&text[run..i]);
                out.put_u8(b'\\');
                out.put_slice(delim);
                i += delim.len();
                run = i;
                continue;
            }
            _ => {
                i += 1;
                continue;
            }
        };
        out.put_slice(&text[run..i]);
        out.put_slice(&[b'\\', letter]);
        i += 1;
        run = i;
    }
    out.put_slice(&text[run..]);
}

/// CSV quoting: quote when the value holds the delimiter, quote, CR/LF, or
/// would read back as NULL.
fn csv_quote(s: &str, delimiter: char, quote: char, null_text: &str, value: bool) -> String {
    let needs = s.contains(delimiter)
        || s.contains(quote)
        || s.contains('\n')
        || s.contains('\r')
        || (value && s == null_text)
        || s.starts_with("\\.");
    if !needs {
        return s.to_string();
    }
    let doubled = s.replace(quote, &format!("{quote}{quote}"));
    format!("{quote}{doubled}{quote}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    use arrow::array::{Int64Array, StringArray};
    use arrow::datatypes::{DataType, Field};

    fn batch() -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![
            Field::new("n", DataType::Int64, true),
            Field::new("s", DataType::Utf8, true),
        ]));
        RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int64Array::from(vec![Some(1), None])),
                Arc::new(StringArray::from(vec![Some("a\tb,\"c\"\n"), Some("")])),
            ],
        )
        .unwrap()
    }

    fn encode(format: CopyFormat) -> Vec<String> {
        let b = batch();
        let enc = CopyEncoder::new(&b.schema(), format, OutputContext::new("UTC"));
        enc.encode_rows(&b)
            .unwrap()
            .into_iter()
            .map(|r| String::from_utf8(r.to_vec()).unwrap())
            .collect()
    }

    #[test]
    fn text_format_escapes() {
        let rows = encode(CopyFormat::Text {
            delimiter: '\t',
            null: "\\N".into(),
        });
        assert_eq!(rows, vec!["1\ta\\tb,\"c\"\\n\n", "\\N\t\n"]);
    }

    #[test]
    fn text_escapes_like_postgres() {
        let mut out = BytesMut::new();
        escape_text(b"a|b\\c\x08\x0c\x0b\td\x01\r\n", '|', &mut out);
        assert_eq!(&out[..], b"a\\|b\\\\c\\b\\f\\v\\td\x01\\r\\n");
        out.clear();
        escape_text("plain ünïcode".as_bytes(), '\t', &mut out);
        assert_eq!(&out[..], "plain ünïcode".as_bytes());
    }

    #[test]
    fn csv_format_quotes() {
        let rows = encode(CopyFormat::Csv {
            delimiter: ',',
            quote: '"',
            escape: '"',
            null: String::new(),
            header: false,
        });
        assert_eq!(rows, vec!["1,\"a\tb,\"\"c\"\"\n\"\n", ",\"\"\n"]);
    }

    #[test]
    fn binary_rows_are_framed() {
        let b = batch();
        let enc = CopyEncoder::new(&b.schema(), CopyFormat::Binary, OutputContext::new("UTC"));
        let rows = enc.encode_rows(&b).unwrap();
        // 2 columns; NULL is length -1
        assert_eq!(&rows[1][..2], &2i16.to_be_bytes());
        assert_eq!(&rows[1][2..6], &(-1i32).to_be_bytes());
        assert_eq!(&rows[0][2..6], &8i32.to_be_bytes());
    }
}
