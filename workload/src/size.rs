//! Sizes on the command line: bytes (`0`, `1000000`, `512MiB`, `2GiB`, `1.5GB`) and short
//! durations (`0`, `200us`, `0.2ms`, `1.5ms`, `0.01s`).

use crate::error::WorkloadError;

/// The leading decimal number of `text` and the unit after it (`"1.5 GiB"` → `(1.5,
/// "GiB")`), or why there is none.
fn number_and_unit(text: &str) -> Result<(f64, &str), &'static str> {
    let trimmed = text.trim();
    let split = trimmed
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(split);
    if number.is_empty() {
        return Err("no number");
    }
    let value: f64 = number.parse().map_err(|_| "not a number")?;
    Ok((value, unit.trim()))
}

/// Parses a byte size. Binary (KiB, MiB, GiB, TiB) and decimal (KB, MB, GB, TB) units;
/// a bare number is bytes.
pub fn parse_bytes(text: &str) -> Result<u64, WorkloadError> {
    let bad = |reason: &str| WorkloadError::BadSize {
        value: text.to_string(),
        reason: reason.to_string(),
    };
    let (value, unit) = number_and_unit(text).map_err(bad)?;
    let scale: f64 = match unit {
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

/// The longest delay `--add-latency` accepts: 10 s (a slower workload is a different
/// workload, not a planted slowdown).
pub const MAX_DELAY: std::time::Duration = std::time::Duration::from_secs(10);

/// Parses a short duration for `--add-latency`: a number and a unit (`ns`, `us` or `µs`,
/// `ms`, `s`); a bare `0` is no delay. At most [`MAX_DELAY`].
pub fn parse_delay(text: &str) -> Result<std::time::Duration, WorkloadError> {
    parse_duration("--add-latency", text, MAX_DELAY, "examples: 0, 200us, 0.2ms, 1.5ms")
}

/// The longest time from readiness `--inject-fault-after`, `--crash-after` and
/// `--grow-memory` accept.
pub const MAX_EVENT_TIME: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

/// Parses `--inject-fault-after`: a duration from readiness, e.g. `5s`, at most a day.
pub fn parse_fault_after(text: &str) -> Result<std::time::Duration, WorkloadError> {
    parse_event_after("--inject-fault-after", text)
}

/// Parses `--crash-after`: a duration from readiness, e.g. `5s`, at most a day.
pub fn parse_crash_after(text: &str) -> Result<std::time::Duration, WorkloadError> {
    parse_event_after("--crash-after", text)
}

/// A time from readiness for an event flag, at most [`MAX_EVENT_TIME`].
fn parse_event_after(flag: &'static str, text: &str) -> Result<std::time::Duration, WorkloadError> {
    parse_duration(flag, text, MAX_EVENT_TIME, "examples: 500ms, 5s, 30s")
}

/// Parses `--grow-memory`: `AFTER:SIZE[,AFTER:SIZE…]`, times from readiness in order,
/// e.g. `5s:8GiB,10s:8GiB`.
pub fn parse_grow_schedule(text: &str) -> Result<Vec<(std::time::Duration, u64)>, WorkloadError> {
    const FLAG: &str = "--grow-memory";
    const HINT: &str = "expected AFTER:SIZE[,AFTER:SIZE…], e.g. 5s:8GiB,10s:8GiB";
    let bad = |reason: String| WorkloadError::BadDelay {
        flag: FLAG,
        value: text.to_string(),
        reason,
    };
    let mut out: Vec<(std::time::Duration, u64)> = Vec::new();
    for part in text.split(',') {
        let (after, size) = part
            .split_once(':')
            .ok_or_else(|| bad(format!("`{}` has no ':'; {HINT}", part.trim())))?;
        let after = parse_duration(FLAG, after, MAX_EVENT_TIME, HINT).map_err(|e| bad(e.to_string()))?;
        let bytes = parse_bytes(size).map_err(|e| bad(e.to_string()))?;
        if bytes == 0 {
            return Err(bad(format!("`{}` grows by nothing", part.trim())));
        }
        if out.last().is_some_and(|(t, _)| *t > after) {
            return Err(bad("times must not go backwards".into()));
        }
        out.push((after, bytes));
    }
    Ok(out)
}

fn parse_duration(
    flag: &'static str,
    text: &str,
    max: std::time::Duration,
    hint: &str,
) -> Result<std::time::Duration, WorkloadError> {
    let bad = |reason: &str| WorkloadError::BadDelay {
        flag,
        value: text.to_string(),
        reason: format!("{reason} ({hint})"),
    };
    let (value, unit) = number_and_unit(text).map_err(bad)?;
    let scale = match unit {
        "" if value == 0.0 => 0.0,
        "" => return Err(bad("give a unit: ns, us, ms or s")),
        "ns" => 1e-9,
        "us" | "µs" => 1e-6,
        "ms" => 1e-3,
        "s" => 1.0,
        _ => return Err(bad("unknown unit: use ns, us, ms or s")),
    };
    let seconds = value * scale;
    if !seconds.is_finite() || seconds > max.as_secs_f64() {
        return Err(bad(&format!("longer than {}s", max.as_secs())));
    }
    Ok(std::time::Duration::from_secs_f64(seconds))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_delays_and_names_bad_ones() {
        use std::time::Duration;
        assert_eq!(parse_delay("0").ok(), Some(Duration::ZERO));
        assert_eq!(parse_delay("200us").ok(), Some(Duration::from_micros(200)));
        assert_eq!(parse_delay("200µs").ok(), Some(Duration::from_micros(200)));
        assert_eq!(parse_delay("0.2ms").ok(), Some(Duration::from_micros(200)));
        assert_eq!(parse_delay("1.5ms").ok(), Some(Duration::from_micros(1500)));
        assert_eq!(parse_delay("2s").ok(), Some(Duration::from_secs(2)));
        for bad in ["", "ms", "5", "0.2 parsecs", "11s", "-1ms", "1.2.3ms"] {
            let err = parse_delay(bad).err().map(|e| e.to_string()).unwrap_or_default();
            assert!(err.contains(&format!("`{bad}`")), "{bad}: {err}");
        }
        assert_eq!(parse_fault_after("5s").ok(), Some(Duration::from_secs(5)));
        assert!(parse_fault_after("2d").is_err());
    }

    #[test]
    fn grow_schedules_parse_in_order_and_bad_ones_are_named() {
        use std::time::Duration;
        assert_eq!(
            parse_grow_schedule("5s:8GiB,10s:1GiB").ok(),
            Some(vec![
                (Duration::from_secs(5), 8 << 30),
                (Duration::from_secs(10), 1 << 30)
            ])
        );
        for (bad, why) in [
            ("8GiB", "has no ':'"),
            ("5s:0", "grows by nothing"),
            ("10s:1GiB,5s:1GiB", "must not go backwards"),
            ("5:1GiB", "give a unit"),
            ("5s:lots", "`lots`"),
        ] {
            let err = parse_grow_schedule(bad)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(err.starts_with(&format!("bad --grow-memory `{bad}`: ")), "{err}");
            assert!(err.contains(why), "{why:?} not in {err}");
        }
    }

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
