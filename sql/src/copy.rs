//! COPY FROM STDIN: PostgreSQL's text and CSV formats into rows of fields.
//!
//! The parser works on a piece of a COPY's data that starts at a row (a staged COPY's
//! chunk, or all of a COPY held whole) and hands out its rows one at a time
//! ([`for_each_row`]), each field borrowed from the data unless unescaping changed it:
//! parsing holds one row, and a row at most one field more than the COPY takes. Errors
//! name the line, as PostgreSQL's do. A NULL is recognized before unescaping (text) or
//! only when unquoted (CSV), as in PostgreSQL.

use std::borrow::Cow;

use crate::error::{sqlstate, Error, Result};
use crate::statement::CopyFormat;

/// A row's fields (`None` = NULL), borrowed from the data unless unescaping changed them.
pub type Fields<'a> = Vec<Option<Cow<'a, str>>>;

/// Rows of fields.
pub type Rows<'a> = Vec<Fields<'a>>;

/// Split a COPY payload into rows of fields (`None` = NULL).
pub fn parse_rows<'a>(data: &'a str, format: &CopyFormat) -> Result<Rows<'a>> {
    parse_rows_until(data, format, 1).map(|(rows, _)| rows)
}

/// The rows of a piece of a COPY's data that starts at line `first_line` (errors name the
/// line in the whole COPY; a CSV header is skipped only in the piece at line 1), and whether
/// the piece holds the end-of-data marker (`\.` on a line of its own): nothing after it is
/// data, in this piece or any later one.
pub fn parse_rows_until<'a>(
    data: &'a str,
    format: &CopyFormat,
    first_line: usize,
) -> Result<(Rows<'a>, bool)> {
    let mut rows = Vec::new();
    let ended = for_each_row(data, format, first_line, usize::MAX, |fields| {
        rows.push(std::mem::take(fields));
        Ok(())
    })?;
    Ok((rows, ended))
}

/// The rows of a piece of a COPY's data (as [`parse_rows_until`]) handed to `row` one at a
/// time, in a vector it may take or leave (it is cleared for the next row): so parsing holds
/// one row, whatever the data. A row keeps at most `max_fields + 1` fields — the ones past
/// that are dropped unread, and the row still shows that it has too many. Returns whether
/// the end-of-data marker ended the data.
pub fn for_each_row<'a>(
    data: &'a str,
    format: &CopyFormat,
    first_line: usize,
    max_fields: usize,
    row: impl FnMut(&mut Fields<'a>) -> Result<()>,
) -> Result<bool> {
    let cap = max_fields.saturating_add(1);
    match format {
        CopyFormat::Text { delimiter, null } => {
            parse_text(data, *delimiter, null, first_line, cap, row)
        }
        CopyFormat::Csv {
            delimiter,
            quote,
            escape,
            null,
            header,
        } => {
            let one_byte = |c: char| u8::try_from(c).ok().filter(u8::is_ascii);
            let (Some(delim), Some(quote), Some(escape)) =
                (one_byte(*delimiter), one_byte(*quote), one_byte(*escape))
            else {
                return Err(Error::unsupported(
                    "COPY delimiter, quote and escape must be single one-byte characters",
                ));
            };
            let csv = Csv {
                delim,
                quote,
                escape,
                null,
                cap,
            };
            csv.parse(data, *header && first_line == 1, first_line, row)
        }
        CopyFormat::Binary => Err(Error::unsupported(
            "COPY FROM with FORMAT binary is not supported; use text or csv",
        )),
    }
}

