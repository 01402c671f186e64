//! Command line: every flag can also be set through its environment variable.

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::daemon::{Daemon, DaemonConfig};
use crate::report::{Backoff, DEFAULT_TOKEN_FILE, HttpSink, HttpSinkConfig, LogSink};
use crate::sandbox;
use crate::scan::{DEFAULT_MAX_FILE_SIZE, ScanOptions, Scanner};
use crate::{Error, output};

/// `--version`: the version and the platform the binary was built for, as
/// an image index names it (`linux/arm64`), so a node's agent says which
/// manifest of a multi-platform image it runs.
pub const VERSION: &str = if cfg!(target_arch = "aarch64") {
    concat!(env!("CARGO_PKG_VERSION"), " (linux/arm64)")
} else if cfg!(target_arch = "x86_64") {
    concat!(env!("CARGO_PKG_VERSION"), " (linux/amd64)")
} else {
    env!("CARGO_PKG_VERSION")
};

/// mountguard node agent: reads and hashes the Secret, ConfigMap and projected
/// volume content (and subPath targets) the kubelet serves to the pods of
/// this node.
#[derive(Debug, Parser)]
#[command(name = "mountguard-agent", version = VERSION)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,

    /// Log format on stderr.
    #[arg(long, global = true, env = "MOUNTGUARD_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// Log filter (tracing EnvFilter syntax, e.g. `info` or `mountguard_agent=debug`).
    #[arg(long, global = true, env = "MOUNTGUARD_LOG", default_value = "info")]
    pub log: String,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Scan once and print the inventory. Exits 0 when the scan ran (read
    /// problems are in the output), non-zero when the kubelet root is unusable.
    Scan(ScanArgs),
    /// Run the agent: watch, rescan, serve /metrics /healthz /readyz, publish.
    Run(Box<RunArgs>),
    /// Test aid (hidden): applies the same Landlock restriction as `run`,
    /// prints `restricted <fully|partially|not>`, then for each line
    /// `read PATH`, `write PATH` or `create PATH` on stdin tries it and
    /// prints `ok` or `denied <error>`.
    #[command(hide = true)]
    SandboxCheck(SandboxCheckArgs),
}

/// `sandbox-check` flags.
#[derive(Debug, Args)]
pub struct SandboxCheckArgs {
    /// The kubelet root, as for `run`.
    #[arg(long)]
    pub kubelet_root: PathBuf,
    /// A token file, as for `run`.
    #[arg(long)]
    pub token_file: Option<PathBuf>,
}

/// Flags shared by both commands.
#[derive(Debug, Args)]
pub struct CommonArgs {
    /// The kubelet root directory (holds `pods/<uid>/volumes/...`).
    #[arg(
        long,
        env = "MOUNTGUARD_KUBELET_ROOT",
        default_value = "/var/lib/kubelet"
    )]
    pub kubelet_root: PathBuf,

    /// Node name written into the inventory (in a DaemonSet, set it from
    /// `spec.nodeName`). Default: this machine's host name.
    #[arg(long, visible_alias = "node-name", env = "MOUNTGUARD_NODE_NAME")]
    pub node: Option<String>,

    /// Files larger than this are not hashed; they are reported as
    /// `tooLarge` errors. Sizes: `16777216`, `16Mi`, `16MiB` (the controller's grammar).
    #[arg(long, env = "MOUNTGUARD_MAX_FILE_SIZE", default_value_t = DEFAULT_MAX_FILE_SIZE, value_parser = parse_size)]
    pub max_file_size: u64,
}

impl CommonArgs {
    fn scan_options(&self) -> ScanOptions {
        let node = self.node.clone().unwrap_or_else(host_name);
        let mut opts = ScanOptions::new(self.kubelet_root.clone(), node);
        opts.max_file_size = self.max_file_size;
        opts
    }
}

/// `scan` flags.
#[derive(Debug, Args)]
pub struct ScanArgs {
    #[command(flatten)]
    pub common: CommonArgs,

    /// Output format: a table for people (digests cut to 12 hex characters)
    /// or the full JSON inventory.
    #[arg(long, env = "MOUNTGUARD_OUTPUT", value_enum, default_value_t = OutputFormat::Table)]
    pub output: OutputFormat,
}

