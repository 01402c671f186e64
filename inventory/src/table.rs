//! The one table writer of every command-line table: the controller's
//! `status`, `wait` and `verify`, and the agent's `scan`. Here rather than
//! in either binary because both print tables and this is the one crate
//! both depend on that needs no network stack.

use std::io::Write;

/// Prints rows as left-aligned columns two spaces apart.
pub fn write_aligned<const N: usize>(
    rows: &[[String; N]],
    out: &mut dyn Write,
) -> std::io::Result<()> {
    let mut widths = [0usize; N];
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            widths[i] = widths[i].max(c.chars().count());
        }
    }
    for r in rows {
        let mut line = String::new();
        for (i, c) in r.iter().enumerate() {
            if i + 1 == N {
                line.push_str(c);
            } else {
                line.push_str(&format!("{c:<w$}  ", w = widths[i]));
            }
        }
        writeln!(out, "{}", line.trim_end())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_are_as_wide_as_their_widest_cell_and_the_last_is_not_padded() {
        let rows = [
            ["A", "BB", "C"].map(String::from),
            ["\u{e9}\u{e9}\u{e9}", "", "last"].map(String::from),
            ["x", "y", ""].map(String::from),
        ];
        let mut out = Vec::new();
        write_aligned(&rows, &mut out).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "A    BB  C\n\u{e9}\u{e9}\u{e9}      last\nx    y\n"
        );
    }
}
