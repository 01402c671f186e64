//! `mountguard-controller`: see the library crate.

use std::io::Read;
use std::process::ExitCode;

use clap::Parser;
use mountguard_controller::live::{
    Cli, Command, Controller, PluginCli, PluginCommand, args::LogFormat, invoked_as_plugin,
};

fn main() -> ExitCode {
    let as_plugin = std::env::args_os()
        .next()
        .is_some_and(|a| invoked_as_plugin(&a));
    let result = if as_plugin {
        match PluginCli::try_parse() {
            Ok(c) => run_plugin(c),
            Err(e) => return usage_error(e),
        }
    } else {
        match Cli::try_parse() {
            Ok(c) => run(c),
            Err(e) => return usage_error(e),
        }
    };
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn usage_error(e: clap::Error) -> ExitCode {
    let _ = e.print();
    ExitCode::from(if e.use_stderr() { 2 } else { 0 })
}

/// `kubectl mountguard ...`: through the API server's service proxy.
fn run_plugin(cli: PluginCli) -> anyhow::Result<u8> {
    let stdout = std::io::stdout();
    let stderr = std::io::stderr();
    runtime()?.block_on(async move {
        let endpoint = cli.proxy.endpoint().await?;
        Ok(match cli.command {
            PluginCommand::Status(q) => q.run(&endpoint, &mut stdout.lock()).await?,
            PluginCommand::Wait(w) => {
                w.run(&endpoint, &mut stdout.lock(), &mut stderr.lock())
                    .await?
            }
        })
    })
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
        Command::Wait(args) => {
            let stdout = std::io::stdout();
            let stderr = std::io::stderr();
            let code = runtime()?.block_on(args.run(&mut stdout.lock(), &mut stderr.lock()))?;
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
