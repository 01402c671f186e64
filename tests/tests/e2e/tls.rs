//! Reports over https: a CA generated for the test, the controller's
//! certificate signed by it, the agents trusting it through `--ca-file`.

use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;

use std::time::{Duration, Instant};

use mountguard_tests::demo::{MetricSample, scrape};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, SanType};

use crate::harness::{Options, System, wait_all_fresh};

fn write_pki(dir: &Path) -> (std::path::PathBuf, std::path::PathBuf, std::path::PathBuf) {
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(DnType::CommonName, "mountguard e2e CA");
    let ca_key = KeyPair::generate().unwrap();
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca, ca_key);
    let mut srv = CertificateParams::new(vec!["localhost".to_string()]).unwrap();
    srv.subject_alt_names
        .push(SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)));
    let srv_key = KeyPair::generate().unwrap();
    let srv_cert = srv.signed_by(&srv_key, &issuer).unwrap();
    let (ca_file, cert_file, key_file) =
        (dir.join("ca.crt"), dir.join("tls.crt"), dir.join("tls.key"));
    std::fs::write(&ca_file, ca_cert.pem()).unwrap();
    std::fs::write(&cert_file, srv_cert.pem()).unwrap();
    std::fs::write(&key_file, srv_key.serialize_pem()).unwrap();
    (ca_file, cert_file, key_file)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reports_over_https_with_a_ca_file() {
    let pki = tempfile::tempdir().unwrap();
    let sys = System::start(Options {
        tls: Some(write_pki(pki.path())),
        ..Options::default()
    })
    .await;
    wait_all_fresh(&sys).await;
    let sum = |m: &[MetricSample], name: &str, label: (&str, &str)| -> f64 {
        m.iter()
            .filter(|s| {
                s.name == name && s.labels.get(label.0).map(String::as_str) == Some(label.1)
            })
            .map(|s| s.value)
            .sum()
    };
    let requests =
        |m: &[MetricSample], result| sum(m, "mountguard_report_requests_total", ("result", result));
    let m = scrape(&sys.metrics_base()).await.unwrap();
    let accepted = requests(&m, "accepted");
    assert!(accepted >= sys.ids.len() as f64, "{accepted}");
    // Between two reports each agent's TLS connection is parked (its HTTP
    // state let go, the TLS session kept), and reports still come.
    let agents = sys.ids.len() as f64;
    let answered = |m: &[MetricSample]| requests(m, "accepted") + requests(m, "unchanged");
    let start = answered(&m);
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut parked_seen = false;
    loop {
        let m = scrape(&sys.metrics_base()).await.unwrap();
        let parked = sum(&m, "mountguard_connections_parked", ("listener", "report"));
        parked_seen |= parked >= agents;
        if parked_seen && answered(&m) >= start + 2.0 * agents {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "parked {parked} of {agents} agents' connections (seen all: {parked_seen}); answered {} since",
            answered(&m) - start
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    wait_all_fresh(&sys).await;
    // Plain HTTP to the TLS port gets no report through.
    let plain = mountguard_tests::mountguard::http_request(
        "PUT",
        &format!("{}/v1/nodes/node-0/heartbeat", sys.report_base()),
        &[],
        b"{}".to_vec(),
    )
    .await;
    assert!(
        plain.is_err() || plain.as_ref().is_ok_and(|(c, _)| *c == 400),
        "{plain:?}"
    );
    sys.shutdown().await;
}
