//! How `status` and `wait` reach a running controller: directly at
//! `--url` (the metrics port), or, as the kubectl plugin, through the API
//! server's service proxy with the user's kubeconfig (no port-forward).
//!
//! The service proxy path is
//! `/api/v1/namespaces/{ns}/services/{scheme}:{service}:{port}/proxy/{path}`
//! (kubernetes `pkg/registry/core/service/proxy.go`, `ProxyREST.Connect`,
//! which appends the path after `proxy/` to the location
//! `pkg/registry/core/service/storage/storage.go` `ResourceLocation`
//! resolves from `scheme:name:port` to one ready endpoint of the Service).
//! The caller needs `get` on `services/proxy` for that Service.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::de::DeserializeOwned;

use crate::Error;

/// Where the controller's metrics port is.
#[derive(Clone)]
pub enum Endpoint {
    /// `http://host:port` of the metrics port.
    Direct(String),
    /// Through the API server's service proxy.
    Proxy {
        /// A client from the user's kubeconfig.
        client: kube::Client,
        /// `/api/v1/namespaces/{ns}/services/{scheme}:{svc}:{port}/proxy`.
        prefix: String,
        /// The API server and kubeconfig context, for messages
        /// (`API server https://...:6443, kubeconfig context kind-a`).
        server: String,
    },
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Endpoint::Direct(u) => write!(f, "Direct({u})"),
            Endpoint::Proxy { prefix, .. } => write!(f, "Proxy({prefix})"),
        }
    }
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
            Endpoint::Direct(u) => u.clone(),
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
            Endpoint::Direct(base) => format!("{}{path}", base.trim_end_matches('/')),
            Endpoint::Proxy { prefix, server, .. } => {
                format!("{prefix}{path} (service proxy of the {server})")
            }
        }
    }

    async fn get_capped(&self, path: &str, max_bytes: u64) -> Result<Vec<u8>, Error> {
        match self {
            Endpoint::Direct(base) => {
                http_get(&format!("{}{path}", base.trim_end_matches('/')), max_bytes).await
            }
            Endpoint::Proxy { client, prefix, .. } => {
                let uri = format!("{prefix}{path}");
                let what = self.url(path);
                let req = http::Request::get(&uri)
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
}

/// The Kubernetes client configuration of every command: the kubeconfig
/// file `kubeconfig` if given (its `context`, else its current one); else,
/// with a `context`, that context of the default kubeconfig; else inferred
/// (KUBECONFIG, ~/.kube/config, or in-cluster).
pub async fn kube_config(
    kubeconfig: Option<&Path>,
    context: Option<&str>,
) -> Result<kube::Config, Error> {
    let options = kube::config::KubeConfigOptions {
        context: context.map(str::to_string),
        ..Default::default()
    };
    match (kubeconfig, context) {
        (Some(p), _) => {
            let kc = kube::config::Kubeconfig::read_from(p)
                .map_err(|e| Error::Kube(format!("reading kubeconfig {}: {e}", p.display())))?;
            kube::Config::from_custom_kubeconfig(kc, &options)
                .await
                .map_err(|e| Error::Kube(format!("kubeconfig {}: {e}", p.display())))
        }
        (None, Some(_)) => kube::Config::from_kubeconfig(&options)
            .await
            .map_err(|e| Error::Kube(format!("kubeconfig: {e}"))),
        (None, None) => kube::Config::infer().await.map_err(|e| {
            Error::Kube(format!(
                "no Kubernetes configuration (KUBECONFIG, ~/.kube/config or in-cluster): {e}"
            ))
        }),
    }
}

/// A client of `config`.
pub fn kube_client(config: kube::Config) -> Result<kube::Client, Error> {
    kube::Client::try_from(config).map_err(|e| Error::Kube(format!("creating the client: {e}")))
}

impl Proxy {
    /// The endpoint: a client from the kubeconfig and the proxy prefix.
    pub async fn endpoint(&self) -> Result<Endpoint, Error> {
        let config = kube_config(self.kubeconfig.as_deref(), self.context.as_deref()).await?;
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
        Ok(Endpoint::Proxy {
            client,
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

/// One plain-HTTP `GET` (the metrics port speaks HTTP), its body at most
/// `max_bytes` long.
async fn http_get(url: &str, max_bytes: u64) -> Result<Vec<u8>, Error> {
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
    let req = http::Request::get(uri.path_and_query().map(|p| p.as_str()).unwrap_or("/"))
        .header(http::header::HOST, host)
        .body(http_body_util::Empty::<hyper::body::Bytes>::new())
        .map_err(|e| err(e.to_string()))?;
    let resp = send
        .send_request(req)
        .await
        .map_err(|e| err(e.to_string()))?;
    let status = resp.status();
    let body = read_capped(resp.into_body(), max_bytes, url, |e| err(e.to_string())).await?;
    if !status.is_success() {
        return Err(err(format!(
            "HTTP {status}: {}",
            String::from_utf8_lossy(&body[..body.len().min(500)])
        )));
    }
    Ok(body)
}

#[cfg(test)]
mod tests {
    use super::*;

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
