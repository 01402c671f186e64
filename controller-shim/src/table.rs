//! The one table writer of the command-line outputs (`status`, `wait`,
//! `verify`).

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
