//! `run`'s flags and settings: the flags of `mountguard-controller run`
//! ([`RunArgs`], with the types of their values; the command tree in
//! `cli.rs` flattens them in), and every one of them checked and converted
//! in one place ([`Settings::try_from`]), before the controller binds a
//! socket or calls the API. The tasks take these typed settings, never
//! the flags.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, ValueEnum};
use jiff::SignedDuration;
use mountguard_core::remediation::machine::{AbsentNodePolicy, FailurePolicy, MachineConfig};
use mountguard_core::remediation::plan::{Mode, PlanConfig};
use mountguard_core::remediation::workload::WorkloadKind;
use mountguard_inventory::parse_duration;

use crate::Error;
use crate::admission::{AdmissionArgs, AdmissionMode, AdmissionSettings};
use crate::api::authorize::StatusAuthMode;
use crate::edge::watch::WatchSettings;
use crate::intake::auth::ServiceAccountRef;
use crate::intake::limits::{CountLimits, ReportConfig};
use crate::leader::LeaderConfig;
use crate::remediation::settings::{
    ObjectName, Prepared, RemediationSettings, SlurmCredential, SlurmSettings,
};
use crate::runtime::limits::RateLimit;

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
    /// Who may read `/v1/verdicts` and `/v1/rollouts/...` on the metrics
    /// port: `kubernetes` (a bearer token, checked with a TokenReview and a
    /// SubjectAccessReview for `get` on `verdicts.mountguard.io`) or `none`
    /// (anyone who reaches the port; docs/security.md).
    #[arg(
        long,
        env = "MOUNTGUARD_STATUS_AUTH",
        value_enum,
        default_value = "kubernetes"
    )]
    pub status_auth: StatusAuthMode,
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
    /// Longest time a report body may take to arrive, plus one second per
    /// 64 KiB received; a slower one is answered 408.
    #[arg(long, env = "MOUNTGUARD_REPORT_BODY_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub report_body_timeout: Duration,
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
    /// How long a workload attempt may hold a node (the
    /// `mountguard.io/replacing` NoSchedule taint that keeps replacements
    /// off it while the old pod goes); lifted after it whatever the attempt
    /// waits for.
    #[arg(long, env = "MOUNTGUARD_NODE_HOLD_TIMEOUT", default_value = "10m", value_parser = parse_duration)]
    pub node_hold_timeout: Duration,
    /// How long the replacement may take to show fresh on the node and
    /// responding in Slurm.
    #[arg(long, env = "MOUNTGUARD_VERIFICATION_TIMEOUT", default_value = "10m", value_parser = parse_duration)]
    pub verification_timeout: Duration,
    /// How long slurmrestd may answer "not found" for a NodeSet pod's Slurm
    /// node before it counts (until then it is retried like any transient
    /// error: a node re-registering or a slurmctld restarting answers so
    /// for a while).
    #[arg(long, env = "MOUNTGUARD_SLURM_NOT_FOUND_GRACE", default_value = "5m", value_parser = parse_duration)]
    pub slurm_not_found_grace: Duration,
    /// What to do with the Slurm node when remediation fails.
    #[arg(
        long,
        env = "MOUNTGUARD_ON_FAILURE",
        value_enum,
        default_value = "keep-drained"
    )]
    pub on_failure: OnFailure,
    /// Workload kinds whose opted-in pods (`mountguard.io/remediate:
    /// evict` on the workload) remediation may evict and verify (comma
    /// separated: deployment, replicaset, statefulset, daemonset); none by
    /// default. With some, `--slurmrestd-url` is needed only for NodeSets.
    #[arg(long, env = "MOUNTGUARD_REMEDIATE_WORKLOADS", value_delimiter = ',', num_args = 0..)]
    pub remediate_workloads: Vec<WorkloadKind>,
    /// Concurrent remediations of workload pods in the cluster (apart from
    /// `--remediation-budget-cluster`, which bounds NodeSet attempts).
    #[arg(
        long,
        env = "MOUNTGUARD_REMEDIATION_BUDGET_WORKLOADS",
        default_value_t = 3
    )]
    pub remediation_budget_workloads: u32,
    /// Also replace the pods pinning an immutable cache entry.
    #[arg(long, env = "MOUNTGUARD_REPLACE_PINNING_PODS", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub replace_pinning_pods: bool,
    /// How mountguard first closes a Slurm node: `drain` (DRAIN, replaced
    /// by the FAIL hold just before the eviction) or `fail` (the FAIL hold
    /// from the first write; with the Slinky operator, whose undrain can
    /// undo a fresh DRAIN).
    #[arg(
        long,
        env = "MOUNTGUARD_DRAIN_STATE",
        value_enum,
        default_value = "drain"
    )]
    pub drain_state: DrainState,
    /// What to do with a NodeSet pod whose Slurm node slurmctld does not
    /// know for the whole not-found grace (a dynamic node whose slurmd
    /// never registered on the current key): `fail` the attempt, or
    /// `replace` the pod without a drain and verify the replacement by its
    /// slurmd's registration.
    #[arg(
        long,
        env = "MOUNTGUARD_ABSENT_SLURM_NODE",
        value_enum,
        default_value = "fail"
    )]
    pub absent_slurm_node: AbsentSlurmNode,
    /// The admission webhook.
    #[command(flatten)]
    pub admission: AdmissionArgs,
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
}

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

