//! One sentence of advice per verdict: what to do about a Stale, Frozen,
//! SourceMissing or Unverifiable subject, following the same kubelet rules
//! as the verdicts (`rules.rs`). A restart is advised only where a restart
//! refreshes; otherwise replacing the pod, or releasing the kubelet cache
//! pin. Pure: the verdict JSON (`advice`), `status`, `verify` and the
//! Events all print this sentence.
//!
//! The kubelet behaviour each sentence relies on:
//! - an immutable Secret or ConfigMap is served from the kubelet's cache
//!   entry, never refreshed, and dropped only when no registered pod on the
//!   node references it (`pkg/kubelet/util/manager/watch_based_manager.go`:
//!   `Get` stops the item's reflector for an immutable object, and
//!   `DeleteReference`, called by `UnregisterPod`, drops the item with its
//!   last reference), so
//!   a container restart gets the same bytes and a replacement pod gets
//!   fresh ones only once no other pod pins the entry;
//! - environment variables are computed when the container starts
//!   (`pkg/kubelet/kubelet_pods.go` `makeEnvironmentVariables`) and a subPath
//!   is bound when the container starts (`pkg/kubelet/kubelet_pods.go`
//!   `makeMounts`, through `PrepareSafeSubpath`), so a restart of that
//!   container refreshes both, but a finished init container never runs
//!   again in its pod;
//! - on kubelets 1.35 and newer (`KubeletEnsureSecretPulledImages`, beta
//!   and on by default: `pkg/features/kube_features.go`) a pod's image pull
//!   Secrets are read from the same cache entry
//!   (`pkg/kubelet/kubelet_pods.go` `getPullSecretsForPod` calls
//!   `secretManager.GetSecret`) and an image already on the node is
//!   accepted for the pod only when those credentials match the pull
//!   records (`pkg/kubelet/images/pullmanager/image_pull_manager.go`
//!   `MustAttemptImagePull`), so a pinned old Secret also decides which
//!   image credentials count on that node;
//! - volumes are projected per pod by the volume manager
//!   (`pkg/kubelet/volumemanager/reconciler`), not per container: a
//!   container restart does not project a stale volume again.
//!
//! Kubernetes code cited here is at v1.37.2 (`k8s.io/*` staging modules
//! at v0.37.2).

use std::sync::Arc;

use super::subject::Subject;
use super::types::{FrozenCause, StaleCause, State, UnverifiableReason};

/// What kind of reference a verdict is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SubjectKind {
    /// A volume of the pod.
    Volume,
    /// A subPath mount of a container.
    SubPath,
    /// An environment reference of a container.
    Env,
}

impl SubjectKind {
    /// The kind of `s`.
    pub fn of(s: &Subject) -> Self {
        match s {
            Subject::Volume { .. } => SubjectKind::Volume,
            Subject::SubPath { .. } => SubjectKind::SubPath,
            Subject::Env { .. } => SubjectKind::Env,
        }
    }
}

/// A container the advice names: its name, and whether it is an init
/// container that ran to completion (it never runs again in this pod, so
/// restarting it is not possible).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Container<'a> {
    /// Container name.
    pub name: &'a str,
    /// A finished init container.
    pub finished_init: bool,
}

fn names(v: &[impl AsRef<str>]) -> String {
    v.iter().map(AsRef::as_ref).collect::<Vec<_>>().join(", ")
}

