//! How `status` and `wait` reach a running controller: directly at
//! `--url` (the metrics port), or, as the kubectl plugin, through the API
//! server's service proxy with the user's kubeconfig (no port-forward).
//!
//! The service proxy path is
//! `/api/v1/namespaces/{ns}/services/{scheme}:{service}:{port}/proxy/{path}`
//! (kubernetes `pkg/registry/core/service/proxy.go`, `ProxyREST.Connect`,
//! which appends the path after `proxy/` to the location
//! `pkg/registry/core/service/storage/storage.go` `ResourceLocation`
//! resolves from `scheme:name:port` to one ready endpoint of the Service,
//! read from its EndpointSlices).
//! The caller needs `get` on `services/proxy` for that Service.
//!
//! The status API answers authorized readers only (`status_auth.rs`):
//! every request carries the reader's bearer token, in `Authorization`
//! when direct, in `X-Mountguard-Authorization` through the service proxy
//! (the API server removes `Authorization` once it authenticated the
//! caller, `staging/src/k8s.io/apiserver/pkg/endpoints/filters/authentication.go`
//! `WithAuthentication`, and passes the other headers on).
//!
//! Kubernetes code cited here is at v1.37.2 (`k8s.io/*` staging modules
//! at v0.37.2).

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::de::DeserializeOwned;

use crate::Error;
use crate::api::authorize::PROXY_AUTH_HEADER;
use crate::runtime::kube::{kube_client, kube_config};

/// Where the controller's metrics port is.
#[derive(Clone)]
pub enum Endpoint {
    /// `http://host:port` of the metrics port.
    Direct {
        /// The base URL.
        url: String,
        /// The reader's bearer token.
        token: Option<String>,
    },
    /// Through the API server's service proxy.
    Proxy {
        /// A client from the user's kubeconfig.
        client: kube::Client,
        /// `/api/v1/namespaces/{ns}/services/{scheme}:{svc}:{port}/proxy`.
        prefix: String,
        /// The reader's bearer token for the controller: given, or a
        /// short-lived one of the chart's status reader asked for at the
        /// first request (within its deadline), then reused.
        token: ProxyToken,
        /// The API server and kubeconfig context, for messages
        /// (`API server https://...:6443, kubeconfig context kind-a`).
        server: String,
    },
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the token.
        match self {
            Endpoint::Direct { url, .. } => write!(f, "Direct({url})"),
            Endpoint::Proxy { prefix, .. } => write!(f, "Proxy({prefix})"),
        }
    }
}

impl Endpoint {
    /// The metrics port at `url`, with the token of `--token` or
    /// `--token-file`.
    pub fn direct(
        url: String,
        token: Option<String>,
        token_file: Option<&Path>,
    ) -> Result<Self, Error> {
        Ok(Endpoint::Direct {
            url,
            token: read_token(token, token_file)?,
        })
    }
}

/// The plugin's token for the status API.
#[derive(Clone)]
pub enum ProxyToken {
    /// `--token`, `--token-file` or the kubeconfig user's.
    Given(Option<String>),
    /// A TokenRequest for this ServiceAccount (namespace, name), made once.
    Reader {
        /// Namespace and name of the ServiceAccount.
        account: (String, String),
        /// The answer, once asked (`None`: it could not be had).
        got: std::sync::Arc<tokio::sync::OnceCell<Option<String>>>,
    },
}

impl std::fmt::Debug for ProxyToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the token.
        match self {
            ProxyToken::Given(t) => {
                write!(f, "Given({})", if t.is_some() { "..." } else { "none" })
            }
            ProxyToken::Reader { account, .. } => write!(f, "Reader({}/{})", account.0, account.1),
        }
    }
}

impl ProxyToken {
    /// The token, asking for the reader's at the first call.
    async fn get(&self, client: &kube::Client) -> Option<String> {
        match self {
            ProxyToken::Given(t) => t.clone(),
            ProxyToken::Reader { account, got } => got
                .get_or_init(|| reader_token(client, &account.0, &account.1))
                .await
                .clone(),
        }
    }
}

