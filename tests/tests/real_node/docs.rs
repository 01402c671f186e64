//! Every shell command of the pages an operator works from (the kind
//! walkthrough, the troubleshooting guide, the runbooks and the how-to
//! guides), run as the page shows it, in page order, against the chart
//! installed as a user
//! installs it (its defaults plus this tier's images, kubelet root and
//! certificate), with kubectl v1.37.2 (scripts/node-tools.sh), Helm 4 and
//! the kubectl plugin on PATH. The placeholders become this cluster's
//! names: namespace `shop` with the Deployment `web` mounting the Secret
//! `web` (NS, NAME, POD), node `node-0` (NODE, and the walkthrough's
//! `mountguard-worker`), namespace `slurm` with the NodeSet `slurm-worker`
//! (SLURM_NS, and NAME where a NodeSet is meant); the walkthrough's
//! `busybox:1.36` becomes the tier's slurmd image (it has `sleep` and
//! `cat`), and its pages run only when that image was built. The commands
//! run in a directory of their own whose entries link to the repository's
//! (files a page writes stay there).
//! A command that fails fails the test, except those listed in [`NOT_RUN`]
//! with the reason they cannot run here (printed).

use std::path::{Path, PathBuf};
use std::time::Duration;

use mountguard_tests::cluster::SLURM_NAMESPACE;
use mountguard_tests::docs::{run_block, shell_blocks, substitute};
use mountguard_tests::mountguard::{kubectl_plugin, poll};
use mountguard_tests::real::real_node::{RealNode, node_tools};
use mountguard_tests::real::{create, raw};
use mountguard_tests::real_node_or_skip;
use serde_json::json;

use crate::harness::{kubectl_mountguard, running_pod};
use crate::helm::{Helm, install};

/// Commands of the pages that this tier cannot run, by their start, and
/// why.
const NOT_RUN: &[(&str, &str)] = &[
    (
        "sinfo ",
        "Slurm's own CLI on a Slurm login node; this tier's Slurm is the slurmrestd double",
    ),
    (
        "ln -s ~/bin/mountguard-controller",
        "installs the plugin; the test puts the same link on PATH",
    ),
    (
        "helm install mountguard charts/mountguard",
        "the install itself: the test runs it with these values plus the tier's images and kubelet root",
    ),
    (
        "cat > kind.yaml",
        "kind's cluster configuration; this tier's cluster is the real node",
    ),
    (
        "kind ",
        "kind is not this tier's cluster: the real node runs the images the tier built and imported",
    ),
    (
        "cargo build --locked --release --target x86_64-unknown-linux-musl",
        "the tier built the static binaries before it started",
    ),
    (
        "MOUNTGUARD_IMAGE_PREFIX=ghcr.io/mountguard bash scripts/images.sh",
        "the tier built the images with scripts/images.sh before it started",
    ),
    (
        "kubectl -n cert-manager wait",
        "cert-manager is not installed: the test's install gives the chart its certificate",
    ),
    (
        "kubectl create namespace mountguard-system",
        "the test's install made the namespace",
    ),
    (
        "kubectl label namespace mountguard-system pod-security.kubernetes.io/enforce=privileged",
        "the test's install labelled the namespace",
    ),
    (
        "helm upgrade mountguard charts/mountguard -n mountguard-system --reuse-values --set metrics.serviceMonitor.enabled=true",
        "needs the Prometheus operator's CRDs (kube-prometheus-stack); a real Prometheus loads the chart's rules in real_node_alert_kubelet_cache_pinned_fires_in_a_real_prometheus",
    ),
];

/// The kind walkthrough, which leaves pods that are stale and frozen on
/// purpose (the test deletes its namespace `demo` after it).
const WALKTHROUGH: &str = "docs/kind-walkthrough.md";

/// A row of `kubectl mountguard status`: state, cause, pod, subject.
type Row = (&'static str, &'static str, &'static str, &'static str);

/// What the walkthrough says mountguard shows, as `kubectl mountguard
/// status --namespace demo --all` rows `(state, cause, pod, subject)`:
/// before the block whose first command starts with the given text (the
/// reader waits `controller.grace` for it), or after the block (the reader
/// looks once it ran).
const WALKTHROUGH_SAYS: &[(&str, bool, &[Row])] = &[
    (
        "kubectl mountguard status --namespace demo",
        true,
        &[
            ("Stale", "ImmutableCachePinned", "demo/pinner", "volume key"),
            ("Stale", "ImmutableCachePinned", "demo/victim", "volume key"),
        ],
    ),
    (
        "kubectl -n demo create configmap app-conf",
        false,
        &[("Frozen", "SubPath", "demo/subpath", "subPath")],
    ),
];

