//! Sizes on the command line (`8GiB`, `512MiB`, `4096`) and in messages
//! (`4 MiB`, `63.2 MiB`).

use std::fmt;
use std::str::FromStr;

/// Parses sizes like `8GiB`, `512MiB`, `1G`, `4096`: K, M, G, T and KiB
/// ... TiB are powers of 1024, KB, MB, GB, TB powers of 1000 (as dd reads
/// them).
pub fn parse_size(s: &str) -> std::result::Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a size (try 8GiB, 512MiB, 4096)"))?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "t" | "tib" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        u => return Err(format!("unknown size unit {u:?} in {s:?}")),
    };
    let v = n * mult as f64;
    if !v.is_finite() || v < 0.0 || v > u64::MAX as f64 {
        return Err(format!("{s:?} is out of range"));
    }
    Ok(v as u64)
}

/// As [`parse_size`], for a length of data, which 0 is not.
pub fn parse_length(s: &str) -> std::result::Result<u64, String> {
    match parse_size(s)? {
        0 => Err(format!("{s:?} is 0 bytes: give a size of at least 1 byte")),
        n => Ok(n),
    }
}

/// A size on the command line: parsed like `8GiB`, `512MiB` or `4096`,
/// shown exactly in the largest unit that divides it (`128MiB`), so a
/// default in `--help` reads well and parses back to itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ByteSize(pub u64);

impl ByteSize {
    /// As a memory size for the engine's settings.
    pub fn bytes(self) -> usize {
        usize::try_from(self.0).unwrap_or(usize::MAX)
    }
}

impl FromStr for ByteSize {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        parse_size(s).map(ByteSize)
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let unit = UNITS
            .iter()
            .rev()
            .find(|(_, size)| self.0 >= *size && self.0.is_multiple_of(*size));
        match unit {
            Some((name, size)) => write!(f, "{}{name}", self.0 / size),
            None => write!(f, "{}", self.0),
        }
    }
}

const UNITS: [(&str, u64); 4] = [
    ("KiB", 1 << 10),
    ("MiB", 1 << 20),
    ("GiB", 1 << 30),
    ("TiB", 1 << 40),
];

pub use zerohop::stats::human_bytes;

#[cfg(test)]
mod tests {
    use super::{parse_length, parse_size, ByteSize};

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("8GiB").unwrap(), 8 << 30);
        assert_eq!(parse_size("512MiB").unwrap(), 512 << 20);
        assert_eq!(parse_size("1G").unwrap(), 1 << 30);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("1.5k").unwrap(), 1536);
        assert!(parse_size("abc").is_err());
        assert!(parse_size("1XB").is_err());
        // Decimal units are powers of 1000, binary ones of 1024.
        assert_eq!(parse_size("1gb").unwrap(), 1_000_000_000);
        assert_eq!(parse_size("2TB").unwrap(), 2_000_000_000_000);
        assert_eq!(parse_size("1gib").unwrap(), parse_size("1G").unwrap());
    }

    #[test]
    fn a_length_is_never_zero() {
        assert_eq!(parse_length("1MiB").unwrap(), 1 << 20);
        assert!(parse_length("0").unwrap_err().contains("0 bytes"));
        assert!(parse_length("0GiB").is_err());
    }

    #[test]
    fn byte_sizes_show_exactly_and_parse_back() {
        for n in [0, 1, 4095, 4096, 128 << 20, 3 << 29, (1 << 40) + 1024] {
            let shown = ByteSize(n).to_string();
            assert_eq!(shown.parse::<ByteSize>(), Ok(ByteSize(n)), "{shown}");
        }
        assert_eq!(ByteSize(128 << 20).to_string(), "128MiB");
        assert_eq!(ByteSize(3 << 29).to_string(), "1536MiB");
        assert_eq!(ByteSize(4097).to_string(), "4097");
    }
}
