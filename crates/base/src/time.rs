//! UTC time as nanoseconds since the Unix epoch, and its RFC 3339 text.
//!
//! Locks: none.

use std::time::{SystemTime, UNIX_EPOCH};

pub fn now_ns() -> i64 {
    match SystemTime::now().duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_nanos() as i64,
        Err(e) => -(e.duration().as_nanos() as i64),
    }
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian
/// (Howard Hinnant's `civil_from_days`).
pub fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (`days_from_civil`).
pub fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = if m > 2 { m - 3 } else { m + 9 } as i64;
    let doy = (153 * mp + 2) / 5 + d as i64 - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Parses `2026-11-30T18:09:30Z`, also written `2026-11-30T18-09-30Z`
/// (no `:`, for file names), as nanoseconds since the epoch.
pub fn parse_utc(s: &str) -> Option<i64> {
    let b = s.as_bytes();
    if b.len() != 20 || b[4] != b'-' || b[7] != b'-' || b[10] != b'T' || b[19] != b'Z' {
        return None;
    }
    let sep = b[13];
    if !(sep == b':' || sep == b'-') || b[16] != sep {
        return None;
    }
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let t = s.get(r)?;
        if !t.bytes().all(|c| c.is_ascii_digit()) {
            return None;
        }
        t.parse().ok()
    };
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, se) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || se > 60 {
        return None;
    }
    let days = days_from_civil(y, mo as u32, d as u32);
    if civil_from_days(days) != (y, mo as u32, d as u32) {
        return None; // 2026-02-30 and the like
    }
    // Years up to 9999 pass the checks above, but `i64` nanoseconds end in
    // 2262: a later time is no time at all, never a wrapped one.
    let ns = ((days as i128 * 86_400) + (h * 3600 + mi * 60 + se) as i128) * 1_000_000_000;
    i64::try_from(ns).ok()
}

/// Parses an RFC 3339 time with an optional fraction of a second and an
/// offset, as Python's `datetime.isoformat()` writes it
/// (`2026-05-01T13:05:42.123456+00:00`, or `…Z`), as nanoseconds since
/// the epoch.
pub fn parse_rfc3339(s: &str) -> Option<i64> {
    let (head, rest) = (s.get(..19)?, s.get(19..)?);
    if head.as_bytes()[13] != b':' {
        return None;
    }
    let secs = parse_utc(&format!("{head}Z"))?;
    let (frac, zone) = match rest.strip_prefix('.') {
        Some(r) => {
            let n = r.bytes().take_while(u8::is_ascii_digit).count();
            (&r[..n], &r[n..])
        }
        None => ("", rest),
    };
    if (rest.starts_with('.') && frac.is_empty()) || frac.len() > 9 {
        return None;
    }
    let frac_ns: i64 = format!("{frac:0<9}").parse().ok()?;
    let offset_s: i64 = match zone.as_bytes() {
        b"Z" | b"z" => 0,
        [sign @ (b'+' | b'-'), h1, h2, b':', m1, m2] => {
            let num = |a: u8, b: u8| -> Option<i64> {
                (a.is_ascii_digit() && b.is_ascii_digit())
                    .then(|| i64::from((a - b'0') * 10 + (b - b'0')))
            };
            let (h, m) = (num(*h1, *h2)?, num(*m1, *m2)?);
            if h > 23 || m > 59 {
                return None;
            }
            let off = h * 3600 + m * 60;
            if *sign == b'+' { off } else { -off }
        }
        _ => return None,
    };
    // `+02:00` is two hours ahead of UTC: UTC is the local time less it.
    secs.checked_sub(offset_s.checked_mul(1_000_000_000)?)?
        .checked_add(frac_ns)
}

/// `2026-11-30T18:09:30Z` (seconds precision).
pub fn format_utc(ns: i64) -> String {
    let secs = ns.div_euclid(1_000_000_000);
    let days = secs.div_euclid(86_400);
    let sod = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        sod / 3600,
        (sod / 60) % 60,
        sod % 60
    )
}

/// A duration in the largest whole unit that fits: `7d`, `12h`, `90s`
/// (the units `--park-max-age` takes).
pub fn format_age(ns: i64) -> String {
    let s = ns.max(0) / 1_000_000_000;
    for (unit, secs) in [("d", 86_400), ("h", 3600), ("m", 60)] {
        if s >= secs && s % secs == 0 {
            return format!("{}{unit}", s / secs);
        }
    }
    format!("{s}s")
}