/// How many bytes at the start of `data` (a COPY's data from a row's start) are whole rows:
/// up to and including the last newline that ends a row — in CSV, one outside quotes. 0 when
/// no row is complete yet, or for a format whose rows are not split here (binary, or CSV
/// with a quote or escape that is not one byte).
pub fn complete_rows_len(data: &[u8], format: &CopyFormat) -> usize {
    let end_after = |i: Option<usize>| i.map_or(0, |i| i + 1);
    match format {
        // a newline inside a text-format value is always escaped
        CopyFormat::Text { .. } => end_after(memchr::memrchr(b'\n', data)),
        CopyFormat::Csv { quote, escape, .. } => {
            let (Ok(quote), Ok(escape)) = (u8::try_from(*quote), u8::try_from(*escape)) else {
                return 0;
            };
            if !quote.is_ascii() || !escape.is_ascii() {
                return 0;
            }
            let mut quoted = false;
            let mut last = None;
            let mut i = 0;
            // only quotes, escapes and newlines matter: the bytes between are skipped
            while let Some(at) = memchr::memchr3(quote, escape, b'\n', &data[i..]) {
                i += at;
                let b = data[i];
                if quoted && b == escape && escape != quote && data.get(i + 1) == Some(&quote) {
                    i += 2;
                    continue;
                }
                if b == quote {
                    // a doubled quote inside quotes toggles out and back in
                    quoted = !quoted;
                } else if b == b'\n' && !quoted {
                    last = Some(i);
                }
                i += 1;
            }
            end_after(last)
        }
        CopyFormat::Binary => 0,
    }
}

fn parse_text<'a>(
    data: &'a str,
    delim: char,
    null: &str,
    first_line: usize,
    cap: usize,
    mut row: impl FnMut(&mut Fields<'a>) -> Result<()>,
) -> Result<bool> {
    let mut fields = Vec::new();
    let mut lines = data.split('\n').enumerate().peekable();
    while let Some((lineno, raw)) = lines.next() {
        let line = raw.strip_suffix('\r').unwrap_or(raw);
        if line == "\\." {
            return Ok(true);
        }
        if line.is_empty() && lines.peek().is_none() {
            continue;
        }
        fields.clear();
        if !line.contains('\\') {
            // no escapes: the fields are the text between delimiters
            let split = line.split(delim).take(cap);
            fields.extend(split.map(|f| (f != null).then_some(Cow::Borrowed(f))));
        } else {
            for f in split_unescaped(line, delim, cap) {
                if f == null {
                    fields.push(None);
                } else {
                    fields.push(Some(Cow::Owned(unescape(&f).map_err(|e| {
                        Error::new(sqlstate::CHARACTER_NOT_IN_REPERTOIRE, e)
                            .with_detail(format!("COPY line {}", lineno + first_line))
                    })?)));
                }
            }
        }
        row(&mut fields)?;
    }
    Ok(false)
}

/// Split on the delimiter, ignoring delimiters escaped with a backslash: at most `cap`
/// fields (the text past them is dropped).
fn split_unescaped(line: &str, delim: char, cap: usize) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if out.len() == cap {
            return out;
        }
        if c == '\\' {
            cur.push(c);
            if let Some(n) = chars.next() {
                cur.push(n);
            }
        } else if c == delim {
            out.push(std::mem::take(&mut cur));
        } else {
            cur.push(c);
        }
    }
    out.push(cur);
    out
}

/// The text format's backslash escapes decoded. The only failure is an escape that makes
/// bytes which are not UTF-8 (`\xff`): PostgreSQL's `22021`, not a malformed value.
fn unescape(f: &str) -> std::result::Result<String, String> {
    if !f.contains('\\') {
        return Ok(f.to_string());
    }
    let mut bytes = Vec::with_capacity(f.len());
    let b = f.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] != b'\\' || i + 1 >= b.len() {
            bytes.push(b[i]);
            i += 1;
            continue;
        }
        let c = b[i + 1];
        i += 2;
        match c {
            b'b' => bytes.push(8),
            b'f' => bytes.push(12),
            b'n' => bytes.push(b'\n'),
            b'r' => bytes.push(b'\r'),
            b't' => bytes.push(b'\t'),
            b'v' => bytes.push(11),
            b'0'..=b'7' => {
                let mut v = (c - b'0') as u32;
                let mut k = 0;
                while k < 2 && i < b.len() && (b'0'..=b'7').contains(&b[i]) {
                    v = v * 8 + (b[i] - b'0') as u32;
                    i += 1;
                    k += 1;
                }
                bytes.push(v as u8);
            }
            b'x' => {
                let mut v = 0u32;
                let mut k = 0;
                while k < 2 && i < b.len() && b[i].is_ascii_hexdigit() {
                    v = v * 16 + (b[i] as char).to_digit(16).unwrap_or(0);
                    i += 1;
                    k += 1;
                }
                bytes.push(v as u8);
            }
            other => bytes.push(other),
        }
    }
    String::from_utf8(bytes).map_err(|_| "invalid byte sequence for encoding \"UTF8\"".to_string())
}

