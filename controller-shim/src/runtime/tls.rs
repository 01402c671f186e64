//! TLS of the report API and the admission webhook: a certificate
//! resolver that reloads the PEM certificate chain and key when their files
//! change (checked on a handshake at most once per second, by modification
//! time and size), so a rotated cert-manager Secret takes effect without a
//! restart. A broken new pair is logged and the previous one kept.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use rustls::crypto::ring;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

use crate::Error;

type Stamp = Option<(SystemTime, u64)>;

#[derive(Debug)]
struct Loaded {
    key: Arc<CertifiedKey>,
    stamps: (Stamp, Stamp),
    checked: Instant,
}

/// A certificate and key loaded from files and reloaded when they change.
#[derive(Debug, Clone)]
pub struct ReloadingCert {
    cert_file: PathBuf,
    key_file: PathBuf,
    current: Arc<Mutex<Loaded>>,
}

fn stamp(p: &PathBuf) -> Stamp {
    let m = std::fs::metadata(p).ok()?;
    Some((m.modified().ok()?, m.len()))
}

fn load_pair(cert_file: &PathBuf, key_file: &PathBuf) -> Result<Arc<CertifiedKey>, Error> {
    let tls = |m: String| Error::Tls(m);
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert_file)
        .map_err(|e| tls(format!("{}: {e}", cert_file.display())))?
        .collect::<Result<_, _>>()
        .map_err(|e| tls(format!("{}: {e}", cert_file.display())))?;
    if certs.is_empty() {
        return Err(tls(format!(
            "{}: no PEM certificate found",
            cert_file.display()
        )));
    }
    let key = PrivateKeyDer::from_pem_file(key_file)
        .map_err(|e| tls(format!("{}: {e}", key_file.display())))?;
    let signer = ring::sign::any_supported_type(&key)
        .map_err(|e| tls(format!("{}: unsupported key: {e}", key_file.display())))?;
    let ck = CertifiedKey::new(certs, signer);
    ck.keys_match()
        .map_err(|e| tls(format!("certificate and key do not match: {e}")))?;
    Ok(Arc::new(ck))
}

impl ReloadingCert {
    /// Loads the pair; fails when either file is unusable.
    pub fn load(cert_file: PathBuf, key_file: PathBuf) -> Result<Self, Error> {
        let stamps = (stamp(&cert_file), stamp(&key_file));
        let key = load_pair(&cert_file, &key_file)?;
        Ok(Self {
            cert_file,
            key_file,
            current: Arc::new(Mutex::new(Loaded {
                key,
                stamps,
                checked: Instant::now(),
            })),
        })
    }

    /// The current pair, reloading it first when the files changed (checked
    /// at most once per second).
    pub fn current(&self) -> Arc<CertifiedKey> {
        let mut cur = self.current.lock().unwrap();
        if cur.checked.elapsed() >= Duration::from_secs(1) {
            cur.checked = Instant::now();
            self.reload_locked(&mut cur);
        }
        cur.key.clone()
    }

    /// Checks the files now (ignoring the once-per-second throttle).
    pub fn check_now(&self) {
        let mut cur = self.current.lock().unwrap();
        cur.checked = Instant::now();
        self.reload_locked(&mut cur);
    }

    fn reload_locked(&self, cur: &mut Loaded) {
        let stamps = (stamp(&self.cert_file), stamp(&self.key_file));
        if stamps == cur.stamps {
            return;
        }
        match load_pair(&self.cert_file, &self.key_file) {
            Ok(k) => {
                tracing::info!(cert = %self.cert_file.display(), "report API certificate reloaded");
                cur.key = k;
                cur.stamps = stamps;
            }
            Err(e) => {
                // Often a half-written rotation: keep the old pair, retry.
                tracing::warn!(error = %e, "new report API certificate unusable; keeping the previous one");
            }
        }
    }

    /// A rustls server configuration (TLS 1.2 and 1.3, ring, HTTP/1.1)
    /// using this resolver.
    pub fn server_config(&self) -> rustls::ServerConfig {
        self.config_with(rustls::server::WebPkiClientVerifier::no_client_auth())
    }

