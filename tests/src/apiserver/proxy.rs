//! The service proxy of the API server double:
//! `/api/v1/namespaces/{ns}/services/{[scheme:]name[:port]}/proxy/{path}`.
//!
//! Follows the real API server, written from its rules:
//! * the id is split into scheme, name and port as
//!   `k8s.io/apimachinery/pkg/util/net` `SplitSchemeNamePort` does
//!   (`name`, `name:port` or `scheme:name:port`, scheme empty, `http` or
//!   `https`; anything else is a 400 "invalid service request");
//! * `pkg/registry/core/service/storage/storage.go` `ResourceLocation`: a
//!   port number is mapped to the Service port's name (503 "no service
//!   port N found" otherwise); an endpoint of the Service with a port of
//!   that name gives the address (503 "no endpoints available for service"
//!   when there is none). The real server reads the Service's
//!   EndpointSlices and skips endpoints whose `ready` is false
//!   (`staging/src/k8s.io/apiserver/pkg/util/proxy/proxy.go`
//!   `RandomEndpoint`); the double reads the Endpoints object of the same
//!   name, a subset with `addresses` (its ready ones) and that port;
//! * `pkg/registry/core/service/proxy.go` `ProxyREST.Connect`: the part
//!   after `proxy` is appended to that location, the query passed on, and
//!   the backend's answer returned as it is;
//! * the request's headers go on to the backend but `Authorization`, which
//!   the API server deletes once it authenticated the caller
//!   (`staging/src/k8s.io/apiserver/pkg/endpoints/filters/authentication.go`
//!   `WithAuthentication`), and the hop-by-hop headers a reverse proxy
//!   drops (`staging/src/k8s.io/apimachinery/pkg/util/proxy/upgradeaware.go`
//!   `ServeHTTP` hands the request to `net/http/httputil.ReverseProxy`).
//!
//! The double dials plain HTTP only (the rig's metrics ports); it picks
//! the first matching address where the real server picks one at random.
//!
//! Kubernetes code cited here is at v1.37.2 (`k8s.io/*` staging modules
//! at v0.37.2).

use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use serde_json::Value;

use super::resources::{ENDPOINTS, SERVICES};
use super::{ApiError, ApiHandle};
use crate::http::{self, Body};

/// A parsed service proxy request.
#[derive(Debug, PartialEq, Eq)]
pub struct ProxyTarget {
    /// Namespace.
    pub namespace: String,
    /// `http` or `https` (empty: `http`).
    pub scheme: String,
    /// Service name.
    pub service: String,
    /// Port name or number (empty: the only port).
    pub port: String,
    /// The path after `proxy` (starting with `/`).
    pub path: String,
}

/// Splits `[scheme:]name[:port]` (`SplitSchemeNamePort`).
fn split_scheme_name_port(id: &str) -> Option<(String, String, String)> {
    let parts: Vec<&str> = id.split(':').collect();
    let (scheme, name, port) = match parts.as_slice() {
        [name] => ("", *name, ""),
        [name, port] => ("", *name, *port),
        [scheme, name, port] => (*scheme, *name, *port),
        _ => return None,
    };
    if name.is_empty() || !matches!(scheme, "" | "http" | "https") {
        return None;
    }
    Some((scheme.to_string(), name.to_string(), port.to_string()))
}

/// Parses a service proxy path; `None` when `path` is not one.
pub fn parse(path: &str) -> Option<Result<ProxyTarget, ApiError>> {
    let rest = path.strip_prefix("/api/v1/namespaces/")?;
    let (namespace, rest) = rest.split_once('/')?;
    let rest = rest.strip_prefix("services/")?;
    let (id, rest) = rest.split_once('/')?;
    let tail = match rest.strip_prefix("proxy") {
        Some(t) if t.is_empty() || t.starts_with('/') => t,
        _ => return None,
    };
    let Some((scheme, service, port)) = split_scheme_name_port(id) else {
        return Some(Err(ApiError::bad_request(format!(
            "invalid service request {id:?}"
        ))));
    };
    Some(Ok(ProxyTarget {
        namespace: namespace.to_string(),
        scheme,
        service,
        port,
        path: if tail.is_empty() {
            "/".into()
        } else {
            tail.to_string()
        },
    }))
}

fn unavailable(message: String) -> ApiError {
    ApiError {
        code: 503,
        reason: "ServiceUnavailable",
        message,
        details: None,
    }
}

/// Resolves the backend `host:port` of `t`.
pub fn resolve(h: &ApiHandle, t: &ProxyTarget) -> Result<String, ApiError> {
    let svc = h.get(&SERVICES, &t.namespace, &t.service)?;
    let ports = svc["spec"]["ports"].as_array().cloned().unwrap_or_default();
    let port_name = if let Ok(n) = t.port.parse::<i64>() {
        ports
            .iter()
            .find(|p| p["port"].as_i64() == Some(n))
            .map(|p| p["name"].as_str().unwrap_or("").to_string())
            .ok_or_else(|| {
                unavailable(format!(
                    "no service port {n} found for service {:?}",
                    t.service
                ))
            })?
    } else {
        t.port.clone()
    };
    let eps = h.get(&ENDPOINTS, &t.namespace, &t.service)?;
    let none = || {
        unavailable(format!(
            "no endpoints available for service {:?}",
            t.service
        ))
    };
    let subsets = eps["subsets"].as_array().cloned().unwrap_or_default();
    for ss in &subsets {
        let Some(addr) = ss["addresses"]
            .as_array()
            .and_then(|a| a.first())
            .and_then(|a| a["ip"].as_str())
        else {
            continue;
        };
        let port = ss["ports"].as_array().and_then(|ps| {
            ps.iter()
                .find(|p| p["name"].as_str().unwrap_or("") == port_name)
                .and_then(|p| p["port"].as_i64())
        });
        if let Some(port) = port {
            return Ok(format!("{addr}:{port}"));
        }
    }
    Err(none())
}

