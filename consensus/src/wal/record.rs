//! Record framing shared by WAL segments and the metadata file:
//! `[len u32 LE][crc32c u32 LE][kind u8][payload; len bytes]`, where the checksum covers
//! `kind` and `payload`. Decoding tells three endings apart, because recovery treats them
//! differently: a clean end, a torn record (the file ends inside it, or the rest of the file is
//! zeros — what a crash mid-append leaves behind), and a complete record that is wrong
//! (corruption).

use crate::error::{Error, Result};

/// Bytes before the payload: length, checksum and kind.
pub(crate) const HEADER_LEN: usize = 9;

/// What a record holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Kind {
    /// A protobuf `eraftpb::Entry`.
    Entry = 1,
    /// A protobuf `eraftpb::HardState`.
    HardState = 2,
    /// A protobuf `eraftpb::SnapshotMetadata`: the compaction point (metadata file only).
    Meta = 3,
}

impl Kind {
    fn from_u8(b: u8) -> Option<Kind> {
        match b {
            1 => Some(Kind::Entry),
            2 => Some(Kind::HardState),
            3 => Some(Kind::Meta),
            _ => None,
        }
    }
}

/// Appends one framed record holding `msg` to `buf`.
pub(crate) fn encode(buf: &mut Vec<u8>, kind: Kind, msg: &impl protobuf::Message) -> Result<()> {
    let start = buf.len();
    buf.extend_from_slice(&[0u8; 8]);
    buf.push(kind as u8);
    msg.write_to_vec(buf)?;
    let len = u32::try_from(buf.len() - start - HEADER_LEN).map_err(|_| {
        buf.truncate(start);
        Error::Config("log record larger than 4 GiB".into())
    })?;
    let crc = crc32c::crc32c(&buf[start + 8..]);
    buf[start..start + 4].copy_from_slice(&len.to_le_bytes());
    buf[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
    Ok(())
}

/// The outcome of decoding at one position.
#[derive(Debug)]
pub(crate) enum Decoded<'a> {
    /// A valid record; `size` is its framed length.
    Record {
        kind: Kind,
        payload: &'a [u8],
        size: usize,
    },
    /// Nothing left.
    End,
    /// An incomplete record or a zero-filled tail: a write the crash interrupted.
    Torn,
    /// A complete record (`size` bytes framed) that fails its checksum or has an unknown kind.
    Corrupt { reason: String, size: usize },
}

/// Decodes the record at the start of `buf`.
pub(crate) fn decode(buf: &[u8]) -> Decoded<'_> {
    if buf.is_empty() {
        return Decoded::End;
    }
    if buf.len() < HEADER_LEN {
        return Decoded::Torn;
    }
    let word = |at: usize| u32::from_le_bytes([buf[at], buf[at + 1], buf[at + 2], buf[at + 3]]);
    let (len, crc) = (word(0) as usize, word(4));
    let size = HEADER_LEN.saturating_add(len);
    if size > buf.len() {
        return Decoded::Torn;
    }
    if crc32c::crc32c(&buf[8..size]) != crc {
        if buf.iter().all(|b| *b == 0) {
            return Decoded::Torn;
        }
        return Decoded::Corrupt {
            reason: format!("checksum mismatch in a {len}-byte record"),
            size,
        };
    }
    match Kind::from_u8(buf[8]) {
        Some(kind) => Decoded::Record {
            kind,
            payload: &buf[HEADER_LEN..size],
            size,
        },
        None => Decoded::Corrupt {
            reason: format!("unknown record kind {}", buf[8]),
            size,
        },
    }
}

/// Parses a record's payload, reporting failure as corruption at `file`/`offset`.
pub(crate) fn parse<M: protobuf::Message>(
    payload: &[u8],
    file: &std::path::Path,
    offset: u64,
) -> Result<M> {
    M::parse_from_bytes(payload).map_err(|e| Error::Corrupt {
        file: file.to_path_buf(),
        offset,
        reason: format!("undecodable payload: {e}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use protobuf::Message as _;
    use raft::eraftpb::HardState;

    fn hs(term: u64) -> HardState {
        HardState {
            term,
            vote: 1,
            commit: 7,
            ..Default::default()
        }
    }

    #[test]
    fn round_trip_and_endings() {
        let mut buf = Vec::new();
        encode(&mut buf, Kind::HardState, &hs(3)).unwrap();
        let first = buf.len();
        encode(&mut buf, Kind::HardState, &hs(4)).unwrap();

        let Decoded::Record {
            kind,
            payload,
            size,
        } = decode(&buf)
        else {
            panic!("expected a record");
        };
        assert_eq!((kind, size), (Kind::HardState, first));
        assert_eq!(HardState::parse_from_bytes(payload).unwrap(), hs(3));
        assert!(matches!(decode(&buf[first..]), Decoded::Record { .. }));
        assert!(matches!(decode(&buf[buf.len()..]), Decoded::End));
        assert!(matches!(decode(&buf[..first - 1]), Decoded::Torn));
        assert!(matches!(decode(&buf[..3]), Decoded::Torn));
        assert!(matches!(decode(&[0u8; 64]), Decoded::Torn));

        let mut bad = buf.clone();
        bad[HEADER_LEN + 1] ^= 0x40;
        assert!(matches!(decode(&bad), Decoded::Corrupt { size, .. } if size == first));
    }
}