    /// [`Self::server_config`] that also requires a client certificate
    /// chaining to a CA in the PEM file `client_ca` (read once).
    pub fn server_config_verifying_clients(
        &self,
        client_ca: &std::path::Path,
    ) -> Result<rustls::ServerConfig, Error> {
        let tls = |m: String| Error::Tls(format!("{}: {m}", client_ca.display()));
        let mut roots = rustls::RootCertStore::empty();
        for c in CertificateDer::pem_file_iter(client_ca).map_err(|e| tls(e.to_string()))? {
            roots
                .add(c.map_err(|e| tls(e.to_string()))?)
                .map_err(|e| tls(e.to_string()))?;
        }
        if roots.is_empty() {
            return Err(tls("no PEM certificate found".into()));
        }
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            Arc::new(roots),
            Arc::new(ring::default_provider()),
        )
        .build()
        .map_err(|e| tls(e.to_string()))?;
        Ok(self.config_with(verifier))
    }

    fn config_with(
        &self,
        clients: Arc<dyn rustls::server::danger::ClientCertVerifier>,
    ) -> rustls::ServerConfig {
        let mut c = rustls::ServerConfig::builder_with_provider(Arc::new(ring::default_provider()))
            .with_safe_default_protocol_versions()
            .expect("ring supports the default protocol versions")
            .with_client_cert_verifier(clients)
            .with_cert_resolver(Arc::new(self.clone()));
        c.alpn_protocols = vec![b"http/1.1".to_vec()];
        c
    }
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

/// The TLS handshake of the report API and the admission webhook.
#[derive(Clone)]
pub struct Handshake(pub tokio_rustls::TlsAcceptor);

impl std::fmt::Debug for Handshake {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Handshake(TlsAcceptor)")
    }
}

