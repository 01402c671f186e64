//! Events on pods when a mount enters or leaves Stale, Frozen or
//! SourceMissing.
//!
//! Which Event to emit is a pure function of the tracked alarm of a subject
//! and its new state ([`decide`]):
//! * `Unknown` (before the node's first inventory after start was
//!   evaluated, or while the subject was never judged) becomes whatever the
//!   new state says **without** an Event: a restarted controller or a new
//!   leader rebuilds its baseline from the next reports without alarms;
//! * an alarm state (`Stale`, `Frozen`, `SourceMissing`) entered or changed
//!   emits `StaleMount`, `KubeletCachePinned` (Stale with a pinned cache),
//!   `FrozenMount` or `SourceMissing`;
//! * `Fresh` after an alarm emits `MountRecovered`;
//! * `Propagating`, `Unverifiable` and `Skipped` are neutral: they keep the
//!   tracked alarm (an API outage or a missing report never raises or
//!   clears anything, and Stale -> Unverifiable -> Stale is not re-sent).
//!
//! Emission is rate limited per pod and globally ([`RateLimiter`]);
//! suppressed Events count `mountguard_events_suppressed_total`.
//!
//! Kubernetes code cited here is at v1.37.2 (`k8s.io/*` staging modules
//! at v0.37.2).

use foldhash::HashMap;
use mountguard_core::PodUid;
use mountguard_core::table::{Keyed, KeyedTable};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use tokio::sync::mpsc;
use tracing::{debug, warn};

use crate::runtime::limits::TokenBucket;
use crate::runtime::metrics::Metrics;
use crate::runtime::shutdown::Shutdown;
use mountguard_core::remediation::slurm_view::SlurmFinding;
use mountguard_core::verdict::{StaleCause, State, SubjectId};

/// The reporting component of Events.
pub const REPORTING_COMPONENT: &str = "mountguard-controller";

/// Event reasons.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    /// Stale content.
    StaleMount,
    /// Stale because another pod pins the kubelet's immutable cache entry.
    KubeletCachePinned,
    /// Only a container restart helps.
    FrozenMount,
    /// The source object or key is gone.
    SourceMissing,
    /// Fresh again after one of the above.
    MountRecovered,
}

impl Reason {
    /// Every reason (docs/reference/events.md lists them).
    pub const ALL: [Reason; 5] = [
        Reason::StaleMount,
        Reason::KubeletCachePinned,
        Reason::FrozenMount,
        Reason::SourceMissing,
        Reason::MountRecovered,
    ];

    /// The Event reason string.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::StaleMount => "StaleMount",
            Reason::KubeletCachePinned => "KubeletCachePinned",
            Reason::FrozenMount => "FrozenMount",
            Reason::SourceMissing => "SourceMissing",
            Reason::MountRecovered => "MountRecovered",
        }
    }

    /// Warning for alarms, Normal for recovery.
    pub fn is_warning(self) -> bool {
        self != Reason::MountRecovered
    }
}

/// What is known about a subject's alarm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tracked {
    /// Never judged since start (or leader change).
    Unknown,
    /// Judged, no alarm.
    Clear,
    /// Judged, in alarm with this reason.
    Alarm(Reason),
}

/// The alarm reason of a state, if it is an alarm.
pub fn alarm_of(s: &State) -> Option<Reason> {
    match s {
        State::Stale(StaleCause::ImmutableCachePinned) => Some(Reason::KubeletCachePinned),
        State::Stale(_) => Some(Reason::StaleMount),
        State::Frozen(_) => Some(Reason::FrozenMount),
        State::SourceMissing => Some(Reason::SourceMissing),
        _ => None,
    }
}