/// The status API token of `status`, `wait` and the plugin: `--token`, else
/// the first line of `--token-file`; `None` when neither is given.
pub fn read_token(
    token: Option<String>,
    token_file: Option<&Path>,
) -> Result<Option<String>, Error> {
    if let Some(t) = token.filter(|t| !t.trim().is_empty()) {
        return Ok(Some(t.trim().to_string()));
    }
    let Some(p) = token_file else {
        return Ok(None);
    };
    let text = std::fs::read_to_string(p).map_err(|e| Error::Io {
        file: format!("token file {}", p.display()),
        source: e,
    })?;
    match text.lines().next().map(str::trim).filter(|t| !t.is_empty()) {
        Some(t) => Ok(Some(t.to_string())),
        None => Err(Error::Config(format!(
            "token file {} is empty",
            p.display()
        ))),
    }
}

/// The bearer token a kubeconfig user authenticates with, when it is a
/// plain one (`token` or `tokenFile`); `None` for client certificates and
/// exec plugins (pass `--token` then).
pub fn kubeconfig_token(config: &kube::Config) -> Option<String> {
    use secrecy::ExposeSecret;
    let a = &config.auth_info;
    if let Some(t) = &a.token {
        return Some(t.expose_secret().trim().to_string()).filter(|t| !t.is_empty());
    }
    a.token_file
        .as_ref()
        .and_then(|f| std::fs::read_to_string(f).ok())
        .map(|t| t.trim().to_string())
        .filter(|t| !t.is_empty())
}

/// The service proxy path prefix of a Service port (`scheme` `http`, a
/// port name or number).
pub fn proxy_prefix(namespace: &str, service: &str, scheme: &str, port: &str) -> String {
    format!("/api/v1/namespaces/{namespace}/services/{scheme}:{service}:{port}/proxy")
}

impl Endpoint {
    /// Where requests go, for messages.
    pub fn describe(&self) -> String {
        match self {
            Endpoint::Direct { url, .. } => url.clone(),
            Endpoint::Proxy { prefix, .. } => format!("the API server's service proxy {prefix}"),
        }
    }

    /// `GET path` (path and query, starting with `/`); the body of a 2xx
    /// answer, complete (connect, headers and body) by `limits.deadline`
    /// and at most `limits.max_bytes` long.
    pub async fn get(&self, path: &str, limits: &Limits) -> Result<Vec<u8>, Error> {
        match tokio::time::timeout_at(limits.deadline, self.get_capped(path, limits.max_bytes))
            .await
        {
            Ok(r) => r,
            Err(_) => Err(Error::Deadline {
                request: format!("GET {}", self.url(path)),
                budget: limits.budget,
                flag: limits.flag,
            }),
        }
    }

    /// Where `path` goes, for messages.
    fn url(&self, path: &str) -> String {
        match self {
            Endpoint::Direct { url, .. } => format!("{}{path}", url.trim_end_matches('/')),
            Endpoint::Proxy { prefix, server, .. } => {
                format!("{prefix}{path} (service proxy of the {server})")
            }
        }
    }

    async fn get_capped(&self, path: &str, max_bytes: u64) -> Result<Vec<u8>, Error> {
        match self {
            Endpoint::Direct { url, token } => {
                http_get(
                    &format!("{}{path}", url.trim_end_matches('/')),
                    token.as_deref(),
                    max_bytes,
                )
                .await
            }
            Endpoint::Proxy {
                client,
                prefix,
                token,
                ..
            } => {
                let uri = format!("{prefix}{path}");
                let what = self.url(path);
                let mut req = http::Request::get(&uri);
                if let Some(t) = token.get(client).await {
                    req = req.header(PROXY_AUTH_HEADER, format!("Bearer {t}"));
                }
                let req = req
                    .body(kube::client::Body::empty())
                    .map_err(|e| Error::Kube(format!("GET {uri}: {e}")))?;
                let resp = client.send(req).await.map_err(|e| {
                    Error::Kube(format!(
                        "GET {what}: {e}; is the API server reachable from here, and are \
                         --context and --kubeconfig the cluster's?"
                    ))
                })?;
                let status = resp.status();
                let body = read_capped(resp.into_body(), max_bytes, &what, |e| {
                    Error::Kube(format!("GET {what}: {e}"))
                })
                .await?;
                if !status.is_success() {
                    return Err(Error::Kube(format!(
                        "GET {what}: HTTP {status}: {}",
                        String::from_utf8_lossy(&body[..body.len().min(500)]).trim()
                    )));
                }
                Ok(body)
            }
        }
    }