/// `run` flags.
#[derive(Debug, Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub common: CommonArgs,

    /// Address for /metrics, /healthz and /readyz.
    #[arg(long, env = "MOUNTGUARD_LISTEN", default_value = "0.0.0.0:9808")]
    pub listen: SocketAddr,

    /// Period of the full rescan, which also covers inotify queue overflow
    /// and lost watches (e.g. `60s`, `5m`).
    #[arg(long, env = "MOUNTGUARD_RESCAN_INTERVAL", default_value = "60s", value_parser = parse_duration)]
    pub rescan_interval: Duration,

    /// Quiet time after an inotify event before rescanning (e.g. `100ms`).
    #[arg(long, env = "MOUNTGUARD_DEBOUNCE", default_value = "100ms", value_parser = parse_duration)]
    pub debounce: Duration,

    /// Do not use inotify; rely on the periodic rescan only.
    #[arg(long, env = "MOUNTGUARD_NO_WATCH")]
    pub no_watch: bool,

    /// The controller's report URL, e.g.
    /// `https://mountguard-controller.mountguard-system.svc:8443`. Absent: the
    /// inventory is only logged (summary, no content).
    #[arg(long, env = "MOUNTGUARD_CONTROLLER_URL")]
    pub controller_url: Option<http::Uri>,

    /// The bearer token (the projected service-account token with audience
    /// `mountguard`); re-read on every request, so rotation needs no restart.
    #[arg(long, env = "MOUNTGUARD_TOKEN_FILE", default_value = DEFAULT_TOKEN_FILE)]
    pub token_file: PathBuf,

    /// PEM file with the CA certificate to trust for an https controller URL
    /// (no system roots are used).
    #[arg(long, env = "MOUNTGUARD_CA_FILE")]
    pub ca_file: Option<PathBuf>,

    /// Period of the heartbeat to the controller (which answers `resend`
    /// when it lacks this node's inventory, e.g. after a restart).
    #[arg(long, env = "MOUNTGUARD_HEARTBEAT_INTERVAL", default_value = "30s", value_parser = parse_duration)]
    pub heartbeat_interval: Duration,
}

/// Log formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// `scan` output formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    /// One row per volume and subPath, errors below.
    Table,
    /// The inventory document (`mountguard.io/node-inventory/v1`).
    Json,
}

/// Parses `250ms`, `60s`, `5m`, `1h` (a bare number is seconds): the
/// grammar of every mountguard duration (`mountguard_inventory::duration`).
pub use mountguard_inventory::parse_duration;

/// A size of the shared grammar (`mountguard_inventory::size`: `16777216`,
/// `16Mi`, `16MiB`), as the controller's.
pub fn parse_size(s: &str) -> Result<u64, mountguard_inventory::SizeError> {
    mountguard_inventory::parse_size(s)
}

/// The flags of the command line that take a duration (for the duration
/// message when the shell split a value: `--debounce 100 ms`).
pub fn duration_flags() -> Vec<String> {
    use clap::CommandFactory;
    let cmd = Cli::command();
    let mut out = Vec::new();
    let mut stack = vec![&cmd];
    while let Some(c) = stack.pop() {
        for a in c.get_arguments() {
            if a.get_value_parser().type_id() == std::any::TypeId::of::<Duration>()
                && let Some(l) = a.get_long()
            {
                out.push(l.to_string());
            }
        }
        stack.extend(c.get_subcommands());
    }
    out
}

fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".into())
}

impl Cli {
    /// Sets up logging on stderr.
    pub fn init_tracing(&self) {
        let filter = tracing_subscriber::EnvFilter::try_new(&self.log)
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
        // Colour codes only for a terminal (not in a container's log).
        let builder = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
        let _ = match self.log_format {
            LogFormat::Text => builder.try_init(),
            LogFormat::Json => builder.json().try_init(),
        };
    }

    /// Runs the command.
    pub fn run(self) -> Result<(), Error> {
        self.init_tracing();
        match self.command {
            Command::Scan(args) => scan(args),
            Command::SandboxCheck(args) => sandbox_check(args),
            Command::Run(args) => {
                // Before any thread exists: Landlock applies to the calling
                // thread and what it starts afterwards.
                match mountguard_serve::raise_nofile_limit() {
                    Ok(n) => {
                        tracing::debug!(open_files = n, "open file limit raised to the hard limit")
                    }
                    Err(e) => tracing::warn!(error = %e, "keeping the open file limit"),
                }
                let mut files: Vec<&Path> = vec![args.token_file.as_path()];
                if let Some(ca) = &args.ca_file {
                    files.push(ca.as_path());
                }
                sandbox::restrict_or_warn(&sandbox::read_paths(&args.common.kubelet_root, &files));
                let rt = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()?;
                rt.block_on(run(*args))
            }
        }
    }
}