/// Waits up to 180 s until `kubectl mountguard status --namespace demo
/// --all` lists every row of `rows`.
async fn shows(node: &RealNode, dir: &Path, rows: &[Row]) {
    let last = std::sync::Mutex::new(String::new());
    poll(
        "the walkthrough's verdicts",
        Duration::from_secs(180),
        || async {
            let (_, out, err) =
                kubectl_mountguard(node, dir, &["status", "--namespace", "demo", "--all"]).await;
            *last.lock().unwrap() = format!("{out}\n{err}");
            rows.iter()
                .all(|(state, cause, pod, subject)| {
                    out.lines().any(|l| {
                        let w: Vec<&str> = l.split_whitespace().collect();
                        w.first() == Some(state)
                            && w.get(1) == Some(cause)
                            && w.contains(pod)
                            && l.contains(&format!("  {subject}"))
                    })
                })
                .then_some(())
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}: want {rows:?}; last:\n{}", last.lock().unwrap()));
}

/// The pages, in the order the test runs them: the kind walkthrough, the
/// troubleshooting guide, the how-to guides that turn repair on, the
/// runbooks (whose repair alerts presume it is on), the upgrade guide last
/// (it ends with `helm uninstall`).
fn pages(repo: &Path) -> Vec<PathBuf> {
    let sorted = |dir: &str| {
        let mut files: Vec<PathBuf> = std::fs::read_dir(repo.join(dir))
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        files.sort();
        files
    };
    let upgrade = repo.join("docs/how-to/upgrade.md");
    let mut out = vec![repo.join(WALKTHROUGH), repo.join("docs/troubleshooting.md")];
    out.extend(sorted("docs/how-to").into_iter().filter(|p| *p != upgrade));
    out.extend(sorted("docs/runbooks"));
    out.push(upgrade);
    out
}

/// Waits, as a reader waits for the rollout after `helm upgrade`, until
/// the controller's Deployment has rolled out and the controller answers
/// that no verdict needs attention (a new controller holds no inventory
/// until the agent reports again; a pod just started is not written yet),
/// each within 120 s.
async fn settled(node: &RealNode, dir: &Path) {
    let kubectl = node_tools().expect("node tools").join("kubectl");
    let out = tokio::process::Command::new(&kubectl)
        .args([
            "-n",
            "mountguard-system",
            "rollout",
            "status",
            "deploy/mountguard-controller",
            "--timeout",
            "120s",
        ])
        .env("KUBECONFIG", node.cluster.kubeconfig_path())
        .output()
        .await
        .expect("kubectl runs");
    assert!(
        out.status.success(),
        "the controller's rollout: {}{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        node.logs(30)
    );
    let last = std::sync::Mutex::new(String::new());
    poll(
        "nothing needs attention",
        Duration::from_secs(120),
        || async {
            let (code, out, err) = kubectl_mountguard(node, dir, &["status"]).await;
            *last.lock().unwrap() = format!("{code:?}\n{out}\n{err}");
            (code == Some(0) && out.contains("no verdict needs attention")).then_some(())
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}: {}\n{}", last.lock().unwrap(), node.logs(30)));
}

/// The fixture the placeholders name.
async fn create_fixture(node: &RealNode, client: &kube::Client) {
    mountguard_tests::real::slinky::create_auth_and_hooks(client)
        .await
        .expect("the Slinky Secrets");
    let objects = [
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "shop"}}),
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "web", "namespace": "shop"},
               "stringData": {"app.conf": "level=info\n"}}),
        json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web", "namespace": "shop"},
               "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "web"}},
                        "template": {"metadata": {"labels": {"app": "web"}},
                                     "spec": {"automountServiceAccountToken": false, "terminationGracePeriodSeconds": 1,
                                              "containers": [{"name": "web", "image": node.images.pause, "imagePullPolicy": "Never",
                                                              "volumeMounts": [{"name": "conf", "mountPath": "/etc/web"}]}],
                                              "volumes": [{"name": "conf", "secret": {"secretName": "web"}}]}}}}),
        // What the Slinky how-to's upgrade names: slurmrestd's token.
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "mountguard-token", "namespace": SLURM_NAMESPACE},
               "stringData": {"token": "not-a-real-token"}}),
        json!({"apiVersion": "slinky.slurm.net/v1beta1", "kind": "NodeSet",
               "metadata": {"name": "slurm-worker", "namespace": SLURM_NAMESPACE},
               "spec": {"controllerRef": {"name": mountguard_tests::cluster::SLURM_CLUSTER, "namespace": SLURM_NAMESPACE},
                        "replicas": 0, "template": {"spec": {"containers": [{"name": "slurmd", "image": node.images.pause}]}}}}),
    ];
    for o in objects {
        create(client, &o)
            .await
            .unwrap_or_else(|e| panic!("creating the {}: {e}", o["kind"]));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_node_docs_commands_run_against_the_default_install() {
    let node = real_node_or_skip!(
        "real_node_docs_commands_run_against_the_default_install",
        start_with_slinky
    );
    let client = node.cluster.client().await.expect("client");
    create_fixture(&node, &client).await;
    let helm = Helm::new(&node);
    install(&node, &helm, &[]).await;
    let web = running_pod(&client, "shop", "labelSelector=app%3Dweb", None).await;
    let web_pod = web["metadata"]["name"].as_str().expect("name").to_string();
    let dir = tempfile::tempdir().expect("dir");
    settled(&node, dir.path()).await;
    let (code, body) = raw(
        &client,
        "GET",
        &format!(
            "/apis/slinky.slurm.net/v1beta1/namespaces/{SLURM_NAMESPACE}/nodesets/slurm-worker"
        ),
        None,
    )
    .await
    .expect("nodeset");
    assert_eq!(code, 200, "{body}");

    // kubectl, Helm (as `helm`) and the plugin on PATH.
    let plugin = kubectl_plugin(dir.path()).expect("plugin");
    let tools = node_tools().expect("node tools");
    let helm_bin = dir.path().join("helm-bin");
    std::fs::create_dir_all(&helm_bin).unwrap();
    std::os::unix::fs::symlink(tools.join("helm"), helm_bin.join("helm")).unwrap();
    std::os::unix::fs::symlink(tools.join("kubectl"), helm_bin.join("kubectl")).unwrap();
    let path = format!(
        "{}:{}:/usr/local/bin:/usr/bin:/bin",
        plugin.parent().unwrap().display(),
        helm_bin.display()
    );
    // The walkthrough's pods need an image with `sleep` and `cat`.
    let shell_image = node.images.slurmd.as_ref().map(|i| {
        node.runtime
            .import(
                &node.images.dir.join("slurmd.tar"),
                Some((&i.image.0, &i.image.1)),
            )
            .expect("importing slurmd.tar");
        format!("{}@{}", i.image.0, i.image.1)
    });
    let map = [
        ("nodeset NAME", "nodeset slurm-worker"),
        ("SLURM_NS", SLURM_NAMESPACE),
        ("NODE", "node-0"),
        ("mountguard-worker", "node-0"),
        (
            "busybox:1.36",
            shell_image.as_deref().unwrap_or("busybox:1.36"),
        ),
        ("POD", web_pod.as_str()),
        ("NS", "shop"),
        ("NAME", "web"),
    ];
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    // The readers' working directory: the repository's entries, linked.
    let work = dir.path().join("work");
    std::fs::create_dir(&work).unwrap();
    for e in std::fs::read_dir(repo).unwrap() {
        let e = e.unwrap();
        std::os::unix::fs::symlink(e.path(), work.join(e.file_name())).unwrap();
    }
    let (mut ran, mut failed) = (0, Vec::new());
    for page in pages(repo) {
        let text = std::fs::read_to_string(&page).unwrap();
        let rel = page.strip_prefix(repo).unwrap().display().to_string();
        if rel == WALKTHROUGH && shell_image.is_none() {
            println!(
                "SKIPPED: {rel}: its pods need an image with a shell; scripts/images.sh builds the \
                 slurmd image when MOUNTGUARD_SLURM_PREFIX names the Slurm install"
            );
            continue;
        }
        for block in shell_blocks(&text) {
            let mut commands = Vec::new();
            for c in &block.commands {
                let c = substitute(c, &map);
                match NOT_RUN.iter().find(|(start, _)| c.starts_with(start)) {
                    Some((_, why)) => println!("not run: {rel}:{}: {c}: {why}", block.line),
                    None => commands.push(c),
                }
            }
            if commands.is_empty() {
                continue;
            }
            let says = WALKTHROUGH_SAYS
                .iter()
                .find(|(start, ..)| rel == WALKTHROUGH && commands[0].starts_with(start));
            if let Some((_, true, rows)) = says {
                shows(&node, dir.path(), rows).await;
            }
            let env = [
                ("PATH", path.clone()),
                ("HOME", dir.path().display().to_string()),
                (
                    "KUBECONFIG",
                    node.cluster.kubeconfig_path().display().to_string(),
                ),
            ];
            ran += commands.len();
            let run = run_block(&commands, &work, &env, Duration::from_secs(180)).await;
            for f in run.failures {
                failed.push(format!("{rel}:{}: {f}", block.line));
            }
            if let Some((_, false, rows)) = says {
                shows(&node, dir.path(), rows).await;
            }
            if commands
                .iter()
                .any(|c| c.starts_with("helm upgrade") && !c.contains("--dry-run"))
            {
                settled(&node, dir.path()).await;
            }
        }
        if rel == WALKTHROUGH {
            // Its pods are stale and frozen on purpose; the next pages
            // start from a cluster where nothing needs attention.
            let (code, body) = raw(&client, "DELETE", "/api/v1/namespaces/demo", None)
                .await
                .expect("delete namespace demo");
            assert!(code == 200 || code == 202, "{code} {body}");
            poll("namespace demo gone", Duration::from_secs(120), || async {
                let (code, _) = raw(&client, "GET", "/api/v1/namespaces/demo", None)
                    .await
                    .ok()?;
                (code == 404).then_some(())
            })
            .await
            .unwrap_or_else(|e| panic!("{e}\n{}", node.logs(30)));
            settled(&node, dir.path()).await;
        }
    }
    println!("ran {ran} commands of the docs");
    assert!(
        ran >= 40,
        "only {ran} commands found: the extraction is broken"
    );
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}
