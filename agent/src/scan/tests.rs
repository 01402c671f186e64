//! Tests of the scanner on kubelet directories written by the AtomicWriter
//! double: digests, errors, links, subPaths, the cache.

use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::Path;

use mountguard_inventory::layout::{DATA_LINK, pod_dir, subpath_target, volume_dir};
use mountguard_inventory::writer::{AtomicWriterDouble, Payload, PayloadFile};
use mountguard_inventory::{Sha256Hex, file_digest, volume_digest};

use super::confirm::PARALLEL_CONFIRM_MIN_PODS;
use super::*;

fn payload(items: &[(&str, &[u8])]) -> Payload {
    items
        .iter()
        .map(|(p, d)| (p.to_string(), PayloadFile::new(d.to_vec())))
        .collect()
}

fn expected(items: &[(&str, &[u8])]) -> BTreeMap<String, Sha256Hex> {
    items
        .iter()
        .map(|(p, d)| (p.to_string(), Sha256Hex(file_digest(d))))
        .collect()
}

fn digest_of(files: &BTreeMap<String, Sha256Hex>) -> Sha256Hex {
    Sha256Hex(volume_digest(files.iter().map(|(p, d)| (p.as_str(), &d.0))))
}

fn root() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join(PODS_DIR)).unwrap();
    dir
}

fn writer(root: &Path, uid: &str, plugin: Plugin, name: &str) -> AtomicWriterDouble {
    AtomicWriterDouble::new(volume_dir(root, uid, plugin, name))
}

fn scanner(root: &Path) -> Scanner {
    let mut opts = ScanOptions::new(root, "node-a");
    opts.start_generation = Some(100);
    Scanner::new(opts)
}

fn volume<'a>(
    inv: &'a NodeInventory,
    uid: &str,
    plugin: Plugin,
    name: &str,
) -> &'a VolumeInventory {
    inv.pod(uid)
        .unwrap_or_else(|| panic!("pod {uid} missing"))
        .volumes
        .iter()
        .find(|v| v.plugin == plugin && v.name == name)
        .unwrap_or_else(|| panic!("volume {name} missing"))
}

fn kinds(errors: &[ReadError]) -> Vec<ReadErrorKind> {
    errors.iter().map(|e| e.kind).collect()
}

#[test]
fn first_write_is_read_with_digest_modes_and_data_dir() {
    let r = root();
    let w = writer(r.path(), "u1", Plugin::Secret, "auth");
    let mut p = payload(&[("slurm.key", b"key-1")]);
    p.insert(
        "jwt.key".into(),
        PayloadFile::with_mode(b"jwt".to_vec(), 0o600),
    );
    w.write(&p).unwrap();

    let scan = scanner(r.path()).scan().unwrap();
    assert!(scan.changed);
    assert_eq!(scan.inventory.generation, 100);
    assert_eq!(scan.inventory.node, "node-a");
    let v = volume(&scan.inventory, "u1", Plugin::Secret, "auth");
    let files = expected(&[("slurm.key", b"key-1"), ("jwt.key", b"jwt")]);
    assert_eq!(v.files, files);
    assert_eq!(v.digest, Some(digest_of(&files)));
    assert_eq!(v.modes["jwt.key"], "0600");
    assert_eq!(v.modes["slurm.key"], "0644");
    assert_eq!(v.data_dir, w.current_data_dir());
    assert!(v.errors.is_empty(), "{:?}", v.errors);
    let ts_meta = std::fs::metadata(w.target().join(v.data_dir.as_ref().unwrap())).unwrap();
    let mtime = jiff::Timestamp::try_from(ts_meta.modified().unwrap()).unwrap();
    assert_eq!(v.written_at, Some(mtime));
    assert_eq!(scan.stats.rehashed, 1);
    assert_eq!(scan.stats.files, 2);
}

/// Every directory below `pods/` (and `pods/` itself) last modified an
/// hour ago, as on a node whose pods started long before: listings and
/// volume identities are then settled and reusable.
fn age(root: &Path) {
    fn walk(d: &Path, old: std::time::SystemTime) {
        for e in std::fs::read_dir(d).unwrap().flatten() {
            if e.file_type().unwrap().is_dir() {
                walk(&e.path(), old);
            }
        }
        std::fs::File::open(d).unwrap().set_modified(old).unwrap();
    }
    walk(
        &root.join(PODS_DIR),
        std::time::SystemTime::now() - Duration::from_secs(3600),
    );
}