/// The state of mountguard's first write on a Slurm node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Default)]
pub enum DrainState {
    /// DRAIN, then the FAIL hold just before the eviction.
    #[default]
    Drain,
    /// The FAIL hold at once.
    Fail,
}

/// What to do with a NodeSet pod whose Slurm node slurmctld does not know.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Default)]
pub enum AbsentSlurmNode {
    /// Fail the attempt; nothing is touched.
    #[default]
    Fail,
    /// Evict the pod without a drain; verify the replacement's
    /// registration.
    Replace,
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

/// A size of the shared grammar (`mountguard_inventory::size`, the same
/// as the agent's `--max-file-size`).
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    mountguard_inventory::parse_size(s).map_err(|e| e.to_string())
}

/// What `run` starts with: every flag of [`RunArgs`], checked, as the
/// settings of the part that uses it.
#[derive(Debug)]
pub struct Settings {
    /// kubeconfig file; `None`: in-cluster (or the default kubeconfig).
    pub kubeconfig: Option<PathBuf>,
    /// File with the installation's fingerprint key; `None`: a random key.
    pub fingerprint_key_file: Option<PathBuf>,
    /// The report API's and the metrics port's listeners and limits.
    pub serve: ServeSettings,
    /// The verdict engine's configuration.
    pub engine: mountguard_core::Config,
    /// What the watches watch.
    pub watch: WatchSettings,
    /// The report handler's configuration.
    pub report: ReportConfig,
    /// Leader election's configuration (also this replica's identity, for
    /// Events and the remediation fence).
    pub leader: LeaderConfig,
    /// Remediation, unless `--remediation off`: its settings and the
    /// slurmrestd client.
    pub remediation: Option<Prepared>,
    /// The admission webhook, when `--admission-listen` is given.
    pub admission: Option<AdmissionSettings>,
}

/// The two listeners and their connection limits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServeSettings {
    /// Address of the report API.
    pub report_listen: SocketAddr,
    /// Address of the metrics and status port.
    pub metrics_listen: SocketAddr,
    /// Certificate and key files of the report API; `None`: plaintext
    /// (`--insecure-plaintext-reports`).
    pub tls: Option<(PathBuf, PathBuf)>,
    /// Open report API connections at most (before fitting the open file
    /// limit).
    pub max_connections: usize,
    /// Longest wait for a request head (both ports).
    pub header_read_timeout: Duration,
    /// A connection idle this long is closed (both ports).
    pub idle_timeout: Duration,
    /// Who may read the status API.
    pub status_auth: StatusAuthMode,
}

/// A duration flag as the engine's signed type (saturating).
fn signed(d: Duration) -> SignedDuration {
    SignedDuration::try_from(d).unwrap_or(SignedDuration::MAX)
}

impl TryFrom<RunArgs> for Settings {
    type Error = Error;

