//! `mountguard-controller`: see the library crate for the engine.

use std::io::Read;
use std::process::ExitCode;

use clap::Parser;
use mountguard_controller::offline::{Cli, Command};

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { 2 } else { 0 });
        }
    };
    match run(cli) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<u8> {
    match cli.command {
        Command::Verify(args) => {
            let mut key = [0u8; 32];
            if args.fingerprint_key_file.is_none() {
                std::fs::File::open("/dev/urandom")?.read_exact(&mut key)?;
            }
            let stdin = std::io::stdin();
            let stdout = std::io::stdout();
            Ok(args.run(
                jiff::Timestamp::now(),
                key,
                &mut stdin.lock(),
                &mut stdout.lock(),
            )?)
        }
    }
}