#[test]
fn settled_pods_are_confirmed_by_metadata_and_any_change_is_still_read() {
    let r = root();
    let wa = writer(r.path(), "a", Plugin::Secret, "s");
    wa.write(&payload(&[("k", b"a1")])).unwrap();
    writer(r.path(), "a", Plugin::Projected, "p")
        .write(&payload(&[("t", b"tok")]))
        .unwrap();
    let wb = writer(r.path(), "b", Plugin::Configmap, "c");
    wb.write(&payload(&[("k", b"b1")])).unwrap();
    age(r.path());
    let mut s = scanner(r.path());
    let first = s.scan().unwrap();
    // The second scan confirms `..data` of each volume once more; from
    // the third on, a pod costs one stat per directory, nothing opened.
    s.scan().unwrap();
    let third = s.scan().unwrap();
    assert!(!third.changed);
    assert!(Arc::ptr_eq(&third.inventory, &first.inventory));
    assert!(third.stats.watch_dirs_unchanged);
    assert_eq!((third.stats.rehashed, third.stats.reused), (0, 3));
    assert_eq!(third.stats.listings_reused, 3);

    // A swap in a settled pod moves its volume directory's mtime.
    wa.write(&payload(&[("k", b"a2")])).unwrap();
    let swapped = s.scan().unwrap();
    assert!(swapped.changed);
    assert_eq!(swapped.stats.rehashed, 1);
    let v = volume(&swapped.inventory, "a", Plugin::Secret, "s");
    assert_eq!(v.files, expected(&[("k", b"a2")]));
    assert_eq!(
        volume(&swapped.inventory, "b", Plugin::Configmap, "c").files,
        expected(&[("k", b"b1")])
    );
    // The rebuilt inventory lists every directory to watch again.
    assert!(!swapped.stats.watch_dirs_unchanged);
    let vol_b = volume_dir(r.path(), "b", Plugin::Configmap, "c");
    assert!(swapped.stats.watch_dirs.contains(&vol_b));

    // A new volume directory in a settled plugin directory, and a new
    // subPaths directory in a settled pod.
    age(r.path());
    s.scan().unwrap();
    s.scan().unwrap();
    writer(r.path(), "b", Plugin::Configmap, "c2")
        .write(&payload(&[("k", b"new")]))
        .unwrap();
    let target = subpath_target(r.path(), "a", "s", "ctr", 0);
    std::fs::create_dir_all(target.parent().unwrap()).unwrap();
    std::fs::write(&target, b"a2").unwrap();
    let grown = s.scan().unwrap();
    assert!(grown.changed);
    assert_eq!(
        volume(&grown.inventory, "b", Plugin::Configmap, "c2").files,
        expected(&[("k", b"new")])
    );
    assert_eq!(grown.inventory.pod("a").unwrap().sub_paths.len(), 1);
}

#[test]
fn with_many_pods_the_parallel_confirmation_still_reads_every_change() {
    // Enough pods for the full scan to confirm them on several threads
    // (when this machine lets the process use more than one CPU).
    let n = PARALLEL_CONFIRM_MIN_PODS + 44;
    let r = root();
    let uid = |i: usize| format!("pod-{i:04}");
    for i in 0..n {
        writer(r.path(), &uid(i), Plugin::Secret, "s")
            .write(&payload(&[("k", format!("v{i}").as_bytes())]))
            .unwrap();
    }
    age(r.path());
    let mut s = scanner(r.path());
    let first = s.scan().unwrap();
    s.scan().unwrap();
    let settled = s.scan().unwrap();
    assert!(!settled.changed);
    assert!(Arc::ptr_eq(&settled.inventory, &first.inventory));
    assert_eq!(
        (settled.stats.rehashed, settled.stats.reused),
        (0, n as u64)
    );
    assert_eq!(settled.stats.listings_reused, n as u64);

    // A swap in one pod of the first thread's share and one of the
    // last's, a new volume in a third, a removed pod: each read, the
    // rest confirmed.
    writer(r.path(), &uid(3), Plugin::Secret, "s")
        .write(&payload(&[("k", b"swapped-3")]))
        .unwrap();
    writer(r.path(), &uid(n - 2), Plugin::Secret, "s")
        .write(&payload(&[("k", b"swapped-last")]))
        .unwrap();
    writer(r.path(), &uid(n / 2), Plugin::Configmap, "c")
        .write(&payload(&[("k", b"new")]))
        .unwrap();
    std::fs::remove_dir_all(r.path().join(PODS_DIR).join(uid(7))).unwrap();
    let changed = s.scan().unwrap();
    assert!(changed.changed);
    assert_eq!(changed.stats.rehashed, 3, "{:?}", changed.stats);
    // All but the removed pod's and the two swapped volumes (the new
    // volume's pod keeps its other one).
    assert_eq!(changed.stats.reused, (n - 3) as u64);
    let inv = &changed.inventory;
    assert_eq!(
        volume(inv, &uid(3), Plugin::Secret, "s").files,
        expected(&[("k", b"swapped-3")])
    );
    assert_eq!(
        volume(inv, &uid(n - 2), Plugin::Secret, "s").files,
        expected(&[("k", b"swapped-last")])
    );
    assert_eq!(
        volume(inv, &uid(n / 2), Plugin::Configmap, "c").files,
        expected(&[("k", b"new")])
    );
    assert!(inv.pod(&uid(7)).is_none());
    assert_eq!(inv.pods.len(), n - 1);
    // Every other pod as before.
    for i in [100, n - 10] {
        assert_eq!(
            volume(inv, &uid(i), Plugin::Secret, "s").files,
            expected(&[("k", format!("v{i}").as_bytes())])
        );
    }
    // A pod entry replaced by a symlink is reported, never followed.
    let pods = r.path().join(PODS_DIR);
    std::fs::remove_dir_all(pods.join(uid(9))).unwrap();
    std::os::unix::fs::symlink(pods.join(uid(10)), pods.join(uid(9))).unwrap();
    let linked = s.scan().unwrap();
    let p9 = linked.inventory.pod(&uid(9)).unwrap();
    assert!(p9.volumes.is_empty(), "{p9:?}");
    assert_eq!(kinds(&p9.errors), [ReadErrorKind::SymlinkEscape]);
}