fn at_line(msg: String, line: usize) -> Error {
    Error::new(sqlstate::INVALID_TEXT_REPRESENTATION, msg).with_detail(format!("COPY line {line}"))
}

/// The CSV format's one-byte special characters.
struct Csv<'n> {
    delim: u8,
    quote: u8,
    escape: u8,
    null: &'n str,
    /// Fields kept per row (see [`for_each_row`]).
    cap: usize,
}

/// A CSV field as it is read: borrowed while it is one span of the data, owned once a
/// doubled quote or an escape splits it.
struct Field<'a> {
    text: Cow<'a, str>,
    quoted: bool,
}

impl<'a> Field<'a> {
    fn new() -> Field<'a> {
        Field {
            text: Cow::Borrowed(""),
            quoted: false,
        }
    }

    fn push(&mut self, span: &'a str) {
        if span.is_empty() {
            return;
        }
        match &mut self.text {
            Cow::Borrowed(t) if t.is_empty() => *t = span,
            text => text.to_mut().push_str(span),
        }
    }

    fn push_quote(&mut self, quote: u8) {
        self.text.to_mut().push(quote as char);
    }

    /// The field's value: NULL when unquoted and equal to the NULL string.
    fn value(self, null: &str) -> Option<Cow<'a, str>> {
        (self.quoted || self.text != null).then_some(self.text)
    }
}

