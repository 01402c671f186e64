//! `mountguard-agent`: see `docs/agent.md` and `mountguard-agent --help`.

use std::process::ExitCode;

use anyhow::Context as _;
use clap::Parser;

fn main() -> ExitCode {
    let cli = match mountguard_agent::cli::Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            // A duration the shell split (`--debounce 100 ms`) or one
            // starting with `-` gets the duration message, not clap's
            // "unexpected argument".
            if e.use_stderr() {
                let args: Vec<String> = std::env::args().skip(1).collect();
                let flags = mountguard_agent::cli::duration_flags();
                if let Some((flag, d)) = mountguard_inventory::split_duration_hint(&args, |f| {
                    flags.iter().any(|x| x == f)
                }) {
                    eprintln!("error: invalid value for '{flag}': {d}");
                    return ExitCode::from(2);
                }
            }
            e.exit()
        }
    };
    match cli.run().context("mountguard-agent") {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}