#[test]
fn targeted_scan_reads_only_the_named_pods_and_the_full_scan_catches_the_rest() {
    let r = root();
    let wa = writer(r.path(), "a", Plugin::Secret, "s");
    wa.write(&payload(&[("k", b"a1")])).unwrap();
    let wb = writer(r.path(), "b", Plugin::Secret, "s");
    wb.write(&payload(&[("k", b"b1")])).unwrap();
    writer(r.path(), "c", Plugin::Configmap, "c")
        .write(&payload(&[("k", b"c1")]))
        .unwrap();
    age(r.path());
    let mut s = scanner(r.path());
    let first = s.scan().unwrap();
    s.scan().unwrap();

    // Changes everywhere; the events name only pod a.
    wa.write(&payload(&[("k", b"a2")])).unwrap();
    wb.write(&payload(&[("k", b"b2")])).unwrap();
    std::fs::remove_dir_all(pod_dir(r.path(), "c")).unwrap();
    writer(r.path(), "d", Plugin::Secret, "s")
        .write(&payload(&[("k", b"d1")]))
        .unwrap();
    let targeted = s.scan_pods(&[b"a".as_slice()]).unwrap();
    assert!(targeted.changed);
    assert_eq!(
        targeted.inventory.generation,
        first.inventory.generation + 1
    );
    assert_eq!(
        targeted.stats.rescanned_pods,
        Some(vec![pod_dir(r.path(), "a")])
    );
    assert_eq!((targeted.stats.rehashed, targeted.stats.reused), (1, 0));
    let inv = &targeted.inventory;
    assert_eq!(
        volume(inv, "a", Plugin::Secret, "s").files,
        expected(&[("k", b"a2")])
    );
    // Nothing else was looked at: b is as it was, c and d as they were.
    assert_eq!(
        volume(inv, "b", Plugin::Secret, "s").files,
        expected(&[("k", b"b1")])
    );
    assert!(inv.pod("c").is_some() && inv.pod("d").is_none());
    assert_eq!(targeted.stats.pods, 3);
    let vol_a = volume_dir(r.path(), "a", Plugin::Secret, "s");
    assert!(targeted.stats.watch_dirs.contains(&vol_a));
    assert!(
        targeted
            .stats
            .watch_dirs
            .iter()
            .all(|d| d.starts_with(pod_dir(r.path(), "a"))),
        "{:?}",
        targeted.stats.watch_dirs
    );

    // A named pod that is gone is dropped; naming it again changes nothing.
    let removed = s.scan_pods(&[b"c".as_slice()]).unwrap();
    assert!(removed.changed && removed.inventory.pod("c").is_none());
    let again = s.scan_pods(&[b"c".as_slice(), b"a".as_slice()]).unwrap();
    assert!(!again.changed);
    assert!(Arc::ptr_eq(&again.inventory, &removed.inventory));

    // The full scan (the daemon's periodic backstop) finds what no
    // event named: b's swap and the new pod d.
    let full = s.scan().unwrap();
    assert!(full.changed);
    assert!(full.stats.rescanned_pods.is_none());
    let inv = &full.inventory;
    assert_eq!(
        volume(inv, "b", Plugin::Secret, "s").files,
        expected(&[("k", b"b2")])
    );
    assert_eq!(
        volume(inv, "d", Plugin::Secret, "s").files,
        expected(&[("k", b"d1")])
    );
    assert_eq!(
        volume(inv, "a", Plugin::Secret, "s").files,
        expected(&[("k", b"a2")])
    );
    assert!(inv.pod("c").is_none());
    assert_eq!(full.stats.rehashed, 2, "b and d, not a again");
    // And it agrees with a scanner that never saw the targeted scans.
    assert_eq!(inv.pods, scanner(r.path()).scan().unwrap().inventory.pods);
}

