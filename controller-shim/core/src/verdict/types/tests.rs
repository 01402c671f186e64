//! Tests of the verdict types: state tags and the output view.

use mountguard_inventory::volume_digest;

use crate::verdict::{EngineState, State};

use crate::verdict::test_support::*;

#[test]
fn verdict_output_never_contains_raw_digests() {
    let (ix, now) = single("2026-11-30T10:30:00Z", true, b"new-secret", b"old-secret");
    let eval = engine().evaluate_all(&ix, &mut EngineState::default(), now);
    let json =
        serde_json::to_string(&eval.iter().map(|(p, v)| v.view(p)).collect::<Vec<_>>()).unwrap();
    let mut state = EngineState::default();
    engine().evaluate_all(&ix, &mut state, now);
    let state_json = serde_json::to_string(&state).unwrap();
    for secret in [&b"new-secret"[..], b"old-secret"] {
        let fd = hex::encode(d(secret));
        let vd = hex::encode(volume_digest([("k", &d(secret))]));
        for text in [&json, &state_json] {
            assert!(!text.contains(&fd[..12]), "file digest prefix leaked");
            assert!(!text.contains(&vd[..12]), "volume digest prefix leaked");
            assert!(!text.contains("secret\""), "plaintext leaked");
        }
    }
    assert!(json.contains("\"state\":\"Stale\""));
    assert!(json.contains("\"cause\":\"ImmutableCache\""));
    assert!(json.contains("\"sourceKind\":\"Secret\""));
}

#[test]
fn every_state_tag_round_trips() {
    let all = State::all();
    let tags: std::collections::BTreeSet<String> = all.iter().map(State::tag).collect();
    assert_eq!(tags.len(), all.len(), "every state has its own tag");
    assert!(tags.contains("Stale/ImmutableCachePinned") && tags.contains("Skipped/subPathExpr"));
    for s in all {
        let json = serde_json::to_string(&s).unwrap();
        assert_eq!(serde_json::from_str::<State>(&json).unwrap(), s, "{json}");
    }
    assert!(serde_json::from_str::<State>("\"Stale/Bogus\"").is_err());
}

/// Every pod holds one verdict per subject (shared by the engine's history
/// and the published record): the subject id, both states and both
/// fingerprints fill 24 bytes, `since` is an 8-byte `CompactTime` and the
/// detail one pointer, so a verdict is 40 bytes (48 with a 16-byte
/// `Timestamp`). A pod's list of them is one pointer, so the pod's
/// verdicts are 16 bytes in each holder (24 with an `Arc<[Verdict]>`), its
/// history 24.
#[test]
fn a_verdict_is_40_bytes_and_a_pods_verdicts_16() {
    use crate::verdict::{PodHistory, PodVerdicts, Verdict, VerdictList};
    assert_eq!(std::mem::size_of::<Verdict>(), 40);
    assert_eq!(std::mem::size_of::<PodVerdicts>(), 16);
    assert_eq!(std::mem::size_of::<PodHistory>(), 24);
    // Reads back as the slice it was made of; clones share it.
    let (ix, now) = single("2026-11-30T10:30:00Z", true, b"new-secret", b"old-secret");
    let eval = engine().evaluate_all(&ix, &mut EngineState::default(), now);
    let all: Vec<Verdict> = eval.iter().map(|(_, v)| v.clone()).collect();
    assert!(!all.is_empty());
    let list: VerdictList = all.clone().into();
    assert_eq!(&list[..], &all[..]);
    let again: VerdictList = all.iter().cloned().collect();
    assert_eq!(list, again);
    assert!(!VerdictList::ptr_eq(&list, &again));
    assert!(VerdictList::ptr_eq(&list.clone(), &list));
    assert!(VerdictList::default().is_empty());
}