/// How long ago `ns` was, in the largest unit that counts it: `5 minutes
/// ago`, `3 days ago` (`in the future` for a clock stepped back).
pub fn ago(ns: i64, now: i64) -> String {
    let s = now.saturating_sub(ns) / 1_000_000_000;
    if s < 0 {
        return "in the future".to_string();
    }
    let (n, unit) = match s {
        0..60 => (s, "second"),
        60..3600 => (s / 60, "minute"),
        3600..86_400 => (s / 3600, "hour"),
        _ => (s / 86_400, "day"),
    };
    format!("{n} {unit}{} ago", if n == 1 { "" } else { "s" })
}

/// `30s`, `10m`, `2h`, `7d` as nanoseconds.
pub fn parse_age(s: &str) -> Option<i64> {
    let s = s.trim();
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit())?);
    let n: i64 = num.parse().ok()?;
    let secs = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        "w" => 7 * 86_400,
        _ => return None,
    };
    n.checked_mul(secs)?.checked_mul(1_000_000_000)
}

/// Test hook, debug builds only: the pause the environment variable `var`
/// names, in milliseconds (a test holds a request that long to act in the
/// moment it opens). Always `None` in a release build.
pub fn test_pause(var: &str) -> Option<std::time::Duration> {
    if !cfg!(debug_assertions) {
        return None;
    }
    let ms = std::env::var(var).ok()?.parse().ok()?;
    Some(std::time::Duration::from_millis(ms))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_in_units() {
        assert_eq!(parse_age("7d"), Some(7 * 86_400 * 1_000_000_000));
        assert_eq!(parse_age("90m"), Some(90 * 60 * 1_000_000_000));
        assert_eq!(parse_age("7"), None);
        assert_eq!(parse_age("1y"), None);
    }

    #[test]
    fn formats_known_instants() {
        assert_eq!(format_utc(0), "1970-01-01T00:00:00Z");
        // 2026-11-30T18:09:30Z
        assert_eq!(
            format_utc(1_796_062_170 * 1_000_000_000),
            "2026-11-30T18:09:30Z"
        );
        assert_eq!(
            format_utc(951_782_400 * 1_000_000_000),
            "2000-02-29T00:00:00Z"
        );
    }

    #[test]
    fn ages_print_in_their_largest_whole_unit() {
        let s = 1_000_000_000;
        assert_eq!(format_age(7 * 86_400 * s), "7d");
        assert_eq!(format_age(3 * 86_400 * s), "3d");
        assert_eq!(format_age(90 * 60 * s), "90m");
        assert_eq!(format_age(61 * s), "61s");
        assert_eq!(ago(0, 90 * s), "1 minute ago");
        assert_eq!(ago(0, 2 * 86_400 * s), "2 days ago");
        assert_eq!(ago(10 * s, 0), "in the future");
    }

    #[test]
    fn parses_python_isoformat_with_fraction_and_offset() {
        let t = 1_796_062_170 * 1_000_000_000;
        assert_eq!(parse_rfc3339("2026-11-30T18:09:30+00:00"), Some(t));
        assert_eq!(
            parse_rfc3339("2026-11-30T18:09:30.123456+00:00"),
            Some(t + 123_456_000)
        );
        assert_eq!(
            parse_rfc3339("2026-11-30T18:09:30.5Z"),
            Some(t + 500_000_000)
        );
        assert_eq!(
            parse_rfc3339("2026-11-30T20:09:30+02:00"),
            Some(t),
            "an offset is taken off"
        );
        for bad in [
            "2026-11-30T18:09:30",
            "2026-11-30T18-09-30Z",
            "2026-11-30T18:09:30.+00:00",
            "2026-11-30T18:09:30.1234567891Z",
            "2026-11-30T18:09:30+0000",
            "",
        ] {
            assert_eq!(parse_rfc3339(bad), None, "{bad}");
        }
    }

    #[test]
    fn parses_both_spellings_and_rejects_nonsense() {
        let t = 1_796_062_170 * 1_000_000_000;
        assert_eq!(parse_utc("2026-11-30T18:09:30Z"), Some(t));
        assert_eq!(parse_utc("2026-11-30T18-09-30Z"), Some(t));
        assert_eq!(
            parse_utc("2000-02-29T00:00:00Z"),
            Some(951_782_400 * 1_000_000_000)
        );
        for bad in [
            "2026-02-30T00:00:00Z",
            "2026-11-30 18:09:30Z",
            "2026-11-30T18:09:30",
            "yesterday",
            "2026-11-30T18:09-30Z",
            "2611-06-22T12:51:20Z",
            "9999-12-31T23:59:59Z",
        ] {
            assert_eq!(parse_utc(bad), None, "{bad}");
        }
    }
}
