//! The kubelet-fidelity scenarios on every kubelet minor of the supported
//! skew window at once: one real control plane (the cluster's own
//! version), one node per kubelet `scripts/upstream.sh` built (1.34 to the
//! cluster's own minor; a kubelet may be up to three minors older than
//! the API server, kubernetes.io/releases/version-skew-policy), each
//! running every scenario body in turn while the other nodes run theirs.
//! Each result is named by the kubelet's version; one failure fails the
//! test after every node has finished.

use std::panic::AssertUnwindSafe;
use std::time::Instant;

use futures::FutureExt as _;
use mountguard_tests::real::kubelet::version_numbers;
use mountguard_tests::real::signer::PodCertificateSigner;

use crate::harness::{Nodes, RealSystem};
use crate::kubelet::serves_the_old_immutable_secret_while_a_pod_pins_it;
use crate::kubelet_files::{
    pod_certificate_and_trust_bundle_files_are_seen_and_never_judged,
    volumes_equal_the_agents_scan_file_by_file,
};
use crate::kubelet_support::On;
use crate::kubelet_updates::{
    GRACE, a_same_content_recreation_is_fresh, file_key_ref_env_is_listed_and_never_judged,
    mutable_updates_go_propagating_then_fresh_never_stale,
    subpath_and_env_keep_the_old_content_and_are_frozen,
};

/// The text of a caught panic.
fn panic_text(p: Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "a panic without a message".into())
}

/// Runs every scenario the kubelet of `version` can carry on node `i`, in
/// order; (scenario, seconds, the failure if any).
async fn scenarios(
    on: On<'_>,
    version: &str,
    signer: &PodCertificateSigner,
) -> Vec<(&'static str, f64, Option<String>)> {
    let mut out = Vec::new();
    macro_rules! run {
        ($name:literal, $fut:expr) => {{
            let t0 = Instant::now();
            let r = AssertUnwindSafe($fut).catch_unwind().await;
            out.push(($name, t0.elapsed().as_secs_f64(), r.err().map(panic_text)));
        }};
    }
    run!(
        "file-by-file equality with the agent's scan",
        volumes_equal_the_agents_scan_file_by_file(on)
    );
    run!(
        "the pin after delete and recreate",
        serves_the_old_immutable_secret_while_a_pod_pins_it(
            &on.sys.client,
            &on.sys.kubelets[on.i],
            &on.name("pin"),
        )
    );
    run!(
        "a same-content recreation is Fresh",
        a_same_content_recreation_is_fresh(on)
    );
    run!(
        "propagation of mutable updates",
        mutable_updates_go_propagating_then_fresh_never_stale(on)
    );
    run!(
        "Frozen subPath and env",
        subpath_and_env_keep_the_old_content_and_are_frozen(on)
    );
    // `EnvFiles` is on from 1.35; a kubelet of 1.34 drops the field.
    if version_numbers(version) >= vec![1, 35] {
        run!(
            "env fileKeyRef listed and never judged",
            file_key_ref_env_is_listed_and_never_judged(on)
        );
    }
    // `PodCertificateRequest` and `ClusterTrustBundleProjection` are on
    // from 1.37 (GA); off by default before.
    if version_numbers(version) >= vec![1, 37] {
        run!(
            "podCertificate and clusterTrustBundle files seen and never judged",
            pod_certificate_and_trust_bundle_files_are_seen_and_never_judged(on, signer)
        );
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn real_kubelet_every_minor_of_the_skew_window_passes_the_fidelity_scenarios() {
    let mut sys = RealSystem::start_with(0, Nodes::EveryKubeletVersion).await;
    let grace = format!("{}s", GRACE.as_secs());
    sys.restart_controller_with(&[("MOUNTGUARD_GRACE", &grace)])
        .await;
    let versions = sys.kubelet_versions.clone();
    let signer = PodCertificateSigner::start(sys.client.clone(), "mountguard.test/pods")
        .expect("the rig's PodCertificateRequest signer");
    assert!(
        versions.len() >= 4,
        "scripts/upstream.sh builds the kubelets of 1.34 to 1.37; found {versions:?}"
    );
    let results = futures::future::join_all(
        versions
            .iter()
            .enumerate()
            .map(|(i, v)| scenarios(On { sys: &sys, i }, v, &signer)),
    )
    .await;
    let mut failed = Vec::new();
    for (version, runs) in versions.iter().zip(&results) {
        for (scenario, secs, failure) in runs {
            let verdict = if failure.is_some() {
                "FAILED"
            } else {
                "passed"
            };
            eprintln!("kubelet {version}: {scenario}: {verdict} in {secs:.0} s");
            if let Some(f) = failure {
                failed.push(format!("kubelet {version}: {scenario}: {f}"));
            }
        }
    }
    drop(signer);
    assert!(failed.is_empty(), "{}", failed.join("\n\n"));
    sys.shutdown().await;
}
