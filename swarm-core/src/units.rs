//! Human-readable byte sizes (`4GiB`, `512MiB`, `2GB`, `4096`), shared by every tool
//! that sizes memory nodes or values, whatever the transport.

use core::fmt;

/// A size that [`parse_size`] refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SizeError {
    /// Not a number followed by an optional known unit.
    Invalid,
    /// The size does not fit in 64 bits.
    Overflow,
}

impl fmt::Display for SizeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Invalid => f.write_str(
                "expected a number with an optional unit (B, KiB, MiB, GiB, TiB, K, M, G, T, KB, MB, GB, TB), e.g. 4GiB",
            ),
            Self::Overflow => f.write_str("the size does not fit in 64 bits"),
        }
    }
}

impl core::error::Error for SizeError {}

/// Parses a memory size: a decimal number and an optional unit. `K`/`KiB`, `M`/`MiB`,
/// `G`/`GiB`, `T`/`TiB` are binary; `KB`, `MB`, `GB`, `TB` are decimal; `B` or nothing
/// is bytes. Spaces around the number and the unit are ignored.
pub fn parse_size(text: &str) -> Result<u64, SizeError> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    if digits.is_empty() {
        return Err(SizeError::Invalid);
    }
    // Only digits are left, so the one way `parse` fails is a number above `u64::MAX`.
    let number: u64 = digits.parse().map_err(|_| SizeError::Overflow)?;
    let multiplier: u64 = match unit.trim() {
        "" | "B" => 1,
        "K" | "KiB" => 1 << 10,
        "M" | "MiB" => 1 << 20,
        "G" | "GiB" => 1 << 30,
        "T" | "TiB" => 1 << 40,
        "KB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        "TB" => 1_000_000_000_000,
        _ => return Err(SizeError::Invalid),
    };
    number.checked_mul(multiplier).ok_or(SizeError::Overflow)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_and_plain_numbers() {
        assert_eq!(parse_size("4GiB"), Ok(4 << 30));
        assert_eq!(parse_size("4G"), Ok(4 << 30));
        assert_eq!(parse_size(" 512 MiB "), Ok(512 << 20));
        assert_eq!(parse_size("2GB"), Ok(2_000_000_000));
        assert_eq!(parse_size("1KB"), Ok(1_000));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("7B"), Ok(7));
    }

    #[test]
    fn bad_sizes_are_refused() {
        for bad in ["", "GiB", "-1", "1.5GiB", "4 gigs", "0x10"] {
            assert_eq!(parse_size(bad), Err(SizeError::Invalid), "{bad:?}");
        }
        assert_eq!(parse_size("16777216TiB"), Err(SizeError::Overflow));
        assert_eq!(parse_size("99999999999999999999"), Err(SizeError::Overflow));
    }
}
