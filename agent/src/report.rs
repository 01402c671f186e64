//! Where each new inventory goes: the seam for the controller's report API.
//!
//! The daemon calls [`InventorySink::publish`] with every new inventory
//! generation and, as a heartbeat, once per rescan interval. A slow sink
//! never delays scanning: it runs in its own task and always gets the latest
//! inventory, skipping intermediate generations.

use std::future::Future;

use mountguard_inventory::NodeInventory;

use crate::Error;

/// Receives the node inventory.
pub trait InventorySink: Send + Sync + 'static {
    /// Hands over the current inventory. An error is logged and counted; the
    /// next change or heartbeat tries again.
    fn publish(&self, inv: &NodeInventory) -> impl Future<Output = Result<(), Error>> + Send;
}

/// A sink that only logs a summary (never content or digests).
#[derive(Debug, Default, Clone, Copy)]
pub struct LogSink;

impl InventorySink for LogSink {
    async fn publish(&self, inv: &NodeInventory) -> Result<(), Error> {
        let volumes: usize = inv.pods.iter().map(|p| p.volumes.len()).sum();
        let sub_paths: usize = inv.pods.iter().map(|p| p.sub_paths.len()).sum();
        let errors: usize = inv
            .pods
            .iter()
            .map(|p| {
                p.errors.len()
                    + p.volumes.iter().map(|v| v.errors.len()).sum::<usize>()
                    + p.sub_paths.iter().map(|s| s.errors.len()).sum::<usize>()
            })
            .sum();
        tracing::info!(
            generation = inv.generation,
            pods = inv.pods.len(),
            volumes,
            sub_paths,
            errors,
            "inventory"
        );
        Ok(())
    }
}
