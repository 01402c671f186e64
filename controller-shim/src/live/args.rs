//! Command line of `mountguard-controller run` (every flag also reads
//! `MOUNTGUARD_<FLAG>`; see `docs/controller.md`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, ValueEnum};
use jiff::SignedDuration;

/// Remediation mode (executed by the remediation module).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Default)]
pub enum RemediationMode {
    /// No remediation.
    #[default]
    Off,
    /// Decide and log, write nothing.
    DryRun,
    /// Drain, evict and verify.
    On,
}

/// What to do with a Slurm node when remediation fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Default)]
pub enum OnFailure {
    /// Keep the node drained for an operator.
    #[default]
    KeepDrained,
    /// Resume the node.
    Undrain,
}

/// Log format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Default)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// A per-node token bucket: `RATE/s` with an optional burst
/// (`2/s,5` or `2/s burst 5`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateLimit {
    /// Tokens per second.
    pub per_second: f64,
    /// Bucket size.
    pub burst: u32,
}

impl std::str::FromStr for RateLimit {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("{s:?} is not a rate like 2/s or 2/s,5 (rate per second, burst)");
        let s2 = s.trim();
        let (rate, burst) = match s2.split_once(',') {
            Some((r, b)) => (r.trim(), Some(b.trim())),
            None => match s2.split_once("burst") {
                Some((r, b)) => (r.trim(), Some(b.trim())),
                None => (s2, None),
            },
        };
        let rate = rate.strip_suffix("/s").unwrap_or(rate).trim();
        let per_second: f64 = rate.parse().map_err(|_| bad())?;
        if !(per_second.is_finite() && per_second > 0.0) {
            return Err(bad());
        }
        let burst = match burst {
            Some(b) => b.parse::<u32>().map_err(|_| bad())?,
            None => (per_second.ceil() as u32).max(1),
        };
        if burst == 0 {
            return Err(bad());
        }
        Ok(Self { per_second, burst })
    }
}

/// `<namespace>:<name>` of the agent's ServiceAccount.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceAccountRef {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
}

impl ServiceAccountRef {
    /// The Kubernetes user name of a token of this ServiceAccount.
    pub fn username(&self) -> String {
        format!("system:serviceaccount:{}:{}", self.namespace, self.name)
    }
}

impl std::str::FromStr for ServiceAccountRef {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.split_once(':').or_else(|| s.split_once('/')) {
            Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains(':') => {
                Ok(Self {
                    namespace: ns.to_string(),
                    name: name.to_string(),
                })
            }
            _ => Err(format!("{s:?} is not <namespace>:<name>")),
        }
    }
}

/// `<namespace>/<name>` of an object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectName {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
}

impl std::str::FromStr for ObjectName {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.split_once('/') {
            Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
                Ok(Self {
                    namespace: ns.to_string(),
                    name: name.to_string(),
                })
            }
            _ => Err(format!("{s:?} is not <namespace>/<name>")),
        }
    }
}

/// Parses a duration like `250ms`, `180s`, `180` or `3m`: the grammar of
/// every mountguard duration (`mountguard_inventory::duration`, shared
/// with the agent and the chart).
pub(crate) use mountguard_inventory::parse_duration;

fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (num, mult) = [
        ("Ki", 1u64 << 10),
        ("Mi", 1 << 20),
        ("Gi", 1 << 30),
        ("K", 1000),
        ("M", 1_000_000),
        ("G", 1_000_000_000),
    ]
    .iter()
    .find_map(|(suf, m)| t.strip_suffix(suf).map(|n| (n, *m)))
    .unwrap_or((t, 1));
    let n: u64 = num
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a size like 33554432 or 32Mi"))?;
    n.checked_mul(mult)
        .filter(|v| *v > 0)
        .ok_or_else(|| format!("{s:?} is out of range"))
}

