//! Table-driven tests of the projection rules: expected files per volume,
//! subPath and env reference.

use mountguard_inventory::volume_digest;

use crate::index::ClusterIndex;
use crate::model::{ProjectedSource, SkipReason, VolumeSource};
use crate::projection::{ExpectedSubPath, project_env, project_sub_path, project_volume};
use crate::testkit::*;

use crate::verdict::test_support::*;

/// (case, volume, sources, expected files (path, content, source index),
/// expected skipped paths, expected missing descriptions)
#[test]
fn projection_rules_table() {
    type Case<'a> = (
        &'a str,
        VolumeSource,
        Vec<(&'a str, &'a str, Vec<(&'a str, &'a [u8])>, bool)>,
        Vec<(&'a str, &'a [u8], u16)>,
        Vec<(&'a str, SkipReason)>,
        Vec<&'a str>,
    );
    let cases: Vec<Case> = vec![
        (
            "secret without items: every key is a file named after the key",
            VolumeSource::Object(obj(SECRET, "s", &[], false)),
            vec![("Secret", "s", vec![("a", b"1"), ("b.conf", b"2")], false)],
            vec![("a", b"1", 0), ("b.conf", b"2", 0)],
            vec![],
            vec![],
        ),
        (
            "items select keys and place them at nested paths",
            VolumeSource::Object(obj(SECRET, "s", &[("a", "x/y/z.key"), ("b", "top")], false)),
            vec![(
                "Secret",
                "s",
                vec![("a", b"1"), ("b", b"2"), ("c", b"3")],
                false,
            )],
            vec![("top", b"2", 0), ("x/y/z.key", b"1", 0)],
            vec![],
            vec![],
        ),
        (
            "optional missing secret gives an empty volume",
            VolumeSource::Object(obj(SECRET, "gone", &[], true)),
            vec![],
            vec![],
            vec![],
            vec![],
        ),
        (
            "non-optional missing secret: the kubelet refuses",
            VolumeSource::Object(obj(SECRET, "gone", &[], false)),
            vec![],
            vec![],
            vec![],
            vec!["Secret/ns/gone not found"],
        ),
        (
            "missing key in items, not optional: refused",
            VolumeSource::Object(obj(SECRET, "s", &[("nokey", "p")], false)),
            vec![("Secret", "s", vec![("a", b"1")], false)],
            vec![],
            vec![],
            vec!["key \"nokey\" missing in Secret/ns/s"],
        ),
        (
            "missing key in items, optional: skipped silently",
            VolumeSource::Object(obj(SECRET, "s", &[("nokey", "p"), ("a", "a")], true)),
            vec![("Secret", "s", vec![("a", b"1")], false)],
            vec![("a", b"1", 0)],
            vec![],
            vec![],
        ),
        (
            "configMap data and binaryData both become files",
            VolumeSource::Object(obj(CM, "c", &[], false)),
            vec![
                ("ConfigMap", "c", vec![("text", b"t")], false),
                (
                    "ConfigMap-binary",
                    "c",
                    vec![("blob", &[0, 159, 146, 150])],
                    false,
                ),
            ],
            vec![("blob", &[0, 159, 146, 150], 0), ("text", b"t", 0)],
            vec![],
            vec![],
        ),
        (
            "configMap items find binaryData keys",
            VolumeSource::Object(obj(CM, "c", &[("blob", "bin/blob")], false)),
            vec![
                ("ConfigMap", "c", vec![("text", b"t")], false),
                ("ConfigMap-binary", "c", vec![("blob", b"B")], false),
            ],
            vec![("bin/blob", b"B", 0)],
            vec![],
            vec![],
        ),
        (
            "projected sources overlap: the later source wins",
            VolumeSource::Projected(Box::new([
                ProjectedSource::Object(obj(SECRET, "first", &[], false)),
                ProjectedSource::Object(obj(CM, "second", &[], false)),
            ])),
            vec![
                (
                    "Secret",
                    "first",
                    vec![("shared", b"from-secret"), ("only1", b"1")],
                    false,
                ),
                ("ConfigMap", "second", vec![("shared", b"from-cm")], false),
            ],
            vec![("only1", b"1", 0), ("shared", b"from-cm", 1)],
            vec![],
            vec![],
        ),
        (
            "projected: optional missing source contributes nothing",
            VolumeSource::Projected(Box::new([
                ProjectedSource::Object(obj(SECRET, "gone", &[], true)),
                ProjectedSource::Object(obj(CM, "c", &[], false)),
            ])),
            vec![("ConfigMap", "c", vec![("k", b"v")], false)],
            vec![("k", b"v", 1)],
            vec![],
            vec![],
        ),
        (
            "projected: paths from outside the API are skipped; a later downwardAPI item overrides a key",
            VolumeSource::Projected(Box::new([
                ProjectedSource::Object(obj(SECRET, "s", &[], false)),
                not_from_api(SkipReason::ServiceAccountToken, &["token"]),
                not_from_api(SkipReason::DownwardApi, &["labels", "a"]),
                not_from_api(SkipReason::ClusterTrustBundle, &["bundle.pem"]),
                not_from_api(SkipReason::PodCertificate, &["cred.pem"]),
            ])),
            vec![("Secret", "s", vec![("a", b"1"), ("b", b"2")], false)],
            vec![("b", b"2", 0)],
            vec![
                ("a", SkipReason::DownwardApi),
                ("bundle.pem", SkipReason::ClusterTrustBundle),
                ("cred.pem", SkipReason::PodCertificate),
                ("labels", SkipReason::DownwardApi),
                ("token", SkipReason::ServiceAccountToken),
            ],
            vec![],
        ),
        (
            "kube-api-access: only ca.crt is verifiable",
            kube_api_access(),
            vec![(
                "ConfigMap",
                "kube-root-ca.crt",
                vec![("ca.crt", b"CA")],
                false,
            )],
            vec![("ca.crt", b"CA", 0)],
            vec![
                ("namespace", SkipReason::DownwardApi),
                ("token", SkipReason::ServiceAccountToken),
            ],
            vec![],
        ),
    ];
    for (name, vol, sources, files, skipped, missing) in cases {
        let mut ix = ClusterIndex::new();
        let mut cm_data: std::collections::BTreeMap<&str, (Values, Values)> = Default::default();
        for (kind, n, values, immutable) in &sources {
            match *kind {
                "Secret" => {
                    put_source(&mut ix, SECRET, "ns", n, values, *immutable, None);
                }
                "ConfigMap" => cm_data
                    .entry(n)
                    .or_default()
                    .0
                    .extend(values.iter().copied()),
                _ => cm_data
                    .entry(n)
                    .or_default()
                    .1
                    .extend(values.iter().copied()),
            }
        }
        for (n, (data, binary)) in cm_data {
            put_config_map(&mut ix, "ns", n, &data, &binary, None);
        }
        let ev = project_volume(&ns(), &vol, |r| ix.source(r));
        let got: Vec<(String, [u8; 32], u16)> = ev
            .files
            .iter()
            .map(|f| (f.path.to_string(), f.digest, f.source))
            .collect();
        let want: Vec<(String, [u8; 32], u16)> = files
            .iter()
            .map(|(p, c, s)| (p.to_string(), d(c), *s))
            .collect();
        assert_eq!(got, want, "{name}: files");
        let got_skipped: Vec<(String, SkipReason)> = ev
            .skipped
            .iter()
            .map(|(p, r)| (p.to_string(), *r))
            .collect();
        let want_skipped: Vec<(String, SkipReason)> =
            skipped.iter().map(|(p, r)| (p.to_string(), *r)).collect();
        assert_eq!(got_skipped, want_skipped, "{name}: skipped");
        let got_missing: Vec<String> = ev.missing.iter().map(ToString::to_string).collect();
        assert_eq!(got_missing, missing, "{name}: missing");
    }
}

