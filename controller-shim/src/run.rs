//! The live controller (`mountguard-controller run`): watches, the report
//! API, evaluation, metrics, Events and leader election, around the pure
//! verdict engine.
//!
//! Tasks (all stop on one shutdown signal):
//! * watches ([`watch`]): Pods, Secrets, ConfigMaps, Nodes, NodeSets and the
//!   agent's pods; each event is converted at the edge (Secret and ConfigMap
//!   content hashed, plaintext dropped) and sent to the evaluation task;
//! * the report API ([`report`]): authenticates and authorizes agents,
//!   checks and parses reports, answers at once and hands accepted
//!   inventories to the evaluation task;
//! * the evaluation task ([`eval`]): owns the index, the engine state and
//!   the published verdicts; re-evaluates only the pods a change touches;
//! * Events ([`events`]), the metrics/status server ([`http`]) and leader
//!   election ([`leader`]);
//! * remediation (opt-in, [`executor`]): plans and steps attempts with the
//!   core's pure machine and performs them (NodeSet annotations, evictions
//!   through [`eviction`], cordons, Events, and slurmrestd through
//!   [`slurm`]);
//! * the admission webhook (opt-in, [`admission`]; its wire format
//!   [`admission_review`]): warns about deletes and
//!   re-creations of immutable Secrets and ConfigMaps that nodes keep
//!   serving from their kubelet's cache, from the evaluation task's view.
//!
//! Every component's metric families (its `metrics.rs`) are registered here
//! on the one registry, whether or not the component runs, and each task is
//! handed its own (`FeatureMetrics`).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch as tokio_watch};
use tokio::task::JoinHandle;
use tracing::{info, warn};

use crate::api::authorize as status_auth;
use crate::api::metrics::ApiMetrics;
use crate::api::routes as http;
use crate::api::store::ReadModel;
use crate::eval::metrics::EvalMetrics;
use crate::eval::{self, EvaluationSnapshot};
use crate::intake::auth;
use crate::intake::metrics::IntakeMetrics;
use crate::intake::report;
use crate::leader;
use crate::remediation::executor;
use crate::remediation::metrics::RemediationMetrics;
use crate::runtime::metrics::Metrics;
use crate::runtime::shutdown::Shutdown;
use crate::runtime::token_review::TokenReviewer;
use crate::runtime::token_review::metrics::TokenReviewMetrics;
use crate::runtime::{events, kube, tls, token_review};
use crate::settings::{RunArgs, Settings};
use crate::state::Shared;
use crate::{admission, edge::watch};

use crate::Error;

/// How long [`Controller::shutdown`] waits for tasks to finish.
pub const SHUTDOWN_BOUND: Duration = Duration::from_secs(10);

/// A running controller.
#[derive(Debug)]
pub struct Controller {
    report_addr: SocketAddr,
    metrics_addr: SocketAddr,
    admission_addr: Option<SocketAddr>,
    shared: Arc<Shared>,
    trigger: tokio_watch::Sender<bool>,
    tasks: Vec<(&'static str, JoinHandle<()>)>,
}

impl Controller {
    /// Starts every task: binds both listeners (so `127.0.0.1:0` works),
    /// connects to the API server, starts the watches, leader election,
    /// evaluation and Events. Returns once the listeners are bound; the
    /// watches sync in the background ([`Controller::is_ready`]).
    pub async fn start(args: RunArgs) -> Result<Controller, Error> {
        Self::start_with(Settings::try_from(args)?).await
    }

