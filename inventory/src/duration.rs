//! The one duration grammar of mountguard's command-line flags, their
//! environment variables and the chart's values: a positive whole number
//! of at most [`MAX_DIGITS`] digits without leading zero, then a unit, `ms`,
//! `s`, `m` or `h`; a bare number is seconds (`250ms`, `60s`, `60`, `5m`,
//! `1h`). Zero, signs, spaces, fractions, compound forms (`1h30m`) and other
//! units are refused with a message saying what is accepted. The chart's
//! `values.schema.json` (`$defs` `duration`) has the same grammar as a
//! pattern; `duration_cases.json` is the table of strings the agent, the
//! controller and the chart are all tested on.
//!
//! It lives here because this is the one crate both binaries share without
//! a network stack.

use std::time::Duration;

/// The longest number accepted: 12 digits keep every unit within `u64`
/// milliseconds, and a JSON Schema pattern can say it.
pub const MAX_DIGITS: usize = 12;

/// Why a string is not a duration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{input:?} is not a duration: {reason}; write a positive whole number and a unit, like 250ms, 60s, 5m or 1h (a bare number is seconds)"
)]
pub struct DurationError {
    /// The string given.
    pub input: String,
    /// What is wrong with it.
    pub reason: &'static str,
}

/// The duration message for a command line a parser refused because a
/// duration flag's value was split by the shell (`--timeout 10 minutes`)
/// or starts with `-` (`--debounce -1s`, taken for a flag): the flag and
/// why its value is not a duration. `is_duration_flag(name)`: whether
/// `--name` takes a duration.
pub fn split_duration_hint(
    args: &[String],
    is_duration_flag: impl Fn(&str) -> bool,
) -> Option<(String, DurationError)> {
    for (i, a) in args.iter().enumerate() {
        let Some(name) = a.strip_prefix("--") else {
            continue;
        };
        let (name, value, next) = match name.split_once('=') {
            Some((n, v)) => (n, Some(v), args.get(i + 1)),
            None => (name, args.get(i + 1).map(String::as_str), args.get(i + 2)),
        };
        let Some(value) = value else { continue };
        if !is_duration_flag(name) {
            continue;
        }
        if value.starts_with('-')
            && value[1..].starts_with(|c: char| c.is_ascii_digit())
            && let Err(e) = parse_duration(value)
        {
            return Some((format!("--{name}"), e));
        }
        if parse_duration(value).is_ok()
            && let Some(word) = next
            && !word.is_empty()
            && word.chars().all(|c| c.is_ascii_alphabetic())
            && let Err(e) = parse_duration(&format!("{value} {word}"))
        {
            return Some((format!("--{name}"), e));
        }
    }
    None
}

/// Splits `s` into its leading number (digits, greater than zero, no
/// leading zero) and the unit after it; the reason when it has none. Shared
/// by the duration and size grammars.
pub(crate) fn number_and_unit(s: &str) -> Result<(&str, &str), &'static str> {
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    if num.is_empty() {
        return Err("it does not start with a number");
    }
    if num.starts_with('0') {
        return Err("it must be greater than zero, without leading zero");
    }
    Ok((num, unit))
}

/// Parses a duration of the grammar above.
pub fn parse_duration(s: &str) -> Result<Duration, DurationError> {
    let err = |reason| DurationError {
        input: s.to_string(),
        reason,
    };
    let (num, unit) = number_and_unit(s).map_err(err)?;
    if num.len() > MAX_DIGITS {
        return Err(err("the number has more than 12 digits"));
    }
    let n: u64 = num.parse().map_err(|_| err("the number is too large"))?;
    let unit_millis = match unit {
        "ms" => 1,
        "" | "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        _ => return Err(err("the unit is not ms, s, m or h")),
    };
    // At most 12 digits: no overflow.
    Ok(Duration::from_millis(n * unit_millis))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shared table: (string, milliseconds or refused).
    pub(crate) fn cases() -> Vec<(String, Option<u64>)> {
        let doc: serde_json::Value =
            serde_json::from_str(include_str!("duration_cases.json")).expect("valid table");
        serde_json::from_value(doc["cases"].clone()).expect("rows of [string, millis]")
    }

    #[test]
    fn the_shared_table() {
        let cases = cases();
        assert!(cases.len() > 20);
        for (s, want) in cases {
            let got = parse_duration(&s).map(|d| d.as_millis() as u64).ok();
            assert_eq!(got, want, "{s:?}");
        }
    }

    #[test]
    fn refusals_say_what_is_accepted() {
        let e = parse_duration("5 parsecs").unwrap_err().to_string();
        assert!(
            e.contains("\"5 parsecs\"") && e.contains("250ms, 60s, 5m or 1h"),
            "{e}"
        );
        assert!(
            parse_duration("0s")
                .unwrap_err()
                .to_string()
                .contains("greater than zero")
        );
    }
}
