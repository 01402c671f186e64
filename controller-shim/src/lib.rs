//! mountguard controller library: the edges around the pure core
//! (`mountguard-core`).
//!
//! The verdict engine, the model, the kubelet's projection rules, the
//! rollout decision and the remediation decisions live in
//! [`mountguard_core`], which has no Kubernetes client, runtime or HTTP
//! dependency. This crate holds what touches the world:
//! * [`convert`]: the edge from k8s-openapi types (and raw `kubectl` JSON)
//!   into the core model.
//! * [`offline`]: the `verify` command.
//! * [`cli`]: the command line of every command.
//! * [`live`]: the running controller (`run`, `status`, `wait`): watches,
//!   the report API, evaluation, metrics, Events, leader election, the
//!   slurmrestd client and the remediation executor.

pub mod admission;
pub mod api;
pub mod cli;
pub mod edge;
pub mod eval;
pub mod intake;
pub(crate) mod leader;
pub mod offline;
pub mod query;
pub mod remediation;
pub mod run;
pub mod runtime;
pub mod settings;
pub mod state;

pub use mountguard_core::READ_AT_START_ANNOTATION;

/// A random fingerprint key of 32 bytes from `/dev/urandom`, for a process
/// started without `--fingerprint-key-file` (its fingerprints change on
/// restart).
pub fn random_fingerprint_key() -> Result<[u8; 32], Error> {
    use std::io::Read;
    let mut key = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut key))
        .map_err(|e| Error::Io {
            file: "/dev/urandom".into(),
            source: e,
        })?;
    Ok(key)
}

/// Errors of the controller library.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file or stream could not be read.
    #[error("{file}: {source}")]
    Io {
        /// The file (or `-` for standard input).
        file: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A document is not valid JSON.
    #[error("{file}: invalid JSON at line {line}, column {column}: {message}")]
    Json {
        /// The file (or `-` for standard input).
        file: String,
        /// 1-based line of the problem.
        line: usize,
        /// 1-based column of the problem.
        column: usize,
        /// What serde_json reported.
        message: String,
    },
    /// A JSON document or list item is not a valid object of its kind.
    #[error("{file}: {place}: {message}")]
    Object {
        /// The file (or `-` for standard input).
        file: String,
        /// Where in the file, e.g. `items[3] (Pod default/web-0)`.
        place: String,
        /// What is wrong.
        message: String,
    },
    /// A file is not what its flag takes (YAML, a table, the other flag's
    /// file): what it looks like and the command that makes the right one.
    #[error("{file}: {message}")]
    WrongInput {
        /// The file (or `-` for standard input).
        file: String,
        /// What it looks like and what to do.
        message: String,
    },
    /// A node inventory is not valid.
    #[error("{file}: {source}")]
    Inventory {
        /// The file.
        file: String,
        /// The inventory crate's error.
        source: mountguard_inventory::Error,
    },
    /// The command line asks for something that cannot be done as asked.
    #[error("{0}")]
    Usage(String),
    /// A configuration value is out of range or malformed.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// The Kubernetes API or its configuration failed.
    #[error("Kubernetes API: {0}")]
    Kube(String),
    /// A TLS certificate or key is unusable.
    #[error("TLS: {0}")]
    Tls(String),
    /// The input holds nothing to judge (no pod, or no pod on the nodes
    /// scanned): a verdict of "all fresh" would be vacuous.
    #[error("nothing to judge: {0}")]
    NothingToJudge(String),
    /// The controller's metrics port could not be reached (`status`).
    #[error(
        "cannot reach the controller at {url}: {message}. Is --url the controller's metrics \
         port? From outside the cluster, forward it first: `kubectl -n {ns} port-forward \
         svc/{svc} 8080` (the release `{release}` in `{ns}`, as the docs install it; the chart \
         names the Service `<release>-mountguard-controller-metrics` for a release whose name \
         does not contain `mountguard`, and its NOTES print the exact command), then \
         `mountguard-controller status --url http://127.0.0.1:8080`",
        ns = mountguard_inventory::names::NAMESPACE,
        release = mountguard_inventory::names::RELEASE,
        svc = mountguard_inventory::names::controller_metrics_service(
            mountguard_inventory::names::RELEASE
        ),
    )]
    Unreachable {
        /// The URL that was tried.
        url: String,
        /// Why the connection failed.
        message: String,
    },
    /// A request of `status` or `wait` was not answered completely in time.
    #[error(
        "{request}: no complete answer within {budget:?} ({flag}): the controller, or the \
         way to it, accepted the request and did not finish answering"
    )]
    Deadline {
        /// `GET <url>`.
        request: String,
        /// The time allowed.
        budget: std::time::Duration,
        /// The flag that allowed it.
        flag: &'static str,
    },
    /// The status API refused the request (401, 403) or failed (another
    /// status): the message says what to do.
    #[error("GET {url}: the controller answered {status}: {advice}")]
    Refused {
        /// The URL requested.
        url: String,
        /// The HTTP status.
        status: u16,
        /// What it means and what to do (for 401 and 403), else the start
        /// of the answer.
        advice: String,
    },
    /// An answer of the controller was larger than allowed.
    #[error(
        "{request}: the answer is larger than {max_bytes} bytes (--max-response-size); \
         narrow the query (--namespace, --node, --state) or raise the limit"
    )]
    TooLarge {
        /// `GET <url>`.
        request: String,
        /// The limit.
        max_bytes: u64,
    },
}

impl From<mountguard_core::Error> for Error {
    fn from(e: mountguard_core::Error) -> Self {
        match e {
            mountguard_core::Error::Config(m) => Error::Config(m),
        }
    }
}
