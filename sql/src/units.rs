//! Durations and sizes as stream options and settings spell them
//! (`'7 days'`, `'500ms'`, `'64MB'`): a number, optionally fractional, then
//! an optional unit. A value that does not read as one is `22023`.

use crate::error::{sqlstate, Error, Result};

/// `'7 days'`, `'2 minutes'`, `'500ms'`, `'10s'` → milliseconds.
pub fn parse_duration_ms(s: &str) -> Result<u64> {
    let t = s.trim().to_lowercase();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num.parse().map_err(|_| {
        Error::new(
            sqlstate::INVALID_PARAMETER_VALUE,
            format!("invalid duration \"{s}\""),
        )
    })?;
    let mult = match unit.trim() {
        "" | "ms" | "millisecond" | "milliseconds" => 1.0,
        "s" | "sec" | "secs" | "second" | "seconds" => 1e3,
        "min" | "mins" | "minute" | "minutes" => 60e3,
        "h" | "hour" | "hours" => 3600e3,
        "d" | "day" | "days" => 86400e3,
        "w" | "week" | "weeks" => 7.0 * 86400e3,
        _ => {
            return Err(Error::new(
                sqlstate::INVALID_PARAMETER_VALUE,
                format!("invalid duration \"{s}\""),
            ))
        }
    };
    Ok((n * mult) as u64)
}

/// `'10 GB'`, `'64MB'`, `'4096'` → bytes.
pub fn parse_bytes(s: &str) -> Result<u64> {
    let t = s.trim().to_lowercase();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num.parse().map_err(|_| {
        Error::new(
            sqlstate::INVALID_PARAMETER_VALUE,
            format!("invalid size \"{s}\""),
        )
    })?;
    let mult = match unit.trim() {
        "" | "b" | "bytes" => 1.0,
        "kb" | "kib" | "k" => 1024.0,
        "mb" | "mib" | "m" => 1024.0 * 1024.0,
        "gb" | "gib" | "g" => 1024.0 * 1024.0 * 1024.0,
        "tb" | "tib" | "t" => 1024.0f64.powi(4),
        _ => {
            return Err(Error::new(
                sqlstate::INVALID_PARAMETER_VALUE,
                format!("invalid size \"{s}\""),
            ))
        }
    };
    Ok((n * mult) as u64)
}
