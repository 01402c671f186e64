//! The command line of `mountguard-controller` and of the kubectl plugin
//! `kubectl mountguard`: the command tree, and the flags of `status`,
//! `wait`, `verify` and the plugin with the types of their values (see
//! `docs/controller.md`). This module only parses: it depends on the
//! commands, never they on it.
//!
//! `run`'s flags, [`RunArgs`] (each also read from `MOUNTGUARD_<FLAG>`),
//! sit with the one conversion that checks them into
//! [`Settings`](crate::settings::Settings), in `settings.rs`; the other
//! commands' flags convert field for field into their settings.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use jiff::{SignedDuration, Timestamp};
use mountguard_core::rollout::Target;

use crate::offline::verify::{FailOn, Output, Verify};
use crate::query::endpoint::Proxy;
use crate::query::status::{StatusOutput, StatusQuery};
use crate::query::wait::{WaitFor, WaitOptions};
use crate::settings::{RunArgs, parse_bytes};

/// Command line of `mountguard-controller` (all subcommands).
#[derive(Debug, clap::Parser)]
#[command(
    name = "mountguard-controller",
    version,
    about = "mountguard controller"
)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Command line of `kubectl mountguard` (the same binary, installed or
/// linked as `kubectl-mountguard`): reaches the controller through the API
/// server's service proxy with the user's kubeconfig.
#[derive(Debug, clap::Parser)]
#[command(
    name = "kubectl-mountguard",
    bin_name = "kubectl mountguard",
    version,
    about = "mountguard verdicts and rollout gate, through the Kubernetes API server"
)]
pub struct PluginCli {
    /// Cluster and controller Service.
    #[command(flatten)]
    pub proxy: ProxyArgs,
    /// What to do.
    #[command(subcommand)]
    pub command: PluginCommand,
}

/// Subcommands of the kubectl plugin.
#[derive(Debug, clap::Subcommand)]
pub enum PluginCommand {
    /// Print the controller's verdicts.
    Status(StatusQueryArgs),
    /// Wait until every consumer of an object is verified fresh on its
    /// node for the object's current content (exit 0), or time out (1).
    Wait(WaitOptionsArgs),
}

/// Whether the program was started as the kubectl plugin (`argv[0]`'s
/// file name is `kubectl-mountguard`, as kubectl runs plugins found on
/// `PATH`).
pub fn invoked_as_plugin(argv0: &std::ffi::OsStr) -> bool {
    std::path::Path::new(argv0)
        .file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n == "kubectl-mountguard" || n == "kubectl-mountguard.exe")
}

/// Subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Run the controller: watches, report API, verdicts, metrics, Events.
    Run(Box<RunArgs>),
    /// Print the verdicts of a running controller.
    Status(StatusArgs),
    /// Wait until every consumer of an object is verified fresh on its
    /// node for the object's current content (exit 0), or time out (1).
    Wait(WaitArgs),
    /// Evaluate verdicts offline from an object dump and agent inventories.
    Verify(VerifyArgs),
}

/// Parses a duration like `250ms`, `180s`, `180` or `3m`: the grammar of
/// every mountguard duration (`mountguard_inventory::duration`, shared
/// with the agent and the chart).
pub use mountguard_inventory::parse_duration;

/// The flags of `cmd` and its subcommands that take a duration (for the
/// duration message when the shell split a value: `--timeout 10 minutes`).
pub fn duration_flags(cmd: &clap::Command) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![cmd];
    while let Some(c) = stack.pop() {
        for a in c.get_arguments() {
            let t = a.get_value_parser().type_id();
            if (t == std::any::TypeId::of::<Duration>()
                || t == std::any::TypeId::of::<SignedDuration>())
                && let Some(l) = a.get_long()
            {
                out.push(l.to_string());
            }
        }
        stack.extend(c.get_subcommands());
    }
    out
}