fn sandbox_check(args: SandboxCheckArgs) -> Result<(), Error> {
    use std::io::BufRead;
    let files: Vec<&Path> = args.token_file.iter().map(PathBuf::as_path).collect();
    let e = sandbox::restrict_or_warn(&sandbox::read_paths(&args.kubelet_root, &files));
    let mut out = std::io::stdout().lock();
    writeln!(out, "restricted {}", e.as_str())?;
    out.flush()?;
    for line in std::io::stdin().lock().lines() {
        let line = line?;
        let Some((op, path)) = line.split_once(' ') else {
            continue;
        };
        let r = match op {
            "read" => std::fs::read(path).map(|_| ()),
            "write" => std::fs::OpenOptions::new()
                .write(true)
                .open(path)
                .and_then(|mut f| f.write_all(b"overwritten by the agent")),
            "create" => std::fs::write(path, b"created by the agent"),
            _ => continue,
        };
        match r {
            Ok(()) => writeln!(out, "{op} ok")?,
            Err(e) => writeln!(out, "{op} denied {e}")?,
        }
        out.flush()?;
    }
    Ok(())
}

fn scan(args: ScanArgs) -> Result<(), Error> {
    // One scan only: nothing is kept for a next one.
    let inventory = Scanner::scan_once(args.common.scan_options())?.inventory;
    let out = std::io::stdout().lock();
    match args.output {
        OutputFormat::Table => {
            let mut out = out;
            out.write_all(output::table(&inventory).as_bytes())?;
            out.flush()?;
        }
        // Streamed through a small buffer: the document is never held
        // whole in memory (tens of MiB at 10,000 volumes).
        OutputFormat::Json => output::json(&inventory, out)?,
    }
    Ok(())
}

async fn run(args: RunArgs) -> Result<(), Error> {
    let RunArgs {
        common,
        listen,
        rescan_interval,
        debounce,
        no_watch,
        controller_url,
        token_file,
        ca_file,
        heartbeat_interval,
    } = args;
    let opts = common.scan_options();
    // Fail fast with a clear message when the root is unusable.
    if let Err(e @ Error::KubeletRoot { .. }) = Scanner::new(opts.clone()).scan() {
        return Err(e);
    }
    tracing::info!(
        kubelet_root = %opts.kubelet_root.display(),
        node = %opts.node,
        %listen,
        rescan_interval_s = rescan_interval.as_secs_f64(),
        heartbeat_interval_s = heartbeat_interval.as_secs_f64(),
        controller_url = controller_url.as_ref().map(|u| u.to_string()).unwrap_or_default(),
        "starting"
    );
    let mut cfg = DaemonConfig::new(opts);
    cfg.listen = Some(listen);
    cfg.rescan_interval = rescan_interval;
    cfg.debounce = debounce;
    cfg.watch = !no_watch;
    cfg.heartbeat_interval = heartbeat_interval;
    let daemon = match controller_url {
        Some(url) => {
            let mut sink_cfg = HttpSinkConfig::new(url, cfg.scan.node.clone());
            sink_cfg.token_file = token_file;
            sink_cfg.ca_file = ca_file;
            // Retries of one body end by the next heartbeat, which resumes.
            sink_cfg.backoff = Backoff {
                window: heartbeat_interval,
                ..Backoff::default()
            };
            Daemon::start(cfg, HttpSink::new(sink_cfg)?).await?
        }
        None => {
            tracing::warn!("no --controller-url: the inventory is only logged");
            Daemon::start(cfg, LogSink).await?
        }
    };
    wait_for_signal().await?;
    tracing::info!("shutting down");
    daemon.shutdown().await;
    tracing::info!("stopped");
    Ok(())
}

