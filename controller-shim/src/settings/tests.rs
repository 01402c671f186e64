//! Tests of the one conversion from `run`'s flags to the settings.

use super::*;

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
        crate::intake::limits::NODE_IN_FLIGHT
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
    let e = crate::run::Controller::start(a)
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
            workload_kinds: BTreeSet::new(),
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
    assert!(
        !Settings::try_from(a.clone())
            .unwrap()
            .remediation
            .unwrap()
            .settings()
            .machine
            .fail_first,
        "DRAIN first by default"
    );
    a.drain_state = DrainState::Fail;
    let s = Settings::try_from(a).unwrap();
    let r = s.remediation.as_ref().unwrap().settings();
    assert!(r.machine.fail_first);
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
    assert_eq!(r.machine.node_hold_timeout, SignedDuration::from_mins(10));
    assert_eq!(
        r.machine.verification_timeout,
        SignedDuration::from_mins(10)
    );
    let slurm = r.slurm.as_ref().expect("NodeSets remediated");
    assert_eq!(slurm.url, "https://slurm:6820");
    assert_eq!(slurm.ca.as_deref(), Some(ca.as_bytes()));
    assert_eq!(
        slurm.credential,
        SlurmCredential::Token("slurm/token".parse().unwrap(), "tok".into())
    );
    assert_eq!(slurm.user, "root");
    assert!(r.plan.workload_kinds.is_empty(), "no workloads by default");
    assert!(s.watch.workload_kinds.is_empty());
    // Workloads only: no slurmrestd needed, the kinds watched and
    // planned, the workload budget apart.
    let mut a = RunArgs::for_test("/dev/null".into(), "mg:agent", "agent");
    a.remediation = RemediationMode::On;
    a.remediate_workloads = vec![WorkloadKind::Deployment, WorkloadKind::DaemonSet];
    a.remediation_budget_workloads = 5;
    let s = Settings::try_from(a).unwrap();
    let r = s.remediation.as_ref().unwrap().settings();
    assert!(r.slurm.is_none());
    let kinds: BTreeSet<WorkloadKind> = [WorkloadKind::Deployment, WorkloadKind::DaemonSet].into();
    assert_eq!(r.plan.workload_kinds, kinds);
    assert_eq!(r.plan.budget_workloads, 5);
    assert_eq!(s.watch.workload_kinds, kinds);
    // Remediation off: the kinds are neither watched nor planned.
    let mut a = RunArgs::for_test("/dev/null".into(), "mg:agent", "agent");
    a.remediate_workloads = vec![WorkloadKind::StatefulSet];
    let s = Settings::try_from(a).unwrap();
    assert!(s.remediation.is_none() && s.watch.workload_kinds.is_empty());
    let mut a = RunArgs::for_test("/dev/null".into(), "mg:agent", "agent");
    a.remediation = RemediationMode::On;
    a.slurmrestd_url = Some("http://slurm:6820".into());
    a.slurm_jwt_key_secret = Some("slurm/jwt".parse().unwrap());
    let s = Settings::try_from(a).unwrap();
    let r = s.remediation.as_ref().unwrap().settings();
    assert_eq!(r.mode, Mode::On);
    assert_eq!(r.machine.on_failure, FailurePolicy::Auto);
    let slurm = r.slurm.as_ref().expect("NodeSets remediated");
    assert_eq!(slurm.ca, None);
    assert_eq!(
        slurm.credential,
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
    let e = crate::run::Controller::start(a)
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("--slurmrestd-ca-file"), "{e}");
    let mut a = base();
    a.slurm_token_secret = Some("slurm/token".parse().unwrap());
    a.slurm_jwt_key_secret = Some("slurm/jwt".parse().unwrap());
    let e = crate::run::Controller::start(a)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("exactly one of --slurm-token-secret and --slurm-jwt-key-secret"),
        "{e}"
    );
}