/// Restart `containers` (those the subject concerns), or replace the pod
/// when one is a finished init container; `why` says why a restart helps.
fn restart(containers: &[Container<'_>], why: &str) -> String {
    let finished: Vec<&str> = containers
        .iter()
        .filter(|c| c.finished_init)
        .map(|c| c.name)
        .collect();
    if !finished.is_empty() {
        return format!(
            "Replace the pod: init container(s) {} ran once and never run again in this pod, \
             so no restart refreshes what they read.",
            finished.join(", ")
        );
    }
    let who = if containers.is_empty() {
        "the container".to_string()
    } else {
        format!(
            "container(s) {}",
            names(&containers.iter().map(|c| c.name).collect::<Vec<_>>())
        )
    };
    format!("Restart {who}: {why}.")
}

/// The advice for a verdict in `state` about a subject of `kind`:
/// `containers` are the containers it concerns (the subPath's or env's
/// container, or a ReadAtStart verdict's containers), `pinned_by` the pods
/// pinning an immutable cache entry, `cached_env` that the verdict is a
/// `Frozen/Env` whose container read an older immutable object from the
/// kubelet's cache entry its pod keeps registered (a restart reads it
/// again), `secret` that the object behind the subject is a Secret (a
/// pinned one may also be a pull Secret). `None` for Fresh, Propagating and
/// Skipped: nothing to do.
pub fn advice(
    state: &State,
    kind: SubjectKind,
    containers: &[Container<'_>],
    pinned_by: &[Arc<str>],
    cached_env: bool,
    secret: bool,
) -> Option<String> {
    use FrozenCause as F;
    use StaleCause as S;
    use UnverifiableReason as U;
    let what = match kind {
        SubjectKind::Volume => "volume",
        SubjectKind::SubPath => "subPath mount",
        SubjectKind::Env => "environment variable",
    };
    Some(match state {
        State::Fresh | State::Propagating | State::Skipped(_) => return None,
        State::Stale(S::ImmutableCache) => format!(
            "Replace the pod (delete it so its owner recreates it; a NodeSet pod: drain, evict, \
             verify, undrain): the kubelet serves this immutable object from its cache until no \
             pod on the node references it, so a container restart does not refresh the {what}."
        ),
        State::Stale(S::ImmutableCachePinned) => format!(
            "Release the pin: replace the pod(s) {} that keep the kubelet's cache entry of this \
             immutable object alive together with this pod, restart the kubelet, or recreate the \
             object under a new name; replacing this pod alone cannot help{}.",
            if pinned_by.is_empty() {
                "listed in pinnedBy".to_string()
            } else {
                names(pinned_by)
            },
            if secret {
                "; until then, on kubelets 1.35 and newer, pods on this node that pull images \
                 with this Secret are checked against the old object's credentials"
            } else {
                ""
            }
        ),
        State::Stale(S::KubeletNotSyncing) => "Look at the kubelet on this node (its connection \
             to the API server, load, log): most of its mutable mounts are stale, so replacing \
             or restarting pods does not help."
            .to_string(),
        State::Stale(S::Unknown) => format!(
            "Replace the pod so the kubelet sets the {what} up again (a container restart does \
             not refresh it), and look at the kubelet's log on the node for errors syncing it."
        ),
        State::Frozen(F::SubPath) => restart(
            containers,
            "a subPath mount is bound when the container starts and never updated, and the \
             volume behind it is current",
        ),
        State::Frozen(F::Env) if cached_env && pinned_by.is_empty() => "Replace the pod if \
             its environment must hold the current object's values (delete it so its owner \
             recreates it; a NodeSet pod: drain, evict, verify, undrain): the kubelet serves \
             this immutable object from the cache entry this pod keeps registered, so a \
             container restart reads the same older values."
            .to_string(),
        State::Frozen(F::Env) if cached_env => format!(
            "Release the pin if the environment must hold the current object's values: replace \
             this pod and the pod(s) {} that keep the kubelet's cache entry of this immutable \
             object alive, restart the kubelet, or recreate the object under a new name; a \
             container restart reads the same older values.",
            names(pinned_by)
        ),
        State::Frozen(F::Env) => restart(
            containers,
            "environment variables are set when the container starts",
        ),
        State::Frozen(F::ReadAtStart) => restart(
            containers,
            "the volume on disk is current but was refreshed after they started, and the pod \
             declares they read it only at start (mountguard.io/read-at-start)",
        ),
        State::SourceMissing => "Restore the missing object or key, or mark the reference \
             optional: the kubelet keeps what it mounted and starts no new pod that needs it."
            .to_string(),
        State::Unverifiable(U::NoInventory) => "Check that the mountguard agent runs on this \
             node and reports (mountguard_node_agent_reporting); offline, pass the node's scan \
             with --inventory."
            .to_string(),
        State::Unverifiable(U::InventoryTooOld) => "Check that the agent on this node still \
             reports (its last scan is older than --inventory-max-age); offline, scan again or \
             raise --inventory-max-age."
            .to_string(),
        State::Unverifiable(U::ReadError) => "Check the agent's read errors for this node (its \
             log and mountguard_agent_read_errors): permissions, mount propagation, or a file \
             over --max-file-size."
            .to_string(),
        State::Unverifiable(U::NotOnDisk) => format!(
            "Usually transient (the {what} is not written yet, or the pod started after the \
             scan); if it stays, look at the pod's events (FailedMount)."
        ),
        State::Unverifiable(U::ContainerNotRunning) => "Nothing to do until the container runs \
             (its start time decides); if it does not start, look at the pod's events."
            .to_string(),
        State::Unverifiable(U::ApiUnavailable) => "Check the controller's access to the API \
             server (its Secret and ConfigMap watches, in its log); the verdict returns once they \
             sync."
            .to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One table over every state and cause and every subject kind: the
    /// sentence follows the rules (a restart only where a restart
    /// refreshes; replace the pod or release the pin otherwise).
    #[test]
    fn advice() {
        use FrozenCause as F;
        use StaleCause as S;
        use UnverifiableReason as U;
        let c = [Container {
            name: "slurmd",
            finished_init: false,
        }];
        let init = [Container {
            name: "copy-key",
            finished_init: true,
        }];
        let pins: Vec<Arc<str>> = vec!["monitor-b".into(), "sshd-b".into()];
        // (state, sentence starts with, must contain, must not contain)
        type Row<'a> = (State, Option<&'a str>, &'a [&'a str], &'a [&'a str]);
        let table: &[Row<'_>] = &[
            (State::Fresh, None, &[], &[]),
            (State::Propagating, None, &[], &[]),
            (
                State::Stale(S::ImmutableCache),
                Some("Replace the pod"),
                &["container restart does not refresh"],
                &["Restart "],
            ),
            (
                State::Stale(S::ImmutableCachePinned),
                Some("Release the pin"),
                &["monitor-b, sshd-b", "replacing this pod alone cannot help"],
                &["Restart "],
            ),
            (
                State::Stale(S::KubeletNotSyncing),
                Some("Look at the kubelet"),
                &["does not help"],
                &["Replace the pod"],
            ),
            (
                State::Stale(S::Unknown),
                Some("Replace the pod"),
                &["container restart does not refresh"],
                &["Restart "],
            ),
            (
                State::Frozen(F::SubPath),
                Some("Restart container(s) slurmd"),
                &["subPath"],
                &["Replace"],
            ),
            (
                State::Frozen(F::Env),
                Some("Restart container(s) slurmd"),
                &["environment variables"],
                &["Replace"],
            ),
            (
                State::Frozen(F::ReadAtStart),
                Some("Restart container(s) slurmd"),
                &["read-at-start"],
                &["Replace"],
            ),
            (
                State::SourceMissing,
                Some("Restore the missing object or key"),
                &["optional"],
                &["Restart "],
            ),
            (
                State::Unverifiable(U::NoInventory),
                Some("Check that the mountguard agent runs"),
                &["--inventory"],
                &["Restart ", "Replace"],
            ),
            (
                State::Unverifiable(U::InventoryTooOld),
                Some("Check that the agent on this node still reports"),
                &["--inventory-max-age"],
                &["Restart ", "Replace"],
            ),
            (
                State::Unverifiable(U::ReadError),
                Some("Check the agent's read errors"),
                &["--max-file-size"],
                &["Restart ", "Replace"],
            ),
            (
                State::Unverifiable(U::NotOnDisk),
                Some("Usually transient"),
                &["FailedMount"],
                &["Restart ", "Replace"],
            ),
            (
                State::Unverifiable(U::ContainerNotRunning),
                Some("Nothing to do until the container runs"),
                &[],
                &["Restart ", "Replace"],
            ),
            (
                State::Unverifiable(U::ApiUnavailable),
                Some("Check the controller's access to the API server"),
                &[],
                &["Restart ", "Replace"],
            ),
        ];
        for s in State::all() {
            for kind in [SubjectKind::Volume, SubjectKind::SubPath, SubjectKind::Env] {
                let got = super::advice(&s, kind, &c, &pins, false, false);
                if let State::Skipped(_) = s {
                    assert_eq!(got, None, "{s:?}");
                    continue;
                }
                let (_, start, has, not) = table
                    .iter()
                    .find(|(t, ..)| *t == s)
                    .unwrap_or_else(|| panic!("{s:?} is not in the table"));
                let Some(start) = start else {
                    assert_eq!(got, None, "{s:?}");
                    continue;
                };
                let got = got.unwrap_or_else(|| panic!("{s:?} {kind:?} has no advice"));
                assert!(got.starts_with(start), "{s:?} {kind:?}: {got}");
                // One sentence.
                assert!(
                    got.ends_with('.') && !got.trim_end_matches('.').contains(". "),
                    "{s:?}: {got}"
                );
                for h in *has {
                    assert!(got.contains(h), "{s:?} {kind:?}: {h:?} in {got}");
                }
                for n in *not {
                    assert!(!got.contains(n), "{s:?} {kind:?}: not {n:?} in {got}");
                }
            }
        }
        // A finished init container cannot be restarted: replace the pod.
        for cause in [F::SubPath, F::Env, F::ReadAtStart] {
            let got = super::advice(
                &State::Frozen(cause),
                SubjectKind::Env,
                &init,
                &[],
                false,
                false,
            )
            .unwrap();
            assert!(
                got.starts_with("Replace the pod") && got.contains("copy-key"),
                "{got}"
            );
        }
        // Pins not known by name still say where they are listed.
        let got = super::advice(
            &State::Stale(S::ImmutableCachePinned),
            SubjectKind::Volume,
            &[],
            &[],
            false,
            false,
        )
        .unwrap();
        assert!(got.contains("pinnedBy"), "{got}");
        // Env read from an older immutable object the pod's own
        // registration keeps cached: a restart reads it again, so never
        // "restart" (`watch_based_manager.go`; `makeEnvironmentVariables`
        // reads through `secretManager.GetSecret`). Alone: replace the pod;
        // with other holders: release the pin, naming them.
        let frozen = State::Frozen(F::Env);
        for (pins, start, has) in [
            (
                &[][..],
                "Replace the pod if",
                &["restart reads the same older values"][..],
            ),
            (
                &pins[..],
                "Release the pin if",
                &["monitor-b, sshd-b", "restart reads the same older values"][..],
            ),
        ] {
            let got = super::advice(&frozen, SubjectKind::Env, &c, pins, true, false).unwrap();
            assert!(got.starts_with(start), "{got}");
            assert!(
                got.ends_with('.') && !got.trim_end_matches('.').contains(". "),
                "{got}"
            );
            for h in has {
                assert!(got.contains(h), "{h:?} in {got}");
            }
            assert!(!got.contains("Restart "), "{got}");
        }
        // A pinned Secret may also be a pull Secret: on 1.35+ the kubelet
        // checks images against the credentials of the cached (old) object
        // (`image_pull_manager.go` `MustAttemptImagePull`, v1.37.2). Said
        // for a Secret, in the same sentence; not for a ConfigMap.
        let pinned = State::Stale(S::ImmutableCachePinned);
        for kind in [SubjectKind::Volume, SubjectKind::SubPath, SubjectKind::Env] {
            let secret = super::advice(&pinned, kind, &c, &pins, false, true).unwrap();
            assert!(
                secret.contains("pull images with this Secret")
                    && secret.contains("1.35")
                    && secret.ends_with('.')
                    && !secret.trim_end_matches('.').contains(". "),
                "{secret}"
            );
            let config_map = super::advice(&pinned, kind, &c, &pins, false, false).unwrap();
            assert!(!config_map.contains("pull images"), "{config_map}");
        }
    }
}
