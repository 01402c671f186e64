//! The agent's output against what the real kubelet wrote, file by file:
//! the test walks the kubelet's root itself (std::fs, following the
//! AtomicWriter layout: `..data` -> timestamped directory, one visible link
//! per top-level name) and compares paths, modes and SHA-256 with
//! `mountguard-agent scan --output json`.
//!
//! Kubernetes code cited here is at v1.37.2 (`k8s.io/*` staging modules
//! at v0.37.2).

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::time::{Duration, Instant};

use mountguard_inventory::NodeInventory;
use mountguard_tests::cluster::SLURM_NAMESPACE;
use mountguard_tests::real::create;
use mountguard_tests::real::signer::PodCertificateSigner;
use mountguard_tests::scenario::{find_verdict, state_tag};
use serde_json::{Value, json};
use sha2::Digest as _;

use crate::harness::wait;
use crate::kubelet_support::{
    On, agent_scan, b64, no_stale, running_pod, sample_until, volume_file,
};

/// One volume or subPath target as found on disk: path -> (mode, SHA-256).
/// Modes of subPath targets are not compared (the agent does not report
/// them): `None` there.
type Files = BTreeMap<String, (Option<String>, String)>;

/// Key of a volume (`<uid> <plugin> <name>`) or subPath target
/// (`<uid> subPath <volume>/<container>/<index>`), to its data directory
/// (volumes) and files.
type Tree = BTreeMap<String, (Option<String>, Files)>;

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(sha2::Sha256::digest(bytes))
}

/// Every regular file under `dir`, recursively, relative to `base` with
/// `/` separators. The kubelet writes nothing but regular files and
/// directories there.
fn walk_files(dir: &Path, prefix: &str, with_modes: bool, out: &mut Files) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap())
        .collect();
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let name = e.file_name().into_string().unwrap();
        let rel = if prefix.is_empty() {
            name.clone()
        } else {
            format!("{prefix}/{name}")
        };
        let md = std::fs::symlink_metadata(e.path()).unwrap();
        if md.is_dir() {
            walk_files(&e.path(), &rel, with_modes, out);
        } else if md.is_file() {
            let mode = with_modes.then(|| format!("{:04o}", md.permissions().mode() & 0o7777));
            out.insert(rel, (mode, sha256_hex(&std::fs::read(e.path()).unwrap())));
        } else {
            panic!(
                "the kubelet wrote neither a file nor a directory at {}",
                e.path().display()
            );
        }
    }
}

/// One AtomicWriter volume directory: its `..data` target and files. The
/// visible top-level entries must be exactly the links `name ->
/// ..data/name` of the data directory's top-level names
/// (pkg/volume/util/atomic_writer.go `createUserVisibleFiles`).
fn walk_volume(dir: &Path) -> (Option<String>, Files) {
    let data = std::fs::read_link(dir.join("..data"))
        .unwrap_or_else(|e| panic!("{}/..data: {e}", dir.display()))
        .into_os_string()
        .into_string()
        .unwrap();
    let mut files = Files::new();
    walk_files(&dir.join(&data), "", true, &mut files);
    let mut visible: Vec<(String, String)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| !n.starts_with(".."))
        .map(|n| {
            let target = std::fs::read_link(dir.join(&n))
                .unwrap_or_else(|e| panic!("{}/{n} is not a link: {e}", dir.display()));
            (n, target.display().to_string())
        })
        .collect();
    visible.sort();
    let mut top: Vec<String> = files
        .keys()
        .map(|p| p.split('/').next().unwrap().to_string())
        .collect();
    top.dedup();
    let want: Vec<(String, String)> = top
        .into_iter()
        .map(|n| (n.clone(), format!("..data/{n}")))
        .collect();
    assert_eq!(visible, want, "visible links of {}", dir.display());
    (Some(data), files)
}