#[test]
fn scan_once_reads_the_same_inventory_and_keeps_no_cache() {
    let r = root();
    writer(r.path(), "a", Plugin::Secret, "s")
        .write(&payload(&[("k", b"1")]))
        .unwrap();
    writer(r.path(), "a", Plugin::Configmap, "c")
        .write(&payload(&[("k", b"2"), ("d/e", b"3")]))
        .unwrap();
    let mut opts = ScanOptions::new(r.path(), "node-a");
    opts.start_generation = Some(100);
    let once = Scanner::scan_once(opts).unwrap();
    let cached = scanner(r.path()).scan().unwrap();
    assert_eq!(once.inventory.pods, cached.inventory.pods);
    assert_eq!(once.stats.rehashed, 2);
}

#[test]
fn targeted_scan_without_a_previous_inventory_is_a_full_scan() {
    let r = root();
    writer(r.path(), "a", Plugin::Secret, "s")
        .write(&payload(&[("k", b"1")]))
        .unwrap();
    writer(r.path(), "b", Plugin::Secret, "s")
        .write(&payload(&[("k", b"2")]))
        .unwrap();
    let scan = scanner(r.path()).scan_pods(&[b"a".as_slice()]).unwrap();
    assert!(scan.stats.rescanned_pods.is_none());
    assert_eq!(scan.inventory.pods.len(), 2);
}

#[test]
fn update_bumps_generation_and_unchanged_volumes_are_not_rehashed() {
    let r = root();
    let w = writer(r.path(), "u1", Plugin::Configmap, "cfg");
    w.write(&payload(&[("a", b"1")])).unwrap();
    writer(r.path(), "u1", Plugin::Secret, "steady")
        .write(&payload(&[("s", b"same")]))
        .unwrap();
    // Directories last modified long ago: their listings are reusable.
    let old = std::time::SystemTime::now() - Duration::from_secs(3600);
    let volumes = pod_dir(r.path(), "u1").join("volumes");
    for d in [
        r.path().join(PODS_DIR),
        volumes.join(Plugin::Configmap.dir_name()),
        volumes.join(Plugin::Secret.dir_name()),
    ] {
        std::fs::File::open(d).unwrap().set_modified(old).unwrap();
    }
    let mut s = scanner(r.path());
    let first = s.scan().unwrap();
    let old_dir = volume(&first.inventory, "u1", Plugin::Configmap, "cfg")
        .data_dir
        .clone();

    let again = s.scan().unwrap();
    assert!(!again.changed);
    assert_eq!(again.inventory.generation, 100);
    assert_eq!((again.stats.rehashed, again.stats.reused), (0, 2));
    // Nothing was read again: the previous inventory is reused as is.
    assert!(Arc::ptr_eq(&again.inventory, &first.inventory));
    assert!(again.scanned_at >= first.scanned_at);

    w.write(&payload(&[("a", b"2")])).unwrap();
    let updated = s.scan().unwrap();
    assert!(updated.changed);
    assert_eq!(updated.inventory.generation, 101);
    assert_eq!(updated.stats.rehashed, 1);
    let v = volume(&updated.inventory, "u1", Plugin::Configmap, "cfg");
    assert_eq!(v.files, expected(&[("a", b"2")]));
    assert_ne!(v.data_dir, old_dir);
    assert_eq!(v.data_dir, w.current_data_dir());
    // The unchanged volume next to it is carried over in full.
    let steady = volume(&updated.inventory, "u1", Plugin::Secret, "steady");
    assert_eq!(steady.files, expected(&[("s", b"same")]));
    assert_eq!(
        steady,
        volume(&first.inventory, "u1", Plugin::Secret, "steady")
    );
    assert_eq!((updated.stats.rehashed, updated.stats.reused), (1, 1));
}

#[test]
fn settled_plugin_listing_is_reused_until_the_directory_changes() {
    let r = root();
    writer(r.path(), "u1", Plugin::Secret, "a")
        .write(&payload(&[("k", b"1")]))
        .unwrap();
    let plugin_dir = pod_dir(r.path(), "u1")
        .join("volumes")
        .join(Plugin::Secret.dir_name());
    let age = |p: &Path| {
        let old = std::time::SystemTime::now() - Duration::from_secs(3600);
        std::fs::File::open(p).unwrap().set_modified(old).unwrap();
    };
    age(&plugin_dir);
    let mut s = scanner(r.path());
    assert_eq!(s.scan().unwrap().stats.listings_reused, 0);
    let again = s.scan().unwrap();
    assert_eq!(again.stats.listings_reused, 1);
    assert_eq!(again.stats.reused, 1);

    // A new volume changes the directory: it is listed again at once.
    writer(r.path(), "u1", Plugin::Secret, "b")
        .write(&payload(&[("k", b"2")]))
        .unwrap();
    let added = s.scan().unwrap();
    assert_eq!(added.stats.listings_reused, 0);
    let pod = added.inventory.pod("u1").unwrap();
    assert_eq!(
        pod.volumes
            .iter()
            .map(|v| v.name.as_str())
            .collect::<Vec<_>>(),
        vec!["a", "b"]
    );

    // A listing taken right after a change is not trusted: a change in
    // the same (possibly coarse) timestamp tick would not move mtime.
    let unsettled = s.scan().unwrap();
    assert_eq!(unsettled.stats.listings_reused, 0);
    assert_eq!(unsettled.stats.reused, 2);
}