/// Headers the proxy does not pass on: the caller's credentials and the
/// hop-by-hop ones (`net/http/httputil` `hopHeaders`), and the framing and
/// host, which belong to the new request.
fn dropped_header(name: &hyper::header::HeaderName) -> bool {
    const HOP: [&str; 9] = [
        "connection",
        "proxy-connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    ];
    let n = name.as_str();
    name == hyper::header::AUTHORIZATION
        || name == hyper::header::HOST
        || name == hyper::header::CONTENT_LENGTH
        || HOP.contains(&n)
}

/// Answers a service proxy request.
pub async fn serve(
    h: &ApiHandle,
    t: ProxyTarget,
    req: Request<Incoming>,
) -> Result<Response<Body>, ApiError> {
    if t.scheme == "https" {
        return Err(ApiError::bad_request(
            "the API server double proxies plain HTTP only",
        ));
    }
    let backend = resolve(h, &t)?;
    let query = req
        .uri()
        .query()
        .map(|q| format!("?{q}"))
        .unwrap_or_default();
    let (parts, body) = http::read_body(req).await.map_err(ApiError::bad_request)?;
    let stream = tokio::net::TcpStream::connect(&backend)
        .await
        .map_err(|e| unavailable(format!("error trying to reach service: {e}")))?;
    let (mut send, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .map_err(|e| unavailable(format!("error trying to reach service: {e}")))?;
    tokio::spawn(conn);
    let mut out = Request::builder()
        .method(parts.method)
        .uri(format!("{}{query}", t.path))
        .header(hyper::header::HOST, backend.as_str());
    for (name, value) in &parts.headers {
        if !dropped_header(name) {
            out = out.header(name, value);
        }
    }
    let out = out
        .body(http_body_util::Full::new(body))
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    let resp = send
        .send_request(out)
        .await
        .map_err(|e| unavailable(format!("error trying to reach service: {e}")))?;
    let status = resp.status();
    let content_type = resp.headers().get(hyper::header::CONTENT_TYPE).cloned();
    let bytes = http_body_util::BodyExt::collect(resp.into_body())
        .await
        .map_err(|e| unavailable(format!("reading the service's answer: {e}")))?
        .to_bytes();
    let mut r = Response::new(http::full(bytes));
    *r.status_mut() = StatusCode::from_u16(status.as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
    if let Some(ct) = content_type {
        r.headers_mut().insert(hyper::header::CONTENT_TYPE, ct);
    }
    Ok(r)
}

/// A Service with one named port and its Endpoints pointing at `addr`
/// (tests: expose a process listening on loopback behind a Service).
pub fn expose(
    h: &ApiHandle,
    namespace: &str,
    service: &str,
    port_name: &str,
    addr: std::net::SocketAddr,
) -> Result<(), ApiError> {
    let svc: Value = serde_json::json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": service, "namespace": namespace},
        "spec": {"type": "ClusterIP", "ports": [{"name": port_name, "port": addr.port(), "targetPort": port_name}]},
    });
    let eps: Value = serde_json::json!({
        "apiVersion": "v1", "kind": "Endpoints",
        "metadata": {"name": service, "namespace": namespace},
        "subsets": [{"addresses": [{"ip": addr.ip().to_string()}], "ports": [{"name": port_name, "port": addr.port()}]}],
    });
    h.ensure_namespace(namespace)?;
    h.create(&SERVICES, namespace, svc)?;
    h.create(&ENDPOINTS, namespace, eps)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_split_like_the_api_server() {
        assert_eq!(
            split_scheme_name_port("http:svc:metrics"),
            Some(("http".into(), "svc".into(), "metrics".into()))
        );
        assert_eq!(
            split_scheme_name_port("svc:8080"),
            Some(("".into(), "svc".into(), "8080".into()))
        );
        assert_eq!(
            split_scheme_name_port("svc"),
            Some(("".into(), "svc".into(), "".into()))
        );
        assert_eq!(split_scheme_name_port("ftp:svc:1"), None);
        assert_eq!(split_scheme_name_port("a:b:c:d"), None);
        assert_eq!(split_scheme_name_port(":x"), None);
        let t = parse("/api/v1/namespaces/ms/services/http:svc:metrics/proxy/v1/verdicts")
            .unwrap()
            .unwrap();
        assert_eq!(t.namespace, "ms");
        assert_eq!(t.path, "/v1/verdicts");
        assert!(parse("/api/v1/namespaces/ms/services/svc").is_none());
        assert!(parse("/api/v1/namespaces/ms/services/svc/proxyx").is_none());
        assert!(matches!(
            parse("/api/v1/namespaces/ms/services/ftp:svc:1/proxy/"),
            Some(Err(_))
        ));
    }
}