/// The kubelet's root as the test reads it: every Secret, ConfigMap and
/// projected volume and every subPath target of every pod; also the
/// names of the other volume plugin directories met (not the agent's).
fn walk_root(root: &Path) -> (Tree, Vec<String>) {
    let mut tree = Tree::new();
    let mut others = Vec::new();
    for pod in std::fs::read_dir(root.join("pods")).unwrap() {
        let pod = pod.unwrap();
        let uid = pod.file_name().into_string().unwrap();
        if let Ok(plugins) = std::fs::read_dir(pod.path().join("volumes")) {
            for plugin in plugins {
                let plugin = plugin.unwrap();
                let dir_name = plugin.file_name().into_string().unwrap();
                let short = match dir_name.as_str() {
                    "kubernetes.io~secret" => "secret",
                    "kubernetes.io~configmap" => "configmap",
                    "kubernetes.io~projected" => "projected",
                    other => {
                        others.push(format!("{uid} {other}"));
                        continue;
                    }
                };
                for vol in std::fs::read_dir(plugin.path()).unwrap() {
                    let vol = vol.unwrap();
                    let name = vol.file_name().into_string().unwrap();
                    tree.insert(format!("{uid} {short} {name}"), walk_volume(&vol.path()));
                }
            }
        }
        // volume-subpaths/<volume>/<container>/<index>
        if let Ok(vols) = std::fs::read_dir(pod.path().join("volume-subpaths")) {
            for vol in vols {
                let vol = vol.unwrap();
                for c in std::fs::read_dir(vol.path()).unwrap() {
                    let c = c.unwrap();
                    for idx in std::fs::read_dir(c.path()).unwrap() {
                        let idx = idx.unwrap();
                        let key = format!(
                            "{uid} subPath {}/{}/{}",
                            vol.file_name().into_string().unwrap(),
                            c.file_name().into_string().unwrap(),
                            idx.file_name().into_string().unwrap()
                        );
                        let md = std::fs::symlink_metadata(idx.path()).unwrap();
                        let mut files = Files::new();
                        if md.is_dir() {
                            walk_files(&idx.path(), "", false, &mut files);
                        } else {
                            files.insert(
                                String::new(),
                                (None, sha256_hex(&std::fs::read(idx.path()).unwrap())),
                            );
                        }
                        tree.insert(key, (None, files));
                    }
                }
            }
        }
    }
    (tree, others)
}

/// The agent's inventory in the same shape; panics on any read error.
fn agent_tree(inv: &NodeInventory) -> Tree {
    let mut tree = Tree::new();
    for pod in &inv.pods {
        assert!(pod.errors.is_empty(), "pod {}: {:?}", pod.uid, pod.errors);
        for v in &pod.volumes {
            assert!(
                v.errors.is_empty(),
                "{} {}: {:?}",
                pod.uid,
                v.name,
                v.errors
            );
            let files = v
                .files
                .iter()
                .map(|(p, d)| {
                    let d = serde_json::to_value(d)
                        .unwrap()
                        .as_str()
                        .unwrap()
                        .to_string();
                    (p.clone(), (v.modes.get(p).cloned(), d))
                })
                .collect();
            tree.insert(
                format!("{} {} {}", pod.uid, v.plugin.as_str(), v.name),
                (v.data_dir.clone(), files),
            );
        }
        for s in &pod.sub_paths {
            assert!(
                s.errors.is_empty(),
                "{} {}: {:?}",
                pod.uid,
                s.volume,
                s.errors
            );
            let files = s
                .files
                .iter()
                .map(|(p, d)| {
                    let d = serde_json::to_value(d)
                        .unwrap()
                        .as_str()
                        .unwrap()
                        .to_string();
                    (p.clone(), (None, d))
                })
                .collect();
            tree.insert(
                format!(
                    "{} subPath {}/{}/{}",
                    pod.uid, s.volume, s.container, s.index
                ),
                (None, files),
            );
        }
    }
    tree
}

fn files_pod(on: On<'_>) -> Value {
    let (secret, config) = (on.name("files-secret"), on.name("files-config"));
    json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": on.name("files"), "namespace": SLURM_NAMESPACE, "labels": {"app": "files"}},
           "spec": {"nodeName": on.node(), "terminationGracePeriodSeconds": 0,
                    "containers": [{"name": "c", "image": "example.invalid/c:1",
                                    "volumeMounts": [
                                        {"name": "sec-all", "mountPath": "/sec-all"},
                                        {"name": "sec-items", "mountPath": "/sec-items"},
                                        {"name": "cm-all", "mountPath": "/cm-all"},
                                        {"name": "cm-items", "mountPath": "/cm-items"},
                                        {"name": "proj", "mountPath": "/proj"},
                                        {"name": "dapi", "mountPath": "/dapi"},
                                        {"name": "cm-all", "mountPath": "/etc/x", "subPath": "x"},
                                        {"name": "sec-items", "mountPath": "/etc/dir", "subPath": "dir"}]}],
                    "volumes": [
                        {"name": "sec-all", "secret": {"secretName": secret}},
                        {"name": "sec-items", "secret": {"secretName": secret, "defaultMode": 0o640,
                            "items": [{"key": "a", "path": "a", "mode": 0o400},
                                      {"key": "b", "path": "dir/sub/b"},
                                      {"key": "c", "path": "dir/c", "mode": 0o600}]}},
                        {"name": "cm-all", "configMap": {"name": config, "defaultMode": 0o755}},
                        {"name": "cm-items", "configMap": {"name": config,
                            "items": [{"key": "x", "path": "nested/deeper/x", "mode": 0o444},
                                      {"key": "z", "path": "z.bin"}]}},
                        {"name": "proj", "projected": {"defaultMode": 0o440, "sources": [
                            {"secret": {"name": secret, "items": [{"key": "a", "path": "secret/a", "mode": 0o600}]}},
                            {"configMap": {"name": config, "items": [{"key": "y", "path": "config/y"}]}},
                            {"serviceAccountToken": {"path": "token", "expirationSeconds": 3600, "audience": "mountguard-test"}},
                            {"downwardAPI": {"items": [
                                {"path": "meta/name", "fieldRef": {"fieldPath": "metadata.name"}},
                                {"path": "meta/labels", "fieldRef": {"fieldPath": "metadata.labels"}}]}}]}},
                        {"name": "dapi", "downwardAPI": {"items": [
                            {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}]}}]}})
}