#[test]
fn key_added_and_removed() {
    let r = root();
    let w = writer(r.path(), "u1", Plugin::Secret, "s");
    let mut s = scanner(r.path());
    w.write(&payload(&[("a", b"1"), ("b", b"2")])).unwrap();
    s.scan().unwrap();
    w.write(&payload(&[("a", b"1"), ("b", b"2"), ("c", b"3")]))
        .unwrap();
    let added = s.scan().unwrap();
    let v = volume(&added.inventory, "u1", Plugin::Secret, "s");
    assert_eq!(v.files, expected(&[("a", b"1"), ("b", b"2"), ("c", b"3")]));
    w.write(&payload(&[("c", b"3")])).unwrap();
    let removed = s.scan().unwrap();
    let v = volume(&removed.inventory, "u1", Plugin::Secret, "s");
    assert_eq!(v.files, expected(&[("c", b"3")]));
    assert!(v.errors.is_empty(), "{:?}", v.errors);
    assert_eq!(removed.inventory.generation, 102);
}

#[test]
fn nested_paths_are_reported_relative_to_the_data_dir() {
    let r = root();
    let w = writer(r.path(), "u1", Plugin::Configmap, "c");
    let items: &[(&str, &[u8])] = &[("etc/enroot/hooks.d/10-x.sh", b"#!/bin/sh"), ("top", b"t")];
    w.write(&payload(items)).unwrap();
    let scan = scanner(r.path()).scan().unwrap();
    let v = volume(&scan.inventory, "u1", Plugin::Configmap, "c");
    assert_eq!(v.files, expected(items));
    assert!(v.errors.is_empty(), "{:?}", v.errors);
}

#[test]
fn projected_volume_with_several_sources() {
    // A projected volume merges a Secret key, ConfigMap keys and a
    // nested path into one payload with per-item modes.
    let r = root();
    let w = writer(r.path(), "u1", Plugin::Projected, "slurm-etc");
    let mut p = Payload::new();
    p.insert(
        "slurm.key".into(),
        PayloadFile::with_mode(b"secret".to_vec(), 0o600),
    );
    p.insert(
        "plugstack.conf".into(),
        PayloadFile::with_mode(b"cm1".to_vec(), 0o644),
    );
    p.insert(
        "plugstack.conf.d/pyxis.conf".into(),
        PayloadFile::with_mode(b"cm2".to_vec(), 0o444),
    );
    w.write(&p).unwrap();
    // A second, independent volume of another plugin in the same pod.
    writer(r.path(), "u1", Plugin::Secret, "other")
        .write(&payload(&[("x", b"y")]))
        .unwrap();
    let scan = scanner(r.path()).scan().unwrap();
    let pod = scan.inventory.pod("u1").unwrap();
    assert_eq!(
        pod.volumes
            .iter()
            .map(|v| (v.plugin, v.name.as_str()))
            .collect::<Vec<_>>(),
        vec![(Plugin::Secret, "other"), (Plugin::Projected, "slurm-etc")]
    );
    let v = volume(&scan.inventory, "u1", Plugin::Projected, "slurm-etc");
    assert_eq!(
        v.files,
        expected(&[
            ("slurm.key", b"secret"),
            ("plugstack.conf", b"cm1"),
            ("plugstack.conf.d/pyxis.conf", b"cm2")
        ])
    );
    assert_eq!(v.modes["slurm.key"], "0600");
    assert_eq!(v.modes["plugstack.conf.d/pyxis.conf"], "0444");
    assert!(v.digest.is_some());
}

#[test]
fn subpath_file_and_directory_targets() {
    let r = root();
    writer(r.path(), "u1", Plugin::Configmap, "sshd")
        .write(&payload(&[("sshd_config", b"cfg")]))
        .unwrap();
    let file_target = subpath_target(r.path(), "u1", "sshd", "slurmd", 0);
    std::fs::create_dir_all(file_target.parent().unwrap()).unwrap();
    std::fs::write(&file_target, b"cfg").unwrap();
    let dir_target = subpath_target(r.path(), "u1", "hooks", "slurmd", 3);
    std::fs::create_dir_all(dir_target.join("d")).unwrap();
    std::fs::write(dir_target.join("d/h.sh"), b"hook").unwrap();
    std::fs::write(dir_target.join("top"), b"t").unwrap();

    let scan = scanner(r.path()).scan().unwrap();
    let pod = scan.inventory.pod("u1").unwrap();
    assert_eq!(pod.sub_paths.len(), 2);
    let hooks = &pod.sub_paths[0];
    assert_eq!(
        (hooks.volume.as_str(), hooks.container.as_str(), hooks.index),
        ("hooks", "slurmd", 3)
    );
    assert_eq!(hooks.files, expected(&[("d/h.sh", b"hook"), ("top", b"t")]));
    let sshd = &pod.sub_paths[1];
    assert_eq!((sshd.volume.as_str(), sshd.index), ("sshd", 0));
    assert_eq!(sshd.files, expected(&[("", b"cfg")]));
    assert!(hooks.errors.is_empty() && sshd.errors.is_empty());
}