async fn wait_for_signal() -> Result<(), Error> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_names_the_platform_built_for() {
        let err = Cli::try_parse_from(["mountguard-agent", "--version"]).unwrap_err();
        assert_eq!(err.kind(), clap::error::ErrorKind::DisplayVersion);
        let platform = match std::env::consts::ARCH {
            "aarch64" => "linux/arm64",
            "x86_64" => "linux/amd64",
            other => panic!("no platform name for {other}"),
        };
        assert_eq!(
            err.to_string().trim(),
            format!(
                "mountguard-agent {} ({platform})",
                env!("CARGO_PKG_VERSION")
            )
        );
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("60s"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("7"), Ok(Duration::from_secs(7)));
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("5 parsecs").is_err());
        assert!(parse_duration("").is_err());
    }

    /// The duration table shared with the controller and the chart, through
    /// every duration flag of `run`.
    #[test]
    fn duration_flags_follow_the_shared_table() {
        let doc: serde_json::Value =
            serde_json::from_str(include_str!("../../inventory/src/duration_cases.json")).unwrap();
        let cases: Vec<(String, Option<u64>)> =
            serde_json::from_value(doc["cases"].clone()).unwrap();
        for flag in ["--rescan-interval", "--debounce", "--heartbeat-interval"] {
            for (s, want) in &cases {
                let r = Cli::try_parse_from(["mountguard-agent", "run", flag, s.as_str()]);
                let got = r.ok().map(|cli| {
                    let Command::Run(args) = cli.command else {
                        panic!("not run")
                    };
                    let d = match flag {
                        "--rescan-interval" => args.rescan_interval,
                        "--debounce" => args.debounce,
                        _ => args.heartbeat_interval,
                    };
                    d.as_millis() as u64
                });
                assert_eq!(got, *want, "{flag} {s:?}");
            }
        }
    }

    #[test]
    fn report_flags_parse() {
        let cli = Cli::try_parse_from([
            "mountguard-agent",
            "run",
            "--node-name",
            "node-a",
            "--controller-url",
            "https://controller.example:8443",
            "--ca-file",
            "/etc/mountguard/ca.crt",
            "--heartbeat-interval",
            "5s",
        ])
        .unwrap();
        let Command::Run(args) = cli.command else {
            panic!("not run")
        };
        let args = *args;
        assert_eq!(args.common.node.as_deref(), Some("node-a"));
        assert_eq!(
            args.controller_url.unwrap().to_string(),
            "https://controller.example:8443/"
        );
        assert_eq!(args.token_file, PathBuf::from(DEFAULT_TOKEN_FILE));
        assert_eq!(args.ca_file, Some(PathBuf::from("/etc/mountguard/ca.crt")));
        assert_eq!(args.heartbeat_interval, Duration::from_secs(5));
    }

    /// The docs check: the flags, environment variables and defaults of
    /// `docs/agent.md`'s table are the ones `--help` prints (the same clap
    /// definitions), and every flag is in it.
    #[test]
    fn docs_list_the_flags_and_defaults_of_help() {
        use clap::CommandFactory;
        let cmd = Cli::command();
        let mut args: Vec<clap::Arg> = cmd.get_arguments().cloned().collect();
        for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
            args.extend(sub.get_arguments().cloned());
        }
        let find = |long: &str| args.iter().find(|a| a.get_long() == Some(long));
        let ticks = |cell: &str| -> Vec<String> {
            cell.split('`')
                .skip(1)
                .step_by(2)
                .map(str::to_string)
                .collect()
        };
        let md = include_str!("../../docs/agent.md");
        let table = md
            .split("| flag | environment | default | meaning |")
            .nth(1)
            .unwrap()
            .split("\n\n")
            .next()
            .unwrap();
        let mut documented = std::collections::BTreeSet::new();
        for row in table.lines().skip(2) {
            let cells: Vec<&str> = row.split(" | ").collect();
            let flag = ticks(cells[0]).remove(0);
            let long = flag.trim_start_matches("--");
            let a = find(long).unwrap_or_else(|| {
                panic!("docs/agent.md lists {flag}, which the agent does not have")
            });
            documented.insert(long.to_string());
            let env = a.get_env().map(|e| e.to_string_lossy().into_owned());
            assert_eq!(ticks(cells[1]).first(), env.as_ref(), "{flag}: environment");
            let help: Vec<String> = a
                .get_default_values()
                .iter()
                .map(|v| v.to_string_lossy().into_owned())
                .collect();
            if let Some(d) = ticks(cells[2]).first() {
                assert_eq!(
                    help.join(","),
                    *d,
                    "{flag}: docs default {d}, --help {help:?}"
                );
            }
        }
        for a in &args {
            if let Some(l) = a.get_long()
                && !["help", "version"].contains(&l)
            {
                assert!(documented.contains(l), "--{l} is not in docs/agent.md");
            }
        }
    }

    #[test]
    fn every_flag_has_an_environment_variable() {
        use clap::CommandFactory;
        let cmd = Cli::command();
        let mut checked = 0;
        // The hidden test aid (sandbox-check) is not configured by a user.
        for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
            for arg in sub.get_arguments() {
                if arg.get_id() == "help" || arg.get_id() == "version" {
                    continue;
                }
                assert!(
                    arg.get_env().is_some(),
                    "--{} of {} has no env",
                    arg.get_id(),
                    sub.get_name()
                );
                checked += 1;
            }
        }
        assert!(checked >= 12, "only {checked} flags checked");
        cmd.debug_assert();
    }
}
