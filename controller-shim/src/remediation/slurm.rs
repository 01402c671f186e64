//! The slurmrestd `v0.0.44` client: read a node, drain it with a reason,
//! undrain it.
//!
//! * `GET /slurm/v0.0.44/node/{node_name}` and `GET /slurm/v0.0.44/nodes/`
//!   (`v0.0.44_openapi_nodes_resp`: `nodes[]` with `state` (array),
//!   `reason`, `reason_set_by_user`, `reason_changed_at`).
//! * `POST /slurm/v0.0.44/node/{node_name}` with a `v0.0.44_update_node_msg`
//!   body: `{"state":["DRAIN"],"reason":"..."}` or `{"state":["UNDRAIN"]}`.
//! * Authentication: header `X-SLURM-USER-TOKEN` from a [`TokenSource`]:
//!   a token kept in a Secret (re-read when it changes, see
//!   [`SharedSecret`]), or a short-lived HS256 JWT minted from `jwt.key`
//!   ([`JwtMinter`]; that key grants full Slurm rights to whoever holds it).
//! * http or https; https trusts the given CA, else the system roots.
//!
//! Tokens never appear in errors, logs or `Debug` output.

use std::fmt;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use base64::Engine as _;
use hmac::{Hmac, KeyInit, Mac};
use http::{Method, Request, StatusCode, Uri};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Bytes;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use jiff::Timestamp;
use serde::{Deserialize, Serialize};
use sha2::Sha256;

use mountguard_core::remediation::{SlurmNodeState, reason_is};

/// The API version spoken.
pub const API_VERSION: &str = "v0.0.44";
/// The token header.
pub const TOKEN_HEADER: &str = "X-SLURM-USER-TOKEN";
/// Largest response body read.
const MAX_BODY: usize = 16 << 20;

/// A slurmrestd error, one variant per class.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SlurmError {
    /// 401/403: the token is missing, expired, or not allowed.
    #[error(
        "slurmrestd refused the token (HTTP {status}): {message}; check the Slurm token Secret (or jwt.key) and that its user may update nodes"
    )]
    Unauthorized {
        /// HTTP status.
        status: u16,
        /// slurmrestd's error description.
        message: String,
    },
    /// slurmrestd does not know the node.
    #[error("Slurm node {node:?} not found: {message}; check the pod's hostname label")]
    NotFound {
        /// Node name.
        node: String,
        /// slurmrestd's error description.
        message: String,
    },
    /// Connection, TLS or timeout: try again later.
    #[error("cannot reach slurmrestd: {0}")]
    Transport(String),
    /// 5xx without a more specific meaning: try again later.
    #[error("slurmrestd failed (HTTP {status}): {message}")]
    Server {
        /// HTTP status.
        status: u16,
        /// slurmrestd's error description.
        message: String,
    },
    /// The request was refused (4xx other than auth, or errors in a 2xx).
    #[error("slurmrestd rejected the request (HTTP {status}): {message}")]
    Rejected {
        /// HTTP status.
        status: u16,
        /// slurmrestd's error description.
        message: String,
    },
    /// The response is not what `v0.0.44` describes.
    #[error("unexpected slurmrestd response (HTTP {status}): {message}")]
    BadResponse {
        /// HTTP status.
        status: u16,
        /// What is wrong.
        message: String,
    },
    /// slurmctld refused the state change for the node's current state
    /// (error 2180).
    #[error("Slurm refused the node state change: {message}")]
    InvalidTransition {
        /// slurmrestd's error description.
        message: String,
    },
    /// No token available yet (Secret not read, missing key).
    #[error("no Slurm token: {0}")]
    Token(String),
    /// Bad URL, CA file or node name.
    #[error("slurmrestd client configuration: {0}")]
    Config(String),
}

impl SlurmError {
    /// Whether retrying later may succeed.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            SlurmError::Transport(_)
                | SlurmError::Server { .. }
                | SlurmError::BadResponse { .. }
                | SlurmError::Token(_)
        )
    }
}

/// Where the token comes from. Called before every request.
pub trait TokenSource: Send + Sync + fmt::Debug {
    /// The token to send now.
    fn token(&self, now: Timestamp) -> Result<String, SlurmError>;
}

/// A secret value updated from outside (a Secret watch or re-read), shared
/// with the token sources. `Debug` never shows it.
#[derive(Clone, Default)]
pub struct SharedSecret(Arc<RwLock<Option<Vec<u8>>>>);

