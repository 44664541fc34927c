//! COPY TO STDOUT: record batches into COPY text, CSV or binary data,
//! framed as the CopyData messages that carry them.
//!
//! One CopyData message per row, as PostgreSQL sends them (clients parse
//! row by row): a CSV header is a message of its own, the binary signature
//! rides in the first row's message and the binary trailer (`-1`) is the
//! last message. Field values use the same text and binary encoders as
//! query results, then the format's escaping or framing.
//!
//! A batch is encoded into one buffer of framed messages ([`Frames`]), so
//! a connection can write it out whole ([`crate::handler`] does, after
//! encoding a snapshot's batches on the query runtime) or hand its
//! messages to pgwire one by one ([`Frames::messages`]).

use std::pin::Pin;

use arrow::array::{Array, RecordBatch};
use arrow::datatypes::Schema;
use bytes::{BufMut, Bytes, BytesMut};
use datafusion::execution::SendableRecordBatchStream;
use futures::{Stream, StreamExt};
use pgwire::error::PgWireResult;
use sluice_sql::statement::CopyFormat;

use crate::encode::{
    column_encoding, encode_binary, encode_text, plain_text, ColumnEncoding, OutputContext,
};

const BINARY_HEADER: &[u8] = b"PGCOPY\n\xff\r\n\0";
/// Upper bound of the buffer reserved up front for one batch's rows.
const MAX_BATCH_PREALLOC: usize = 16 << 20;
/// Bytes of a message's frame: the tag and the length.
const FRAME: usize = 5;

/// CopyData messages framed for the wire (`'d'`, length, data), and how
/// many of them are rows (a CSV header or the binary trailer is not).
#[derive(Debug, Default)]
pub struct Frames {
    pub bytes: Bytes,
    pub rows: usize,
}

impl Frames {
    /// Each message's data, without its frame (slices of one buffer).
    pub fn messages(&self) -> impl Iterator<Item = Bytes> + '_ {
        let mut at = 0;
        std::iter::from_fn(move || {
            let head = self.bytes.get(at..at + FRAME)?;
            let len = i32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
            let data = self.bytes.slice(at + FRAME..at + 1 + len);
            at += 1 + len;
            Some(data)
        })
    }
}

/// Starts a framed message in `out`: the tag and a length that
/// [`close_frame`] fills in. Returns where the message starts.
fn open_frame(out: &mut BytesMut) -> usize {
    let at = out.len();
    out.put_u8(b'd');
    out.put_i32(0);
    at
}

/// Ends the message [`open_frame`] started at `at`: everything written
/// since is its data.
fn close_frame(out: &mut BytesMut, at: usize) {
    let len = (out.len() - at - 1) as i32;
    out[at + 1..at + FRAME].copy_from_slice(&len.to_be_bytes());
}

pub struct CopyEncoder {
    format: CopyFormat,
    encodings: Vec<ColumnEncoding>,
    ctx: OutputContext,
    /// The CSV header or binary signature, until it is sent.
    header: Option<Bytes>,
}

impl CopyEncoder {
    pub fn new(schema: &Schema, format: CopyFormat, ctx: OutputContext) -> CopyEncoder {
        let header = match &format {
            CopyFormat::Binary => {
                let mut b = BytesMut::with_capacity(19);
                b.put_slice(BINARY_HEADER);
                b.put_i32(0);
                b.put_i32(0);
                Some(b.freeze())
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
                let mut line = names.join(&delimiter.to_string());
                line.push('\n');
                Some(Bytes::from(line))
            }
            _ => None,
        };
        CopyEncoder {
            format,
            encodings: schema.fields().iter().map(|f| column_encoding(f)).collect(),
            ctx,
            header,
        }
    }

    /// The wire format code: 0 text/CSV, 1 binary.
    pub fn format_code(&self) -> i8 {
        matches!(self.format, CopyFormat::Binary) as i8
    }