impl Csv<'_> {
    fn parse<'a>(
        &self,
        data: &'a str,
        header: bool,
        first_line: usize,
        mut sink: impl FnMut(&mut Fields<'a>) -> Result<()>,
    ) -> Result<bool> {
        let mut row = Vec::new();
        let mut i = 0;
        let mut line = first_line;
        let mut first = true;
        while i < data.len() {
            row.clear();
            let (field, ended_line) = self.row(data, &mut i, &mut line, &mut row)?;
            if !field.quoted && row.is_empty() && field.text == "\\." {
                return Ok(true);
            }
            if row.len() < self.cap {
                row.push(field.value(self.null));
            }
            line += 1;
            if first && header {
                first = false;
                continue;
            }
            first = false;
            if !(row.len() == 1 && row[0].is_none() && !ended_line && self.null.is_empty()) {
                sink(&mut row)?;
            }
        }
        Ok(false)
    }

    /// The row at `*i` (a row's start), read up to its end: its fields but the last into
    /// `row` (at most `cap`), the last returned, and whether a newline ended it (else the data did). `line` counts the newlines
    /// inside quotes. Only the special bytes are looked at: every one is ASCII, so each
    /// position is a character boundary and the text between them is taken as spans.
    fn row<'a>(
        &self,
        data: &'a str,
        i: &mut usize,
        line: &mut usize,
        row: &mut Fields<'a>,
    ) -> Result<(Field<'a>, bool)> {
        let b = data.as_bytes();
        let (quote, escape) = (self.quote, self.escape);
        let mut field = Field::new();
        let mut in_quotes = false;
        let mut span = *i;
        loop {
            let next = match (in_quotes, escape == quote) {
                (true, true) => memchr::memchr2(quote, b'\n', &b[*i..]),
                (true, false) => memchr::memchr3(quote, escape, b'\n', &b[*i..]),
                (false, _) => memchr::memchr3(quote, self.delim, b'\n', &b[*i..]),
            };
            let Some(at) = next else {
                *i = b.len();
                if in_quotes {
                    return Err(at_line("unterminated CSV quoted field".into(), *line));
                }
                field.push(&data[span..]);
                return Ok((field, false));
            };
            *i += at;
            let c = b[*i];
            if in_quotes {
                if c == escape && escape != quote && b.get(*i + 1) == Some(&quote) {
                    field.push(&data[span..*i]);
                    field.push_quote(quote);
                    *i += 2;
                    span = *i;
                } else if c == quote {
                    field.push(&data[span..*i]);
                    if escape == quote && b.get(*i + 1) == Some(&quote) {
                        field.push_quote(quote);
                        *i += 2;
                    } else {
                        in_quotes = false;
                        *i += 1;
                    }
                    span = *i;
                } else {
                    // a newline, or an escape before no quote: both are data here
                    *line += usize::from(c == b'\n');
                    *i += 1;
                }
            } else if c == quote {
                field.push(&data[span..*i]);
                in_quotes = true;
                field.quoted = true;
                *i += 1;
                span = *i;
            } else if c == self.delim {
                field.push(&data[span..*i]);
                let done = std::mem::replace(&mut field, Field::new());
                if row.len() < self.cap {
                    row.push(done.value(self.null));
                }
                *i += 1;
                span = *i;
            } else {
                // the newline that ends the row; a CR just before it (outside quotes) goes
                let end = if *i > span && b[*i - 1] == b'\r' {
                    *i - 1
                } else {
                    *i
                };
                field.push(&data[span..end]);
                *i += 1;
                return Ok((field, true));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text() -> CopyFormat {
        CopyFormat::Text {
            delimiter: '\t',
            null: "\\N".into(),
        }
    }

    fn csv_field(field: String, was_quoted: bool, null: &str) -> Option<String> {
        (was_quoted || field != null).then_some(field)
    }

    /// Rows with every field owned, to compare with the reference's.
    fn owned(rows: Rows<'_>) -> Vec<Vec<Option<String>>> {
        rows.into_iter()
            .map(|r| r.into_iter().map(|f| f.map(Cow::into_owned)).collect())
            .collect()
    }

    fn csv() -> CopyFormat {
        CopyFormat::Csv {
            delimiter: ',',
            quote: '"',
            escape: '"',
            null: String::new(),
            header: false,
        }
    }

    /// The CSV parser before it worked on bytes (one char at a time): the reference the
    /// byte parser must agree with.
    #[allow(clippy::too_many_arguments)]
    fn reference_csv(
        data: &str,
        delim: char,
        quote: char,
        escape: char,
        null: &str,
        header: bool,
    ) -> Result<Vec<Vec<Option<String>>>> {
        let mut rows = Vec::new();
        let mut chars = data.chars().peekable();
        let mut line = 1usize;
        let mut first = true;
        loop {
            if chars.peek().is_none() {
                break;
            }
            // end-of-data marker
            let mut row: Vec<Option<String>> = Vec::new();
            let mut field = String::new();
            let mut quoted = false;
            let mut was_quoted = false;
            let mut ended_line = false;
            while let Some(c) = chars.next() {
                if quoted {
                    if c == escape && escape != quote && chars.peek() == Some(&quote) {
                        field.push(quote);
                        chars.next();
                    } else if c == quote {
                        if escape == quote && chars.peek() == Some(&quote) {
                            field.push(quote);
                            chars.next();
                        } else {
                            quoted = false;
                        }
                    } else {
                        if c == '\n' {
                            line += 1;
                        }
                        field.push(c);
                    }
                } else if c == quote {
                    quoted = true;
                    was_quoted = true;
                } else if c == delim {
                    row.push(csv_field(std::mem::take(&mut field), was_quoted, null));
                    was_quoted = false;
                } else if c == '\n' {
                    ended_line = true;
                    break;
                } else if c == '\r' && chars.peek() == Some(&'\n') {
                    continue;
                } else {
                    field.push(c);
                }
            }
            if quoted {
                return Err(at_line("unterminated CSV quoted field".into(), line));
            }
            if !was_quoted && row.is_empty() && field == "\\." {
                break;
            }
            row.push(csv_field(field, was_quoted, null));
            line += 1;
            if first && header {
                first = false;
                continue;
            }
            first = false;
            if !(row.len() == 1 && row[0].is_none() && !ended_line && null.is_empty()) {
                rows.push(row);
            }
        }
        Ok(rows)
    }

    /// Random CSV from a small alphabet of the bytes that matter (quotes, escapes,
    /// delimiters, CR, LF, the end marker, multi-byte text).
    fn random_csv(rng: &mut impl rand::Rng, quote: char, escape: char) -> String {
        let pieces = [
            "a", "bc", ",", ";", "\n", "\r\n", "\r", "é", "日本", "\\.", "\\", " ",
        ];
        let mut out = String::new();
        for _ in 0..rng.gen_range(0..60) {
            match rng.gen_range(0..10) {
                0 => out.push(quote),
                1 => out.push(escape),
                _ => out.push_str(pieces[rng.gen_range(0..pieces.len())]),
            }
        }
        out
    }

    /// The byte parser gives what the char parser gave, rows or error, on random CSV; and
    /// COPY data cut at `complete_rows_len` parses, piece by piece, into the same rows.
    #[test]
    fn csv_on_bytes_agrees_with_the_reference_and_splits_at_row_ends() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(25);
        for case in 0..20_000 {
            let (quote, escape) = match case % 3 {
                0 => ('"', '"'),
                1 => ('"', '\\'),
                _ => ('\'', '\''),
            };
            let data = random_csv(&mut rng, quote, escape);
            let header = case % 7 == 0;
            let null = if case % 5 == 0 { "\\N" } else { "" };
            let delimiter = if case % 4 == 3 { ';' } else { ',' };
            let format = CopyFormat::Csv {
                delimiter,
                quote,
                escape,
                null: null.into(),
                header,
            };
            let got = parse_rows_until(&data, &format, 1).map(|(rows, _)| owned(rows));
            let want = reference_csv(&data, delimiter, quote, escape, null, header);
            match (&got, &want) {
                (Ok(g), Ok(w)) => assert_eq!(g, w, "{data:?}"),
                (Err(g), Err(w)) => assert_eq!(
                    (&g.code, &g.message, &g.detail),
                    (&w.code, &w.message, &w.detail),
                    "{data:?}"
                ),
                _ => panic!("{data:?}: byte parser {got:?}, reference {want:?}"),
            }
            // pieces cut where complete_rows_len says parse into the whole's rows
            let Ok(whole) = got else { continue };
            let mut rest = data.as_bytes();
            let mut line = 1;
            let mut pieces = Vec::new();
            while !rest.is_empty() {
                let take = rng.gen_range(1..=rest.len());
                let n = complete_rows_len(&rest[..take], &format);
                let n = if n == 0 { rest.len() } else { n };
                let piece = std::str::from_utf8(&rest[..n]).expect("cut at a newline");
                let (rows, ended) = parse_rows_until(piece, &format, line).expect("a piece parses");
                pieces.extend(owned(rows));
                if ended {
                    break; // as a COPY in chunks stops at the end marker
                }
                line += piece.matches('\n').count();
                rest = &rest[n..];
            }
            assert_eq!(pieces, whole, "{data:?}");
        }
    }

    #[test]
    fn escapes_that_make_bytes_which_are_not_utf8_are_22021_as_in_postgres() {
        // PostgreSQL: ERROR: invalid byte sequence for encoding "UTF8": 0xff (22021)
        for data in ["a\\xff\n", "\\377b\n", "ok\t\\xc3\n"] {
            let e = parse_rows(data, &text()).unwrap_err();
            assert_eq!(e.code, "22021", "{data:?}: {}", e.message);
            assert!(e.message.contains("UTF8"), "{}", e.message);
        }
        // a valid two-byte sequence written as escapes is fine
        let rows = parse_rows("\\xc3\\xa9\n", &text()).unwrap();
        assert_eq!(rows[0], vec![Some("é".into())]);
    }

    #[test]
    fn text_format_escapes_and_nulls() {
        let rows = parse_rows("a\\tb\t\\N\t1\nx\\\\y\t\t2\n\\.\n", &text()).unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0], vec![Some("a\tb".into()), None, Some("1".into())]);
        assert_eq!(
            rows[1],
            vec![Some("x\\y".into()), Some("".into()), Some("2".into())]
        );
    }

    #[test]
    fn csv_quotes_and_nulls() {
        let rows = parse_rows(
            "\"a,b\",,\"\"\n\"he said \"\"hi\"\"\",x,\"multi\nline\"\n",
            &csv(),
        )
        .unwrap();
        assert_eq!(rows[0], vec![Some("a,b".into()), None, Some("".into())]);
        assert_eq!(
            rows[1],
            vec![
                Some("he said \"hi\"".into()),
                Some("x".into()),
                Some("multi\nline".into())
            ]
        );
        assert!(parse_rows("\"open\n", &csv()).is_err());
    }
}