/// The new tracked value and the Event to emit, if any (pure).
pub fn decide(prev: Tracked, new: &State) -> (Tracked, Option<Reason>) {
    let neutral = matches!(
        new,
        State::Propagating | State::Unverifiable(_) | State::Skipped(_)
    );
    if neutral {
        return (prev, None);
    }
    let next = match alarm_of(new) {
        Some(r) => Tracked::Alarm(r),
        None => Tracked::Clear,
    };
    let event = match (prev, next) {
        (Tracked::Unknown, _) => None,
        (Tracked::Clear, Tracked::Alarm(r)) => Some(r),
        (Tracked::Alarm(a), Tracked::Alarm(b)) if a != b => Some(b),
        (Tracked::Alarm(_), Tracked::Clear) => Some(Reason::MountRecovered),
        _ => None,
    };
    (next, event)
}

/// One pod's stored subjects.
#[derive(Debug)]
struct TrackedPod {
    uid: PodUid,
    subjects: Vec<(SubjectId, Tracked)>,
}

impl Keyed for TrackedPod {
    type Key = PodUid;

    fn key(&self) -> &PodUid {
        &self.uid
    }
}

/// Tracked alarms of every subject. A dense table: the first evaluation
/// stores every pod, and as the pods turn Fresh their entries go and the
/// memory with them (a hash map keeps its buckets until it is shrunk).
#[derive(Debug, Default)]
pub struct Tracker {
    subjects: KeyedTable<TrackedPod>,
    /// What the last Event of a subject in alarm said of its Slurm node
    /// (only NodeSet workers with a Slurm side: few entries).
    slurm_told: HashMap<(PodUid, SubjectId), SlurmFinding>,
}

impl Tracker {
    /// Below this many entries the table is never shrunk.
    const KEEP: usize = 1024;

    /// Feeds the new state of a subject; `baselined` says whether the pod's
    /// node had its first inventory evaluated before (a subject first seen
    /// on such a node starts `Clear`, else `Unknown`).
    pub fn observe(
        &mut self,
        uid: &PodUid,
        id: SubjectId,
        state: &State,
        baselined: bool,
    ) -> Option<Reason> {
        // Only Unknown and Alarm are stored: a missing entry is Clear on a
        // baselined node and Unknown elsewhere, so fresh pods cost nothing.
        let default = if baselined {
            Tracked::Clear
        } else {
            Tracked::Unknown
        };
        let prev = self
            .subjects
            .get(uid)
            .and_then(|p| p.subjects.iter().find(|(s, _)| *s == id))
            .map_or(default, |(_, t)| *t);
        let (next, ev) = decide(prev, state);
        if !matches!(next, Tracked::Alarm(_)) && !self.slurm_told.is_empty() {
            self.slurm_told.remove(&(uid.clone(), id));
        }
        if next == Tracked::Clear {
            if let Some(p) = self.subjects.get_mut(uid) {
                p.subjects.retain(|(s, _)| *s != id);
                if p.subjects.is_empty() {
                    self.subjects.remove(uid);
                    self.shrink();
                }
            }
        } else if next != prev || prev == default {
            let p = self.subjects.get_or_insert_with(uid, || TrackedPod {
                uid: uid.clone(),
                subjects: Vec::new(),
            });
            match p.subjects.iter_mut().find(|(s, _)| *s == id) {
                Some(slot) => slot.1 = next,
                None => p.subjects.push((id, next)),
            }
        }
        ev
    }

    /// The reason of the alarm subject `id` of pod `uid` is in, if any.
    pub fn alarm(&self, uid: &PodUid, id: SubjectId) -> Option<Reason> {
        match self
            .subjects
            .get(uid)?
            .subjects
            .iter()
            .find(|(s, _)| *s == id)?
        {
            (_, Tracked::Alarm(r)) => Some(*r),
            _ => None,
        }
    }

    /// What the last Event of subject `id` of pod `uid` said of its Slurm
    /// node, while it is in alarm.
    pub fn slurm_told(&self, uid: &PodUid, id: SubjectId) -> Option<SlurmFinding> {
        if self.slurm_told.is_empty() {
            return None;
        }
        self.slurm_told.get(&(uid.clone(), id)).copied()
    }