/// Arguments of `mountguard-controller run`.
#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    /// kubeconfig file; absent = in-cluster configuration (or the default
    /// kubeconfig when not in a cluster).
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// Namespaces whose pods, Secrets and ConfigMaps are checked (comma
    /// separated); empty = all.
    #[arg(long, env = "MOUNTGUARD_WATCH_NAMESPACES", value_delimiter = ',', num_args = 0..)]
    pub watch_namespaces: Vec<String>,
    /// Label selector restricting the pods checked.
    #[arg(long, env = "MOUNTGUARD_POD_SELECTOR")]
    pub pod_selector: Option<String>,
    /// Address of the report API.
    #[arg(long, env = "MOUNTGUARD_REPORT_LISTEN", default_value = "0.0.0.0:8443")]
    pub report_listen: SocketAddr,
    /// PEM certificate chain of the report API (reloaded when it changes).
    #[arg(long, env = "MOUNTGUARD_TLS_CERT_FILE", requires = "tls_key_file")]
    pub tls_cert_file: Option<PathBuf>,
    /// PEM private key of the report API (reloaded when it changes).
    #[arg(long, env = "MOUNTGUARD_TLS_KEY_FILE", requires = "tls_cert_file")]
    pub tls_key_file: Option<PathBuf>,
    /// Serve the report API over plain HTTP (only for tests and demos).
    #[arg(long, env = "MOUNTGUARD_INSECURE_PLAINTEXT_REPORTS", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub insecure_plaintext_reports: bool,
    /// Address of `/metrics`, `/healthz`, `/readyz` and `/v1/verdicts`.
    #[arg(
        long,
        env = "MOUNTGUARD_METRICS_LISTEN",
        default_value = "0.0.0.0:8080"
    )]
    pub metrics_listen: SocketAddr,
    /// Audience the agents' projected tokens are issued for.
    #[arg(long, env = "MOUNTGUARD_TOKEN_AUDIENCE", default_value = "mountguard")]
    pub token_audience: String,
    /// The agent's ServiceAccount, `<namespace>:<name>`.
    #[arg(long, env = "MOUNTGUARD_AGENT_SERVICE_ACCOUNT")]
    pub agent_service_account: ServiceAccountRef,
    /// Name of the agent DaemonSet (in the ServiceAccount's namespace).
    #[arg(long, env = "MOUNTGUARD_AGENT_DAEMONSET")]
    pub agent_daemonset: String,
    /// Grace period for propagation of changed content.
    #[arg(long, env = "MOUNTGUARD_GRACE", default_value = "180s", value_parser = parse_duration)]
    pub grace: Duration,
    /// Inventories scanned longer ago than this are too old to judge by.
    #[arg(long, env = "MOUNTGUARD_INVENTORY_MAX_AGE", default_value = "300s", value_parser = parse_duration)]
    pub inventory_max_age: Duration,
    /// File with the installation's fingerprint key (at least 16 bytes);
    /// absent = a random key per process.
    #[arg(long, env = "MOUNTGUARD_FINGERPRINT_KEY_FILE")]
    pub fingerprint_key_file: Option<PathBuf>,
    /// Largest accepted report body (bytes; `Ki`/`Mi` suffixes allowed).
    #[arg(long, env = "MOUNTGUARD_MAX_REPORT_BYTES", default_value = "33554432", value_parser = parse_bytes)]
    pub max_report_bytes: u64,
    /// Per-node report rate: `RATE/s[,BURST]`.
    #[arg(long, env = "MOUNTGUARD_REPORT_RATE_LIMIT", default_value = "2/s,5")]
    pub report_rate_limit: RateLimit,
    /// Open report API connections at most (lowered to fit the open file
    /// limit); more are closed at once.
    #[arg(long, env = "MOUNTGUARD_MAX_CONNECTIONS", default_value = "10000")]
    pub max_connections: usize,
    /// Longest wait for a request head, also between requests on a
    /// kept-alive connection (report and metrics ports).
    #[arg(long, env = "MOUNTGUARD_HEADER_READ_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub header_read_timeout: Duration,
    /// A connection that moves no byte for this long is closed.
    #[arg(long, env = "MOUNTGUARD_IDLE_TIMEOUT", default_value = "60s", value_parser = parse_duration)]
    pub idle_timeout: Duration,
    /// Elect one acting replica through a Lease.
    #[arg(long, env = "MOUNTGUARD_LEADER_ELECTION", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub leader_election: bool,
    /// Name of the Lease (in `--pod-namespace`).
    #[arg(
        long,
        env = "MOUNTGUARD_LEASE_NAME",
        default_value = "mountguard-controller"
    )]
    pub lease_name: String,
    /// This replica's pod name (leader identity and leader label).
    #[arg(long, env = "MOUNTGUARD_POD_NAME")]
    pub pod_name: Option<String>,
    /// This replica's namespace (Lease and leader label).
    #[arg(long, env = "MOUNTGUARD_POD_NAMESPACE")]
    pub pod_namespace: Option<String>,
    /// Remediation mode.
    #[arg(
        long,
        env = "MOUNTGUARD_REMEDIATION",
        value_enum,
        default_value = "off"
    )]
    pub remediation: RemediationMode,
    /// slurmrestd base URL.
    #[arg(long, env = "MOUNTGUARD_SLURMRESTD_URL")]
    pub slurmrestd_url: Option<String>,
    /// CA certificate (PEM) trusted for slurmrestd.
    #[arg(long, env = "MOUNTGUARD_SLURMRESTD_CA_FILE")]
    pub slurmrestd_ca_file: Option<PathBuf>,
    /// Secret `<namespace>/<name>` holding a slurmrestd token.
    #[arg(long, env = "MOUNTGUARD_SLURM_TOKEN_SECRET")]
    pub slurm_token_secret: Option<ObjectName>,
    /// Key of the token in `--slurm-token-secret`.
    #[arg(long, env = "MOUNTGUARD_SLURM_TOKEN_KEY", default_value = "SLURM_JWT")]
    pub slurm_token_key: String,
    /// Secret `<namespace>/<name>` holding `jwt.key`, to mint short-lived
    /// HS256 tokens.
    #[arg(long, env = "MOUNTGUARD_SLURM_JWT_KEY_SECRET")]
    pub slurm_jwt_key_secret: Option<ObjectName>,
    /// Slurm user of minted tokens.
    #[arg(long, env = "MOUNTGUARD_SLURM_USER", default_value = "slurm")]
    pub slurm_user: String,
    /// Concurrent remediations per NodeSet.
    #[arg(
        long,
        env = "MOUNTGUARD_REMEDIATION_BUDGET_PER_NODESET",
        default_value_t = 1
    )]
    pub remediation_budget_per_nodeset: u32,
    /// Concurrent remediations in the cluster.
    #[arg(
        long,
        env = "MOUNTGUARD_REMEDIATION_BUDGET_CLUSTER",
        default_value_t = 3
    )]
    pub remediation_budget_cluster: u32,
    /// How long a verdict must hold before remediation starts.
    #[arg(long, env = "MOUNTGUARD_REMEDIATION_DELAY", default_value = "5m", value_parser = parse_duration)]
    pub remediation_delay: Duration,
    /// How long to wait for a drain.
    #[arg(long, env = "MOUNTGUARD_DRAIN_TIMEOUT", default_value = "24h", value_parser = parse_duration)]
    pub drain_timeout: Duration,
    /// How long to wait for a replacement pod.
    #[arg(long, env = "MOUNTGUARD_REPLACEMENT_TIMEOUT", default_value = "15m", value_parser = parse_duration)]
    pub replacement_timeout: Duration,
    /// How long the Eviction API may keep refusing (PodDisruptionBudget,
    /// errors) before the attempt fails.
    #[arg(long, env = "MOUNTGUARD_EVICTION_TIMEOUT", default_value = "30m", value_parser = parse_duration)]
    pub eviction_timeout: Duration,
    /// How long the replacement may take to show fresh on the node and
    /// responding in Slurm.
    #[arg(long, env = "MOUNTGUARD_VERIFICATION_TIMEOUT", default_value = "10m", value_parser = parse_duration)]
    pub verification_timeout: Duration,
    /// What to do with the Slurm node when remediation fails.
    #[arg(
        long,
        env = "MOUNTGUARD_ON_FAILURE",
        value_enum,
        default_value = "keep-drained"
    )]
    pub on_failure: OnFailure,
    /// Also replace the pods pinning an immutable cache entry.
    #[arg(long, env = "MOUNTGUARD_REPLACE_PINNING_PODS", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub replace_pinning_pods: bool,
    /// Log format.
    #[arg(
        long,
        env = "MOUNTGUARD_LOG_FORMAT",
        value_enum,
        default_value = "text"
    )]
    pub log_format: LogFormat,
    /// Log filter (`tracing` env-filter syntax).
    #[arg(long = "log", env = "MOUNTGUARD_LOG", default_value = "info")]
    pub log: String,
}

