//! Byte sizes on the command line: `0`, `1000000`, `512MiB`, `2GiB`, `1.5GB`.

use crate::error::WorkloadError;

/// Parses a byte size. Binary (KiB, MiB, GiB, TiB) and decimal (KB, MB, GB, TB) units;
/// a bare number is bytes.
pub fn parse_bytes(text: &str) -> Result<u64, WorkloadError> {
    let bad = |reason: &str| WorkloadError::BadSize {
        value: text.to_string(),
        reason: reason.to_string(),
    };
    let trimmed = text.trim();
    let split = trimmed
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(split);
    if number.is_empty() {
        return Err(bad("no number"));
    }
    let value: f64 = number.parse().map_err(|_| bad("not a number"))?;
    let scale: f64 = match unit.trim() {
        "" | "B" => 1.0,
        "KiB" => 1024.0,
        "MiB" => 1024.0 * 1024.0,
        "GiB" => 1024.0 * 1024.0 * 1024.0,
        "TiB" => 1024.0f64.powi(4),
        "KB" | "kB" => 1e3,
        "MB" => 1e6,
        "GB" => 1e9,
        "TB" => 1e12,
        _ => return Err(bad("unknown unit")),
    };
    let bytes = value * scale;
    if !bytes.is_finite() || bytes > 1e15 {
        return Err(bad("too large"));
    }
    Ok(bytes.round() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units() {
        assert_eq!(parse_bytes("0").ok(), Some(0));
        assert_eq!(parse_bytes("1000000").ok(), Some(1_000_000));
        assert_eq!(parse_bytes("512MiB").ok(), Some(512 << 20));
        assert_eq!(parse_bytes("2GiB").ok(), Some(2 << 30));
        assert_eq!(parse_bytes("1.5GB").ok(), Some(1_500_000_000));
        assert_eq!(parse_bytes("3 KB").ok(), Some(3000));
    }

    #[test]
    fn rejects_nonsense_with_the_value_in_the_message() {
        for bad in ["", "GiB", "12XB", "1.2.3MiB", "-5"] {
            let err = parse_bytes(bad).err().map(|e| e.to_string()).unwrap_or_default();
            assert!(err.contains(&format!("`{bad}`")), "{bad}: {err}");
        }
    }
}