impl mountguard_serve::Handshake for Handshake {
    type Io = tokio_rustls::server::TlsStream<tokio::net::TcpStream>;
    async fn handshake(&self, tcp: tokio::net::TcpStream) -> std::io::Result<Self::Io> {
        self.0.accept(tcp).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_pair(dir: &std::path::Path, name: &str) -> (PathBuf, PathBuf, Vec<u8>) {
        let ck = rcgen::generate_simple_self_signed(vec![name.to_string()]).unwrap();
        let c = dir.join("tls.crt");
        let k = dir.join("tls.key");
        std::fs::write(&c, ck.cert.pem()).unwrap();
        std::fs::write(&k, ck.signing_key.serialize_pem()).unwrap();
        (c, k, ck.cert.der().to_vec())
    }

    /// Everything `addr` sends over TLS with the client configuration `cfg`
    /// (server name `localhost`).
    async fn read_over_tls(
        addr: std::net::SocketAddr,
        cfg: rustls::ClientConfig,
    ) -> std::io::Result<Vec<u8>> {
        use tokio::io::AsyncReadExt;
        let conn = tokio_rustls::TlsConnector::from(Arc::new(cfg));
        let s = tokio::net::TcpStream::connect(addr).await.unwrap();
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        let mut t = conn.connect(name, s).await?;
        let mut buf = Vec::new();
        t.read_to_end(&mut buf).await?;
        Ok(buf)
    }

    #[test]
    fn reloads_changed_files_and_keeps_old_pair_on_garbage() {
        let dir = tempfile::tempdir().unwrap();
        let (c, k, der1) = write_pair(dir.path(), "one.test");
        let r = ReloadingCert::load(c.clone(), k.clone()).unwrap();
        assert_eq!(r.current().cert[0].as_ref(), der1.as_slice());
        // Rotate (new content; the size or mtime differs).
        std::thread::sleep(Duration::from_millis(20));
        let (_, _, der2) = write_pair(dir.path(), "two.longer-name.test");
        r.check_now();
        assert_eq!(r.current().cert[0].as_ref(), der2.as_slice());
        // A half-written rotation keeps the last good pair.
        std::fs::write(&k, b"not a key").unwrap();
        r.check_now();
        assert_eq!(r.current().cert[0].as_ref(), der2.as_slice());
        assert!(ReloadingCert::load(c, k).is_err());
    }

    #[tokio::test]
    async fn serves_tls_with_the_reloaded_certificate() {
        use tokio::io::AsyncWriteExt;
        let dir = tempfile::tempdir().unwrap();
        let (c, k, _) = write_pair(dir.path(), "localhost");
        let r = ReloadingCert::load(c, k).unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(r.server_config()));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            for _ in 0..2 {
                let (s, _) = listener.accept().await.unwrap();
                let mut t = acceptor.accept(s).await.unwrap();
                t.write_all(b"ok").await.unwrap();
                t.shutdown().await.unwrap();
            }
        });
        let connect = |der: Vec<u8>| async move {
            let mut roots = rustls::RootCertStore::empty();
            roots.add(CertificateDer::from(der)).unwrap();
            let cfg =
                rustls::ClientConfig::builder_with_provider(Arc::new(ring::default_provider()))
                    .with_safe_default_protocol_versions()
                    .unwrap()
                    .with_root_certificates(roots)
                    .with_no_client_auth();
            read_over_tls(addr, cfg).await
        };
        let first = std::fs::read(dir.path().join("tls.crt")).unwrap();
        let der1 = CertificateDer::from_pem_slice(&first).unwrap().to_vec();
        assert_eq!(connect(der1.clone()).await.unwrap(), b"ok");
        // Rotate: clients trusting only the new certificate connect.
        std::thread::sleep(Duration::from_millis(20));
        let (_, _, der2) = write_pair(dir.path(), "localhost");
        r.check_now();
        assert_eq!(connect(der2).await.unwrap(), b"ok");
        server.await.unwrap();
    }

    /// With a client CA, a client without a certificate, or with one of
    /// another CA, is refused in the handshake; one with a certificate of
    /// that CA is served.
    #[tokio::test]
    async fn a_client_ca_refuses_clients_without_its_certificate() {
        use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
        use tokio::io::AsyncWriteExt;
        let dir = tempfile::tempdir().unwrap();
        let (c, k, server_der) = write_pair(dir.path(), "localhost");
        let ca = |name: &str| {
            let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
            p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            p.distinguished_name.push(rcgen::DnType::CommonName, name);
            let key = KeyPair::generate().unwrap();
            let cert = p.self_signed(&key).unwrap();
            (cert.pem(), Issuer::new(p, key))
        };
        let (ca_pem, issuer) = ca("api-server-client-ca");
        let (_, other) = ca("someone-else");
        let client_cert = |issuer: &Issuer<'static, KeyPair>| {
            let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
            p.distinguished_name
                .push(rcgen::DnType::CommonName, "kube-apiserver");
            let key = KeyPair::generate().unwrap();
            let cert = p.signed_by(&key, issuer).unwrap();
            (
                CertificateDer::from(cert.der().to_vec()),
                PrivateKeyDer::try_from(key.serialize_der()).unwrap(),
            )
        };
        let ca_file = dir.path().join("client-ca.crt");
        std::fs::write(&ca_file, ca_pem).unwrap();
        let r = ReloadingCert::load(c, k).unwrap();
        assert!(
            r.server_config_verifying_clients(&dir.path().join("absent"))
                .is_err()
        );
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(
            r.server_config_verifying_clients(&ca_file).unwrap(),
        ));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            loop {
                let (s, _) = listener.accept().await.unwrap();
                if let Ok(mut t) = acceptor.accept(s).await {
                    t.write_all(b"ok").await.unwrap();
                    t.shutdown().await.unwrap();
                }
            }
        });
        let connect = |identity: Option<(CertificateDer<'static>, PrivateKeyDer<'static>)>| {
            let server_der = server_der.clone();
            async move {
                let mut roots = rustls::RootCertStore::empty();
                roots.add(CertificateDer::from(server_der)).unwrap();
                let b =
                    rustls::ClientConfig::builder_with_provider(Arc::new(ring::default_provider()))
                        .with_safe_default_protocol_versions()
                        .unwrap()
                        .with_root_certificates(roots);
                let cfg = match identity {
                    Some((c, k)) => b.with_client_auth_cert(vec![c], k).unwrap(),
                    None => b.with_no_client_auth(),
                };
                read_over_tls(addr, cfg).await
            }
        };
        assert!(connect(None).await.is_err(), "no client certificate");
        assert!(
            connect(Some(client_cert(&other))).await.is_err(),
            "a certificate of another CA"
        );
        assert_eq!(connect(Some(client_cert(&issuer))).await.unwrap(), b"ok");
    }
}