#[test]
fn swap_racing_the_hash_is_retried_to_a_consistent_result() {
    let r = root();
    let w = writer(r.path(), "u1", Plugin::Secret, "s");
    w.write(&payload(&[("k", b"old"), ("gone", b"x")])).unwrap();
    let mut s = scanner(r.path());
    let w2 = w.clone();
    let attempts = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = attempts.clone();
    s.set_after_hash_hook(move |h| {
        seen.lock().unwrap().push(h.attempt);
        if h.attempt == 1 {
            // The kubelet publishes new content while the old was hashed.
            w2.write(&payload(&[("k", b"new")])).unwrap();
        }
    });
    let scan = s.scan().unwrap();
    let v = volume(&scan.inventory, "u1", Plugin::Secret, "s");
    assert_eq!(v.files, expected(&[("k", b"new")]));
    assert_eq!(v.data_dir, w.current_data_dir());
    assert_eq!(v.digest, Some(digest_of(&expected(&[("k", b"new")]))));
    assert!(v.errors.is_empty(), "{:?}", v.errors);
    assert_eq!(*attempts.lock().unwrap(), vec![1, 2]);
}

#[test]
fn endless_swaps_end_as_vanished_after_bounded_attempts() {
    let r = root();
    let w = writer(r.path(), "u1", Plugin::Secret, "s");
    w.write(&payload(&[("k", b"0")])).unwrap();
    let mut s = scanner(r.path());
    let w2 = w.clone();
    let count = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let c = count.clone();
    s.set_after_hash_hook(move |h| {
        c.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        w2.write(&payload(&[("k", h.attempt.to_string().as_bytes())]))
            .unwrap();
    });
    let scan = s.scan().unwrap();
    let v = volume(&scan.inventory, "u1", Plugin::Secret, "s");
    assert_eq!(
        count.load(std::sync::atomic::Ordering::SeqCst),
        DEFAULT_MAX_ATTEMPTS
    );
    assert_eq!(kinds(&v.errors), vec![ReadErrorKind::Vanished]);
    assert!(v.files.is_empty() && v.digest.is_none());
}

#[test]
fn symlinks_out_of_the_volume_are_reported_and_never_followed() {
    let r = root();
    let outside = r.path().join("outside-secret");
    std::fs::write(&outside, b"host secret").unwrap();
    let w = writer(r.path(), "u1", Plugin::Secret, "s");
    w.write(&payload(&[("ok", b"fine")])).unwrap();
    let data = w.target().join(w.current_data_dir().unwrap());
    symlink(&outside, data.join("inner")).unwrap();
    symlink(&outside, w.target().join("evil")).unwrap();

    // ..data itself pointing out of the volume.
    let w2 = writer(r.path(), "u1", Plugin::Secret, "t");
    std::fs::create_dir_all(w2.target()).unwrap();
    symlink(r.path(), w2.target().join(DATA_LINK)).unwrap();
    let w3 = writer(r.path(), "u1", Plugin::Secret, "u");
    std::fs::create_dir_all(w3.target()).unwrap();
    symlink("..", w3.target().join(DATA_LINK)).unwrap();

    let scan = scanner(r.path()).scan().unwrap();
    let v = volume(&scan.inventory, "u1", Plugin::Secret, "s");
    assert_eq!(v.files, expected(&[("ok", b"fine")]));
    let mut errs: Vec<_> = v.errors.iter().map(|e| (e.path.as_str(), e.kind)).collect();
    errs.sort();
    assert_eq!(
        errs,
        vec![
            ("evil", ReadErrorKind::SymlinkEscape),
            ("inner", ReadErrorKind::SymlinkEscape)
        ]
    );
    assert!(
        v.digest.is_none(),
        "no digest when something could not be read"
    );
    for name in ["t", "u"] {
        let v = volume(&scan.inventory, "u1", Plugin::Secret, name);
        assert_eq!(
            kinds(&v.errors),
            vec![ReadErrorKind::SymlinkEscape],
            "{name}"
        );
        assert!(v.files.is_empty() && v.data_dir.is_none(), "{name}");
    }
    let digest = Sha256Hex(file_digest(b"host secret"));
    let json = serde_json::to_string(&*scan.inventory).unwrap();
    assert!(!json.contains(&mountguard_inventory::digest::to_hex(&digest.0)));
}

