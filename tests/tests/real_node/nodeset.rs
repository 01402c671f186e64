//! A stale `slurm.key` of a NodeSet worker repaired on the real node by
//! the controller running as the chart's pod, the toggle flipped with
//! `helm upgrade`: with remediation off the worker is reported and gated,
//! nothing is written to Slurm or the cluster; with it on, the controller
//! drains the Slurm node through slurmrestd, evicts the worker through
//! the real Eviction API, the NodeSet double makes the replacement, the
//! real kubelet on containerd writes its volume with the current key,
//! mountguard verifies it on the node and undrains. Twice: with the
//! slurmrestd double and the slurmd bridge, which starts the replacement's
//! slurmd with the key the kubelet wrote (`mountguard_tests::real::slinky`),
//! and with real Slurm, the worker's slurmd being the pod's own container
//! ([`RealNode::start_with_real_slurm`]).

use std::time::Duration;

use base64::Engine as _;
use mountguard_core::remediation::REMEDIATE_ANNOTATION;
use mountguard_tests::cluster::{
    AUTH_SECRET, JWT_SECRET, NODESET, SLURM_NAMESPACE, slurmd_template,
};
use mountguard_tests::mountguard::poll;
use mountguard_tests::real::operator::custom_resources;
use mountguard_tests::real::raw;
use mountguard_tests::real::real_node::{RealNode, SlurmdImage};
use mountguard_tests::real::slinky::{create_nodeset, first_slurm_key, slurmd_prestop_command};
use mountguard_tests::real::slurm::{RealSlurm, node_states};
use mountguard_tests::real_node_or_skip;
use mountguard_tests::slurmrestd::{SlurmHandle, WriteRecord};
use serde_json::{Value, json};

use crate::harness::{
    assert_no_hold_taint, assert_one_eviction, kubectl_mountguard, recreate_secret,
    remediation_writes, running_pod, served, wait_secret,
};
use crate::helm::{Helm, controller_with_remediation, install, upgrade};

/// The Slurm user of the tokens the controller mints from `jwt.key`.
const SLURM_USER: &str = "mountguard";

/// The worker's one pod (ordinal 0), Running and not being deleted, other
/// than UID `not`.
async fn running_worker(client: &kube::Client, not: Option<&str>) -> Value {
    let query = format!("fieldSelector=metadata.name%3D{NODESET}-0");
    running_pod(client, SLURM_NAMESPACE, &query, not).await
}

/// The `slurm.key` the kubelet wrote for pod `uid` (its projected volume
/// `slurm-etc`).
fn served_key(node: &RealNode, uid: &str) -> Vec<u8> {
    served(node, uid, "kubernetes.io~projected/slurm-etc/slurm.key")
}

/// The seed rotation: the immutable `slurm.key` Secret deleted and created
/// again with `key`; returns the new object's UID.
async fn rotate(client: &kube::Client, key: &[u8]) -> String {
    let secret = json!({"apiVersion": "v1", "kind": "Secret", "immutable": true,
        "metadata": {"name": AUTH_SECRET, "namespace": SLURM_NAMESPACE},
        "data": {"slurm.key": base64::engine::general_purpose::STANDARD.encode(key)}});
    recreate_secret(client, &secret).await
}

/// The Slurm writes the controller made (authenticated as
/// [`SLURM_USER`]).
fn controller_slurm_writes(slurm: &SlurmHandle) -> Vec<WriteRecord> {
    slurm
        .writes()
        .into_iter()
        .filter(|w| w.user.as_deref() == Some(SLURM_USER))
        .collect()
}

/// Waits (up to 120 s) until `kubectl mountguard wait` of the `slurm.key`
/// Secret (new UID `uid`) fails naming the worker `host`.
async fn gate_names_the_worker(node: &RealNode, dir: &std::path::Path, uid: &str, host: &str) {
    let target = format!("secret/{SLURM_NAMESPACE}/{AUTH_SECRET}");
    let gated = poll(
        "wait naming the stale worker",
        Duration::from_secs(120),
        || async {
            let (code, out, _) = wait_secret(node, dir, &target, uid).await;
            (code == Some(1) && out.contains(host)).then_some(())
        },
    )
    .await;
    if let Err(e) = gated {
        panic!("{e}\n{}", node.logs(30));
    }
}