    /// Checks every flag. Each is named here, so a new flag cannot be
    /// added without deciding what it needs checked and who takes it.
    fn try_from(args: RunArgs) -> Result<Self, Error> {
        let RunArgs {
            kubeconfig,
            watch_namespaces,
            pod_selector,
            report_listen,
            tls_cert_file,
            tls_key_file,
            insecure_plaintext_reports,
            metrics_listen,
            status_auth,
            token_audience,
            agent_service_account,
            agent_daemonset,
            grace,
            inventory_max_age,
            fingerprint_key_file,
            max_report_bytes,
            report_rate_limit,
            report_body_timeout,
            max_connections,
            header_read_timeout,
            idle_timeout,
            leader_election,
            lease_name,
            pod_name,
            pod_namespace,
            remediation,
            slurmrestd_url,
            slurmrestd_ca_file,
            slurm_token_secret,
            slurm_token_key,
            slurm_jwt_key_secret,
            slurm_user,
            remediation_budget_per_nodeset,
            remediation_budget_cluster,
            remediation_delay,
            drain_timeout,
            replacement_timeout,
            eviction_timeout,
            node_hold_timeout,
            verification_timeout,
            slurm_not_found_grace,
            on_failure,
            replace_pinning_pods,
            drain_state,
            absent_slurm_node,
            remediate_workloads,
            remediation_budget_workloads,
            admission,
            // The log flags are the binary's: it sets up logging before
            // anything else; the filter is checked here too.
            log_format: _,
            log,
        } = args;
        let admission = admission_settings(
            admission,
            tls_cert_file.as_ref().zip(tls_key_file.as_ref()),
            remediation == RemediationMode::On,
        )?;
        let tls = if insecure_plaintext_reports {
            if tls_cert_file.is_some() {
                tracing::warn!("--insecure-plaintext-reports given: ignoring the TLS certificate");
            }
            None
        } else {
            match (tls_cert_file, tls_key_file) {
                (Some(c), Some(k)) => Some((c, k)),
                _ => {
                    return Err(Error::Config(
                        "the report API needs --tls-cert-file and --tls-key-file \
                         (or --insecure-plaintext-reports for tests)"
                            .into(),
                    ));
                }
            }
        };
        if leader_election && (pod_name.is_none() || pod_namespace.is_none()) {
            return Err(Error::Config(
                "--leader-election needs --pod-name and --pod-namespace \
                 (MOUNTGUARD_POD_NAME / MOUNTGUARD_POD_NAMESPACE from the downward API)"
                    .into(),
            ));
        }
        tracing_subscriber::EnvFilter::try_new(&log)
            .map_err(|e| Error::Config(format!("--log {log:?}: {e}")))?;
        let engine = mountguard_core::Config {
            grace: signed(grace),
            inventory_max_age: signed(inventory_max_age),
            ..Default::default()
        };
        let namespaces: Vec<String> = watch_namespaces
            .iter()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect();
        let workload_kinds: BTreeSet<WorkloadKind> = match remediation {
            RemediationMode::Off => BTreeSet::new(),
            _ => remediate_workloads.into_iter().collect(),
        };
        let watch = WatchSettings {
            namespaces: if namespaces.is_empty() {
                vec![None]
            } else {
                namespaces.into_iter().map(Some).collect()
            },
            pod_selector: pod_selector.filter(|s| !s.trim().is_empty()),
            agent_namespace: agent_service_account.namespace.clone(),
            agent_daemonset: agent_daemonset.clone(),
            workload_kinds: workload_kinds.clone(),
        };
        let mode = match remediation {
            RemediationMode::Off => Mode::Off,
            RemediationMode::DryRun => Mode::DryRun,
            RemediationMode::On => Mode::On,
        };
        let remediation = match mode {
            Mode::Off => None,
            Mode::DryRun | Mode::On => {
                // slurmrestd is for NodeSets: without it, only workloads.
                let slurm = match slurmrestd_url {
                    None if !workload_kinds.is_empty() => None,
                    None => {
                        return Err(Error::Config(
                            "--remediation needs --slurmrestd-url (NodeSets) or \
                             --remediate-workloads (Deployments, ReplicaSets, StatefulSets, \
                             DaemonSets)"
                                .into(),
                        ));
                    }
                    Some(url) => {
                        let credential = match (slurm_token_secret, slurm_jwt_key_secret) {
                            (Some(s), None) => SlurmCredential::Token(s, slurm_token_key),
                            (None, Some(s)) => SlurmCredential::JwtKey(s),
                            _ => {
                                return Err(Error::Config(
                                    "--remediation with --slurmrestd-url needs exactly one of \
                                     --slurm-token-secret and --slurm-jwt-key-secret"
                                        .into(),
                                ));
                            }
                        };
                        let ca = match slurmrestd_ca_file {
                            Some(p) => Some(std::fs::read(&p).map_err(|e| Error::Io {
                                file: p.display().to_string(),
                                source: e,
                            })?),
                            None => None,
                        };
                        Some(SlurmSettings {
                            url,
                            ca,
                            credential,
                            user: slurm_user,
                        })
                    }
                };
                // Builds the slurmrestd client: the URL's form and the CA
                // bundle are checked here; no request is made.
                Some(Prepared::new(RemediationSettings {
                    mode,
                    plan: PlanConfig {
                        mode,
                        delay: signed(remediation_delay),
                        budget_per_nodeset: remediation_budget_per_nodeset,
                        budget_cluster: remediation_budget_cluster,
                        replace_pinning_pods,
                        workload_kinds,
                        budget_workloads: remediation_budget_workloads,
                    },
                    machine: MachineConfig {
                        drain_timeout: signed(drain_timeout),
                        replacement_timeout: signed(replacement_timeout),
                        eviction_timeout: signed(eviction_timeout),
                        node_hold_timeout: signed(node_hold_timeout),
                        verification_timeout: signed(verification_timeout),
                        not_found_grace: signed(slurm_not_found_grace),
                        on_failure: match on_failure {
                            OnFailure::KeepDrained => FailurePolicy::Auto,
                            OnFailure::Undrain => FailurePolicy::Undrain,
                        },
                        fail_first: drain_state == DrainState::Fail,
                        absent_node: match absent_slurm_node {
                            AbsentSlurmNode::Fail => AbsentNodePolicy::Fail,
                            AbsentSlurmNode::Replace => AbsentNodePolicy::Replace,
                        },
                        ..Default::default()
                    },
                    slurm,
                })?)
            }
        };
        let report = ReportConfig {
            audience: token_audience,
            agent_sa: agent_service_account,
            agent_daemonset,
            max_bytes: max_report_bytes,
            rate: report_rate_limit,
            limits: CountLimits::default(),
            body_timeout: report_body_timeout,
            node_in_flight: crate::intake::limits::NODE_IN_FLIGHT,
        };
        let leader = LeaderConfig {
            enabled: leader_election,
            lease_name,
            pod_name,
            pod_namespace,
        };
        Ok(Settings {
            kubeconfig,
            fingerprint_key_file,
            serve: ServeSettings {
                report_listen,
                metrics_listen,
                tls,
                max_connections,
                header_read_timeout,
                idle_timeout,
                status_auth,
            },
            engine,
            watch,
            report,
            leader,
            remediation,
            admission,
        })
    }
}