#[test]
fn fifo_is_reported_without_blocking() {
    let r = root();
    let w = writer(r.path(), "u1", Plugin::Configmap, "c");
    w.write(&payload(&[("a", b"1")])).unwrap();
    let data = w.target().join(w.current_data_dir().unwrap());
    nix::unistd::mkfifo(&data.join("pipe"), Mode::from_bits_truncate(0o644)).unwrap();
    let scan = scanner(r.path()).scan().unwrap();
    let v = volume(&scan.inventory, "u1", Plugin::Configmap, "c");
    assert_eq!(v.files, expected(&[("a", b"1")]));
    assert_eq!(v.errors.len(), 1);
    assert_eq!(
        (v.errors[0].path.as_str(), v.errors[0].kind),
        ("pipe", ReadErrorKind::NotRegularFile)
    );
}

#[test]
fn file_over_the_cap_is_too_large() {
    let r = root();
    let w = writer(r.path(), "u1", Plugin::Secret, "s");
    w.write(&payload(&[
        ("small", b"0123456789"),
        ("big", b"0123456789A"),
    ]))
    .unwrap();
    let mut opts = ScanOptions::new(r.path(), "n");
    opts.max_file_size = 10;
    let scan = Scanner::new(opts).scan().unwrap();
    let v = volume(&scan.inventory, "u1", Plugin::Secret, "s");
    assert_eq!(v.files, expected(&[("small", b"0123456789")]));
    assert_eq!(kinds(&v.errors), vec![ReadErrorKind::TooLarge]);
    assert_eq!(v.errors[0].path, "big");
    assert_eq!(scan.stats.errors[&ReadErrorKind::TooLarge], 1);
}

#[test]
fn pod_directory_removed_mid_scan_is_dropped() {
    let r = root();
    writer(r.path(), "a-gone", Plugin::Secret, "s")
        .write(&payload(&[("k", b"1")]))
        .unwrap();
    writer(r.path(), "a-gone", Plugin::Secret, "t")
        .write(&payload(&[("k", b"1")]))
        .unwrap();
    writer(r.path(), "b-stays", Plugin::Secret, "s")
        .write(&payload(&[("k", b"2")]))
        .unwrap();
    let mut s = scanner(r.path());
    let gone = pod_dir(r.path(), "a-gone");
    s.set_after_hash_hook(move |h| {
        if h.pod_uid == "a-gone" {
            let _ = std::fs::remove_dir_all(&gone);
        }
    });
    let scan = s.scan().unwrap();
    assert!(scan.inventory.pod("a-gone").is_none());
    let v = volume(&scan.inventory, "b-stays", Plugin::Secret, "s");
    assert_eq!(v.files, expected(&[("k", b"2")]));
    assert_eq!(scan.inventory.pods.len(), 1);
}

#[test]
fn non_utf8_file_name_is_escaped_and_flagged() {
    use std::os::unix::ffi::OsStrExt;
    let r = root();
    let w = writer(r.path(), "u1", Plugin::Configmap, "c");
    w.write(&payload(&[("a", b"1")])).unwrap();
    let data = w.target().join(w.current_data_dir().unwrap());
    std::fs::write(data.join(OsStr::from_bytes(b"bad\xffname")), b"odd").unwrap();
    let scan = scanner(r.path()).scan().unwrap();
    let v = volume(&scan.inventory, "u1", Plugin::Configmap, "c");
    assert_eq!(v.files, expected(&[("a", b"1"), ("bad\\xffname", b"odd")]));
    assert_eq!(kinds(&v.errors), vec![ReadErrorKind::InvalidName]);
    assert_eq!(v.errors[0].path, "bad\\xffname");
}

#[test]
fn empty_secret_volume_hints_at_mount_propagation_but_configmap_does_not() {
    let r = root();
    std::fs::create_dir_all(volume_dir(r.path(), "u1", Plugin::Secret, "s")).unwrap();
    std::fs::create_dir_all(volume_dir(r.path(), "u1", Plugin::Projected, "p")).unwrap();
    std::fs::create_dir_all(volume_dir(r.path(), "u1", Plugin::Configmap, "c")).unwrap();
    let scan = scanner(r.path()).scan().unwrap();
    for (plugin, name, want) in [
        (Plugin::Secret, "s", vec![ReadErrorKind::MountPropagation]),
        (
            Plugin::Projected,
            "p",
            vec![ReadErrorKind::MountPropagation],
        ),
        (Plugin::Configmap, "c", vec![]),
    ] {
        let v = volume(&scan.inventory, "u1", plugin, name);
        assert_eq!(kinds(&v.errors), want, "{name}");
        assert!(v.data_dir.is_none() && v.files.is_empty() && v.digest.is_none());
    }
}

