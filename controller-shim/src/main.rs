//! `mountguard-controller`: see the library crate.

use std::io::Read;
use std::process::ExitCode;

use clap::Parser;
use mountguard_controller::live::{Cli, Command, Controller, args::LogFormat};

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

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?)
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
        Command::Run(args) => {
            let filter = tracing_subscriber::EnvFilter::try_new(&args.log)
                .map_err(|e| anyhow::anyhow!("--log {:?}: {e}", args.log))?;
            let builder = tracing_subscriber::fmt().with_env_filter(filter);
            match args.log_format {
                LogFormat::Json => builder.json().init(),
                LogFormat::Text => builder.init(),
            }
            runtime()?.block_on(async move {
                let controller = Controller::start(*args).await?;
                wait_for_signal().await?;
                controller.shutdown().await;
                Ok(0)
            })
        }
        Command::Status(args) => {
            let stdout = std::io::stdout();
            let code = runtime()?.block_on(args.run(&mut stdout.lock()))?;
            Ok(code)
        }
    }
}

async fn wait_for_signal() -> anyhow::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    tokio::select! {
        _ = term.recv() => {}
        r = tokio::signal::ctrl_c() => r?,
    }
    tracing::info!("signal received; shutting down");
    Ok(())
}
