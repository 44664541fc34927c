//! The check after the load: stream `w` read back (`COPY (SELECT offset, k FROM w) TO
//! STDOUT`) and compared with what the writers were told. Sluice promises that every
//! acknowledged `(k, offset)` is there exactly at that offset, that offsets are gapless from
//! 0, that a write refused as not applied is not there, and that nothing else appears; a
//! write with an unknown outcome may be there (once) or not.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use futures::StreamExt;

use super::login;

/// How long reading the stream back may take.
pub const READ_TIMEOUT: Duration = Duration::from_secs(600);
/// Examples kept of each kind of problem.
const EXAMPLES: usize = 5;

/// Rows of `w` as `(offset, k)`, in the order they came.
pub async fn read_back(port: u16) -> Result<Vec<(i64, i64)>, String> {
    let read = async {
        let client = login::session(port, None).await?;
        let out = client
            .copy_out("COPY (SELECT offset, k FROM w) TO STDOUT")
            .await
            .map_err(|e| format!("COPY: {e}"))?;
        let mut out = std::pin::pin!(out);
        let mut text = Vec::new();
        while let Some(chunk) = out.next().await {
            text.extend_from_slice(&chunk.map_err(|e| format!("COPY data: {e}"))?);
        }
        parse_rows(&text)
    };
    tokio::time::timeout(READ_TIMEOUT, read)
        .await
        .map_err(|_| format!("reading w back took over {READ_TIMEOUT:?}"))?
}

/// `offset<TAB>k` lines.
fn parse_rows(text: &[u8]) -> Result<Vec<(i64, i64)>, String> {
    let text = std::str::from_utf8(text).map_err(|e| format!("COPY text: {e}"))?;
    text.lines()
        .map(|line| {
            let (o, k) = line
                .split_once('\t')
                .ok_or_else(|| format!("bad COPY line {line:?}"))?;
            let num = |s: &str| {
                s.parse::<i64>()
                    .map_err(|e| format!("bad COPY line {line:?}: {e}"))
            };
            Ok((num(o)?, num(k)?))
        })
        .collect()
}

/// What the comparison found.
#[derive(Clone, Debug, Default)]
pub struct Check {
    pub rows: usize,
    pub acknowledged: usize,
    /// Acknowledged and not there.
    pub lost: usize,
    /// Acknowledged and there at another offset.
    pub moved: usize,
    /// Keys there more than once.
    pub duplicated: usize,
    /// Refused as not applied, and there.
    pub refused_present: usize,
    /// Never attempted (by the writers), and there.
    pub phantom: usize,
    /// Offsets out of place (gaps, repeats).
    pub misplaced_offsets: usize,
    pub unknown_present: usize,
    pub unknown_absent: usize,
    pub examples: Vec<String>,
}

impl Check {
    /// Every broken promise, one line each; empty when all is well.
    pub fn problems(&self) -> Vec<String> {
        let mut p = Vec::new();
        for (n, what) in [
            (self.lost, "acknowledged rows lost"),
            (self.moved, "acknowledged rows at another offset"),
            (self.duplicated, "keys present more than once"),
            (
                self.refused_present,
                "rows refused as not applied but present",
            ),
            (self.phantom, "rows nobody wrote"),
            (
                self.misplaced_offsets,
                "offsets out of place (not gapless from 0)",
            ),
        ] {
            if n > 0 {
                p.push(format!("{n} {what}"));
            }
        }
        if !p.is_empty() && !self.examples.is_empty() {
            p.push(format!("examples: {}", self.examples.join("; ")));
        }
        p
    }
}

/// Compares `rows` (`(offset, k)`) with the writers' acknowledged `(k, offset)`, the keys of
/// unknown outcome and the keys refused as not applied.
pub fn check(
    mut rows: Vec<(i64, i64)>,
    acks: &[(i64, i64)],
    unknown: &[i64],
    refused: &[i64],
) -> Check {
    let mut c = Check {
        rows: rows.len(),
        acknowledged: acks.len(),
        ..Check::default()
    };
    let note = |examples: &mut Vec<String>, s: String| {
        if examples.len() < EXAMPLES * 4 {
            examples.push(s);
        }
    };
    rows.sort_unstable();
    for (i, (offset, _)) in rows.iter().enumerate() {
        if *offset != i as i64 {
            c.misplaced_offsets += 1;
            if c.misplaced_offsets <= EXAMPLES {
                note(&mut c.examples, format!("row {i} has offset {offset}"));
            }
        }
    }
    let mut at: HashMap<i64, i64> = HashMap::with_capacity(rows.len());
    for &(offset, k) in &rows {
        if at.insert(k, offset).is_some() {
            c.duplicated += 1;
            if c.duplicated <= EXAMPLES {
                note(&mut c.examples, format!("k {k} again at offset {offset}"));
            }
        }
    }
    for &(k, offset) in acks {
        match at.get(&k) {
            None => {
                c.lost += 1;
                if c.lost <= EXAMPLES {
                    note(
                        &mut c.examples,
                        format!("k {k} acknowledged at {offset} is missing"),
                    );
                }
            }
            Some(&found) if found != offset => {
                c.moved += 1;
                if c.moved <= EXAMPLES {
                    note(
                        &mut c.examples,
                        format!("k {k} acknowledged at {offset} is at {found}"),
                    );
                }
            }
            Some(_) => {}
        }
    }
    let acked: HashSet<i64> = acks.iter().map(|a| a.0).collect();
    let unknown: HashSet<i64> = unknown.iter().copied().collect();
    let refused: HashSet<i64> = refused.iter().copied().collect();
    for (&k, &offset) in &at {
        if acked.contains(&k) {
            continue;
        }
        if unknown.contains(&k) {
            c.unknown_present += 1;
        } else if refused.contains(&k) {
            c.refused_present += 1;
            if c.refused_present <= EXAMPLES {
                note(&mut c.examples, format!("refused k {k} is at {offset}"));
            }
        } else {
            c.phantom += 1;
            if c.phantom <= EXAMPLES {
                note(&mut c.examples, format!("unwritten k {k} is at {offset}"));
            }
        }
    }
    c.unknown_absent = unknown.len() - c.unknown_present;
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_faithful_stream_has_no_problem() {
        let rows = vec![(1, 11), (0, 10), (2, 12)];
        let c = check(rows, &[(10, 0), (11, 1)], &[12, 13], &[14]);
        assert!(c.problems().is_empty(), "{:?}", c.problems());
        assert_eq!((c.unknown_present, c.unknown_absent), (1, 1));
    }

    #[test]
    fn every_broken_promise_is_found() {
        // offset 2 missing (gap), k 10 twice, k 11 lost, k 12 moved, 14 refused, 99 phantom
        let rows = vec![(0, 10), (1, 10), (3, 12), (4, 14), (5, 99)];
        let c = check(rows, &[(10, 0), (11, 1), (12, 2)], &[], &[14]);
        assert_eq!(c.lost, 1);
        assert_eq!(c.moved, 2, "k 10 is found at 1 (its last row), k 12 at 3");
        assert_eq!(c.duplicated, 1);
        assert_eq!(c.refused_present, 1);
        assert_eq!(c.phantom, 1);
        assert_eq!(c.misplaced_offsets, 3);
        assert!(c.problems().len() > 5);
    }

    #[test]
    fn copy_lines_parse() {
        assert_eq!(
            parse_rows(b"0\t5\n1\t7\n").expect("rows"),
            vec![(0, 5), (1, 7)]
        );
        assert!(parse_rows(b"0 5\n").is_err());
    }
}