#[test]
fn unusable_root_is_an_error_and_stray_entries_are_harmless() {
    let r = tempfile::tempdir().unwrap();
    let err = scanner(&r.path().join("missing")).scan().unwrap_err();
    assert!(
        err.to_string().contains("cannot open the kubelet root"),
        "{err}"
    );
    let err = scanner(r.path()).scan().unwrap_err();
    assert!(err.to_string().contains("pods directory"), "{err}");

    std::fs::create_dir(r.path().join(PODS_DIR)).unwrap();
    std::fs::write(r.path().join("pods/stray-file"), b"x").unwrap();
    let plugin_dir = pod_dir(r.path(), "u1").join("volumes/kubernetes.io~secret");
    std::fs::create_dir_all(&plugin_dir).unwrap();
    std::fs::write(plugin_dir.join("not-a-dir"), b"x").unwrap();
    std::fs::create_dir_all(pod_dir(r.path(), "u1").join("volume-subpaths/v/c/notanumber"))
        .unwrap();
    let scan = scanner(r.path()).scan().unwrap();
    assert_eq!(scan.inventory.pods.len(), 2);
    let stray = scan.inventory.pod("stray-file").unwrap();
    assert_eq!(kinds(&stray.errors), vec![ReadErrorKind::NotRegularFile]);
    let pod = scan.inventory.pod("u1").unwrap();
    assert_eq!(
        kinds(&pod.volumes[0].errors),
        vec![ReadErrorKind::NotRegularFile]
    );
    assert_eq!(kinds(&pod.errors), vec![ReadErrorKind::InvalidName]);
}

#[test]
fn symlinked_pod_entries_and_volumes_dirs_are_errors_not_followed() {
    let r = root();
    // Elsewhere on the node: a directory laid out like a pod, with a
    // readable Secret volume.
    let elsewhere = tempfile::tempdir().unwrap();
    let w = writer(elsewhere.path(), "victim", Plugin::Secret, "s");
    w.write(&payload(&[("k", b"secret")])).unwrap();
    let victim = pod_dir(elsewhere.path(), "victim");
    // pods/linked -> a pod directory elsewhere.
    symlink(&victim, r.path().join("pods/linked")).unwrap();
    // pods/u2/volumes -> the other pod's volumes directory.
    std::fs::create_dir_all(pod_dir(r.path(), "u2")).unwrap();
    symlink(
        victim.join("volumes"),
        pod_dir(r.path(), "u2").join("volumes"),
    )
    .unwrap();
    // pods/fifo: a FIFO.
    nix::unistd::mkfifo(&r.path().join("pods/fifo"), Mode::from_bits_truncate(0o600)).unwrap();
    let scan = scanner(r.path()).scan().unwrap();
    let inv = &scan.inventory;
    let linked = inv.pod("linked").unwrap();
    assert_eq!(kinds(&linked.errors), vec![ReadErrorKind::SymlinkEscape]);
    assert!(
        linked.volumes.is_empty(),
        "followed pods/linked: {linked:?}"
    );
    let u2 = inv.pod("u2").unwrap();
    assert_eq!(kinds(&u2.errors), vec![ReadErrorKind::SymlinkEscape]);
    assert_eq!(u2.errors[0].path, "volumes");
    assert!(
        u2.volumes.is_empty(),
        "followed the volumes symlink: {u2:?}"
    );
    let fifo = inv.pod("fifo").unwrap();
    assert_eq!(kinds(&fifo.errors), vec![ReadErrorKind::NotRegularFile]);
    assert_eq!(inv.pods.len(), 3);
}

#[test]
fn non_root_unreadable_file_is_a_permission_error() {
    // As root, permissions are bypassed: the integration test covers
    // this case by running the binary without privileges.
    if nix::unistd::geteuid().is_root() {
        eprintln!("skipped in-process: running as root; see agent/tests/it.rs");
        return;
    }
    let r = root();
    let w = writer(r.path(), "u1", Plugin::Secret, "s");
    w.write(&payload(&[("k", b"1")])).unwrap();
    let f = w.target().join(w.current_data_dir().unwrap()).join("k");
    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o000)).unwrap();
    let scan = scanner(r.path()).scan().unwrap();
    let v = volume(&scan.inventory, "u1", Plugin::Secret, "s");
    assert_eq!(kinds(&v.errors), vec![ReadErrorKind::Permission]);
}

#[test]
fn output_is_valid_inventory_json_and_table_shows_short_digests() {
    let r = root();
    writer(r.path(), "u1", Plugin::Secret, "s")
        .write(&payload(&[("k", b"v")]))
        .unwrap();
    let scan = scanner(r.path()).scan().unwrap();
    let json = serde_json::to_vec(&*scan.inventory).unwrap();
    assert_eq!(NodeInventory::from_json(&json).unwrap(), *scan.inventory);
    let full = mountguard_inventory::digest::to_hex(
        &volume(&scan.inventory, "u1", Plugin::Secret, "s")
            .digest
            .unwrap()
            .0,
    );
    let table = crate::output::table(&scan.inventory);
    assert!(table.contains(&full[..12]), "{table}");
    assert!(!table.contains(&full[..13]), "{table}");
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("u1") && l.contains("secret") && l.contains(" s "))
    );
}