    /// `GET path`, parsed as JSON.
    pub async fn get_json<T: DeserializeOwned>(
        &self,
        path: &str,
        limits: &Limits,
    ) -> Result<T, Error> {
        let body = self.get(path, limits).await?;
        serde_json::from_slice(&body).map_err(|e| Error::Json {
            file: format!("{} {path}", self.describe()),
            line: e.line(),
            column: e.column(),
            message: e.to_string(),
        })
    }
}

/// The bound on one request of `status` or `wait`: answered completely
/// (connect, headers and body) by `deadline`, in at most `max_bytes`
/// bytes. A server that accepts and never answers, trickles, or streams
/// without end fails the request (exit 2) instead of holding the command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// When the answer must be complete.
    pub deadline: tokio::time::Instant,
    /// The time the flag allowed, for messages.
    pub budget: Duration,
    /// The flag that set `budget` (`--timeout`, `--request-timeout`).
    pub flag: &'static str,
    /// Largest body accepted (`--max-response-size`).
    pub max_bytes: u64,
}

impl Limits {
    /// `budget` from now.
    pub fn from_now(budget: Duration, flag: &'static str, max_bytes: u64) -> Self {
        Self {
            deadline: tokio::time::Instant::now() + budget,
            budget,
            flag,
            max_bytes,
        }
    }

    /// The earlier of `self` and `other` (the size cap of `self`).
    pub fn min(self, other: Self) -> Self {
        if other.deadline < self.deadline {
            Self {
                max_bytes: self.max_bytes,
                ..other
            }
        } else {
            self
        }
    }
}

/// Reads `body` to its end, refusing more than `max_bytes` (the
/// Content-Length is not trusted: a chunked body has none).
async fn read_capped<B, E>(
    body: B,
    max_bytes: u64,
    what: &str,
    err: impl Fn(E) -> Error,
) -> Result<Vec<u8>, Error>
where
    B: hyper::body::Body<Data = hyper::body::Bytes, Error = E>,
{
    use http_body_util::BodyExt;
    let mut body = std::pin::pin!(body);
    let mut out = Vec::new();
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame.map_err(&err)?.into_data() else {
            continue;
        };
        if (out.len() + data.len()) as u64 > max_bytes {
            return Err(Error::TooLarge {
                request: format!("GET {what}"),
                max_bytes,
            });
        }
        out.extend_from_slice(&data);
    }
    Ok(out)
}

/// Where the kubectl plugin reaches the controller: which cluster, and
/// which Service of the controller through the API server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Proxy {
    /// kubeconfig file (default: `KUBECONFIG`, else `~/.kube/config`, else
    /// in-cluster).
    pub kubeconfig: Option<PathBuf>,
    /// kubeconfig context (default: the current context).
    pub context: Option<String>,
    /// Namespace of the mountguard release.
    pub controller_namespace: String,
    /// The controller's metrics Service (the chart's `<fullname>-controller-metrics`:
    /// `mountguard-controller-metrics` for the release `mountguard`).
    pub controller_service: String,
    /// Port of that Service (name or number).
    pub controller_port: String,
    /// The reader's token for the status API (`None`, with no
    /// `token_file`: the kubeconfig user's, when it is a plain token).
    pub token: Option<String>,
    /// File holding that token.
    pub token_file: Option<PathBuf>,
}