    /// A batch's rows as framed messages (after the CSV header, or with the
    /// binary signature in the first row, if neither has gone out yet).
    pub fn encode_batch(&mut self, batch: &RecordBatch) -> Result<Frames, String> {
        let n = batch.num_rows();
        if n == 0 {
            return Ok(Frames::default());
        }
        // the bytes of the rows in this batch, not of the buffers a sliced batch shares
        let data: usize = batch
            .columns()
            .iter()
            .map(|c| c.to_data().get_slice_memory_size().unwrap_or(0))
            .sum();
        let estimate = data.min(MAX_BATCH_PREALLOC) + (16 + FRAME) * n;
        let mut out = BytesMut::with_capacity(estimate);
        let binary = matches!(self.format, CopyFormat::Binary);
        let mut header = self.header.take();
        if !binary {
            if let Some(h) = header.take() {
                let at = open_frame(&mut out);
                out.put_slice(&h);
                close_frame(&mut out, at);
            }
        }
        let mut field = BytesMut::new();
        for r in 0..n {
            let at = open_frame(&mut out);
            if let Some(h) = header.take() {
                out.put_slice(&h);
            }
            self.encode_row(batch, r, &mut field, &mut out)?;
            close_frame(&mut out, at);
        }
        Ok(Frames {
            bytes: out.freeze(),
            rows: n,
        })
    }

    /// What ends the data: the CSV header if no row carried it, the binary
    /// trailer (after the signature, if no row carried that).
    pub fn finish(&mut self) -> Option<Frames> {
        let header = self.header.take();
        let binary = matches!(self.format, CopyFormat::Binary);
        if !binary && header.is_none() {
            return None;
        }
        let mut out = BytesMut::new();
        let at = open_frame(&mut out);
        if let Some(h) = header {
            out.put_slice(&h);
        }
        if binary {
            out.put_i16(-1);
        }
        close_frame(&mut out, at);
        Some(Frames {
            bytes: out.freeze(),
            rows: 0,
        })
    }

    fn encode_row(
        &self,
        batch: &RecordBatch,
        r: usize,
        field: &mut BytesMut,
        out: &mut BytesMut,
    ) -> Result<(), String> {
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
                        Some(ty) => encode_binary(col.as_ref(), r, ty, enc.trim_numeric, field)?,
                        None => field.put_slice(fallback_text(col.as_ref(), r)?.as_bytes()),
                    }
                    out.put_i32(field.len() as i32);
                    out.put_slice(field);
                }
                CopyFormat::Text {
                    delimiter,
                    null: null_text,
                } => {
                    if c > 0 {
                        put_char(out, *delimiter);
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
                        Some(text) => escape_text(text.as_bytes(), *delimiter, out),
                        None => {
                            self.text_into(col.as_ref(), r, enc, field)?;
                            escape_text(field, *delimiter, out);
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
                        put_char(out, *delimiter);
                    }
                    if null {
                        out.put_slice(null_text.as_bytes());
                        continue;
                    }
                    self.text_into(col.as_ref(), r, enc, field)?;
                    let text = std::str::from_utf8(field).map_err(|e| e.to_string())?;
                    out.put_slice(csv_quote(text, *delimiter, *quote, null_text, true).as_bytes());
                }
            }
        }
        if !matches!(self.format, CopyFormat::Binary) {
            out.put_u8(b'\n');
        }
        Ok(())
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

/// The COPY data of `batches`, framed, header and trailer included; an
/// error ends it.
pub fn copy_frames(
    encoder: CopyEncoder,
    batches: SendableRecordBatchStream,
) -> impl Stream<Item = Result<Frames, sluice_sql::Error>> + Send + 'static {
    futures::stream::unfold(Some((encoder, batches)), |state| async move {
        let (mut encoder, mut batches) = state?;
        match batches.next().await {
            Some(Ok(b)) => {
                let frames = encoder
                    .encode_batch(&b)
                    .map_err(sluice_sql::Error::internal);
                let go_on = frames.is_ok();
                Some((frames, go_on.then_some((encoder, batches))))
            }
            Some(Err(e)) => Some((Err(e.into()), None)),
            None => encoder.finish().map(|f| (Ok(f), None)),
        }
    })
}

/// The COPY data of one statement, ready to send.
pub struct CopyOut {
    /// 0 text/CSV, 1 binary.
    pub format: i8,
    pub columns: usize,
    pub frames: Pin<Box<dyn Stream<Item = PgWireResult<Frames>> + Send>>,
}