    /// [`Controller::start`] with flags already checked.
    pub async fn start_with(settings: Settings) -> Result<Controller, Error> {
        let Settings {
            kubeconfig,
            fingerprint_key_file,
            serve,
            engine,
            watch: watch_settings,
            report: report_config,
            leader: leader_config,
            remediation,
            admission,
        } = settings;
        let key = load_fingerprint_key(fingerprint_key_file.as_deref())?;
        let fingerprinter = mountguard_core::Fingerprinter::new(&key)?;
        drop(key);
        let tls = match serve.tls {
            Some((cert, key)) => Some(tls::ReloadingCert::load(cert, key)?),
            None => None,
        };
        let client = kube::kube_client(kube::kube_config(kubeconfig.as_deref(), None).await?)?;

        let metrics = Metrics::new();
        let features = FeatureMetrics::register(&metrics);
        let shared = Arc::new(Shared::new(metrics));
        let store = ReadModel::default();
        store.write().unwrap().replicasets_watched = watch_settings
            .workload_kinds
            .contains(&mountguard_core::remediation::workload::WorkloadKind::Deployment);
        let (trigger, shutdown) = Shutdown::new();
        let (input_tx, input_rx) = mpsc::channel::<eval::Input>(4096);
        let (event_tx, event_rx) = mpsc::channel::<events::EventRequest>(1024);
        let (snap_tx, snapshots) = tokio_watch::channel(Arc::new(EvaluationSnapshot::default()));

        match mountguard_serve::raise_nofile_limit() {
            Ok(n) => info!(open_files = n, "open file limit raised to the hard limit"),
            Err(e) => warn!(error = %e, "keeping the open file limit"),
        }
        let fds = mountguard_serve::nofile_limit();
        let metrics_limits =
            http::limits(serve.header_read_timeout, serve.idle_timeout).fit_in(fds / 4, 0);
        // Room for the metrics port, the API client, watches and files.
        let report_limits = crate::intake::limits::limits(
            serve.header_read_timeout,
            serve.idle_timeout,
            serve.max_connections,
        )
        .fit_in(fds, metrics_limits.max_connections as u64 + 256);
        info!(
            report_max_connections = report_limits.max_connections,
            metrics_max_connections = metrics_limits.max_connections,
            "connection caps"
        );
        let report_listener = tokio::net::TcpListener::bind(serve.report_listen)
            .await
            .map_err(|e| Error::Io {
                file: format!("report listener {}", serve.report_listen),
                source: e,
            })?;
        let metrics_listener = tokio::net::TcpListener::bind(serve.metrics_listen)
            .await
            .map_err(|e| Error::Io {
                file: format!("metrics listener {}", serve.metrics_listen),
                source: e,
            })?;
        let report_addr = report_listener.local_addr().map_err(|e| Error::Io {
            file: "report listener".into(),
            source: e,
        })?;
        let metrics_addr = metrics_listener.local_addr().map_err(|e| Error::Io {
            file: "metrics listener".into(),
            source: e,
        })?;

        let admission = match admission {
            Some(a) => {
                let cert = tls::ReloadingCert::load(a.tls.0.clone(), a.tls.1.clone())?;
                let cert = match &a.client_ca {
                    Some(ca) => cert.server_config_verifying_clients(ca)?,
                    None => cert.server_config(),
                };
                let listener =
                    tokio::net::TcpListener::bind(a.listen)
                        .await
                        .map_err(|e| Error::Io {
                            file: format!("admission listener {}", a.listen),
                            source: e,
                        })?;
                Some((a, cert, listener))
            }
            None => None,
        };
        let admission_addr = match &admission {
            Some((_, _, l)) => Some(l.local_addr().map_err(|e| Error::Io {
                file: "admission listener".into(),
                source: e,
            })?),
            None => None,
        };

        let agents = Arc::new(auth::AgentPods::default());
        let reviewer: Arc<dyn TokenReviewer> = Arc::new(
            token_review::CachedReviewer::new(
                token_review::KubeTokenReviewer::new(client.clone()),
                shared.metrics.clone(),
                features.token_review,
                10_000,
            )
            .for_agent(report_config.agent_sa.username()),
        );
        let fetcher = auth::KubePodFetcher::new(
            client.clone(),
            report_config.agent_sa.namespace.clone(),
            shared.metrics.clone(),
        );
        let handler = Arc::new(report::ReportHandler::new(
            report_config,
            shared.clone(),
            features.intake,
            reviewer,
            agents.clone(),
            Some(Arc::new(fetcher)),
            input_tx.clone(),
        ));

        let status_gate = Arc::new(match serve.status_auth {
            status_auth::StatusAuthMode::Kubernetes => status_auth::StatusGate::kubernetes(
                Arc::new(status_auth::KubeAccessReviewer::new(client.clone())),
                status_auth::StatusAuthLimits::default(),
            ),
            status_auth::StatusAuthMode::None => {
                warn!(
                    "--status-auth none: /v1/verdicts and /v1/rollouts answer anyone who reaches the metrics port"
                );
                status_auth::StatusGate::open()
            }
        });

        let mut tasks: Vec<(&'static str, JoinHandle<()>)> = Vec::new();
        tasks.push((
            "report-server",
            tokio::spawn(report::serve(
                report_listener,
                tls,
                handler.clone(),
                report_limits,
                shared.metrics.serve("report"),
                shutdown.clone(),
            )),
        ));
        tasks.push((
            "metrics-server",
            tokio::spawn(http::serve(
                metrics_listener,
                shared.clone(),
                features.api,
                store.clone(),
                status_gate,
                metrics_limits,
                shared.metrics.serve("metrics"),
                shutdown.clone(),
            )),
        ));
        if let Some((a, cert, listener)) = admission {
            info!(mode = ?a.mode, addr = ?admission_addr, "admission webhook");
            let handler = Arc::new(admission::AdmissionHandler::new(
                a,
                shared.clone(),
                input_tx.clone(),
                features.admission,
            ));
            tasks.push((
                "admission-server",
                tokio::spawn(admission::serve(
                    listener,
                    cert,
                    handler,
                    metrics_limits,
                    shared.metrics.serve("admission"),
                    shutdown.clone(),
                )),
            ));
        }
        let engine = mountguard_core::Engine::new(engine, fingerprinter);
        tasks.push((
            "evaluation",
            tokio::spawn(eval::run(
                eval::EvalTask::new(
                    engine,
                    shared.clone(),
                    features.eval,
                    store.clone(),
                    event_tx,
                    snap_tx,
                ),
                input_rx,
                shutdown.clone(),
            )),
        ));
        tasks.push((
            "events",
            tokio::spawn(events::run_emitter(
                client.clone(),
                leader_config.pod_name.clone(),
                shared.metrics.clone(),
                event_rx,
                shutdown.clone(),
            )),
        ));
        if let Some(prepared) = remediation {
            let t = executor::spawn(
                prepared,
                kubeconfig.as_deref(),
                &leader_config,
                client.clone(),
                shared.clone(),
                features.remediation,
                store,
                snapshots,
                shutdown.clone(),
            )
            .await?;
            tasks.push(("remediation", t));
        } else {
            // Nobody subscribes: the evaluation builds no snapshot.
            drop(snapshots);
        }
        for (name, t) in watch::spawn_all(
            &client,
            &watch_settings,
            shared.clone(),
            agents,
            input_tx.clone(),
            shutdown.clone(),
        ) {
            tasks.push((name, t));
        }
        tasks.push((
            "leader",
            tokio::spawn(leader::run(
                client,
                leader_config,
                shared.clone(),
                handler,
                input_tx,
                shutdown,
            )),
        ));
        info!(%report_addr, %metrics_addr, "controller started");
        Ok(Controller {
            report_addr,
            metrics_addr,
            admission_addr,
            shared,
            trigger,
            tasks,
        })
    }

    /// Bound address of the report API.
    pub fn report_addr(&self) -> SocketAddr {
        self.report_addr
    }

    /// Bound address of the metrics and status server.
    pub fn metrics_addr(&self) -> SocketAddr {
        self.metrics_addr
    }

    /// Bound address of the admission webhook, when served.
    pub fn admission_addr(&self) -> Option<SocketAddr> {
        self.admission_addr
    }

    /// Whether every watch finished its initial list.
    pub fn is_ready(&self) -> bool {
        self.shared.is_ready()
    }

    /// Whether this replica acts (leader, or no election).
    pub fn is_acting(&self) -> bool {
        self.shared.is_acting()
    }

    /// The metrics registry (every component registered its families on
    /// it).
    pub fn metrics(&self) -> &Metrics {
        &self.shared.metrics
    }

    /// Stops every task (leader label removed and Lease released when
    /// leading), waiting at most [`SHUTDOWN_BOUND`].
    pub async fn shutdown(self) {
        let _ = self.trigger.send(true);
        let deadline = tokio::time::Instant::now() + SHUTDOWN_BOUND;
        for (name, mut t) in self.tasks {
            match tokio::time::timeout_at(deadline, &mut t).await {
                Ok(_) => {}
                Err(_) => {
                    warn!(task = name, "task did not stop in time; aborting it");
                    t.abort();
                }
            }
        }
        info!("controller stopped");
    }
}

/// The families each component registers beside what it measures, all
/// registered whether or not the component runs, so /metrics always lists
/// every family (zeroed when its feature is off); each task is handed its
/// own.
struct FeatureMetrics {
    eval: EvalMetrics,
    intake: IntakeMetrics,
    token_review: TokenReviewMetrics,
    api: ApiMetrics,
    remediation: RemediationMetrics,
    admission: admission::metrics::AdmissionMetrics,
}

impl FeatureMetrics {
    fn register(m: &Metrics) -> Self {
        Self {
            eval: EvalMetrics::register(m),
            intake: IntakeMetrics::register(m),
            token_review: TokenReviewMetrics::register(m),
            api: ApiMetrics::register(m),
            remediation: RemediationMetrics::register(m),
            admission: admission::metrics::AdmissionMetrics::register(m),
        }
    }
}

/// Reads the fingerprint key, or makes a random one (with a warning).
pub fn load_fingerprint_key(path: Option<&std::path::Path>) -> Result<Vec<u8>, Error> {
    match path {
        Some(p) => std::fs::read(p).map_err(|e| Error::Io {
            file: p.display().to_string(),
            source: e,
        }),
        None => {
            warn!(
                "no --fingerprint-key-file: using a random key; fingerprints change when the controller restarts"
            );
            Ok(crate::random_fingerprint_key()?.to_vec())
        }
    }
}

#[cfg(test)]
mod tests;