impl RunArgs {
    /// Arguments for tests and the demo: every default, plaintext reports,
    /// loopback listeners on ephemeral ports, this kubeconfig and agent
    /// identity.
    pub fn for_test(kubeconfig: PathBuf, agent_sa: &str, agent_daemonset: &str) -> Self {
        use clap::Parser;
        #[derive(Parser)]
        struct P {
            #[command(flatten)]
            a: RunArgs,
        }
        let kc = kubeconfig.display().to_string();
        let mut p = P::try_parse_from([
            "x",
            "--kubeconfig",
            &kc,
            "--agent-service-account",
            agent_sa,
            "--agent-daemonset",
            agent_daemonset,
            "--insecure-plaintext-reports",
            "--report-listen",
            "127.0.0.1:0",
            "--metrics-listen",
            "127.0.0.1:0",
        ])
        .expect("test arguments parse");
        // Environment variables must not leak into tests.
        p.a.watch_namespaces.clear();
        p.a
    }

    /// The engine's view of `--grace`.
    pub fn grace_signed(&self) -> SignedDuration {
        SignedDuration::try_from(self.grace).unwrap_or(SignedDuration::MAX)
    }
}

/// What `run` starts with: every flag of [`RunArgs`] checked in one place,
/// before the controller binds a socket or calls the API
/// ([`Settings::try_from`]).
#[derive(Debug)]
pub struct Settings {
    /// The flags, for the parts the tasks take as given.
    pub args: RunArgs,
    /// Certificate and key files of the report API; `None`: plaintext
    /// (`--insecure-plaintext-reports`).
    pub tls: Option<(PathBuf, PathBuf)>,
    /// The verdict engine's configuration.
    pub engine: mountguard_core::Config,
    /// Remediation, unless `--remediation off`: its configurations and the
    /// slurmrestd client.
    pub remediation: Option<super::executor::Prepared>,
    /// The report handler's configuration.
    pub report: super::report::ReportConfig,
    /// Leader election's configuration.
    pub leader: super::leader::LeaderConfig,
}