/// The controller's metrics port, reached directly (`status`, `wait`).
#[derive(Debug, Clone, Args)]
pub struct UrlArgs {
    /// Base URL of the controller's metrics port, e.g. http://mountguard-controller-metrics:8080.
    #[arg(
        long,
        env = "MOUNTGUARD_STATUS_URL",
        default_value = "http://127.0.0.1:8080"
    )]
    pub url: String,
    /// Bearer token of a reader allowed to `get` `verdicts.mountguard.io`
    /// (the status API's default `--status-auth kubernetes`).
    #[arg(long, env = "MOUNTGUARD_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// File holding that token (e.g. a pod's
    /// `/var/run/secrets/kubernetes.io/serviceaccount/token`).
    #[arg(long, env = "MOUNTGUARD_TOKEN_FILE", conflicts_with = "token")]
    pub token_file: Option<PathBuf>,
}

/// Arguments of `mountguard-controller status`.
#[derive(Debug, Clone, Args)]
pub struct StatusArgs {
    /// Where the controller is.
    #[command(flatten)]
    pub controller: UrlArgs,
    /// What to list and how.
    #[command(flatten)]
    pub query: StatusQueryArgs,
}

/// Filters and output of `status` (shared by `mountguard-controller status`
/// and `kubectl mountguard status`).
#[derive(Debug, Clone, Args)]
pub struct StatusQueryArgs {
    /// Only this namespace.
    #[arg(long)]
    pub namespace: Option<String>,
    /// Only this node.
    #[arg(long)]
    pub node: Option<String>,
    /// Only this state (`Stale`) or tag (`Stale/ImmutableCachePinned`).
    #[arg(long)]
    pub state: Option<String>,
    /// Include Fresh and Skipped verdicts.
    #[arg(long)]
    pub all: bool,
    /// Output format.
    #[arg(long, value_enum, default_value = "table")]
    pub output: StatusOutput,
    /// The request, from connecting to the last byte of the answer, must
    /// end within this (exit 2 otherwise).
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub request_timeout: Duration,
    /// Largest answer accepted (exit 2 beyond it), e.g. `256Mi`.
    #[arg(long, default_value = "256Mi", value_parser = parse_bytes)]
    pub max_response_size: u64,
}

/// What to wait for and how (shared by `mountguard-controller wait` and
/// `kubectl mountguard wait`).
#[derive(Debug, Clone, Args)]
pub struct WaitOptionsArgs {
    /// `secret/NAMESPACE/NAME`, `configmap/NAMESPACE/NAME`,
    /// `nodeset/NAMESPACE/NAME`, `deployment/NAMESPACE/NAME`,
    /// `replicaset/...`, `statefulset/...`, `daemonset/...` or
    /// `pod/NAMESPACE/NAME`.
    pub target: Target,
    /// Condition.
    #[arg(long = "for", value_enum, default_value = "fresh")]
    pub condition: WaitFor,
    /// Give up after this long (exit 1), e.g. `10m`.
    #[arg(long, default_value = "10m", value_parser = parse_duration)]
    pub timeout: Duration,
    /// Time between two requests.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub interval: Duration,
    /// The UID the Secret or ConfigMap has now (after a delete and
    /// recreate): until the controller sees this object, the rollout is not
    /// complete.
    #[arg(long)]
    pub uid: Option<String>,
    /// Output format of the result.
    #[arg(long, value_enum, default_value = "table")]
    pub output: StatusOutput,
    /// Each request, from connecting to the last byte of the answer, must
    /// end within this (a request failing after the first is retried); no
    /// request outlasts `--timeout`.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub request_timeout: Duration,
    /// Largest answer accepted (exit 2 beyond it), e.g. `256Mi`.
    #[arg(long, default_value = "256Mi", value_parser = parse_bytes)]
    pub max_response_size: u64,
}

/// Arguments of `mountguard-controller wait`.
#[derive(Debug, Clone, Args)]
pub struct WaitArgs {
    /// Where the controller is.
    #[command(flatten)]
    pub controller: UrlArgs,
    /// What to wait for.
    #[command(flatten)]
    pub wait: WaitOptionsArgs,
}

