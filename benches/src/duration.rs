//! Durations on the command line: `2s`, `250ms`, `1.5s`, `100us`, `1m`.

/// Why a duration was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid duration {0:?}: use a number with a unit, e.g. 2s, 250ms, 1.5s, 100us, 500ns or 1m"
)]
pub struct DurationError(pub String);

/// Parses a duration into nanoseconds (a bare number is seconds).
pub fn parse_duration_ns(text: &str) -> Result<u64, DurationError> {
    let bad = || DurationError(text.to_owned());
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let scale: f64 = match unit.trim() {
        "ns" => 1.0,
        "us" | "µs" => 1e3,
        "ms" => 1e6,
        "" | "s" => 1e9,
        "m" | "min" => 60e9,
        "h" => 3600e9,
        _ => return Err(bad()),
    };
    let value: f64 = number.parse().map_err(|_| bad())?;
    let ns = value * scale;
    if !ns.is_finite() || ns < 0.0 || ns >= u64::MAX as f64 {
        return Err(bad());
    }
    Ok(ns.round() as u64)
}

/// Formats nanoseconds the way [`parse_duration_ns`] reads them (for messages).
pub fn format_ns(ns: u64) -> String {
    if ns >= 1_000_000_000 && ns.is_multiple_of(1_000_000) {
        format!("{}s", ns as f64 / 1e9)
    } else if ns >= 1_000_000 && ns.is_multiple_of(1_000) {
        format!("{}ms", ns as f64 / 1e6)
    } else {
        format!("{ns}ns")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_with_units_and_refuse_garbage() {
        assert_eq!(parse_duration_ns("2s"), Ok(2_000_000_000));
        assert_eq!(parse_duration_ns("250ms"), Ok(250_000_000));
        assert_eq!(parse_duration_ns("1.5s"), Ok(1_500_000_000));
        assert_eq!(parse_duration_ns("100us"), Ok(100_000));
        assert_eq!(parse_duration_ns("1m"), Ok(60_000_000_000));
        assert_eq!(parse_duration_ns("3"), Ok(3_000_000_000));
        for bad in ["", "s", "2 weeks", "-1s", "1e400s", "1..2s"] {
            assert!(parse_duration_ns(bad).is_err(), "{bad:?}");
        }
        assert_eq!(format_ns(2_000_000_000), "2s");
        assert_eq!(format_ns(250_000_000), "250ms");
        assert_eq!(format_ns(7), "7ns");
    }
}
