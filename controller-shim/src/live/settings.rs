//! `run`'s settings: every flag of [`RunArgs`] checked and converted in
//! one place ([`Settings::try_from`]), before the controller binds a
//! socket or calls the API. The tasks take these typed settings, never
//! the flags.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use jiff::SignedDuration;
use mountguard_core::remediation::machine::{FailurePolicy, MachineConfig};
use mountguard_core::remediation::plan::{Mode, PlanConfig};

use super::admission::AdmissionSettings;
use super::executor::{Prepared, RemediationSettings, SlurmCredential};
use super::leader::LeaderConfig;
use super::report::{CountLimits, ReportConfig};
use super::watch::WatchSettings;
use crate::Error;
use crate::cli::{AdmissionArgs, AdmissionMode, OnFailure, RemediationMode, RunArgs};

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
    pub status_auth: crate::cli::StatusAuthMode,
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
            verification_timeout,
            on_failure,
            replace_pinning_pods,
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
        let watch = WatchSettings {
            namespaces: if namespaces.is_empty() {
                vec![None]
            } else {
                namespaces.into_iter().map(Some).collect()
            },
            pod_selector: pod_selector.filter(|s| !s.trim().is_empty()),
            agent_namespace: agent_service_account.namespace.clone(),
            agent_daemonset: agent_daemonset.clone(),
        };
        let mode = match remediation {
            RemediationMode::Off => Mode::Off,
            RemediationMode::DryRun => Mode::DryRun,
            RemediationMode::On => Mode::On,
        };
        let remediation = match mode {
            Mode::Off => None,
            Mode::DryRun | Mode::On => {
                let slurmrestd_url = slurmrestd_url
                    .ok_or_else(|| Error::Config("--remediation needs --slurmrestd-url".into()))?;
                let credential = match (slurm_token_secret, slurm_jwt_key_secret) {
                    (Some(s), None) => SlurmCredential::Token(s, slurm_token_key),
                    (None, Some(s)) => SlurmCredential::JwtKey(s),
                    _ => {
                        return Err(Error::Config(
                            "--remediation needs exactly one of --slurm-token-secret and \
                             --slurm-jwt-key-secret"
                                .into(),
                        ));
                    }
                };
                let slurmrestd_ca = match slurmrestd_ca_file {
                    Some(p) => Some(std::fs::read(&p).map_err(|e| Error::Io {
                        file: p.display().to_string(),
                        source: e,
                    })?),
                    None => None,
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
                    },
                    machine: MachineConfig {
                        drain_timeout: signed(drain_timeout),
                        replacement_timeout: signed(replacement_timeout),
                        eviction_timeout: signed(eviction_timeout),
                        verification_timeout: signed(verification_timeout),
                        on_failure: match on_failure {
                            OnFailure::KeepDrained => FailurePolicy::Auto,
                            OnFailure::Undrain => FailurePolicy::Undrain,
                        },
                        ..Default::default()
                    },
                    slurmrestd_url,
                    slurmrestd_ca,
                    credential,
                    slurm_user,
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
            node_in_flight: super::report::NODE_IN_FLIGHT,
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
mod tests {
    use super::*;
    use crate::cli::ObjectName;

    /// Every combination of flags `run` refuses is refused by the one
    /// conversion, before anything is bound or called.
    #[test]
    fn settings_check_every_flag_before_start() {
        let base = || RunArgs::for_test("/dev/null".into(), "mg:agent", "agent");
        let s = Settings::try_from(base()).unwrap();
        assert!(s.serve.tls.is_none(), "for_test is plaintext");
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
        assert_eq!(s.serve.tls, Some(("/c".into(), "/k".into())));
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
        a.report_body_timeout = Duration::from_secs(7);
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
        assert_eq!(s.report.body_timeout, Duration::from_secs(7));
        assert_eq!(
            s.report.node_in_flight,
            super::super::report::NODE_IN_FLIGHT
        );
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

    /// The watches', listeners' and remediation's settings come out of the
    /// conversion, flag for flag: the tasks read nothing else.
    #[test]
    fn settings_carry_the_watch_serve_and_remediation_settings() {
        let mut a = RunArgs::for_test("/dev/null".into(), "mg:agent", "agent-ds");
        a.watch_namespaces = vec![" a".into(), "".into(), "b ".into()];
        a.pod_selector = Some("app=slurm".into());
        a.max_connections = 17;
        a.header_read_timeout = Duration::from_secs(3);
        a.idle_timeout = Duration::from_secs(4);
        let s = Settings::try_from(a).unwrap();
        assert_eq!(
            s.watch,
            WatchSettings {
                namespaces: vec![Some("a".into()), Some("b".into())],
                pod_selector: Some("app=slurm".into()),
                agent_namespace: "mg".into(),
                agent_daemonset: "agent-ds".into(),
            }
        );
        assert_eq!(s.kubeconfig.as_deref(), Some("/dev/null".as_ref()));
        assert_eq!(s.serve.max_connections, 17);
        assert_eq!(s.serve.header_read_timeout, Duration::from_secs(3));
        assert_eq!(s.serve.idle_timeout, Duration::from_secs(4));
        assert_eq!(s.serve.report_listen, "127.0.0.1:0".parse().unwrap());
        assert_eq!(s.serve.metrics_listen, "127.0.0.1:0".parse().unwrap());

        // No namespace given (or only blanks): one watch of all; a blank
        // selector selects everything.
        let mut a = RunArgs::for_test("/dev/null".into(), "mg:agent", "agent");
        a.watch_namespaces = vec![" ".into()];
        a.pod_selector = Some("  ".into());
        let s = Settings::try_from(a).unwrap();
        assert_eq!(s.watch.namespaces, vec![None]);
        assert_eq!(s.watch.pod_selector, None);

        // Remediation: the pure configurations, the credential and the CA
        // bundle's bytes, read here.
        let ca = rcgen::generate_simple_self_signed(vec!["slurm".to_string()])
            .unwrap()
            .cert
            .pem();
        let dir = tempfile::tempdir().unwrap();
        let ca_file = dir.path().join("ca.crt");
        std::fs::write(&ca_file, &ca).unwrap();
        let mut a = RunArgs::for_test("/dev/null".into(), "mg:agent", "agent");
        a.remediation = RemediationMode::DryRun;
        a.slurmrestd_url = Some("https://slurm:6820".into());
        a.slurmrestd_ca_file = Some(ca_file);
        a.slurm_token_secret = Some("slurm/token".parse().unwrap());
        a.slurm_token_key = "tok".into();
        a.slurm_user = "root".into();
        a.on_failure = OnFailure::Undrain;
        a.remediation_budget_cluster = 7;
        a.replace_pinning_pods = true;
        let s = Settings::try_from(a).unwrap();
        let r = s.remediation.as_ref().unwrap().settings();
        assert_eq!(r.mode, Mode::DryRun);
        assert_eq!(
            (
                r.plan.mode,
                r.plan.budget_cluster,
                r.plan.budget_per_nodeset
            ),
            (Mode::DryRun, 7, 1)
        );
        assert!(r.plan.replace_pinning_pods);
        assert_eq!(r.plan.delay, SignedDuration::from_mins(5));
        assert_eq!(r.machine.on_failure, FailurePolicy::Undrain);
        assert_eq!(r.machine.drain_timeout, SignedDuration::from_hours(24));
        assert_eq!(r.machine.replacement_timeout, SignedDuration::from_mins(15));
        assert_eq!(r.machine.eviction_timeout, SignedDuration::from_mins(30));
        assert_eq!(
            r.machine.verification_timeout,
            SignedDuration::from_mins(10)
        );
        assert_eq!(r.slurmrestd_url, "https://slurm:6820");
        assert_eq!(r.slurmrestd_ca.as_deref(), Some(ca.as_bytes()));
        assert_eq!(
            r.credential,
            SlurmCredential::Token("slurm/token".parse().unwrap(), "tok".into())
        );
        assert_eq!(r.slurm_user, "root");
        let mut a = RunArgs::for_test("/dev/null".into(), "mg:agent", "agent");
        a.remediation = RemediationMode::On;
        a.slurmrestd_url = Some("http://slurm:6820".into());
        a.slurm_jwt_key_secret = Some("slurm/jwt".parse().unwrap());
        let s = Settings::try_from(a).unwrap();
        let r = s.remediation.as_ref().unwrap().settings();
        assert_eq!(r.mode, Mode::On);
        assert_eq!(r.machine.on_failure, FailurePolicy::Auto);
        assert_eq!(r.slurmrestd_ca, None);
        assert_eq!(
            r.credential,
            SlurmCredential::JwtKey("slurm/jwt".parse().unwrap())
        );
    }

    /// A CA file that holds no certificate, or both credentials at once,
    /// is refused by the conversion: the controller never starts with it.
    #[tokio::test]
    async fn a_bad_remediation_combination_is_refused_before_start() {
        let dir = tempfile::tempdir().unwrap();
        let ca_file = dir.path().join("ca.crt");
        std::fs::write(&ca_file, "not a certificate").unwrap();
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let base = || {
            let mut a = RunArgs::for_test("/nonexistent/kubeconfig".into(), "mg:agent", "agent");
            a.report_listen = taken.local_addr().unwrap();
            a.remediation = RemediationMode::On;
            a.slurmrestd_url = Some("https://slurm:6820".into());
            a
        };
        let mut a = base();
        a.slurm_token_secret = Some("slurm/token".parse().unwrap());
        a.slurmrestd_ca_file = Some(ca_file);
        let e = crate::live::Controller::start(a)
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains("--slurmrestd-ca-file"), "{e}");
        let mut a = base();
        a.slurm_token_secret = Some("slurm/token".parse().unwrap());
        a.slurm_jwt_key_secret = Some("slurm/jwt".parse().unwrap());
        let e = crate::live::Controller::start(a)
            .await
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("exactly one of --slurm-token-secret and --slurm-jwt-key-secret"),
            "{e}"
        );
    }
}