impl TryFrom<RunArgs> for Settings {
    type Error = crate::Error;

    /// Checks every flag. Each is named here, so a new flag cannot be
    /// added without deciding what it needs checked.
    fn try_from(args: RunArgs) -> Result<Self, crate::Error> {
        use crate::Error;
        let RunArgs {
            // Checked by clap's parsers (types, durations, sizes, rates,
            // names), used as given.
            kubeconfig: _,
            watch_namespaces: _,
            pod_selector: _,
            report_listen: _,
            metrics_listen: _,
            fingerprint_key_file: _,
            max_connections: _,
            header_read_timeout: _,
            idle_timeout: _,
            log_format: _,
            // Taken into the report handler's and leader election's
            // configurations below.
            token_audience,
            agent_service_account,
            agent_daemonset,
            max_report_bytes,
            report_rate_limit,
            lease_name,
            // Checked below.
            tls_cert_file,
            tls_key_file,
            insecure_plaintext_reports,
            grace,
            inventory_max_age,
            leader_election,
            pod_name,
            pod_namespace,
            remediation,
            log,
            // Remediation's, checked by `executor::prepare`.
            slurmrestd_url: _,
            slurmrestd_ca_file: _,
            slurm_token_secret: _,
            slurm_token_key: _,
            slurm_jwt_key_secret: _,
            slurm_user: _,
            remediation_budget_per_nodeset: _,
            remediation_budget_cluster: _,
            remediation_delay: _,
            drain_timeout: _,
            replacement_timeout: _,
            eviction_timeout: _,
            verification_timeout: _,
            on_failure: _,
            replace_pinning_pods: _,
        } = &args;
        let tls = if *insecure_plaintext_reports {
            if tls_cert_file.is_some() {
                tracing::warn!("--insecure-plaintext-reports given: ignoring the TLS certificate");
            }
            None
        } else {
            match (tls_cert_file, tls_key_file) {
                (Some(c), Some(k)) => Some((c.clone(), k.clone())),
                _ => {
                    return Err(Error::Config(
                        "the report API needs --tls-cert-file and --tls-key-file \
                         (or --insecure-plaintext-reports for tests)"
                            .into(),
                    ));
                }
            }
        };
        if *leader_election && (pod_name.is_none() || pod_namespace.is_none()) {
            return Err(Error::Config(
                "--leader-election needs --pod-name and --pod-namespace \
                 (MOUNTGUARD_POD_NAME / MOUNTGUARD_POD_NAMESPACE from the downward API)"
                    .into(),
            ));
        }
        tracing_subscriber::EnvFilter::try_new(log)
            .map_err(|e| Error::Config(format!("--log {log:?}: {e}")))?;
        let engine = mountguard_core::Config {
            grace: SignedDuration::try_from(*grace).unwrap_or(SignedDuration::MAX),
            inventory_max_age: SignedDuration::try_from(*inventory_max_age)
                .unwrap_or(SignedDuration::MAX),
            ..Default::default()
        };
        let remediation = match remediation {
            RemediationMode::Off => None,
            _ => Some(super::executor::prepare(&args)?),
        };
        let report = super::report::ReportConfig {
            audience: token_audience.clone(),
            agent_sa: agent_service_account.clone(),
            agent_daemonset: agent_daemonset.clone(),
            max_bytes: *max_report_bytes,
            rate: *report_rate_limit,
            limits: super::report::CountLimits::default(),
        };
        let leader = super::leader::LeaderConfig {
            enabled: *leader_election,
            lease_name: lease_name.clone(),
            pod_name: pod_name.clone(),
            pod_namespace: pod_namespace.clone(),
        };
        Ok(Settings {
            tls,
            engine,
            remediation,
            report,
            leader,
            args,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_limit_forms() {
        let r: RateLimit = "2/s,5".parse().unwrap();
        assert_eq!((r.per_second, r.burst), (2.0, 5));
        let r: RateLimit = "2/s burst 5".parse().unwrap();
        assert_eq!((r.per_second, r.burst), (2.0, 5));
        let r: RateLimit = "0.5/s".parse().unwrap();
        assert_eq!((r.per_second, r.burst), (0.5, 1));
        assert!("0/s".parse::<RateLimit>().is_err());
        assert!("fast".parse::<RateLimit>().is_err());
        assert!("2/s,0".parse::<RateLimit>().is_err());
    }

    #[test]
    fn names_and_sizes() {
        let sa: ServiceAccountRef = "mg:agent".parse().unwrap();
        assert_eq!(sa.username(), "system:serviceaccount:mg:agent");
        assert!("agent".parse::<ServiceAccountRef>().is_err());
        assert!("a/b/c".parse::<ObjectName>().is_err());
        assert_eq!(parse_bytes("32Mi").unwrap(), 32 << 20);
        assert_eq!(parse_bytes("33554432").unwrap(), 32 << 20);
        assert!(parse_bytes("-1").is_err());
        assert_eq!(parse_duration("3m").unwrap(), Duration::from_secs(180));
    }

    /// The duration table shared with the agent and the chart, through
    /// every duration flag of `run`, `wait` and `verify`.
    #[test]
    fn duration_flags_follow_the_shared_table() {
        use crate::cli::{Cli, Command};
        use clap::Parser;
        let doc: serde_json::Value =
            serde_json::from_str(include_str!("../../../inventory/src/duration_cases.json"))
                .unwrap();
        let cases: Vec<(String, Option<u64>)> =
            serde_json::from_value(doc["cases"].clone()).unwrap();
        let run = [
            "run",
            "--agent-service-account",
            "mg:agent",
            "--agent-daemonset",
            "a",
        ];
        let wait = ["wait", "secret/ns/s"];
        let verify = ["verify", "--objects", "objects.json"];
        let flags: &[(&[&str], &str)] = &[
            (&run, "--grace"),
            (&run, "--inventory-max-age"),
            (&run, "--header-read-timeout"),
            (&run, "--idle-timeout"),
            (&run, "--remediation-delay"),
            (&run, "--drain-timeout"),
            (&run, "--replacement-timeout"),
            (&run, "--eviction-timeout"),
            (&run, "--verification-timeout"),
            (&wait, "--timeout"),
            (&wait, "--interval"),
            (&verify, "--grace"),
            (&verify, "--inventory-max-age"),
        ];
        for (command, flag) in flags {
            for (s, want) in &cases {
                let mut argv = vec!["mountguard-controller"];
                argv.extend_from_slice(command);
                argv.extend_from_slice(&[flag, s.as_str()]);
                let got = Cli::try_parse_from(argv).ok().map(|cli| {
                    let d = match (cli.command, *flag) {
                        (Command::Run(a), "--grace") => a.grace,
                        (Command::Run(a), "--inventory-max-age") => a.inventory_max_age,
                        (Command::Run(a), "--header-read-timeout") => a.header_read_timeout,
                        (Command::Run(a), "--idle-timeout") => a.idle_timeout,
                        (Command::Run(a), "--remediation-delay") => a.remediation_delay,
                        (Command::Run(a), "--drain-timeout") => a.drain_timeout,
                        (Command::Run(a), "--replacement-timeout") => a.replacement_timeout,
                        (Command::Run(a), "--eviction-timeout") => a.eviction_timeout,
                        (Command::Run(a), "--verification-timeout") => a.verification_timeout,
                        (Command::Wait(w), "--timeout") => w.wait.timeout,
                        (Command::Wait(w), "--interval") => w.wait.interval,
                        (Command::Verify(v), "--grace") => v.grace.unsigned_abs(),
                        (Command::Verify(v), "--inventory-max-age") => {
                            v.inventory_max_age.unsigned_abs()
                        }
                        (_, f) => panic!("{f}"),
                    };
                    d.as_millis() as u64
                });
                assert_eq!(got, *want, "{command:?} {flag} {s:?}");
            }
        }
    }

    /// Every combination of flags `run` refuses is refused by the one
    /// conversion, before anything is bound or called.
    #[test]
    fn settings_check_every_flag_before_start() {
        let base = || RunArgs::for_test("/dev/null".into(), "mg:agent", "agent");
        let s = Settings::try_from(base()).unwrap();
        assert!(s.tls.is_none(), "for_test is plaintext");
        assert!(s.remediation.is_none());
        assert_eq!(s.engine.grace, SignedDuration::from_secs(180));
        assert_eq!(s.engine.inventory_max_age, SignedDuration::from_secs(300));
        let refused = |change: &dyn Fn(&mut RunArgs), want: &str| {
            let mut a = base();
            change(&mut a);
            let e = Settings::try_from(a).unwrap_err().to_string();
            assert!(e.contains(want), "{want}: {e}");
        };
        refused(
            &|a| a.insecure_plaintext_reports = false,
            "needs --tls-cert-file and --tls-key-file",
        );
        refused(
            &|a| {
                a.insecure_plaintext_reports = false;
                a.tls_cert_file = Some("/c".into());
            },
            "needs --tls-cert-file and --tls-key-file",
        );
        refused(
            &|a| a.leader_election = true,
            "--leader-election needs --pod-name and --pod-namespace",
        );
        refused(&|a| a.log = "info,[".into(), "--log");
        refused(
            &|a| a.remediation = RemediationMode::DryRun,
            "--remediation needs --slurmrestd-url",
        );
        refused(
            &|a| {
                a.remediation = RemediationMode::On;
                a.slurmrestd_url = Some("http://slurm:6820".into());
            },
            "exactly one of --slurm-token-secret and --slurm-jwt-key-secret",
        );
        let secret: ObjectName = "slurm/token".parse().unwrap();
        refused(
            &|a| {
                a.remediation = RemediationMode::On;
                a.slurmrestd_url = Some("slurm:6820".into());
                a.slurm_token_secret = Some(secret.clone());
            },
            "--slurmrestd-url",
        );
        refused(
            &|a| {
                a.remediation = RemediationMode::On;
                a.slurmrestd_url = Some("https://slurm:6820".into());
                a.slurm_token_secret = Some(secret.clone());
                a.slurmrestd_ca_file = Some("/nonexistent/ca.crt".into());
            },
            "/nonexistent/ca.crt",
        );
        let mut a = base();
        a.insecure_plaintext_reports = false;
        a.tls_cert_file = Some("/c".into());
        a.tls_key_file = Some("/k".into());
        a.remediation = RemediationMode::DryRun;
        a.slurmrestd_url = Some("http://slurm:6820".into());
        a.slurm_jwt_key_secret = Some(secret.clone());
        let s = Settings::try_from(a).unwrap();
        assert_eq!(s.tls, Some(("/c".into(), "/k".into())));
        assert!(s.remediation.is_some());
    }

    /// The report handler's and leader election's configurations come out
    /// of the same conversion, flag for flag.
    #[test]
    fn settings_carry_the_report_and_leader_configurations() {
        let mut a = RunArgs::for_test("/dev/null".into(), "mg:agent", "agent");
        a.token_audience = "aud".into();
        a.max_report_bytes = 1234;
        a.report_rate_limit = "3/s,7".parse().unwrap();
        a.leader_election = true;
        a.lease_name = "the-lease".into();
        a.pod_name = Some("pod-a".into());
        a.pod_namespace = Some("mg".into());
        let s = Settings::try_from(a).unwrap();
        assert_eq!(s.report.audience, "aud");
        assert_eq!(
            s.report.agent_sa.username(),
            "system:serviceaccount:mg:agent"
        );
        assert_eq!(s.report.agent_daemonset, "agent");
        assert_eq!(s.report.max_bytes, 1234);
        assert_eq!((s.report.rate.per_second, s.report.rate.burst), (3.0, 7));
        assert!(s.leader.enabled);
        assert_eq!(s.leader.lease_name, "the-lease");
        assert_eq!(s.leader.pod_name.as_deref(), Some("pod-a"));
        assert_eq!(s.leader.pod_namespace.as_deref(), Some("mg"));
    }

    /// A bad flag is reported before the controller reads a kubeconfig or
    /// binds a socket: here the kubeconfig is unusable and the report port
    /// is taken, yet the answer names the flag.
    #[tokio::test]
    async fn start_refuses_bad_flags_before_anything_else() {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut a = RunArgs::for_test("/nonexistent/kubeconfig".into(), "mg:agent", "agent");
        a.report_listen = taken.local_addr().unwrap();
        a.remediation = RemediationMode::On;
        let e = crate::live::Controller::start(a)
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains("--remediation needs --slurmrestd-url"), "{e}");
    }
}