/// Secret, ConfigMap and projected volumes (items with modes, nested
/// paths, binaryData, a serviceAccountToken and downwardAPI items in a
/// projected volume, the injected `kube-api-access-*` volume), file and
/// directory subPaths, written by the real kubelet: the agent's scan of
/// the kubelet's root equals the test's own walk of it for every pod on
/// the node (paths, modes, SHA-256, data directory), with no read error;
/// a few paths are also checked against the API objects. A plain
/// downwardAPI volume is on disk but not the agent's. The controller,
/// which skips the token and downwardAPI paths, finds every volume and
/// subPath Fresh.
pub async fn volumes_equal_the_agents_scan_file_by_file(on: On<'_>) {
    let sys = on.sys;
    let files = on.name("files");
    let binary_c: Vec<u8> = vec![0, 255, 1, 2, b'\n'];
    let binary_z: Vec<u8> = vec![0xff, 0xfe, 0, 7];
    create(
        &sys.client,
        &json!({"apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": on.name("files-secret"), "namespace": SLURM_NAMESPACE},
                "data": {"a": b64(b"alpha\n"), "b": b64(b"bravo\n"), "c": b64(&binary_c)}}),
    )
    .await
    .unwrap();
    create(
        &sys.client,
        &json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": on.name("files-config"), "namespace": SLURM_NAMESPACE},
                "data": {"x": "x-ray\n", "y": "yankee\n"},
                "binaryData": {"z": b64(&binary_z)}}),
    )
    .await
    .unwrap();
    create(&sys.client, &files_pod(on)).await.unwrap();
    let pod = running_pod(sys, &files).await;
    let uid = pod["metadata"]["uid"].as_str().unwrap().to_string();
    let root = on.root().to_path_buf();

    // The walk, the scan, the walk again: the two walks must agree (the
    // kubelet did not republish in between), else once more.
    let mut tries = 0;
    let (walked, others, inv) = loop {
        let (before, others) = walk_root(&root);
        let inv = agent_scan(&root, &on.node(), None);
        let (after, _) = walk_root(&root);
        if before == after {
            break (after, others, inv);
        }
        tries += 1;
        assert!(tries < 5, "the kubelet's volumes kept changing");
    };
    let agent = agent_tree(&inv);
    let keys = |t: &Tree| t.keys().cloned().collect::<Vec<_>>();
    assert_eq!(keys(&agent), keys(&walked), "volumes and subPaths seen");
    for (k, w) in &walked {
        assert_eq!(
            &agent[k], w,
            "{k}: the agent's view differs from the kubelet's files"
        );
    }
    assert!(
        walked.keys().filter(|k| k.starts_with(&uid)).count() >= 8,
        "{walked:#?}"
    );
    eprintln!(
        "{} volumes and subPath targets of {} pods, {} files: the agent's scan equals the kubelet's files",
        walked.len(),
        inv.pods.len(),
        walked.values().map(|(_, f)| f.len()).sum::<usize>()
    );

    // The kubelet's files themselves, for a few paths whose content and
    // mode follow from the objects (pkg/volume/secret, configmap,
    // projected; items' `mode` over `defaultMode`, 0644 without either).
    let f = |key: &str, path: &str| walked[&format!("{uid} {key}")].1[path].clone();
    let m = |s: &str| Some(s.to_string());
    assert_eq!(
        f("secret sec-all", "a"),
        (m("0644"), sha256_hex(b"alpha\n"))
    );
    assert_eq!(
        f("secret sec-items", "a"),
        (m("0400"), sha256_hex(b"alpha\n"))
    );
    assert_eq!(
        f("secret sec-items", "dir/sub/b"),
        (m("0640"), sha256_hex(b"bravo\n"))
    );
    assert_eq!(
        f("secret sec-items", "dir/c"),
        (m("0600"), sha256_hex(&binary_c))
    );
    assert_eq!(
        f("configmap cm-all", "z"),
        (m("0755"), sha256_hex(&binary_z))
    );
    assert_eq!(
        f("configmap cm-items", "nested/deeper/x"),
        (m("0444"), sha256_hex(b"x-ray\n"))
    );
    assert_eq!(
        f("projected proj", "secret/a"),
        (m("0600"), sha256_hex(b"alpha\n"))
    );
    assert_eq!(
        f("projected proj", "config/y"),
        (m("0440"), sha256_hex(b"yankee\n"))
    );
    let proj = &walked[&format!("{uid} projected proj")].1;
    for p in ["token", "meta/name", "meta/labels"] {
        assert!(proj.contains_key(p), "the kubelet wrote proj/{p}: {proj:?}");
    }
    assert_eq!(proj["meta/name"].1, sha256_hex(files.as_bytes()));
    assert_eq!(
        walked[&format!("{uid} subPath cm-all/c/6")]
            .1
            .keys()
            .collect::<Vec<_>>(),
        [""],
        "a file subPath"
    );
    assert_eq!(
        walked[&format!("{uid} subPath sec-items/c/7")]
            .1
            .keys()
            .collect::<Vec<_>>(),
        ["c", "sub/b"],
        "a directory subPath"
    );
    assert!(
        others.contains(&format!("{uid} kubernetes.io~downward-api")),
        "the plain downwardAPI volume is on disk, and not the agent's: {others:?}"
    );

    // The controller judges them: token and downwardAPI paths skipped,
    // everything else compared, every volume and subPath Fresh.
    let base = sys.metrics_base();
    let subjects = [
        "volume sec-all",
        "volume sec-items",
        "volume cm-all",
        "volume cm-items",
        "volume proj",
        "subPath c:cm-all/x",
        "subPath c:sec-items/dir",
    ];
    let doc = wait(
        sys,
        &format!("every mount of pod {files} Fresh"),
        Duration::from_secs(60),
        || {
            let base = base.clone();
            let files = files.clone();
            async move {
                let doc = mountguard_tests::scenario::verdicts(&base, "all=1")
                    .await
                    .ok()?;
                let access = doc["verdicts"].as_array()?.iter().find(|v| {
                    v["pod"] == files.as_str()
                        && v["subject"]
                            .as_str()
                            .is_some_and(|s| s.starts_with("volume kube-api-access-"))
                })?;
                (subjects
                    .iter()
                    .all(|s| find_verdict(&doc, &files, s).is_some_and(|v| v["state"] == "Fresh"))
                    && access["state"] == "Fresh")
                    .then_some(doc)
            }
        },
    )
    .await;
    assert!(
        find_verdict(&doc, &files, "volume dapi")
            .is_none_or(|v| state_tag(v).starts_with("Skipped")),
        "{doc}"
    );
}

