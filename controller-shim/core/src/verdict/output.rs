//! The output form of a verdict: [`SourceView`] and [`VerdictView`], what
//! the offline command and the status endpoint print, with its one-sentence
//! advice ([`super::advice()`]). Fingerprints only, never digests.

use std::sync::Arc;

use jiff::Timestamp;
use serde::Serialize;

use super::advice::{Container, SubjectKind};
use super::subject::{Subject, SubjectId};
use super::types::{FileVerdict, FrozenCause, PodVerdicts, State, Verdict};
use crate::fingerprint::Fingerprint;
use crate::model::PodModel;
use crate::uid::PodUid;

/// A source as shown in output.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SourceView {
    /// `Secret` or `ConfigMap`.
    pub kind: &'static str,
    /// Object name (in the pod's namespace).
    pub name: Arc<str>,
}

/// The output form of a verdict (JSON for the offline command and the
/// status endpoint): fingerprints only, never digests.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct VerdictView<'a> {
    /// State name.
    pub state: &'static str,
    /// Cause or reason.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cause: Option<&'static str>,
    /// Pod namespace.
    pub namespace: &'a str,
    /// Pod name.
    pub pod: &'a str,
    /// Pod UID (written as its text).
    pub uid: &'a PodUid,
    /// Node.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<&'a str>,
    /// Controlling NodeSet.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nodeset: Option<&'a str>,
    /// `volume`, `subPath` or `env`.
    pub subject: &'static str,
    /// Volume name (volume and subPath subjects).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub volume: Option<Arc<str>>,
    /// Container (subPath and env subjects).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub container: Option<Arc<str>>,
    /// subPath.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sub_path: Option<Arc<str>>,
    /// Environment variable, or `envFrom[:prefix]`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub env: Option<Arc<str>>,
    /// Source kind of the first source.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source_kind: Option<&'static str>,
    /// Source name of the first source.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source_name: Option<Arc<str>>,
    /// Every source involved.
    pub sources: Vec<SourceView>,
    /// Expected content fingerprint.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expected: Option<Fingerprint>,
    /// Observed content fingerprint.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub observed: Option<Fingerprint>,
    /// Paths that differ.
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    pub differing_paths: &'a [Arc<str>],
    /// Per-file verdicts.
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    pub files: &'a [FileVerdict],
    /// Pods pinning an immutable cache entry.
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    pub pinned_by: &'a [Arc<str>],
    /// Since when the state holds.
    pub since: Timestamp,
    /// Explanation.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<&'a str>,
    /// What to do, in one sentence ([`super::advice()`]); none for Fresh,
    /// Propagating and Skipped.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub advice: Option<String>,
}

impl Verdict {
    /// The output view of this verdict of `pod`.
    pub fn view<'a>(&'a self, pod: &'a PodVerdicts) -> VerdictView<'a> {
        let advice = self.advice(pod);
        let (subject, volume, container, sub_path, env) = match pod.subject(self) {
            Subject::Volume { volume } => ("volume", Some(volume), None, None, None),
            Subject::SubPath {
                container,
                volume,
                sub_path,
                ..
            } => (
                "subPath",
                Some(volume),
                Some(container),
                Some(sub_path),
                None,
            ),
            Subject::Env { container, var } => ("env", None, Some(container), None, Some(var)),
        };
        let sources = pod.sources(self);
        let first = sources.first();
        let p = &pod.pod;
        VerdictView {
            state: self.state.name(),
            cause: self.state.cause(),
            namespace: p.namespace(),
            pod: &p.name,
            uid: &p.uid,
            node: p.node_name(),
            nodeset: p.nodeset(),
            subject,
            volume,
            container,
            sub_path,
            env,
            source_kind: first.map(|r| r.kind.as_str()),
            source_name: first.map(|r| r.name.clone()),
            sources: sources
                .iter()
                .map(|r| SourceView {
                    kind: r.kind.as_str(),
                    name: r.name.clone(),
                })
                .collect(),
            expected: self.expected,
            observed: self.observed,
            differing_paths: self.differing_paths(),
            files: self.files(),
            pinned_by: self.pinned_by(),
            since: self.since.get(),
            message: self.message(),
            advice,
        }
    }

    /// What to do about this verdict of `pod`, in one sentence
    /// ([`super::advice()`]).
    pub fn advice(&self, pod: &PodVerdicts) -> Option<String> {
        let p = &pod.pod;
        fn container(c: &crate::model::ContainerModel) -> Container<'_> {
            Container {
                name: &c.name,
                finished_init: c.finished,
            }
        }
        fn by_name<'a>(p: &'a PodModel, n: &'a Arc<str>) -> Container<'a> {
            p.containers
                .iter()
                .find(|c| c.name == *n)
                .map(container)
                .unwrap_or(Container {
                    name: n,
                    finished_init: false,
                })
        }
        let containers: Vec<Container<'_>> = match (self.state, self.id) {
            (State::Frozen(FrozenCause::ReadAtStart), _) => self
                .detail
                .as_deref()
                .map(|d| d.containers.iter().map(|n| by_name(p, n)).collect())
                .unwrap_or_default(),
            (_, SubjectId::SubPath(ci, _) | SubjectId::Env(ci, _)) => p
                .containers
                .get(ci as usize)
                .map(container)
                .into_iter()
                .collect(),
            _ => Vec::new(),
        };
        let kind = SubjectKind::of(&pod.subject(self));
        let cached_env = self.detail.as_deref().is_some_and(|d| d.cached_env);
        let secret = pod
            .sources(self)
            .iter()
            .any(|r| r.kind == crate::model::SourceKind::Secret);
        super::advice::advice(
            &self.state,
            kind,
            &containers,
            self.pinned_by(),
            cached_env,
            secret,
        )
    }
}