impl fmt::Debug for SharedSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let set = self.0.read().map(|v| v.is_some()).unwrap_or(false);
        write!(f, "SharedSecret({})", if set { "set" } else { "unset" })
    }
}

impl SharedSecret {
    /// Replaces the value (None: the Secret or key is gone).
    pub fn set(&self, value: Option<Vec<u8>>) {
        let mut g = self.0.write().unwrap_or_else(|e| e.into_inner());
        *g = value;
    }

    /// Whether a value is held.
    pub fn is_set(&self) -> bool {
        self.0.read().map(|v| v.is_some()).unwrap_or(false)
    }

    fn get(&self) -> Option<Vec<u8>> {
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// A token kept in a Secret (e.g. Slinky's `Token` resource, key
/// `SLURM_JWT`), sent as is.
#[derive(Debug, Clone, Default)]
pub struct SecretToken {
    /// The Secret's value, kept current by the caller.
    pub value: SharedSecret,
}

impl TokenSource for SecretToken {
    fn token(&self, _now: Timestamp) -> Result<String, SlurmError> {
        let v = self
            .value
            .get()
            .ok_or_else(|| SlurmError::Token("the token Secret has not been read yet".into()))?;
        let s =
            String::from_utf8(v).map_err(|_| SlurmError::Token("the token is not UTF-8".into()))?;
        let s = s.trim();
        if s.is_empty() {
            return Err(SlurmError::Token("the token is empty".into()));
        }
        Ok(s.to_string())
    }
}

/// Mints short-lived HS256 tokens from `jwt.key` (claims `sun`, `iat`,
/// `exp`), like `scontrol token`. Whoever holds `jwt.key` can act as any
/// Slurm user.
#[derive(Debug, Clone)]
pub struct JwtMinter {
    /// `jwt.key`, kept current by the caller.
    pub key: SharedSecret,
    /// Slurm user (`sun`).
    pub user: String,
    /// Token lifetime.
    pub ttl: Duration,
}

impl TokenSource for JwtMinter {
    fn token(&self, now: Timestamp) -> Result<String, SlurmError> {
        let key = self
            .key
            .get()
            .ok_or_else(|| SlurmError::Token("the jwt.key Secret has not been read yet".into()))?;
        if key.is_empty() {
            return Err(SlurmError::Token("jwt.key is empty".into()));
        }
        Ok(mint_hs256(&key, &self.user, now.as_second(), self.ttl))
    }
}

/// An HS256 JWT with claims `sun`, `iat`, `exp`.
pub fn mint_hs256(key: &[u8], user: &str, iat: i64, ttl: Duration) -> String {
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let head = b64.encode(br#"{"alg":"HS256","typ":"JWT"}"#);
    let claims = serde_json::json!({
        "sun": user,
        "iat": iat,
        "exp": iat.saturating_add(ttl.as_secs() as i64),
    });
    let body = b64.encode(claims.to_string());
    let signing = format!("{head}.{body}");
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(key).expect("HMAC takes any key");
    mac.update(signing.as_bytes());
    let sig = b64.encode(mac.finalize().into_bytes());
    format!("{signing}.{sig}")
}

/// A node as slurmrestd reports it (the fields remediation uses).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct SlurmNode {
    /// `name`.
    pub name: String,
    /// `state`: base state and flags.
    #[serde(default)]
    pub state: Vec<String>,
    /// `reason`.
    #[serde(default)]
    pub reason: String,
    /// `reason_set_by_user`.
    #[serde(default)]
    pub reason_set_by_user: String,
    /// `reason_changed_at` (UNIX seconds), when set.
    #[serde(default, deserialize_with = "no_val")]
    pub reason_changed_at: Option<i64>,
    /// `alloc_cpus`.
    #[serde(default)]
    pub alloc_cpus: u32,
    /// `slurmd_start_time` (UNIX seconds), when set: moves only when a
    /// registration of the node's slurmd authenticates.
    #[serde(default, deserialize_with = "no_val")]
    pub slurmd_start_time: Option<i64>,
}

impl SlurmNode {
    /// The state the machine looks at.
    pub fn to_state(&self) -> SlurmNodeState {
        SlurmNodeState {
            state: self.state.clone(),
            reason: self.reason.clone(),
            reason_set_by_user: self.reason_set_by_user.clone(),
            alloc_cpus: self.alloc_cpus,
            slurmd_start_time: self.slurmd_start_time,
        }
    }
}

#[derive(Deserialize)]
struct NoVal {
    #[serde(default)]
    set: bool,
    #[serde(default)]
    infinite: bool,
    #[serde(default)]
    number: i64,
}

fn no_val<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<i64>, D::Error> {
    let v: Option<NoVal> = Option::deserialize(d)?;
    Ok(v.and_then(|v| (v.set && !v.infinite).then_some(v.number)))
}

#[derive(Deserialize, Default)]
struct ApiError {
    #[serde(default)]
    description: String,
    #[serde(default)]
    error_number: i64,
    #[serde(default)]
    error: String,
}

#[derive(Deserialize)]
struct Envelope {
    #[serde(default)]
    nodes: Option<Vec<SlurmNode>>,
    #[serde(default)]
    errors: Vec<ApiError>,
}

/// `v0.0.44_update_node_msg`, the fields used.
#[derive(Debug, Serialize)]
struct UpdateNodeMsg<'a> {
    state: [&'a str; 1],
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<&'a str>,
}

// Slurm error numbers (`slurm/slurm_errno.h`, Slurm 26.05) that change
// what an answer means.
/// "Invalid node name specified": a write (or, on older releases, a read)
/// for a node slurmctld does not know.
const ESLURM_INVALID_NODE_NAME: i64 = 2018;
/// "User ID missing from credential": `_slurm_rpc_update_node`
/// (`src/slurmctld/proc_req.c`) answers it to a user who is not a Slurm
/// administrator (`validate_super_user`); slurmrestd sends it as HTTP 422.
const ESLURM_USER_ID_MISSING: i64 = 2010;
/// "Invalid node state transition requested": `update_node`
/// (`src/slurmctld/node_mgr.c`, `_valid_node_state_change`), e.g. a RESUME
/// of a node that is neither DOWN, DRAIN nor FAIL; HTTP 422.
const ESLURM_INVALID_NODE_STATE_TRANSITION: i64 = 2180;

/// The slurmrestd client.
#[derive(Clone)]
pub struct SlurmClient {
    base: Uri,
    client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
    token: Arc<dyn TokenSource>,
    timeout: Duration,
}

impl fmt::Debug for SlurmClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SlurmClient")
            .field("base", &self.base)
            .field("token", &self.token)
            .finish()
    }
}

