//! `mountguard-controller`: see the library crate.

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::{CommandFactory, Parser};
use mountguard_controller::cli::{Cli, Command, PluginCli, PluginCommand, invoked_as_plugin};
use mountguard_controller::offline::verify::Verify;
use mountguard_controller::query::endpoint::{Endpoint, Proxy};
use mountguard_controller::query::status::StatusQuery;
use mountguard_controller::query::wait::WaitOptions;
use mountguard_controller::run::Controller;
use mountguard_controller::settings::LogFormat;

/// mimalloc instead of the C library's allocator: the static images link
/// musl, whose allocator doubled the CPU time of a catch-up after a restart
/// at 550,000 pods (docs/performance.md, "Controller"). The chart sets
/// `MIMALLOC_PURGE_DELAY=0` and `MIMALLOC_ARENA_EAGER_COMMIT=0`, which keep
/// the resident size below musl's.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    // Fault injection for the crash tests (feature `failpoints` only).
    #[cfg(feature = "failpoints")]
    let _failpoints = mountguard_controller::runtime::failpoint::setup();
    let as_plugin = std::env::args_os()
        .next()
        .is_some_and(|a| invoked_as_plugin(&a));
    let result = if as_plugin {
        match PluginCli::try_parse() {
            Ok(c) => run_plugin(c),
            Err(e) => return usage_error(e, &PluginCli::command()),
        }
    } else {
        match Cli::try_parse() {
            Ok(c) => run(c),
            Err(e) => return usage_error(e, &Cli::command()),
        }
    };
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("error: {}", message(&e));
            ExitCode::from(2)
        }
    }
}

fn usage_error(e: clap::Error, cmd: &clap::Command) -> ExitCode {
    // A duration the shell split (`--timeout 10 minutes`) or one starting
    // with `-` gets the duration message, not clap's "unexpected argument".
    if e.use_stderr() {
        let args: Vec<String> = std::env::args().skip(1).collect();
        let flags = mountguard_controller::cli::duration_flags(cmd);
        if let Some((flag, d)) =
            mountguard_inventory::split_duration_hint(&args, |f| flags.iter().any(|x| x == f))
        {
            eprintln!("error: invalid value for '{flag}': {d}");
            return ExitCode::from(2);
        }
    }
    let _ = e.print();
    ExitCode::from(if e.use_stderr() { 2 } else { 0 })
}

/// `kubectl mountguard ...`: through the API server's service proxy.
fn run_plugin(cli: PluginCli) -> anyhow::Result<u8> {
    let stdout = std::io::stdout();
    let stderr = std::io::stderr();
    runtime()?.block_on(async move {
        let endpoint = Proxy::from(cli.proxy).endpoint().await?;
        Ok(match cli.command {
            PluginCommand::Status(q) => {
                StatusQuery::from(q)
                    .run(&endpoint, &mut stdout.lock())
                    .await?
            }
            PluginCommand::Wait(w) => {
                WaitOptions::from(w)
                    .run(&endpoint, &mut stdout.lock(), &mut stderr.lock())
                    .await?
            }
        })
    })
}

/// The error and its causes, each said once: an error whose message already
/// includes its source's (`file: No such file or directory`) does not get it
/// appended a second time.
fn message(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if !out.contains(&text) {
            if !out.is_empty() {
                out.push_str(": ");
            }
            out.push_str(&text);
        }
    }
    out
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?)
}

fn run(cli: Cli) -> anyhow::Result<u8> {
    match cli.command {
        Command::Verify(args) => {
            let key = match args.fingerprint_key_file {
                None => mountguard_controller::random_fingerprint_key()?,
                Some(_) => [0u8; 32],
            };
            let stdin = std::io::stdin();
            let stdout = std::io::stdout();
            let stderr = std::io::stderr();
            Ok(Verify::from(args).run(
                jiff::Timestamp::now(),
                key,
                &mut stdin.lock(),
                &mut stdout.lock(),
                &mut stderr.lock(),
            )?)
        }
        Command::Run(args) => {
            // kube-client logs an ERROR for every failed request; the
            // watches log each failure streak once themselves, so those
            // lines are left out unless --log names kube_client.
            let directives = if args.log.contains("kube_client") {
                args.log.clone()
            } else {
                format!("{},kube_client::client::builder=off", args.log)
            };
            let filter = tracing_subscriber::EnvFilter::try_new(&directives)
                .map_err(|e| anyhow::anyhow!("--log {:?}: {e}", args.log))?;
            // Logs on stderr; colour codes only for a terminal (not in a
            // container's log or a file).
            let builder = tracing_subscriber::fmt()
                .with_env_filter(filter)
                .with_writer(std::io::stderr)
                .with_ansi(std::io::stderr().is_terminal());
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
            let query = StatusQuery::from(args.query);
            let c = args.controller;
            let endpoint = Endpoint::direct(c.url, c.token, c.token_file.as_deref())?;
            let code = runtime()?.block_on(query.run(&endpoint, &mut stdout.lock()))?;
            Ok(code)
        }
        Command::Wait(args) => {
            let stdout = std::io::stdout();
            let stderr = std::io::stderr();
            let wait = WaitOptions::from(args.wait);
            let c = args.controller;
            let endpoint = Endpoint::direct(c.url, c.token, c.token_file.as_deref())?;
            let code =
                runtime()?.block_on(wait.run(&endpoint, &mut stdout.lock(), &mut stderr.lock()))?;
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