impl Proxy {
    /// The endpoint: a client from the kubeconfig and the proxy prefix.
    pub async fn endpoint(&self) -> Result<Endpoint, Error> {
        let config = kube_config(self.kubeconfig.as_deref(), self.context.as_deref()).await?;
        let token = read_token(self.token.clone(), self.token_file.as_deref())?
            .or_else(|| kubeconfig_token(&config));
        let context = match &self.context {
            Some(c) => c.clone(),
            None => {
                let kc = match &self.kubeconfig {
                    Some(p) => kube::config::Kubeconfig::read_from(p).ok(),
                    None => kube::config::Kubeconfig::read().ok(),
                };
                kc.and_then(|k| k.current_context)
                    .unwrap_or_else(|| "(none: in-cluster configuration)".into())
            }
        };
        let server = format!(
            "API server {}, kubeconfig context {context}",
            config.cluster_url
        );
        let client = kube_client(config)?;
        let token = match (token, status_reader_account(&self.controller_service)) {
            (None, Some(sa)) => ProxyToken::Reader {
                account: (self.controller_namespace.clone(), sa),
                got: Default::default(),
            },
            (t, _) => ProxyToken::Given(t),
        };
        Ok(Endpoint::Proxy {
            client,
            token,
            server,
            prefix: proxy_prefix(
                &self.controller_namespace,
                &self.controller_service,
                "http",
                &self.controller_port,
            ),
        })
    }
}

/// The chart's status reader ServiceAccount beside the controller's
/// metrics Service: `<release>-status-reader` for
/// `<release>-controller-metrics` (charts/mountguard/templates/_helpers.tpl
/// `mountguard.controller.metricsService`, `status-reader.yaml`).
pub fn status_reader_account(controller_service: &str) -> Option<String> {
    controller_service
        .strip_suffix("-controller-metrics")
        .filter(|p| !p.is_empty())
        .map(|p| format!("{p}-status-reader"))
}

/// A short-lived token of the chart's status reader ServiceAccount
/// `namespace/sa` (`POST .../serviceaccounts/{name}/token`, a TokenRequest
/// the user's RBAC must allow); `None` when it cannot be had: the status API
/// then answers 401 with what to do.
async fn reader_token(client: &kube::Client, namespace: &str, sa: &str) -> Option<String> {
    let path = format!("/api/v1/namespaces/{namespace}/serviceaccounts/{sa}/token");
    let body = serde_json::json!({
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {"expirationSeconds": 600},
    });
    let req = http::Request::post(&path)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(kube::client::Body::from(serde_json::to_vec(&body).ok()?))
        .ok()?;
    let resp = client.send(req).await.ok()?;
    if !resp.status().is_success() {
        return None;
    }
    // A TokenRequest answer is a few KiB: anything longer is not one.
    let body = read_capped(resp.into_body(), 64 << 10, &path, |_| {
        Error::Kube(String::new())
    })
    .await
    .ok()?;
    let out: serde_json::Value = serde_json::from_slice(&body).ok()?;
    out["status"]["token"].as_str().map(str::to_string)
}