/// Flags of the kubectl plugin: which cluster, and which Service of the
/// controller to reach through the API server.
#[derive(Debug, Clone, Args)]
pub struct ProxyArgs {
    /// kubeconfig file (default: `KUBECONFIG`, else `~/.kube/config`, else
    /// in-cluster).
    #[arg(long, global = true)]
    pub kubeconfig: Option<PathBuf>,
    /// kubeconfig context (default: the current context).
    #[arg(long, global = true)]
    pub context: Option<String>,
    /// Namespace of the mountguard release.
    #[arg(
        long,
        global = true,
        env = "MOUNTGUARD_CONTROLLER_NAMESPACE",
        default_value = "mountguard-system"
    )]
    pub controller_namespace: String,
    /// The controller's metrics Service (the chart's `<fullname>-controller-metrics`:
    /// `mountguard-controller-metrics` for the release `mountguard`).
    #[arg(
        long,
        global = true,
        env = "MOUNTGUARD_CONTROLLER_SERVICE",
        default_value = "mountguard-controller-metrics"
    )]
    pub controller_service: String,
    /// Port of that Service (name or number).
    #[arg(long, global = true, default_value = "metrics")]
    pub controller_port: String,
    /// Bearer token of a reader allowed to `get` `verdicts.mountguard.io`
    /// (default: the kubeconfig user's token, when it has a plain one).
    #[arg(long, global = true, env = "MOUNTGUARD_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// File holding that token.
    #[arg(
        long,
        global = true,
        env = "MOUNTGUARD_TOKEN_FILE",
        conflicts_with = "token"
    )]
    pub token_file: Option<PathBuf>,
}

/// Arguments of `verify`.
#[derive(Debug, Args)]
pub struct VerifyArgs {
    /// JSON of `kubectl get pods,secrets,configmaps -A -o json` (a v1 List,
    /// a typed list or a single object); several files allowed, `-` reads
    /// standard input.
    #[arg(long, env = "MOUNTGUARD_OBJECTS", required = true, num_args = 1.., value_delimiter = ',')]
    pub objects: Vec<PathBuf>,
    /// Agent inventories (`mountguard-agent scan --output json`), one node
    /// each (a JSON array of inventories is accepted too).
    #[arg(long, env = "MOUNTGUARD_INVENTORY", num_args = 1.., value_delimiter = ',')]
    pub inventory: Vec<PathBuf>,
    /// Evaluation time (RFC 3339); defaults to the current time.
    #[arg(long, env = "MOUNTGUARD_NOW", value_parser = parse_time)]
    pub now: Option<Timestamp>,
    /// Grace period for propagation of changed content.
    #[arg(long, env = "MOUNTGUARD_GRACE", default_value = "180s", value_parser = parse_signed_duration)]
    pub grace: SignedDuration,
    /// Inventories scanned longer ago than this are too old to judge by.
    #[arg(long, env = "MOUNTGUARD_INVENTORY_MAX_AGE", default_value = "5m", value_parser = parse_signed_duration)]
    pub inventory_max_age: SignedDuration,
    /// Minimum number of mutable volume mounts on a node for the
    /// KubeletNotSyncing rule.
    #[arg(long, env = "MOUNTGUARD_NOT_SYNCING_MIN_MOUNTS", default_value_t = 3)]
    pub not_syncing_min_mounts: u32,
    /// File holding the installation's fingerprint key (at least 16 bytes).
    /// Without it a one-off random key is used and fingerprints are only
    /// comparable within one run.
    #[arg(long, env = "MOUNTGUARD_FINGERPRINT_KEY_FILE")]
    pub fingerprint_key_file: Option<PathBuf>,
    /// Output format.
    #[arg(long, env = "MOUNTGUARD_OUTPUT", value_enum, default_value = "table")]
    pub output: Output,
    /// Exit 1 when a verdict matches, or when a subject cannot be verified
    /// (Unverifiable: the gate fails closed).
    #[arg(long, env = "MOUNTGUARD_FAIL_ON", value_enum)]
    pub fail_on: Option<FailOn>,
    /// With --fail-on, let Unverifiable subjects pass.
    #[arg(long, env = "MOUNTGUARD_ALLOW_UNVERIFIABLE", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub allow_unverifiable: bool,
    /// Judge without inventories: only what the objects alone show
    /// (without it, no --inventory is a usage error).
    #[arg(long, env = "MOUNTGUARD_SPEC_ONLY", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub spec_only: bool,
}

/// A duration of the shared grammar (`mountguard_inventory::duration`) as
/// the engine's signed type.
fn parse_signed_duration(s: &str) -> Result<SignedDuration, String> {
    let d = mountguard_inventory::parse_duration(s).map_err(|e| e.to_string())?;
    SignedDuration::try_from(d).map_err(|e| format!("{s:?}: {e}"))
}