    /// Records what an Event of subject `id` of pod `uid` just said of its
    /// Slurm node (nothing, or a subject not in alarm: forgotten).
    pub fn tell_slurm(&mut self, uid: &PodUid, id: SubjectId, finding: Option<SlurmFinding>) {
        match finding {
            Some(f) if self.alarm(uid, id).is_some() => {
                self.slurm_told.insert((uid.clone(), id), f);
            }
            _ => {
                self.slurm_told.remove(&(uid.clone(), id));
            }
        }
    }

    /// Number of pods with a stored entry.
    pub fn len(&self) -> usize {
        self.subjects.len()
    }

    /// Whether nothing is stored.
    pub fn is_empty(&self) -> bool {
        self.subjects.is_empty()
    }

    /// Forgets a pod.
    pub fn forget(&mut self, uid: &PodUid) {
        if self.subjects.remove(uid).is_some() {
            self.shrink();
        }
        self.slurm_told.retain(|(u, _), _| u != uid);
    }

    /// Gives back the position table's room once it is mostly empty: it
    /// keeps its capacity when entries are removed, and the first
    /// evaluation stores an entry for every pod (`Unknown` until its node
    /// reports), so without this a cluster whose pods all turned Fresh
    /// kept positions for every pod. Shrinking when the table is under a
    /// quarter full costs amortized constant time per removal.
    fn shrink(&mut self) {
        if self.subjects.capacity() > 4 * self.subjects.len().max(Self::KEEP) {
            self.subjects.shrink_to_fit();
        }
    }

    /// Forgets everything (new leader).
    pub fn clear(&mut self) {
        self.subjects.clear();
        self.slurm_told.clear();
    }
}

/// Token buckets per pod and for the whole controller (time passed in).
#[derive(Debug)]
pub struct RateLimiter {
    per_pod: HashMap<PodUid, TokenBucket>,
    global: TokenBucket,
    /// Per pod: events per second and burst.
    pub pod_rate: (f64, u32),
    /// Global: events per second and burst.
    pub global_rate: (f64, u32),
}

impl RateLimiter {
    /// Per pod 5 Events then one per minute; globally 50 then 10 per second.
    pub fn new(now: Instant) -> Self {
        Self::with_rates(now, (1.0 / 60.0, 5), (10.0, 50))
    }

    /// With explicit rates `(per second, burst)`.
    pub fn with_rates(now: Instant, pod_rate: (f64, u32), global_rate: (f64, u32)) -> Self {
        Self {
            per_pod: HashMap::default(),
            global: TokenBucket::full(global_rate.1, now),
            pod_rate,
            global_rate,
        }
    }

    /// Whether an Event for pod `uid` may go out at `now`.
    pub fn allow(&mut self, uid: &PodUid, now: Instant) -> bool {
        let (pr, pb) = self.pod_rate;
        if self.per_pod.len() > 100_000 {
            // Forget full buckets of quiet pods.
            self.per_pod.retain(|_, b| !b.is_full(pr, pb, now));
        }
        let pod = self
            .per_pod
            .entry(uid.clone())
            .or_insert(TokenBucket::full(pb, now));
        let mut probe = *pod;
        if probe.take(pr, pb, now).is_err() {
            *pod = probe;
            return false;
        }
        let (gr, gb) = self.global_rate;
        if self.global.take(gr, gb, now).is_err() {
            return false;
        }
        *pod = probe;
        true
    }

    /// Forgets the bucket of a deleted pod (its UID never comes back):
    /// without this, every pod that ever had an Event kept one until the
    /// table passed 100 000 entries.
    pub fn forget(&mut self, uid: &PodUid) {
        self.per_pod.remove(uid);
    }

    /// Number of pods with a bucket.
    pub fn len(&self) -> usize {
        self.per_pod.len()
    }

