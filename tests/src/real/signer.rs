//! A PodCertificateRequest signer for the real rig: what a cluster's
//! signer controller does for the `podCertificate` projected source, done
//! for one signer name. The kubelet (pkg/kubelet/podcertificate/
//! podcertificatemanager.go `createPodCertificateRequest`, v1.37.2) creates
//! a PodCertificateRequest carrying a stub PKCS#10 request for the key it
//! generated; the signer answers in its status with a chain whose leaf is
//! issued to that key. What the API server accepts as an issued status
//! (pkg/apis/certificates/validation/validation.go
//! `ValidatePodCertificateRequestStatusUpdate`, v1.37.2): exactly one
//! `Issued` condition with status True; `notBefore` and `notAfter` equal
//! to the leaf's and `notBefore` within 5 minutes of the server's clock; a
//! lifetime of at least one hour and at most `spec.maxExpirationSeconds`;
//! `beginRefreshAt` at least 10 minutes inside both ends. Only a user
//! allowed to `sign` for the signer name may write the status
//! (pkg/registry/certificates/podcertificaterequest/strategy.go
//! `StatusStrategy.ValidateUpdate`): the rig's admin.

use std::io;
use std::time::Duration;

use rcgen::{CertificateSigningRequestParams, DnType};
use serde_json::{Value, json};

use super::{Pki, raw};

/// The lifetime of an issued leaf (the API server wants at least one hour).
const LIFETIME: Duration = Duration::from_secs(2 * 3600);

/// A running signer; it stops when dropped.
#[derive(Debug)]
pub struct PodCertificateSigner {
    /// The signer name it answers (`spec.signerName`).
    pub signer_name: String,
    /// Its CA certificate (PEM): the issuer of every leaf.
    pub ca_pem: String,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for PodCertificateSigner {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl PodCertificateSigner {
    /// Starts answering every PodCertificateRequest for `signer_name` in
    /// the cluster, every 300 ms; a request it cannot issue is logged and
    /// tried again.
    pub fn start(client: kube::Client, signer_name: &str) -> io::Result<Self> {
        let pki = Pki::new()?;
        let ca_pem = pki.ca_pem.clone();
        let name = signer_name.to_string();
        let task = tokio::spawn(async move {
            loop {
                if let Err(e) = issue_pending(&client, &pki, &name).await {
                    eprintln!("pod certificate signer {name}: {e}");
                }
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        });
        Ok(Self {
            signer_name: signer_name.to_string(),
            ca_pem,
            task,
        })
    }
}

/// Issues every request for `signer` that has no condition yet.
async fn issue_pending(client: &kube::Client, pki: &Pki, signer: &str) -> io::Result<()> {
    let (code, list) = raw(
        client,
        "GET",
        "/apis/certificates.k8s.io/v1/podcertificaterequests",
        None,
    )
    .await?;
    if code != 200 {
        return Err(io::Error::other(format!(
            "list PodCertificateRequests: {code} {list}"
        )));
    }
    let pending = list["items"].as_array().into_iter().flatten().filter(|r| {
        r["spec"]["signerName"] == signer
            && r["status"]["conditions"]
                .as_array()
                .is_none_or(|c| c.is_empty())
    });
    for req in pending {
        let status = issued_status(pki, req)?;
        let mut updated = req.clone();
        updated["status"] = status;
        let path = format!(
            "/apis/certificates.k8s.io/v1/namespaces/{}/podcertificaterequests/{}/status",
            req["metadata"]["namespace"].as_str().unwrap_or_default(),
            req["metadata"]["name"].as_str().unwrap_or_default()
        );
        let (code, body) = raw(client, "PUT", &path, Some(&updated)).await?;
        if code != 200 {
            return Err(io::Error::other(format!("issue {path}: {code} {body}")));
        }
    }
    Ok(())
}

/// The status that issues `req`: a leaf for the key of its stub PKCS#10
/// request, valid from now (whole seconds, as the status's times are) for
/// [`LIFETIME`] or `spec.maxExpirationSeconds` if shorter, refreshed
/// halfway.
fn issued_status(pki: &Pki, req: &Value) -> io::Result<Value> {
    let stub = req["spec"]["stubPKCS10Request"]
        .as_str()
        .ok_or_else(|| io::Error::other("the request has no stubPKCS10Request"))?;
    let der = base64::Engine::decode(&base64::engine::general_purpose::STANDARD, stub)
        .map_err(io::Error::other)?;
    let mut csr = CertificateSigningRequestParams::from_der(&der.as_slice().into())
        .map_err(io::Error::other)?;
    let max = req["spec"]["maxExpirationSeconds"]
        .as_u64()
        .map_or(LIFETIME, Duration::from_secs)
        .min(LIFETIME);
    let now = jiff::Timestamp::now().as_second();
    let not_after = now + max.as_secs() as i64;
    let at = |s: i64| rcgen::date_time_ymd(1970, 1, 1) + Duration::from_secs(s as u64);
    csr.params.not_before = at(now);
    csr.params.not_after = at(not_after);
    csr.params.distinguished_name.push(
        DnType::CommonName,
        format!(
            "{}/{}",
            req["spec"]["podName"].as_str().unwrap_or_default(),
            req["spec"]["podUID"].as_str().unwrap_or_default()
        ),
    );
    let leaf = csr.signed_by(&pki.issuer).map_err(io::Error::other)?;
    let rfc = |s: i64| {
        jiff::Timestamp::from_second(s)
            .map(|t| t.to_string())
            .map_err(io::Error::other)
    };
    Ok(json!({
        "conditions": [{
            "type": "Issued",
            "status": "True",
            "reason": "Issued",
            "message": "issued by the rig's signer",
            "lastTransitionTime": rfc(now)?,
        }],
        "certificateChain": leaf.pem(),
        "notBefore": rfc(now)?,
        "notAfter": rfc(not_after)?,
        "beginRefreshAt": rfc(now + (not_after - now) / 2)?,
    }))
}