fn parse_time(s: &str) -> Result<Timestamp, String> {
    s.parse()
        .map_err(|e| format!("{s:?} is not an RFC 3339 time like 2026-11-30T10:00:00Z: {e}"))
}

/// `From<flags> for settings`, field for field. Both sides are written out
/// in full (no `..`), so a flag added to one and not the other does not
/// compile.
macro_rules! field_for_field {
    ($from:ident => $to:ident { $($field:ident),* $(,)? }) => {
        impl From<$from> for $to {
            fn from(flags: $from) -> Self {
                let $from { $($field),* } = flags;
                $to { $($field),* }
            }
        }
    };
}

field_for_field!(StatusQueryArgs => StatusQuery {
    namespace, node, state, all, output, request_timeout, max_response_size,
});
field_for_field!(WaitOptionsArgs => WaitOptions {
    target, condition, timeout, interval, uid, output, request_timeout, max_response_size,
});
field_for_field!(ProxyArgs => Proxy {
    kubeconfig, context, controller_namespace, controller_service, controller_port, token,
    token_file,
});
field_for_field!(VerifyArgs => Verify {
    objects, inventory, now, grace, inventory_max_age, not_syncing_min_mounts,
    fingerprint_key_file, output, fail_on, allow_unverifiable, spec_only,
});

