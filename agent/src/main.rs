//! `mountguard-agent`: see `docs/agent.md` and `mountguard-agent --help`.

use std::process::ExitCode;

use anyhow::Context as _;
use clap::Parser;

fn main() -> ExitCode {
    let cli = mountguard_agent::cli::Cli::parse();
    match cli.run().context("mountguard-agent") {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}