/// The admission flags, checked: a listener needs a certificate (its own,
/// or the report API's), and the answer must come before the webhook's
/// longest `timeoutSeconds` (30 s, `admissionregistration/v1`).
fn admission_settings(
    args: AdmissionArgs,
    report_tls: Option<(&PathBuf, &PathBuf)>,
    remediation: bool,
) -> Result<Option<AdmissionSettings>, Error> {
    let AdmissionArgs {
        admission_listen,
        admission_mode,
        admission_tls_cert_file,
        admission_tls_key_file,
        admission_client_ca_file,
        admission_answer_timeout,
    } = args;
    let Some(listen) = admission_listen else {
        return Ok(None);
    };
    let tls = match (admission_tls_cert_file, admission_tls_key_file) {
        (Some(c), Some(k)) => (c, k),
        _ => match report_tls {
            Some((c, k)) => (c.clone(), k.clone()),
            None => {
                return Err(Error::Config(
                    "the admission webhook is served over HTTPS only: give \
                     --admission-tls-cert-file and --admission-tls-key-file (or \
                     --tls-cert-file and --tls-key-file, which it then shares)"
                        .into(),
                ));
            }
        },
    };
    if admission_answer_timeout.is_zero() || admission_answer_timeout > Duration::from_secs(29) {
        return Err(Error::Config(format!(
            "--admission-answer-timeout {admission_answer_timeout:?}: give more than 0 and less \
             than the webhook's 30 s limit (keep it under the chart's timeoutSeconds)"
        )));
    }
    let mode = match admission_mode {
        AdmissionMode::Warn => mountguard_core::admission::Mode::Warn,
        AdmissionMode::Deny => mountguard_core::admission::Mode::Deny,
        AdmissionMode::Off => mountguard_core::admission::Mode::Off,
    };
    Ok(Some(AdmissionSettings {
        listen,
        tls,
        mode,
        answer_timeout: admission_answer_timeout,
        remediation,
        client_ca: admission_client_ca_file,
    }))
}

#[cfg(test)]
mod tests;
