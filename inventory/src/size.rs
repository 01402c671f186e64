//! The one size grammar of mountguard's flags (the agent's
//! `--max-file-size`, the controller's `--max-report-bytes` and
//! `--max-response-size`): a positive whole number of bytes without
//! leading zero, optionally with a unit: `Ki`, `Mi`, `Gi` (or `KiB`, `MiB`,
//! `GiB`) for powers of 1024, `K`, `M`, `G` (or `KB`, `MB`, `GB`) for powers
//! of 1000 (`16777216`, `16Mi`, `16MiB`).

/// Why a string is not a size.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{input:?} is not a size: {reason}; write a whole number of bytes, optionally with a unit, like 16777216, 16Mi or 16MiB (Ki, Mi, Gi: powers of 1024; K, M, G: powers of 1000)"
)]
pub struct SizeError {
    /// The string given.
    pub input: String,
    /// What is wrong with it.
    pub reason: &'static str,
}

/// Parses a size of the grammar above.
pub fn parse_size(s: &str) -> Result<u64, SizeError> {
    let err = |reason| SizeError {
        input: s.to_string(),
        reason,
    };
    let (num, unit) = crate::duration::number_and_unit(s).map_err(err)?;
    let mult: u64 = match unit {
        "" | "B" => 1,
        "Ki" | "KiB" => 1 << 10,
        "Mi" | "MiB" => 1 << 20,
        "Gi" | "GiB" => 1 << 30,
        "K" | "KB" => 1_000,
        "M" | "MB" => 1_000_000,
        "G" | "GB" => 1_000_000_000,
        _ => return Err(err("the unit is not Ki, Mi, Gi, K, M or G")),
    };
    num.parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .ok_or_else(|| err("it is too large"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The table shared with the chart's schema tests: every string the
    /// flags accept means the same number of bytes in the chart.
    #[test]
    fn the_shared_table() {
        let doc: serde_json::Value =
            serde_json::from_str(include_str!("size_cases.json")).expect("valid table");
        let cases: Vec<(String, Option<u64>)> =
            serde_json::from_value(doc["cases"].clone()).expect("rows of [string, bytes]");
        assert!(cases.len() > 20);
        for (s, want) in cases {
            assert_eq!(parse_size(&s).ok(), want, "{s:?}");
        }
    }

    #[test]
    fn sizes() {
        for (s, want) in [
            ("16777216", Some(16 << 20)),
            ("16Mi", Some(16 << 20)),
            ("16MiB", Some(16 << 20)),
            ("32Mi", Some(32 << 20)),
            ("1Gi", Some(1 << 30)),
            ("2K", Some(2000)),
            ("0", None),
            ("-1", None),
            ("16 MiB", None),
            ("1.5Mi", None),
            ("16mb", None),
            ("99999999999999999999", None),
        ] {
            assert_eq!(parse_size(s).ok(), want, "{s:?}");
        }
        assert!(
            parse_size("16 MiB")
                .unwrap_err()
                .to_string()
                .contains("like 16777216, 16Mi or 16MiB")
        );
    }
}