/// One plain-HTTP `GET` (the metrics port speaks HTTP) with the reader's
/// `token`, its body at most `max_bytes` long.
async fn http_get(url: &str, token: Option<&str>, max_bytes: u64) -> Result<Vec<u8>, Error> {
    let err = |m: String| Error::Config(format!("GET {url}: {m}"));
    let uri: http::Uri = url.parse().map_err(|e| err(format!("{e}")))?;
    if uri.scheme_str() != Some("http") {
        return Err(err(
            "only http:// URLs are supported (the metrics port)".into()
        ));
    }
    let host = uri.host().ok_or_else(|| err("no host".into()))?.to_string();
    let port = uri.port_u16().unwrap_or(80);
    let unreachable = |m: String| Error::Unreachable {
        url: url.to_string(),
        message: m,
    };
    let stream = tokio::net::TcpStream::connect((host.as_str(), port))
        .await
        .map_err(|e| unreachable(e.to_string()))?;
    let (mut send, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .map_err(|e| unreachable(e.to_string()))?;
    tokio::spawn(conn);
    let mut req = http::Request::get(uri.path_and_query().map(|p| p.as_str()).unwrap_or("/"))
        .header(http::header::HOST, host);
    if let Some(t) = token {
        req = req.header(http::header::AUTHORIZATION, format!("Bearer {t}"));
    }
    let req = req
        .body(http_body_util::Empty::<hyper::body::Bytes>::new())
        .map_err(|e| err(e.to_string()))?;
    let resp = send
        .send_request(req)
        .await
        .map_err(|e| err(e.to_string()))?;
    let status = resp.status();
    let body = read_capped(resp.into_body(), max_bytes, url, |e| err(e.to_string())).await?;
    if !status.is_success() {
        return Err(refused(url, status.as_u16(), &body));
    }
    Ok(body)
}

/// The error for a status API answer that is not a success: for 401 and
/// 403, what the reader is missing and how to get it (the default
/// `--status-auth kubernetes` wants a reader's token).
fn refused(url: &str, status: u16, body: &[u8]) -> Error {
    let reader = format!(
        "{}-status-reader",
        mountguard_inventory::names::fullname(mountguard_inventory::names::RELEASE)
    );
    let ns = mountguard_inventory::names::NAMESPACE;
    let advice = match status {
        401 => format!(
            "the status API wants a reader's bearer token: pass --token-file FILE or --token \
             (for example from `kubectl -n {ns} create token {reader}`, the chart's status \
             reader), or use `kubectl mountguard status`, which reads with your kubeconfig"
        ),
        403 => "the token's user may not get verdicts.mountguard.io for what was asked: \
             bind it to the chart's ClusterRole <fullname>-reader in that namespace, or ask \
             for a namespace it may read (--namespace)"
            .to_string(),
        _ => String::from_utf8_lossy(&body[..body.len().min(500)]).into_owned(),
    };
    Error::Refused {
        url: url.to_string(),
        status,
        advice,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `status --url` without a token against the default
    /// `--status-auth kubernetes`: the 401 says what to pass, and is not
    /// called a configuration error.
    #[test]
    fn a_401_from_the_status_api_says_which_token_to_pass() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/v1/verdicts", listener.local_addr().unwrap());
        let server = std::thread::spawn(move || {
            use std::io::{Read, Write};
            let (mut s, _) = listener.accept().unwrap();
            let mut buf = [0u8; 1024];
            let _ = s.read(&mut buf).unwrap();
            s.write_all(
                b"HTTP/1.1 401 Unauthorized\r\ncontent-length: 21\r\nconnection: close\r\n\r\nbearer token required",
            )
            .unwrap();
        });
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let e = rt.block_on(http_get(&url, None, 1 << 20)).unwrap_err();
        server.join().unwrap();
        let msg = e.to_string();
        assert!(!msg.contains("invalid configuration"), "{msg}");
        assert!(msg.contains("401"), "{msg}");
        assert!(msg.contains("--token-file"), "{msg}");
        assert!(
            msg.contains("create token mountguard-status-reader"),
            "{msg}"
        );
    }

    #[test]
    fn the_status_reader_follows_the_charts_names() {
        assert_eq!(
            status_reader_account("mountguard-controller-metrics").as_deref(),
            Some("mountguard-status-reader")
        );
        assert_eq!(
            status_reader_account("prod-mountguard-controller-metrics").as_deref(),
            Some("prod-mountguard-status-reader")
        );
        assert_eq!(status_reader_account("-controller-metrics"), None);
        assert_eq!(status_reader_account("custom"), None);
    }

    #[test]
    fn a_token_comes_from_the_flag_else_the_files_first_line() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("t");
        std::fs::write(&f, "  abc \nrest\n").unwrap();
        assert_eq!(read_token(None, Some(&f)).unwrap().as_deref(), Some("abc"));
        assert_eq!(
            read_token(Some(" x ".into()), Some(&f)).unwrap().as_deref(),
            Some("x")
        );
        assert_eq!(read_token(None, None).unwrap(), None);
        std::fs::write(&f, "\n").unwrap();
        assert!(
            read_token(None, Some(&f))
                .unwrap_err()
                .to_string()
                .contains("empty")
        );
        let missing = dir.path().join("missing");
        assert!(read_token(None, Some(&missing)).is_err());
    }

    #[test]
    fn proxy_prefix_follows_the_api_server_path_form() {
        assert_eq!(
            proxy_prefix(
                "mountguard-system",
                "mountguard-controller-metrics",
                "http",
                "metrics"
            ),
            "/api/v1/namespaces/mountguard-system/services/http:mountguard-controller-metrics:metrics/proxy"
        );
    }
}