impl CopyOut {
    /// Encodes `batches` on `runtime` unless `live` (a tail's rows are
    /// encoded where they are sent, one hand-off fewer before the client
    /// sees them): the connection only writes a snapshot's bytes.
    pub fn new(
        schema: &Schema,
        format: CopyFormat,
        batches: SendableRecordBatchStream,
        live: bool,
        ctx: OutputContext,
        runtime: Option<&tokio::runtime::Handle>,
    ) -> CopyOut {
        let encoder = CopyEncoder::new(schema, format, ctx);
        let code = encoder.format_code();
        let frames = copy_frames(encoder, batches).map(|f| f.map_err(crate::errors::user_error));
        let frames = match runtime {
            Some(rt) if !live => sluice_sql::executor::spawn_stream(
                rt,
                frames,
                sluice_sql::executor::HANDOFF_BATCHES,
            )
            .boxed(),
            _ => frames.boxed(),
        };
        CopyOut {
            format: code,
            columns: schema.fields().len(),
            frames,
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
        let mut enc = CopyEncoder::new(&b.schema(), format, OutputContext::new("UTC"));
        let frames = enc.encode_batch(&b).unwrap();
        assert_eq!(frames.rows, 2);
        frames
            .messages()
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
        let mut enc = CopyEncoder::new(&b.schema(), CopyFormat::Binary, OutputContext::new("UTC"));
        let frames = enc.encode_batch(&b).unwrap();
        let rows: Vec<Bytes> = frames.messages().collect();
        assert_eq!(rows.len(), 2);
        // the signature and header extension rides in the first row's message
        assert!(rows[0].starts_with(BINARY_HEADER));
        let first = &rows[0][BINARY_HEADER.len() + 8..];
        // 2 columns; NULL is length -1
        assert_eq!(&first[..2], &2i16.to_be_bytes());
        assert_eq!(&first[2..6], &8i32.to_be_bytes());
        assert_eq!(&rows[1][..2], &2i16.to_be_bytes());
        assert_eq!(&rows[1][2..6], &(-1i32).to_be_bytes());
        // the trailer is the last message of its own
        let end = enc.finish().unwrap();
        assert_eq!(end.rows, 0);
        assert_eq!(&end.bytes[..], &[b'd', 0, 0, 0, 6, 0xff, 0xff]);
    }

    #[test]
    fn frames_are_copy_data_messages() {
        let b = batch();
        let mut enc = CopyEncoder::new(
            &b.schema(),
            CopyFormat::Text {
                delimiter: '\t',
                null: "\\N".into(),
            },
            OutputContext::new("UTC"),
        );
        let frames = enc.encode_batch(&b).unwrap();
        let mut expected = Vec::new();
        for row in ["1\ta\\tb,\"c\"\\n\n", "\\N\t\n"] {
            expected.push(b'd');
            expected.extend(((row.len() + 4) as i32).to_be_bytes());
            expected.extend(row.as_bytes());
        }
        assert_eq!(&frames.bytes[..], &expected[..]);
        // text has nothing after the rows
        assert!(enc.finish().is_none());
    }

    #[test]
    fn a_csv_header_is_its_own_message_with_or_without_rows() {
        let csv = CopyFormat::Csv {
            delimiter: ',',
            quote: '"',
            escape: '"',
            null: String::new(),
            header: true,
        };
        let b = batch();
        let mut enc = CopyEncoder::new(&b.schema(), csv.clone(), OutputContext::new("UTC"));
        let frames = enc.encode_batch(&b).unwrap();
        let messages: Vec<Bytes> = frames.messages().collect();
        assert_eq!(frames.rows, 2);
        assert_eq!(&messages[0][..], b"n,s\n");
        assert_eq!(messages.len(), 3);
        assert!(enc.finish().is_none());

        let mut empty = CopyEncoder::new(&b.schema(), csv, OutputContext::new("UTC"));
        assert_eq!(empty.encode_batch(&b.slice(0, 0)).unwrap().rows, 0);
        let end = empty.finish().unwrap();
        assert_eq!(
            end.messages().collect::<Vec<_>>(),
            vec![Bytes::from("n,s\n")]
        );
    }

    #[test]
    fn binary_with_no_rows_sends_signature_and_trailer_together() {
        let b = batch();
        let mut enc = CopyEncoder::new(&b.schema(), CopyFormat::Binary, OutputContext::new("UTC"));
        let end = enc.finish().unwrap();
        let messages: Vec<Bytes> = end.messages().collect();
        assert_eq!(messages.len(), 1);
        assert!(messages[0].starts_with(BINARY_HEADER));
        assert_eq!(&messages[0][BINARY_HEADER.len() + 8..], &[0xff, 0xff]);
    }
}