/// `kubectl mountguard wait nodeset/<ns>/<name>` for up to 180 s, asking
/// every second.
async fn wait_nodeset(node: &RealNode, dir: &std::path::Path) -> (Option<i32>, String, String) {
    let target = format!("nodeset/{SLURM_NAMESPACE}/{NODESET}");
    let args = ["wait", &target, "--timeout", "180s", "--interval", "1s"];
    kubectl_mountguard(node, dir, &args).await
}

/// Opts the NodeSet in and installs the chart as an operator configures
/// it for Slinky: slurmrestd at `url` with tokens for `user` minted from
/// slurmctld's jwt.key, the toggle off.
async fn opt_in_and_install(node: &RealNode, client: &kube::Client, url: &str, user: &str) -> Helm {
    let (code, body) = raw(
        client,
        "PATCH",
        &format!("/apis/slinky.slurm.net/v1beta1/namespaces/{SLURM_NAMESPACE}/nodesets/{NODESET}"),
        Some(&json!({"metadata": {"annotations": {REMEDIATE_ANNOTATION: "true"}}})),
    )
    .await
    .expect("opt in");
    assert_eq!(code, 200, "opting the NodeSet in: {body}");
    let helm = Helm::new(node);
    let settings = [
        format!("remediation.slurmrestd.url={url}"),
        format!("remediation.slurmrestd.jwtKeySecret.namespace={SLURM_NAMESPACE}"),
        format!("remediation.slurmrestd.jwtKeySecret.name={JWT_SECRET}"),
        format!("remediation.slurmrestd.user={user}"),
        "remediation.delay=5s".to_string(),
        "controller.grace=10s".to_string(),
    ];
    let extra: Vec<&str> = settings.iter().flat_map(|s| ["--set", s]).collect();
    install(node, &helm, &extra).await;
    helm
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_node_helm_upgrade_toggle_on_repairs_the_stale_nodeset_worker_drains_and_undrains() {
    let node = real_node_or_skip!(
        "real_node_helm_upgrade_toggle_on_repairs_the_stale_nodeset_worker_drains_and_undrains",
        start_with_slinky
    );
    let client = node.cluster.client().await.expect("client");
    let slurm = node.cluster.slurm().expect("the slurmrestd double");
    let url = node.slurmrestd_url().expect("slurmrestd on the bridge");

    // The NodeSet, opted in: one worker on the pause image, mounting the
    // immutable slurm.key, the sshd config by subPath and the hooks.
    let mut template = slurmd_template();
    template["spec"]["automountServiceAccountToken"] = json!(false);
    template["spec"]["terminationGracePeriodSeconds"] = json!(5);
    template["spec"]["containers"][0]["image"] = json!(node.images.pause);
    template["spec"]["containers"][0]["imagePullPolicy"] = json!("Never");
    create_nodeset(&client, 1, template)
        .await
        .expect("the Slinky objects");
    let helm = opt_in_and_install(&node, &client, &url, SLURM_USER).await;

    let old = running_worker(&client, None).await;
    let old_uid = old["metadata"]["uid"].as_str().expect("uid").to_string();
    let host = format!("{NODESET}-0");
    poll(
        "the worker's slurmd up with the first key",
        Duration::from_secs(120),
        || async {
            (served_key(&node, &old_uid) == first_slurm_key() && slurm.slurmd_key_matches(&host))
                .then_some(())
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", node.logs(30)));

    // Off: the rotation leaves the worker's slurmd on the old key; the
    // gate names it; nothing is written, past the delay and the grace.
    let new_key: Vec<u8> = (0..1024u32).map(|i| (i * 13 + 5) as u8).collect();
    let new_secret_uid = rotate(&client, &new_key).await;
    let bin = tempfile::tempdir().expect("bin");
    gate_names_the_worker(&node, bin.path(), &new_secret_uid, &host).await;
    tokio::time::sleep(Duration::from_secs(20)).await;
    assert_eq!(
        served_key(&node, &old_uid),
        first_slurm_key(),
        "the kubelet's cache"
    );
    assert_eq!(
        running_worker(&client, None).await["metadata"]["uid"],
        old_uid.as_str()
    );
    assert_eq!(
        controller_slurm_writes(&slurm),
        [],
        "no Slurm write while off"
    );
    assert_eq!(remediation_writes(&node), [], "no cluster write while off");

    // On: the new controller pod drains, evicts, verifies the replacement
    // on the node and undrains.
    upgrade(&helm, &["remediation.mode=on"]);
    controller_with_remediation(&node, "on").await;
    let new = running_worker(&client, Some(&old_uid)).await;
    let new_uid = new["metadata"]["uid"].as_str().expect("uid").to_string();
    let (code, out, err) = wait_nodeset(&node, bin.path()).await;
    assert_eq!(
        code,
        Some(0),
        "wait after the repair:\n{out}\n{err}\n{}",
        node.logs(30)
    );
    assert_eq!(
        served_key(&node, &new_uid),
        new_key,
        "the replacement's key"
    );
    let undrained = poll(
        "the Slurm node back in service with the current key",
        Duration::from_secs(120),
        || async {
            let n = slurm.node(&host)?;
            (slurm.slurmd_key_matches(&host)
                && !n
                    .state
                    .iter()
                    .any(|s| matches!(s.as_str(), "DRAIN" | "DOWN" | "FAIL" | "NOT_RESPONDING")))
            .then_some(())
        },
    )
    .await;
    if let Err(e) = undrained {
        panic!(
            "{e}\nnode: {:?}\nwrites: {:#?}\n{}",
            slurm.node(&host),
            slurm.writes(),
            node.logs(30)
        );
    }
    // Slurm: closed with mountguard's reason before anything else, opened
    // last, every write to this worker's node.
    let writes = controller_slurm_writes(&slurm);
    assert!(
        writes.iter().all(|w| w.node == host && w.status == 200),
        "{writes:#?}"
    );
    let states: Vec<&Value> = writes.iter().map(|w| &w.body["state"]).collect();
    assert_eq!(
        states.first(),
        Some(&&json!(["DRAIN"])),
        "drained first: {writes:#?}"
    );
    assert_eq!(
        states.last(),
        Some(&&json!(["RESUME"])),
        "resumed last: {writes:#?}"
    );
    // The cluster: one eviction, of the stale worker, never a delete.
    assert_one_eviction(&node, SLURM_NAMESPACE, &host);
    assert_no_hold_taint(&client).await;
}

/// `slurmd_start_time` of Slurm node `host` as real slurmrestd serves it
/// (`{"set": true, "number": T}`), with its state names; `None` while
/// slurmctld does not know the node.
async fn real_node_state(slurm: &RealSlurm, host: &str) -> Option<(Option<i64>, Vec<String>)> {
    let (code, v) = slurm.node(host, &slurm.token(REAL_SLURM_USER)).await;
    let n = v["nodes"].as_array()?.first()?.clone();
    (code == 200).then_some(())?;
    let t = &n["slurmd_start_time"];
    let start = (t["set"] == true).then(|| t["number"].as_i64()).flatten();
    Some((start, node_states(&v)))
}

/// In service: known, and neither drained, down, failed nor unresponsive.
fn in_service(states: &[String]) -> bool {
    !states
        .iter()
        .any(|s| matches!(s.as_str(), "DRAIN" | "DOWN" | "FAIL" | "NOT_RESPONDING"))
}

/// SlurmUser: slurmctld takes node updates from it (Slurm 26.05
/// src/slurmctld/proc_req.c `_slurm_rpc_update_node` ->
/// `validate_super_user`); the rig has no accounting to make another user
/// an administrator.
const REAL_SLURM_USER: &str = "slurm";

/// Who makes the worker pod in [`stale_key_in_the_slurmd_container_repaired`].
#[derive(Clone, Copy, PartialEq, Eq)]
enum Workers {
    /// The NodeSet double, from a template written as the Slinky worker
    /// builder writes it.
    NodeSetDouble,
    /// The real Slinky operator, from its custom resources.
    Operator,
}

/// The seed's failure and its repair with Slurm itself on the other side:
/// the worker's slurmd is the NodeSet pod's container (the slurmd image,
/// configless and dynamic, its preStop hook, its probes and the key file
/// the real kubelet wrote, as the Slinky worker builder makes the pod),
/// slurmctld and slurmrestd are real. After the immutable `slurm.key`
/// Secret is recreated with a new key and slurmctld restarted on it, the
/// running slurmd keeps the old key: a job pinned to it does not start,
/// and mountguard, remediation off, names the stale worker and writes
/// nothing. `helm upgrade` turns remediation on: the controller drains
/// through real slurmrestd, evicts, sees the replacement's slurmd register
/// with the new key, resumes, and a job pinned to the worker completes.
/// The worker pods are the NodeSet double's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_node_real_slurm_stale_key_in_the_slurmd_container_repaired_by_the_helm_toggle() {
    let node = real_node_or_skip!(
        "real_node_real_slurm_stale_key_in_the_slurmd_container_repaired_by_the_helm_toggle",
        start_with_real_slurm
    );
    stale_key_in_the_slurmd_container_repaired(node, Workers::NodeSetDouble).await;
}

/// The same with the real Slinky operator making the worker pod from its
/// NodeSet (its own slurmd container, logfile sidecar and PDB), its slurm
/// client on the real slurmrestd.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_node_real_slurm_and_operator_stale_key_in_the_slurmd_container_repaired_by_the_helm_toggle()
 {
    let node = real_node_or_skip!(
        "real_node_real_slurm_and_operator_stale_key_in_the_slurmd_container_repaired_by_the_helm_toggle",
        start_with_real_slurm_and_operator
    );
    stale_key_in_the_slurmd_container_repaired(node, Workers::Operator).await;
}

/// Creates the Slurm worker: the NodeSet, its Secrets and what else
/// `workers` needs, the slurmd being the slurmd image's.
async fn create_slurm_worker(
    client: &kube::Client,
    slurm: &RealSlurm,
    image: &SlurmdImage,
    workers: Workers,
) {
    // The image's Slurm looks for its key in its own configuration
    // directory, so SLURM_SACK_KEY names /etc/slurm/slurm.key, where the
    // Slinky worker builder mounts it (Slurm 26.05
    // src/plugins/auth/slurm/internal.c `init_internal`).
    let sack_key = json!([{"name": "SLURM_SACK_KEY", "value": "/etc/slurm/slurm.key"}]);
    if workers == Workers::Operator {
        mountguard_tests::real::slinky::create_auth_and_hooks(client)
            .await
            .expect("the Slinky Secrets");
        for mut o in custom_resources(1, slurm.ctld_addr()) {
            if o["kind"] == "NodeSet" {
                for c in ["slurmd", "logfile"] {
                    o["spec"][c]["image"] = json!(image.reference());
                    o["spec"][c]["imagePullPolicy"] = json!("Never");
                }
                o["spec"]["slurmd"]["env"] = sack_key.clone();
                o["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = json!(5);
            }
            mountguard_tests::real::create(client, &o)
                .await
                .unwrap_or_else(|e| panic!("creating the {}: {e}", o["kind"]));
        }
        return;
    }
    // The worker as the Slinky worker builder makes it (slurm-operator
    // v1.2.1 internal/builder/workerbuilder/worker_app.go,
    // `slurmdContainer`, `slurmdArgs`): `-Z --conf-server <slurmctld>
    // --conf Features=<nodeset>`, port `slurmd` 6818 with the /livez and
    // /readyz probes, the preStop `scontrol update ... state=down`, and
    // `slurm.key` from the projected volume at /etc/slurm.
    let probe = |path: &str| json!({"httpGet": {"path": path, "port": "slurmd"}});
    let mut template = slurmd_template();
    template["spec"]["automountServiceAccountToken"] = json!(false);
    template["spec"]["terminationGracePeriodSeconds"] = json!(5);
    let c = &mut template["spec"]["containers"][0];
    c["image"] = json!(image.reference());
    c["imagePullPolicy"] = json!("Never");
    c["args"] = json!([
        "-Z",
        "--conf-server",
        slurm.ctld_addr().to_string(),
        "--conf",
        format!("Features={NODESET}")
    ]);
    c["env"] = sack_key;
    c["ports"] = json!([{"name": "slurmd", "containerPort": 6818, "protocol": "TCP"}]);
    c["startupProbe"] = probe("/livez");
    c["startupProbe"]["failureThreshold"] = json!(6);
    c["startupProbe"]["periodSeconds"] = json!(10);
    c["livenessProbe"] = probe("/livez");
    c["readinessProbe"] = probe("/readyz");
    c["lifecycle"] = json!({"preStop": {"exec": {"command": slurmd_prestop_command()}}});
    create_nodeset(client, 1, template)
        .await
        .expect("the Slinky objects");
}

/// The body of the two tests above.
async fn stale_key_in_the_slurmd_container_repaired(node: RealNode, workers: Workers) {
    let client = node.cluster.client().await.expect("client");
    let slurm = node.cluster.real_slurm().expect("real Slurm");
    let url = node.slurmrestd_url().expect("slurmrestd on the bridge");
    let image = node.images.slurmd.clone().expect("the slurmd image");
    let host = format!("{NODESET}-0");
    create_slurm_worker(&client, &slurm, &image, workers).await;
    let helm = opt_in_and_install(&node, &client, &url, REAL_SLURM_USER).await;

    // The worker's slurmd registered on the first key, and runs a job.
    let old = running_worker(&client, None).await;
    let old_uid = old["metadata"]["uid"].as_str().expect("uid").to_string();
    let registered = poll(
        "the worker's slurmd registered on the first key",
        Duration::from_secs(120),
        || async {
            let (start, states) = real_node_state(&slurm, &host).await?;
            (start.is_some() && in_service(&states) && states.iter().any(|s| s == "IDLE"))
                .then_some(start)
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}\n{}", slurm.logs(20), node.logs(30)));
    assert_eq!(served_key(&node, &old_uid), first_slurm_key());
    let job = slurm
        .submit_pinned_job(&host, "#!/bin/sh\ntrue\n")
        .await
        .expect("submit");
    job_completes(&slurm, job, &node).await;

    // Off: the rotation; slurmctld restarts on the new key; the running
    // slurmd keeps the old one.
    let new_key: Vec<u8> = (0..1024u32).map(|i| (i * 13 + 5) as u8).collect();
    let new_secret_uid = rotate(&client, &new_key).await;
    poll(
        "slurmctld on the new key",
        Duration::from_secs(60),
        || async { (slurm.cluster_key() == new_key).then_some(()) },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", slurm.logs(20)));
    let bin = tempfile::tempdir().expect("bin");
    gate_names_the_worker(&node, bin.path(), &new_secret_uid, &host).await;
    // Slurm's side of it: a job pinned to the worker never completes, and
    // nothing drained the node, past the delay and the grace. Slurm tries
    // to launch a job whenever the flapping node reads IDLE alone at a
    // scheduling pass (one runs at each submission); the launch fails
    // authentication and the node then holds the job COMPLETING until a
    // slurmd that authenticates answers (the replacement's). A job is
    // submitted every 3 s until that shows (at most 60 s), so that the
    // repair below meets the node as Slurm leaves it.
    let mut jobs = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let tried = loop {
        jobs.push(
            slurm
                .submit_pinned_job(&host, "#!/bin/sh\ntrue\n")
                .await
                .expect("submit"),
        );
        tokio::time::sleep(Duration::from_secs(3)).await;
        let (_, states) = real_node_state(&slurm, &host).await.expect("the node");
        if states.iter().any(|s| s == "COMPLETING") {
            break true;
        }
        if tokio::time::Instant::now() > deadline {
            break false;
        }
    };
    tokio::time::sleep(Duration::from_secs(5)).await;
    for job in &jobs {
        let states = slurm.job_state(*job).await;
        assert!(
            !states.iter().any(|s| s == "COMPLETED"),
            "job {job} on the stale slurmd: {states:?}"
        );
        slurm.cancel_job(*job).await.expect("cancel");
    }
    let (start, states) = real_node_state(&slurm, &host).await.expect("the node");
    println!(
        "the stale node after {} cancelled jobs: {states:?} (a launch tried: {tried})",
        jobs.len()
    );
    // slurmctld restores the node from its saved state with
    // `slurmd_start_time` 0; only an authenticated registration sets it.
    assert_eq!(
        start.unwrap_or(0),
        0,
        "the stale slurmd registered since slurmctld restarted on the new key: {states:?}"
    );
    assert!(!states.iter().any(|s| s == "DRAIN"), "{states:?}");
    assert_eq!(served_key(&node, &old_uid), first_slurm_key(), "the pin");
    assert_eq!(remediation_writes(&node), [], "no cluster write while off");

    // On: drain, evict, the replacement registers on the new key, resume.
    upgrade(&helm, &["remediation.mode=on"]);
    controller_with_remediation(&node, "on").await;
    // The replacement; on failure, what the controller and Slurm said.
    let replaced = tokio::time::timeout(
        Duration::from_secs(230),
        running_worker(&client, Some(&old_uid)),
    )
    .await;
    let new = match replaced {
        Ok(p) => p,
        Err(_) => {
            let (_, status, _) = kubectl_mountguard(&node, bin.path(), &["status"]).await;
            panic!(
                "no replacement of the stale worker\n{status}\nnode: {:?}\n{}\n{}",
                real_node_state(&slurm, &host).await,
                slurm.logs(30),
                node.logs(40)
            );
        }
    };
    let new_uid = new["metadata"]["uid"].as_str().expect("uid").to_string();
    let (code, out, err) = wait_nodeset(&node, bin.path()).await;
    assert_eq!(
        code,
        Some(0),
        "wait after the repair:\n{out}\n{err}\n{}\n{}",
        slurm.logs(20),
        node.logs(30)
    );
    assert_eq!(
        served_key(&node, &new_uid),
        new_key,
        "the replacement's key"
    );
    poll(
        "the Slurm node back in service, registered on the new key",
        Duration::from_secs(120),
        || async {
            let (start, states) = real_node_state(&slurm, &host).await?;
            (start > registered && in_service(&states)).then_some(())
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}\n{}", slurm.logs(20), node.logs(30)));
    let job = slurm
        .submit_pinned_job(&host, "#!/bin/sh\ntrue\n")
        .await
        .expect("submit");
    job_completes(&slurm, job, &node).await;
    assert_one_eviction(&node, SLURM_NAMESPACE, &host);
    assert_no_hold_taint(&client).await;
}

/// Waits (up to 60 s) until job `id` completed.
async fn job_completes(slurm: &RealSlurm, id: u64, node: &RealNode) {
    let done = poll(
        "the pinned job completed",
        Duration::from_secs(60),
        || async {
            slurm
                .job_state(id)
                .await
                .iter()
                .any(|s| s == "COMPLETED")
                .then_some(())
        },
    )
    .await;
    if let Err(e) = done {
        panic!(
            "{e}: {:?}\n{}\n{}",
            slurm.job_state(id).await,
            slurm.logs(20),
            node.logs(30)
        );
    }
}
