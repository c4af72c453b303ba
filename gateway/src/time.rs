//! Times in the `/ingest` query string: Unix seconds, milliseconds, microseconds or nanoseconds
//! (told apart by magnitude), or `now`, `now-1h` style offsets; and durations (`30d`, `12h`:
//! tokens' lifetimes, the tenant file's, compaction levels' ages).

use std::time::{SystemTime, UNIX_EPOCH};

/// Now, in Unix nanoseconds.
pub fn now_nanos() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}

/// Parses a time parameter into Unix nanoseconds.
pub fn parse_time(s: &str, now: i64) -> Option<i64> {
    let s = s.trim();
    if let Some(rest) = s.strip_prefix("now") {
        if rest.is_empty() {
            return Some(now);
        }
        let rest = rest.strip_prefix('-')?;
        let (num, unit) = rest.split_at(rest.find(|c: char| !c.is_ascii_digit())?);
        let n: i64 = num.parse().ok()?;
        let unit_nanos: i64 = match unit {
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            "d" => 86_400_000_000_000,
            _ => return None,
        };
        return now.checked_sub(n.checked_mul(unit_nanos)?);
    }
    let v: i64 = s.parse().ok()?;
    if v < 0 {
        return None;
    }
    match v {
        v if v < 100_000_000_000 => v.checked_mul(1_000_000_000),
        v if v < 100_000_000_000_000 => v.checked_mul(1_000_000),
        v if v < 100_000_000_000_000_000 => v.checked_mul(1_000),
        v => Some(v),
    }
}

/// Parses `30d`, `12h`, `15m`, `90s` or plain seconds ([`crate::units::secs`]).
pub fn parse_duration_secs(s: &str) -> Option<u64> {
    crate::units::secs(s).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_units_agree() {
        let want = 1_795_234_556_000_000_000;
        for s in [
            "1795234556",
            "1795234556000",
            "1795234556000000",
            "1795234556000000000",
        ] {
            assert_eq!(parse_time(s, 0), Some(want), "{s}");
        }
        assert_eq!(parse_time("now", 42), Some(42));
        assert_eq!(parse_time("now-1h", 3_600_000_000_001), Some(1));
        assert_eq!(parse_time("yesterday", 0), None);
        assert_eq!(parse_time("-5", 0), None);
        assert_eq!(parse_time("10000000000", 0), None, "overflows as seconds");
        assert_eq!(parse_time("now-999999999999d", 0), None);
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration_secs("30d"), Some(30 * 86_400));
        assert_eq!(parse_duration_secs("90"), Some(90));
        assert_eq!(parse_duration_secs("3x"), None);
    }
}