#[test]
fn sub_path_projection_file_directory_and_skipped() {
    let mut ix = ClusterIndex::new();
    put_source(
        &mut ix,
        SECRET,
        "ns",
        "s",
        &[("a", b"1"), ("b", b"2")],
        false,
        None,
    );
    let vol = VolumeSource::Projected(Box::new([
        ProjectedSource::Object(obj(
            SECRET,
            "s",
            &[("a", "etc/a.conf"), ("b", "etc/sub/b")],
            false,
        )),
        not_from_api(SkipReason::ServiceAccountToken, &["token"]),
    ]));
    let ev = project_volume(&ns(), &vol, |r| ix.source(r));
    assert_eq!(
        project_sub_path(&ev, "etc/a.conf"),
        ExpectedSubPath::Files(vec![(a(""), d(b"1"), 0)])
    );
    assert_eq!(
        project_sub_path(&ev, "./etc/"),
        ExpectedSubPath::Files(vec![(a("a.conf"), d(b"1"), 0), (a("sub/b"), d(b"2"), 0)])
    );
    assert_eq!(
        project_sub_path(&ev, "token"),
        ExpectedSubPath::Skipped(SkipReason::ServiceAccountToken)
    );
    assert_eq!(
        project_sub_path(&ev, "nothing"),
        ExpectedSubPath::Files(vec![])
    );
}

#[test]
fn env_projection_rules() {
    let mut ix = ClusterIndex::new();
    put_config_map(
        &mut ix,
        "ns",
        "c",
        &[("K", b"v"), ("L", b"w")],
        &[("BIN", b"b")],
        None,
    );
    put_source(
        &mut ix,
        SECRET,
        "ns",
        "s",
        &[("pw", b"hunter2")],
        false,
        None,
    );
    let look = |r: &crate::model::SourceRef| ix.source(r);

    let e = project_env(&ns(), &env_key("X", SECRET, "s", "pw", false), look).unwrap();
    assert_eq!(e.digest, Some(d(b"hunter2")));
    assert_eq!(e.missing, None);

    // configMapKeyRef reads `data` only: a binaryData key is missing.
    let e = project_env(&ns(), &env_key("X", CM, "c", "BIN", false), look).unwrap();
    assert_eq!(e.digest, None);
    assert_eq!(
        e.missing.unwrap().to_string(),
        "key \"BIN\" missing in ConfigMap/ns/c"
    );
    let e = project_env(&ns(), &env_key("X", CM, "c", "BIN", true), look).unwrap();
    assert_eq!((e.digest, e.missing), (None, None));

    // envFrom: data keys with the prefix, binaryData left out.
    let e = project_env(&ns(), &env_from(CM, "c", "P_", false), look).unwrap();
    let want = volume_digest([("P_K", &d(b"v")), ("P_L", &d(b"w"))]);
    assert_eq!(e.digest, Some(want));
    let other_prefix = project_env(&ns(), &env_from(CM, "c", "", false), look).unwrap();
    assert_ne!(
        other_prefix.digest,
        Some(want),
        "the prefix is part of the variable set"
    );

    let e = project_env(&ns(), &env_from(SECRET, "gone", "", true), look).unwrap();
    assert_eq!((e.digest, e.missing), (None, None));
    let e = project_env(&ns(), &env_from(SECRET, "gone", "", false), look).unwrap();
    assert_eq!(e.missing.unwrap().to_string(), "Secret/ns/gone not found");
}