/// Files the kubelet writes that come from no Secret or ConfigMap (on from
/// 1.37, both GA: pkg/features/kube_features.go `PodCertificateRequest`,
/// `ClusterTrustBundleProjection`, v1.37.2). The kubelet writes a
/// `clusterTrustBundle` source's certificates
/// (pkg/volume/projected/projected.go `collectData`, from
/// pkg/kubelet/clustertrustbundle) and a `podCertificate` source's key and
/// chain once the rig's signer has issued the kubelet's
/// PodCertificateRequest (pkg/kubelet/podcertificate/
/// podcertificatemanager.go `handleProjection`); the pod does not start
/// before (`collectData` fails while no chain is issued). The agent's scan
/// equals those files; the controller judges the Secret item beside them
/// (Fresh) and never the rest: a volume of only a podCertificate source is
/// `Skipped/podCertificate`, one of only a clusterTrustBundle source
/// `Skipped/clusterTrustBundle`, and nothing is ever Stale.
pub async fn pod_certificate_and_trust_bundle_files_are_seen_and_never_judged(
    on: On<'_>,
    signer: &PodCertificateSigner,
) {
    let sys = on.sys;
    let pod = on.name("certs");
    let (secret, bundle, account) = (on.name("certs-secret"), on.name("bundle"), on.name("certs"));
    let signer_name = signer.signer_name.as_str();
    for object in [
        json!({"apiVersion": "v1", "kind": "Secret",
               "metadata": {"name": secret, "namespace": SLURM_NAMESPACE},
               "data": {"a": b64(b"alpha\n")}}),
        json!({"apiVersion": "certificates.k8s.io/v1", "kind": "ClusterTrustBundle",
               "metadata": {"name": bundle},
               "spec": {"trustBundle": signer.ca_pem}}),
        json!({"apiVersion": "v1", "kind": "ServiceAccount",
               "metadata": {"name": account, "namespace": SLURM_NAMESPACE}}),
        json!({"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": pod, "namespace": SLURM_NAMESPACE},
               "spec": {"nodeName": on.node(), "serviceAccountName": account,
                        "automountServiceAccountToken": false,
                        "terminationGracePeriodSeconds": 0,
                        "volumes": [
                            {"name": "mixed", "projected": {"sources": [
                                {"secret": {"name": secret, "items": [{"key": "a", "path": "a"}]}},
                                {"clusterTrustBundle": {"name": bundle, "path": "bundle.pem"}},
                                {"podCertificate": {"signerName": signer_name, "keyType": "ED25519",
                                                    "credentialBundlePath": "credential.pem"}}]}},
                            {"name": "cert", "projected": {"sources": [
                                {"podCertificate": {"signerName": signer_name, "keyType": "ECDSAP256",
                                                    "keyPath": "tls.key",
                                                    "certificateChainPath": "tls.crt"}}]}},
                            {"name": "trust", "projected": {"sources": [
                                {"clusterTrustBundle": {"name": bundle, "path": "ca.pem"}}]}}],
                        "containers": [{"name": "c", "image": "example.invalid/c:1",
                                        "volumeMounts": [
                                            {"name": "mixed", "mountPath": "/mixed"},
                                            {"name": "cert", "mountPath": "/cert"},
                                            {"name": "trust", "mountPath": "/trust"}]}]}}),
    ] {
        create(&sys.client, &object).await.unwrap();
    }
    let running = running_pod(sys, &pod).await;
    let uid = running["metadata"]["uid"].as_str().unwrap().to_string();

    // What the kubelet wrote.
    let (walked, _) = walk_root(on.root());
    let volume = |name: &str| {
        walked
            .get(&format!("{uid} projected {name}"))
            .unwrap_or_else(|| panic!("volume {name} of {pod} on disk: {walked:#?}"))
            .1
            .clone()
    };
    let names = |files: &Files| files.keys().cloned().collect::<Vec<_>>();
    assert_eq!(
        names(&volume("mixed")),
        ["a", "bundle.pem", "credential.pem"]
    );
    assert_eq!(names(&volume("cert")), ["tls.crt", "tls.key"]);
    assert_eq!(names(&volume("trust")), ["ca.pem"]);
    let read = |rel: &str| {
        std::fs::read_to_string(volume_file(sys, on.i, &uid, "projected", rel)).unwrap()
    };
    let credential = read("mixed/credential.pem");
    assert!(
        credential.contains("PRIVATE KEY-----") && credential.contains("BEGIN CERTIFICATE-----"),
        "the credential bundle holds a key and its chain: {} bytes",
        credential.len()
    );
    assert!(read("cert/tls.crt").starts_with("-----BEGIN CERTIFICATE-----"));
    for rel in ["mixed/bundle.pem", "trust/ca.pem"] {
        assert_eq!(
            read(rel).trim(),
            signer.ca_pem.trim(),
            "{rel}: the ClusterTrustBundle's certificate"
        );
    }

    // The agent's scan of those volumes equals the walk.
    let agent = agent_tree(&agent_scan(on.root(), &on.node(), None));
    for name in ["mixed", "cert", "trust"] {
        let key = format!("{uid} projected {name}");
        assert_eq!(
            agent.get(&key),
            walked.get(&key),
            "{key}: the agent's view differs from the kubelet's files"
        );
    }

    // The verdicts: the Secret judged, the rest skipped, nothing Stale.
    let subjects = ["volume mixed", "volume cert", "volume trust"];
    let want = [
        "Fresh",
        "Skipped/podCertificate",
        "Skipped/clusterTrustBundle",
    ];
    let (seen, _) = sample_until(
        sys,
        &pod,
        &subjects,
        Instant::now(),
        Duration::from_secs(60),
        || (),
        |latest, _| latest.iter().zip(want).all(|(s, w)| s.tag == w),
    )
    .await;
    for (subject, samples) in subjects.iter().zip(&seen) {
        no_stale(subject, samples);
    }
}