impl SlurmClient {
    /// A client for `url` (`http://` or `https://`, optionally with a path
    /// prefix). `ca_pem` is the CA bundle to trust for https (None: the
    /// system roots).
    pub fn new(
        url: &str,
        ca_pem: Option<&[u8]>,
        token: Arc<dyn TokenSource>,
        timeout: Duration,
    ) -> Result<Self, SlurmError> {
        let base: Uri = url
            .parse()
            .map_err(|e| SlurmError::Config(format!("--slurmrestd-url {url:?}: {e}")))?;
        match base.scheme_str() {
            Some("http" | "https") => {}
            _ => {
                return Err(SlurmError::Config(format!(
                    "--slurmrestd-url {url:?}: the scheme must be http or https"
                )));
            }
        }
        if base.authority().is_none() {
            return Err(SlurmError::Config(format!(
                "--slurmrestd-url {url:?}: no host"
            )));
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = hyper_rustls::HttpsConnectorBuilder::new();
        let builder = match ca_pem {
            Some(pem) => {
                use rustls::pki_types::CertificateDer;
                use rustls::pki_types::pem::PemObject as _;
                let bad = |m: String| {
                    SlurmError::Config(format!(
                        "--slurmrestd-ca-file: {m}; give a PEM file with the CA certificate"
                    ))
                };
                let certs = CertificateDer::pem_slice_iter(pem)
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| bad(e.to_string()))?;
                let mut roots = rustls::RootCertStore::empty();
                let (added, _) = roots.add_parsable_certificates(certs);
                if added == 0 {
                    return Err(bad("no usable certificate".into()));
                }
                let tls = rustls::ClientConfig::builder_with_provider(provider)
                    .with_safe_default_protocol_versions()
                    .map_err(|e| SlurmError::Config(format!("TLS setup: {e}")))?
                    .with_root_certificates(roots)
                    .with_no_client_auth();
                builder.with_tls_config(tls)
            }
            // Plain http needs no roots.
            None if base.scheme_str() == Some("http") => builder.with_tls_config(
                rustls::ClientConfig::builder_with_provider(provider)
                    .with_safe_default_protocol_versions()
                    .map_err(|e| SlurmError::Config(format!("TLS setup: {e}")))?
                    .with_root_certificates(rustls::RootCertStore::empty())
                    .with_no_client_auth(),
            ),
            None => builder
                .with_provider_and_native_roots(provider)
                .map_err(|e| {
                    SlurmError::Config(format!(
                        "--slurmrestd-url {url:?} is https and no --slurmrestd-ca-file is given, \
                     but the system CA roots cannot be loaded ({e}; the controller's image \
                     carries them at /etc/ssl/certs/ca-certificates.crt): give the CA that \
                     signs slurmrestd's certificate (--slurmrestd-ca-file, chart value \
                     remediation.slurmrestd.caSecret)"
                    ))
                })?,
        };
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_connect_timeout(Some(timeout));
        http.set_nodelay(true);
        let connector = builder.https_or_http().enable_http1().wrap_connector(http);
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(60))
            .build(connector);
        Ok(Self {
            base,
            client,
            token,
            timeout,
        })
    }

    fn uri(&self, rest: &str) -> Result<Uri, SlurmError> {
        let prefix = self.base.path().trim_end_matches('/');
        let path = format!("{prefix}/slurm/{API_VERSION}/{rest}");
        Uri::builder()
            .scheme(self.base.scheme_str().unwrap_or("http"))
            .authority(self.base.authority().map_or("", |a| a.as_str()))
            .path_and_query(path)
            .build()
            .map_err(|e| SlurmError::Config(format!("URL: {e}")))
    }

    fn node_path(name: &str) -> Result<String, SlurmError> {
        let ok = !name.is_empty()
            && name.len() <= 253
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
        if !ok {
            return Err(SlurmError::Config(format!(
                "{name:?} is not a valid Slurm node name"
            )));
        }
        Ok(format!("node/{name}"))
    }

    async fn call(
        &self,
        method: Method,
        rest: &str,
        body: Option<Vec<u8>>,
    ) -> Result<(StatusCode, Envelope), SlurmError> {
        let uri = self.uri(rest)?;
        let token = self.token.token(Timestamp::now())?;
        let mut req = Request::builder()
            .method(method)
            .uri(uri)
            .header(http::header::ACCEPT, "application/json")
            .header(TOKEN_HEADER, token);
        if body.is_some() {
            req = req.header(http::header::CONTENT_TYPE, "application/json");
        }
        let req = req
            .body(Full::new(Bytes::from(body.unwrap_or_default())))
            .map_err(|e| SlurmError::Config(format!("request: {e}")))?;
        let fut = async {
            let resp = self
                .client
                .request(req)
                .await
                .map_err(|e| SlurmError::Transport(error_chain(&e)))?;
            let status = resp.status();
            let bytes = Limited::new(resp.into_body(), MAX_BODY)
                .collect()
                .await
                .map_err(|e| SlurmError::Transport(format!("reading the response: {e}")))?
                .to_bytes();
            Ok::<_, SlurmError>((status, bytes))
        };
        let (status, bytes) = tokio::time::timeout(self.timeout, fut)
            .await
            .map_err(|_| SlurmError::Transport(format!("no answer within {:?}", self.timeout)))??;
        let env: Result<Envelope, _> = serde_json::from_slice(&bytes);
        let describe = |errors: &[ApiError]| -> String {
            let parts: Vec<String> = errors
                .iter()
                .map(|e| {
                    let d = if e.description.is_empty() {
                        &e.error
                    } else {
                        &e.description
                    };
                    format!("{d} (error {})", e.error_number)
                })
                .collect();
            if parts.is_empty() {
                status.canonical_reason().unwrap_or("error").to_string()
            } else {
                parts.join("; ")
            }
        };
        let code = status.as_u16();
        let numbers: Vec<i64> = env.as_ref().map_or_else(
            |_| Vec::new(),
            |e| e.errors.iter().map(|x| x.error_number).collect(),
        );
        let has = |number: i64| numbers.contains(&number);
        let detail = env.as_ref().map_or_else(
            |_| status.canonical_reason().unwrap_or("").to_string(),
            |e| describe(&e.errors),
        );
        // 401 (no token: a text/plain body), 403, and 511 (a token whose
        // signature or expiry slurmrestd refused: error 1007,
        // `SLURM_PROTOCOL_AUTHENTICATION_ERROR`, which `src/common/http.c`
        // maps to `HTTP_STATUS_CODE_SRVERR_NETWORK_AUTH_REQ`): the token,
        // not the server, is wrong, and retrying will not change it.
        if status == StatusCode::UNAUTHORIZED
            || status == StatusCode::FORBIDDEN
            || status == StatusCode::NETWORK_AUTHENTICATION_REQUIRED
        {
            let message = if status == StatusCode::NETWORK_AUTHENTICATION_REQUIRED {
                format!(
                    "{detail}: slurmrestd could not verify the token's signature or it has expired; the token (or jwt.key) must be signed with the key slurmctld loads (AuthAltParameters jwt_key)"
                )
            } else {
                detail
            };
            return Err(SlurmError::Unauthorized {
                status: code,
                message,
            });
        }
        // A user slurmctld does not count as an administrator may read, but
        // its writes are refused.
        if has(ESLURM_USER_ID_MISSING) {
            return Err(SlurmError::Unauthorized {
                status: code,
                message: format!(
                    "{detail}: the token's user is not a Slurm administrator; use a token of SlurmUser or of a user with AdminLevel=Admin"
                ),
            });
        }
        let env = match env {
            Ok(e) => e,
            Err(e) if status.is_server_error() => {
                return Err(SlurmError::Server {
                    status: code,
                    message: format!("non-JSON body ({e})"),
                });
            }
            Err(e) => {
                return Err(SlurmError::BadResponse {
                    status: code,
                    message: format!("not a v0.0.44 JSON envelope: {e}"),
                });
            }
        };
        // A node slurmctld does not know: error 2018 on a write; on a read of
        // one node, HTTP 200, no `nodes`, and an error entry "Failure to
        // query node <name>" carrying the load's errno, 0 when the load
        // itself worked (`src/slurmrestd/plugins/openapi/slurmctld/nodes.c`,
        // `_dump_nodes`, Slurm 26.05).
        let unknown_read = status.is_success()
            && rest.starts_with("node/")
            && env.nodes.is_none()
            && !env.errors.is_empty();
        if has(ESLURM_INVALID_NODE_NAME) || unknown_read {
            return Err(SlurmError::NotFound {
                node: rest.rsplit('/').next().unwrap_or_default().to_string(),
                message: detail,
            });
        }
        if status == StatusCode::UNPROCESSABLE_ENTITY && has(ESLURM_INVALID_NODE_STATE_TRANSITION) {
            return Err(SlurmError::InvalidTransition {
                message: describe(&env.errors),
            });
        }
        if status.is_server_error() {
            return Err(SlurmError::Server {
                status: code,
                message: describe(&env.errors),
            });
        }
        if !status.is_success() || !env.errors.is_empty() {
            return Err(SlurmError::Rejected {
                status: code,
                message: describe(&env.errors),
            });
        }
        Ok((status, env))
    }

    /// `GET /node/{name}`.
    pub async fn get_node(&self, name: &str) -> Result<SlurmNode, SlurmError> {
        let (status, env) = self
            .call(Method::GET, &Self::node_path(name)?, None)
            .await?;
        let nodes = env.nodes.ok_or_else(|| SlurmError::BadResponse {
            status: status.as_u16(),
            message: "no nodes array".into(),
        })?;
        match nodes.into_iter().find(|n| n.name == name) {
            Some(n) => Ok(n),
            None => Err(SlurmError::NotFound {
                node: name.to_string(),
                message: "not in the response".into(),
            }),
        }
    }

    /// `GET /nodes/`.
    pub async fn nodes(&self) -> Result<Vec<SlurmNode>, SlurmError> {
        let (status, env) = self.call(Method::GET, "nodes/", None).await?;
        env.nodes.ok_or_else(|| SlurmError::BadResponse {
            status: status.as_u16(),
            message: "no nodes array".into(),
        })
    }

    async fn update(&self, name: &str, msg: &UpdateNodeMsg<'_>) -> Result<(), SlurmError> {
        let body = serde_json::to_vec(msg).map_err(|e| SlurmError::Config(e.to_string()))?;
        self.call(Method::POST, &Self::node_path(name)?, Some(body))
            .await
            .map(|_| ())
    }

    /// Sets DRAIN with `reason`.
    pub async fn drain(&self, name: &str, reason: &str) -> Result<(), SlurmError> {
        if reason.trim().is_empty() {
            return Err(SlurmError::Config("a drain needs a reason".into()));
        }
        self.update(
            name,
            &UpdateNodeMsg {
                state: ["DRAIN"],
                reason: Some(reason),
            },
        )
        .await
    }

    /// Sets FAIL with `reason` (clears DRAIN: Slurm holds one or the other).
    pub async fn hold(&self, name: &str, reason: &str) -> Result<(), SlurmError> {
        if reason.trim().is_empty() {
            return Err(SlurmError::Config("a FAIL needs a reason".into()));
        }
        self.update(
            name,
            &UpdateNodeMsg {
                state: ["FAIL"],
                reason: Some(reason),
            },
        )
        .await
    }

    /// Clears DRAIN (unconditionally: prefer [`Self::undrain_if_reason`]).
    pub async fn undrain(&self, name: &str) -> Result<(), SlurmError> {
        self.update(
            name,
            &UpdateNodeMsg {
                state: ["UNDRAIN"],
                reason: None,
            },
        )
        .await
    }

    /// `{"state":["RESUME"]}`: clears DOWN, DRAIN and FAIL. Slurm refuses
    /// a RESUME of a node that is none of these (error 2180): it is open
    /// already, which is what a RESUME asks for.
    pub async fn resume(&self, name: &str) -> Result<(), SlurmError> {
        match self
            .update(
                name,
                &UpdateNodeMsg {
                    state: ["RESUME"],
                    reason: None,
                },
            )
            .await
        {
            Err(SlurmError::InvalidTransition { .. }) => Ok(()),
            r => r,
        }
    }

    /// Re-reads the node and resumes it only if it is drained (or FAIL)
    /// with `reason` (exactly, or with Slurm's appended messages:
    /// [`reason_is`]). Returns whether it resumed.
    pub async fn resume_if_reason(&self, name: &str, reason: &str) -> Result<bool, SlurmError> {
        let n = self.get_node(name).await?;
        if !(held(&n.state) && reason_is(&n.reason, reason)) {
            return Ok(false);
        }
        self.resume(name).await.map(|_| true)
    }

    /// Re-reads the node and, only if it is drained (or FAIL) with
    /// `owned_reason`, sets `state` (`DRAIN` or `FAIL`) with `reason`: a
    /// drain someone else had set before, handed back. Returns whether it
    /// wrote.
    pub async fn restore_if_reason(
        &self,
        name: &str,
        owned_reason: &str,
        state: &str,
        reason: &str,
    ) -> Result<bool, SlurmError> {
        let n = self.get_node(name).await?;
        if !(held(&n.state) && reason_is(&n.reason, owned_reason)) {
            return Ok(false);
        }
        let state = match state {
            "FAIL" => "FAIL",
            _ => "DRAIN",
        };
        if reason.trim().is_empty() {
            return Err(SlurmError::Config("a drain needs a reason".into()));
        }
        self.update(
            name,
            &UpdateNodeMsg {
                state: [state],
                reason: Some(reason),
            },
        )
        .await
        .map(|_| true)
    }

    /// Releases an orphaned mountguard drain or FAIL hold whose reason is
    /// still `reason` ([`reason_is`]): a FAIL first becomes a DRAIN with the same
    /// reason, then it is undrained (a DOWN stays, as an undrain leaves
    /// it). Returns whether it released.
    pub async fn release_if_reason(&self, name: &str, reason: &str) -> Result<bool, SlurmError> {
        let n = self.get_node(name).await?;
        if !(held(&n.state) && reason_is(&n.reason, reason)) {
            return Ok(false);
        }
        if n.state.iter().any(|s| s == "FAIL") {
            self.drain(name, reason).await?;
        }
        self.undrain(name).await.map(|_| true)
    }

    /// Re-reads the node and clears DRAIN only if its reason is still
    /// `reason` ([`reason_is`]). Returns whether it undrained. (Slurm has no
    /// compare-and-set; the window is one round trip.)
    pub async fn undrain_if_reason(&self, name: &str, reason: &str) -> Result<bool, SlurmError> {
        let n = self.get_node(name).await?;
        if !(n.state.iter().any(|s| s == "DRAIN") && reason_is(&n.reason, reason)) {
            return Ok(false);
        }
        self.undrain(name).await.map(|_| true)
    }
}

/// DRAIN or FAIL in a node's state array.
fn held(state: &[String]) -> bool {
    state.iter().any(|s| s == "DRAIN" || s == "FAIL")
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

#[cfg(test)]
mod tests;