#[cfg(test)]
mod tests {
    use super::*;
    use crate::intake::auth::ServiceAccountRef;
    use crate::remediation::settings::ObjectName;
    use crate::runtime::limits::RateLimit;

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
    /// every duration flag of `run`, `status`, `wait` and `verify`.
    #[test]
    fn duration_flags_follow_the_shared_table() {
        use clap::Parser;
        let doc: serde_json::Value =
            serde_json::from_str(include_str!("../../inventory/src/duration_cases.json")).unwrap();
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
        let status = ["status"];
        let verify = ["verify", "--objects", "objects.json"];
        let flags: &[(&[&str], &str)] = &[
            (&run, "--grace"),
            (&run, "--inventory-max-age"),
            (&run, "--header-read-timeout"),
            (&run, "--idle-timeout"),
            (&run, "--report-body-timeout"),
            (&run, "--admission-answer-timeout"),
            (&run, "--remediation-delay"),
            (&run, "--drain-timeout"),
            (&run, "--replacement-timeout"),
            (&run, "--eviction-timeout"),
            (&run, "--node-hold-timeout"),
            (&run, "--verification-timeout"),
            (&wait, "--timeout"),
            (&wait, "--interval"),
            (&wait, "--request-timeout"),
            (&status, "--request-timeout"),
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
                        (Command::Run(a), "--admission-answer-timeout") => {
                            a.admission.admission_answer_timeout
                        }
                        (Command::Run(a), "--report-body-timeout") => a.report_body_timeout,
                        (Command::Run(a), "--remediation-delay") => a.remediation_delay,
                        (Command::Run(a), "--drain-timeout") => a.drain_timeout,
                        (Command::Run(a), "--replacement-timeout") => a.replacement_timeout,
                        (Command::Run(a), "--eviction-timeout") => a.eviction_timeout,
                        (Command::Run(a), "--node-hold-timeout") => a.node_hold_timeout,
                        (Command::Run(a), "--verification-timeout") => a.verification_timeout,
                        (Command::Wait(w), "--timeout") => w.wait.timeout,
                        (Command::Wait(w), "--interval") => w.wait.interval,
                        (Command::Wait(w), "--request-timeout") => w.wait.request_timeout,
                        (Command::Status(s), "--request-timeout") => s.query.request_timeout,
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

    /// What the README says: every flag of `run` and `verify` reads an
    /// environment variable; of `status`, `wait` and the plugin only these.
    #[test]
    fn environment_variables_are_where_the_docs_say() {
        use clap::CommandFactory;
        let with_env = |c: &clap::Command| -> Vec<String> {
            c.get_arguments()
                .filter(|a| a.get_env().is_some())
                .map(|a| a.get_id().to_string())
                .collect()
        };
        let cmd = Cli::command();
        for sub in cmd.get_subcommands() {
            let flags: Vec<&clap::Arg> = sub
                .get_arguments()
                .filter(|a| {
                    !a.is_positional() && !["help", "version"].contains(&a.get_id().as_str())
                })
                .collect();
            match sub.get_name() {
                "run" | "verify" => {
                    for a in flags {
                        // --kubeconfig reads KUBECONFIG through the client.
                        assert!(
                            a.get_env().is_some() || a.get_id() == "kubeconfig",
                            "{} --{} has no environment variable",
                            sub.get_name(),
                            a.get_id()
                        );
                    }
                }
                "status" | "wait" => assert_eq!(
                    with_env(sub),
                    ["url", "token", "token_file"],
                    "{}",
                    sub.get_name()
                ),
                other => panic!("{other}: say in the README which flags read the environment"),
            }
        }
        let plugin = PluginCli::command();
        assert_eq!(
            with_env(&plugin),
            [
                "controller_namespace",
                "controller_service",
                "token",
                "token_file"
            ]
        );
        for sub in plugin.get_subcommands() {
            assert!(with_env(sub).is_empty(), "{}", sub.get_name());
        }
    }

    /// The docs check: the flags and defaults `docs/controller.md` lists
    /// for `run` (its table) and for `status` and `wait` (their synopsis,
    /// `[--flag DEFAULT]`), and `docs/verdicts.md` for `verify`, are the
    /// ones `--help` prints (the same clap definitions).
    #[test]
    fn docs_list_the_flags_and_defaults_of_help() {
        use clap::CommandFactory;
        let cmd = Cli::command();
        let sub = |n: &str| cmd.find_subcommand(n).unwrap().clone();
        let default_of = |c: &clap::Command, long: &str| -> Option<String> {
            let a = c.get_arguments().find(|a| a.get_long() == Some(long))?;
            let v: Vec<String> = a
                .get_default_values()
                .iter()
                .map(|v| v.to_string_lossy().into_owned())
                .collect();
            (!v.is_empty()).then(|| v.join(","))
        };
        // Two defaults agree when they are the same string or the same
        // duration or size.
        let same = |doc: &str, help: &str| {
            doc == help
                || matches!((parse_duration(doc), parse_duration(help)), (Ok(a), Ok(b)) if a == b)
                || matches!((parse_bytes(doc), parse_bytes(help)), (Ok(a), Ok(b)) if a == b)
        };
        let ticks = |cell: &str| -> Vec<String> {
            cell.split('`')
                .skip(1)
                .step_by(2)
                .map(str::to_string)
                .collect()
        };
        let controller_md = include_str!("../../docs/controller.md");
        // run: the table under "## Flags".
        let run = sub("run");
        let table = controller_md
            .split("| flag | default | meaning |")
            .nth(1)
            .unwrap()
            .split("\n\n")
            .next()
            .unwrap();
        let mut documented = std::collections::BTreeSet::new();
        for row in table.lines().skip(2) {
            let cells: Vec<&str> = row.split(" | ").collect();
            let flags: Vec<String> = ticks(cells[0])
                .into_iter()
                .filter(|f| f.starts_with("--"))
                .collect();
            let doc_default = ticks(cells[1]).into_iter().next();
            for f in &flags {
                let long = f.trim_start_matches("--");
                assert!(
                    run.get_arguments().any(|a| a.get_long() == Some(long)),
                    "docs/controller.md lists {f}, which run does not have"
                );
                documented.insert(long.to_string());
                if flags.len() == 1
                    && let (Some(d), Some(h)) = (&doc_default, default_of(&run, long))
                {
                    assert!(same(d, &h), "{f}: docs say {d}, --help says {h}");
                }
            }
        }
        for a in run.get_arguments() {
            if let Some(l) = a.get_long()
                && !a.is_hide_set()
                && l != "help"
            {
                assert!(
                    documented.contains(l),
                    "run --{l} is not in docs/controller.md"
                );
            }
        }
        // status and wait: `[--flag VALUE]` in the synopsis.
        let synopsis = |text: &str, start: &str| -> Vec<(String, String)> {
            let from = text.find(start).unwrap();
            let block: String = text[from..]
                .lines()
                .take_while(|l| !l.trim().is_empty() && !l.starts_with("```"))
                .collect::<Vec<_>>()
                .join(" ");
            let block = block
                .split(" mountguard-controller ")
                .next()
                .unwrap()
                .to_string();
            block
                .split('[')
                .skip(1)
                .filter_map(|s| {
                    let inner = s.split(']').next()?;
                    let mut it = inner.split_whitespace();
                    let f = it.next()?.strip_prefix("--")?.to_string();
                    Some((f, it.next().unwrap_or("").to_string()))
                })
                .collect()
        };
        for (name, start) in [
            ("status", "mountguard-controller status --url"),
            ("wait", "mountguard-controller wait secret/"),
        ] {
            let c = sub(name);
            let listed = synopsis(controller_md, start);
            assert!(!listed.is_empty(), "{name}");
            for (f, v) in listed {
                let has = c.get_arguments().any(|a| a.get_long() == Some(f.as_str()));
                assert!(
                    has,
                    "docs/controller.md lists {name} --{f}, which it does not have"
                );
                if let Some(h) = default_of(&c, &f)
                    && !v.contains('|')
                    && !v.chars().all(|ch| ch.is_ascii_uppercase() || ch == '.')
                {
                    assert!(same(&v, &h), "{name} --{f}: docs say {v}, --help says {h}");
                }
            }
        }
        let verdicts_md = include_str!("../../docs/verdicts.md");
        let verify = sub("verify");
        let listed = synopsis(verdicts_md, "mountguard-controller verify --objects");
        assert!(listed.len() >= 8, "{listed:?}");
        for (f, v) in listed {
            assert!(
                verify
                    .get_arguments()
                    .any(|a| a.get_long() == Some(f.as_str())),
                "docs/verdicts.md lists verify --{f}, which it does not have"
            );
            if let Some(h) = default_of(&verify, &f)
                && !v.contains('|')
                && !v.chars().all(|ch| ch.is_ascii_lowercase())
            {
                assert!(same(&v, &h), "verify --{f}: docs say {v}, --help says {h}");
            }
        }
    }

    #[test]
    fn unreachable_controller_says_how_to_reach_it() {
        // A port nobody listens on: bound, then released.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let url = format!("http://127.0.0.1:{port}");
        let cli = <Cli as clap::Parser>::try_parse_from([
            "mountguard-controller",
            "status",
            "--url",
            &url,
        ])
        .unwrap();
        let Command::Status(args) = cli.command else {
            unreachable!("status parses as status")
        };
        let endpoint =
            crate::query::endpoint::Endpoint::direct(args.controller.url, None, None).unwrap();
        let query = StatusQuery::from(args.query);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let mut out = Vec::new();
        let e = rt.block_on(query.run(&endpoint, &mut out)).unwrap_err();
        assert!(matches!(e, crate::Error::Unreachable { .. }), "{e}");
        let msg = e.to_string();
        assert!(
            msg.contains(&format!("http://127.0.0.1:{port}/v1/verdicts")),
            "{msg}"
        );
        assert!(
            msg.contains(
                "kubectl -n mountguard-system port-forward svc/mountguard-controller-metrics 8080"
            ),
            "{msg}"
        );
        assert!(!msg.contains("invalid configuration"), "{msg}");
        assert!(out.is_empty());
    }

    /// The plugin's default Service and namespace are the chart's names for
    /// the README's release (`mountguard_inventory::names`, checked against
    /// a render in `tests/tests/chart.rs` `hint_names`).
    #[test]
    fn hint_names_plugin_defaults() {
        use clap::Parser;
        use mountguard_inventory::names;
        let cli = PluginCli::try_parse_from(["kubectl-mountguard", "status"]).unwrap();
        assert_eq!(
            cli.proxy.controller_service,
            names::controller_metrics_service(names::RELEASE)
        );
        assert_eq!(cli.proxy.controller_namespace, names::NAMESPACE);
    }

    #[test]
    fn duration_and_time_flags_are_validated() {
        assert_eq!(
            parse_signed_duration("180s").unwrap(),
            SignedDuration::from_secs(180)
        );
        assert_eq!(
            parse_signed_duration("3m").unwrap(),
            SignedDuration::from_secs(180)
        );
        assert!(parse_signed_duration("-5s").is_err());
        assert!(parse_signed_duration("soon").is_err());
        assert!(parse_time("2026-11-30T10:00:00Z").is_ok());
        assert!(parse_time("yesterday").unwrap_err().contains("RFC 3339"));
    }
}
