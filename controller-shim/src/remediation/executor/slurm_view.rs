//! The reads behind what a stale worker's verdict says of Slurm: the Slurm
//! node of every NodeSet pod whose `slurm.key` verdict is not Fresh, read
//! (GET, never a write) at most once per
//! [`REFRESH`](mountguard_core::remediation::slurm_view::REFRESH) per node,
//! and kept in the status API's store, where the status API and the
//! evaluation's Events read them. Which nodes, when, and what they say is
//! decided in the core (`mountguard_core::remediation::slurm_view`); a
//! failed read is kept as such and never changes a verdict.

use mountguard_core::remediation::slurm_view::{ReadOutcome, SlurmRead, due, wanted};

use super::*;

/// More nodes due at once than this are read with one `GET /nodes/`
/// rather than one `GET /node/{name}` each.
const LIST_ABOVE: usize = 4;

impl Executor {
    /// Reads the Slurm nodes the snapshot's stale workers show and are due,
    /// and forgets those no verdict shows any more.
    pub(super) async fn refresh_slurm_view(&self, snap: &EvaluationSnapshot, now: Timestamp) {
        let Some(slurm) = &self.slurm else {
            return;
        };
        let wanted = wanted(&snap.verdicts);
        let due = {
            let mut store = self.store.write().unwrap();
            store.slurm.nodes.retain(|n, _| wanted.contains(n));
            due(&wanted, &store.slurm, now)
        };
        if due.is_empty() {
            return;
        }
        let mut reads: Vec<(String, ReadOutcome)> = Vec::with_capacity(due.len());
        if due.len() > LIST_ABOVE {
            match slurm.nodes().await {
                Ok(all) => {
                    for name in due {
                        let outcome = match all.iter().find(|n| n.name == name) {
                            Some(n) => ReadOutcome::Node(n.to_state()),
                            None => ReadOutcome::NotFound,
                        };
                        reads.push((name, outcome));
                    }
                }
                Err(e) => {
                    self.shared.metrics.api_error("slurm_list_nodes");
                    debug!(error = %e, "reading the Slurm nodes of stale workers failed");
                    reads.extend(due.into_iter().map(|n| (n, failed(&e))));
                }
            }
        } else {
            for name in due {
                let outcome = match slurm.get_node(&name).await {
                    Ok(n) => ReadOutcome::Node(n.to_state()),
                    Err(SlurmError::NotFound { .. }) => ReadOutcome::NotFound,
                    Err(e) => {
                        self.shared.metrics.api_error("slurm_get_node");
                        debug!(node = %name, error = %e, "reading the Slurm node of a stale worker failed");
                        failed(&e)
                    }
                };
                reads.push((name, outcome));
            }
        }
        let mut store = self.store.write().unwrap();
        for (name, outcome) in reads {
            store
                .slurm
                .nodes
                .insert(name, SlurmRead { at: now, outcome });
        }
    }
}

fn failed(e: &SlurmError) -> ReadOutcome {
    ReadOutcome::Failed(e.to_string())
}