    /// Whether no pod has a bucket.
    pub fn is_empty(&self) -> bool {
        self.per_pod.is_empty()
    }
}

/// The longest Event note sent, in bytes: under the API server's limit of
/// 1 KiB (kubernetes `pkg/apis/core/validation/events.go`,
/// `NoteLengthLimit = 1024`, checked when an `events.k8s.io/v1` Event, as
/// kube's `Recorder` writes them, is created).
pub const NOTE_MAX: usize = 1000;

/// `message` as an Event note: cut at a character boundary to at most
/// [`NOTE_MAX`] bytes, ending in `...` when cut.
pub fn event_note(message: &str) -> String {
    if message.len() <= NOTE_MAX {
        return message.to_string();
    }
    let mut cut = NOTE_MAX - 3;
    while !message.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}...", &message[..cut])
}

/// An Event to publish.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventRequest {
    /// Pod namespace.
    pub namespace: String,
    /// Pod name.
    pub pod: String,
    /// Pod UID.
    pub uid: String,
    /// Reason.
    pub reason: Reason,
    /// Human-readable note (volume, source, fingerprints, pinning pods).
    pub message: String,
}

/// Publishes Events through kube-runtime's [`Recorder`] (events.k8s.io/v1)
/// until shutdown; failures are logged and counted, never retried forever.
pub async fn run_emitter(
    client: kube::Client,
    instance: Option<String>,
    metrics: Metrics,
    mut rx: mpsc::Receiver<EventRequest>,
    mut shutdown: Shutdown,
) {
    let recorder = Recorder::new(
        client,
        Reporter {
            controller: REPORTING_COMPONENT.into(),
            instance,
        },
    );
    loop {
        let req = tokio::select! {
            _ = shutdown.wait() => return,
            r = rx.recv() => match r { Some(r) => r, None => return },
        };
        let reference = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            namespace: Some(req.namespace.clone()),
            name: Some(req.pod.clone()),
            uid: Some(req.uid.clone()),
            ..Default::default()
        };
        let note = event_note(&req.message);
        let ev = Event {
            type_: if req.reason.is_warning() {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: req.reason.as_str().into(),
            note: Some(note),
            action: "Verify".into(),
            secondary: None,
        };
        match tokio::time::timeout(Duration::from_secs(10), recorder.publish(&ev, &reference)).await
        {
            Ok(Ok(())) => {
                metrics
                    .events
                    .with_label_values(&[req.reason.as_str()])
                    .inc();
                debug!(pod = %req.pod, namespace = %req.namespace, reason = req.reason.as_str(), "event published");
            }
            Ok(Err(e)) => {
                metrics.api_error("create_event");
                warn!(pod = %req.pod, namespace = %req.namespace, reason = req.reason.as_str(), error = %e, "publishing an event failed");
            }
            Err(_) => {
                metrics.api_error("create_event");
                warn!(pod = %req.pod, reason = req.reason.as_str(), "publishing an event timed out");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// docs/reference/events.md lists every Event the controller emits,
    /// with its type, and nothing else: the verdicts' reasons in its first
    /// table, the remediation's in its second. Every variant is matched
    /// below, so a new one fails to compile until it is listed in `ALL`.
    #[test]
    fn the_events_reference_lists_every_reason_with_its_type() {
        use mountguard_core::remediation::EventReason;
        for r in Reason::ALL {
            match r {
                Reason::StaleMount
                | Reason::KubeletCachePinned
                | Reason::FrozenMount
                | Reason::SourceMissing
                | Reason::MountRecovered => {}
            }
        }
        for r in EventReason::ALL {
            match r {
                EventReason::RemediationStarted
                | EventReason::SlurmNodeDrained
                | EventReason::PodEvicted
                | EventReason::RemediationVerified
                | EventReason::RemediationSucceeded
                | EventReason::RemediationFailed
                | EventReason::RemediationDryRun
                | EventReason::KubeletCachePinned
                | EventReason::InvalidRemediationAnnotation => {}
            }
        }
        let doc = include_str!("../../../docs/reference/events.md");
        let table = |heading: &str| -> std::collections::BTreeSet<(String, String)> {
            doc.split("\n## ")
                .find(|s| s.starts_with(heading))
                .unwrap_or_else(|| panic!("no `## {heading}` section"))
                .lines()
                .filter(|l| l.starts_with("| `"))
                .map(|l| {
                    let cells: Vec<&str> = l.split(" | ").collect();
                    (
                        cells[0].trim_matches(['|', ' ', '`']).to_string(),
                        cells[1].to_string(),
                    )
                })
                .collect()
        };
        let kind = |w: bool| if w { "Warning" } else { "Normal" }.to_string();
        let verdicts: std::collections::BTreeSet<(String, String)> = Reason::ALL
            .iter()
            .map(|r| (r.as_str().to_string(), kind(r.is_warning())))
            .collect();
        assert_eq!(
            table("Verdicts"),
            verdicts,
            "docs/reference/events.md, verdicts"
        );
        let repair: std::collections::BTreeSet<(String, String)> = EventReason::ALL
            .iter()
            .map(|r| (r.as_str().to_string(), kind(r.warning())))
            .collect();
        assert_eq!(table("Repair"), repair, "docs/reference/events.md, repair");
    }

    #[test]
    fn notes_are_cut_at_a_character_boundary_under_the_limit() {
        assert_eq!(event_note("short"), "short");
        let exact = "a".repeat(NOTE_MAX);
        assert_eq!(event_note(&exact), exact);
        for filler in ["a", "\u{e9}", "\u{20ac}", "\u{1f512}"] {
            let long = filler.repeat(2 * NOTE_MAX);
            let n = event_note(&long);
            assert!(n.len() <= NOTE_MAX, "{filler}: {}", n.len());
            assert!(
                n.len() > NOTE_MAX - 3 - 4,
                "{filler}: cut no more than needed"
            );
            assert!(n.ends_with("..."));
            assert!(long.starts_with(n.trim_end_matches("...")));
        }
    }
    use mountguard_core::verdict::{FrozenCause, UnverifiableReason};

    const FRESH: State = State::Fresh;
    const STALE: State = State::Stale(StaleCause::ImmutableCache);
    const PINNED: State = State::Stale(StaleCause::ImmutableCachePinned);
    const NOINV: State = State::Unverifiable(UnverifiableReason::NoInventory);
    const API: State = State::Unverifiable(UnverifiableReason::ApiUnavailable);

    #[test]
    fn decision_table() {
        use Tracked::*;
        // Baseline: unknown never emits.
        assert_eq!(decide(Unknown, &STALE), (Alarm(Reason::StaleMount), None));
        assert_eq!(decide(Unknown, &FRESH), (Clear, None));
        assert_eq!(decide(Unknown, &NOINV), (Unknown, None));
        // Entering alarms.
        assert_eq!(
            decide(Clear, &STALE),
            (Alarm(Reason::StaleMount), Some(Reason::StaleMount))
        );
        assert_eq!(
            decide(Clear, &PINNED),
            (
                Alarm(Reason::KubeletCachePinned),
                Some(Reason::KubeletCachePinned)
            )
        );
        assert_eq!(
            decide(Clear, &State::Frozen(FrozenCause::SubPath)).1,
            Some(Reason::FrozenMount)
        );
        assert_eq!(
            decide(Clear, &State::SourceMissing).1,
            Some(Reason::SourceMissing)
        );
        // Same alarm: deduplicated.
        assert_eq!(decide(Alarm(Reason::StaleMount), &STALE).1, None);
        // Cause changes to pinned.
        assert_eq!(
            decide(Alarm(Reason::StaleMount), &PINNED).1,
            Some(Reason::KubeletCachePinned)
        );
        // Neutral states keep the alarm: no flapping through Unverifiable.
        assert_eq!(
            decide(Alarm(Reason::StaleMount), &API),
            (Alarm(Reason::StaleMount), None)
        );
        assert_eq!(
            decide(Alarm(Reason::StaleMount), &State::Propagating).1,
            None
        );
        assert_eq!(decide(Clear, &API), (Clear, None));
        // Leaving.
        assert_eq!(
            decide(Alarm(Reason::FrozenMount), &FRESH),
            (Clear, Some(Reason::MountRecovered))
        );
        assert_eq!(decide(Clear, &FRESH).1, None);
    }

    #[test]
    fn tracker_baselines_per_node_and_dedups() {
        let mut t = Tracker::default();
        let uid = PodUid::new("u");
        let v = SubjectId::Volume(0);
        // Node not baselined: the first stale verdict is the baseline.
        assert_eq!(t.observe(&uid, v, &STALE, false), None);
        assert_eq!(t.observe(&uid, v, &STALE, true), None);
        assert_eq!(
            t.observe(&uid, v, &FRESH, true),
            Some(Reason::MountRecovered)
        );
        assert_eq!(t.observe(&uid, v, &STALE, true), Some(Reason::StaleMount));
        // A new subject on a baselined node starts Clear.
        let new = PodUid::new("n");
        assert_eq!(
            t.observe(&new, v, &PINNED, true),
            Some(Reason::KubeletCachePinned)
        );
        assert_eq!(
            t.observe(&new, v, &FRESH, true),
            Some(Reason::MountRecovered)
        );
        assert_eq!(
            t.observe(&uid, v, &FRESH, true),
            Some(Reason::MountRecovered)
        );
        assert!(t.is_empty(), "clear subjects are not stored");
        assert_eq!(t.observe(&uid, v, &STALE, true), Some(Reason::StaleMount));
        t.clear();
        assert_eq!(t.observe(&uid, v, &STALE, false), None);
    }

    #[test]
    fn tracker_gives_back_its_room_once_the_pods_turn_fresh() {
        let mut t = Tracker::default();
        let v = SubjectId::Volume(0);
        let nodata = State::Unverifiable(UnverifiableReason::NoInventory);
        let uids: Vec<PodUid> = (0..100_000)
            .map(|i| PodUid::new(&format!("u{i}")))
            .collect();
        // The first evaluation: no node has reported, every pod is stored.
        for u in &uids {
            assert_eq!(t.observe(u, v, &nodata, false), None);
        }
        assert_eq!(t.len(), uids.len());
        let full = t.subjects.capacity();
        // The nodes report and every pod is Fresh; one pod is deleted.
        for u in &uids[1..] {
            assert_eq!(t.observe(u, v, &FRESH, true), None);
        }
        t.forget(&uids[0]);
        assert!(t.is_empty());
        assert!(
            t.subjects.capacity() <= 4 * Tracker::KEEP,
            "{} of {full} slots kept for no entry",
            t.subjects.capacity()
        );
        // Still tracks as before.
        assert_eq!(
            t.observe(&uids[1], v, &STALE, true),
            Some(Reason::StaleMount)
        );
    }

    #[test]
    fn rate_limit_per_pod_and_global() {
        let t0 = Instant::now();
        let mut r = RateLimiter::with_rates(t0, (1.0, 2), (100.0, 3));
        let a = PodUid::new("a");
        let b = PodUid::new("b");
        assert!(r.allow(&a, t0));
        assert!(r.allow(&a, t0));
        assert!(!r.allow(&a, t0), "pod burst of 2");
        assert!(r.allow(&b, t0));
        assert!(!r.allow(&b, t0), "global burst of 3");
        let t1 = t0 + Duration::from_secs(1);
        assert!(r.allow(&a, t1), "refilled");
    }
}
