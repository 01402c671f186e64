//! The one shutdown signal every long-running agent task stops on. Same
//! shape as the controller's `runtime::shutdown::Shutdown` (a `tokio::sync::watch` flag
//! and its trigger), so both binaries stop their tasks the same way.

use tokio::sync::watch;

/// Requests shutdown; dropping it requests shutdown too.
#[derive(Debug)]
pub struct Trigger(watch::Sender<bool>);

impl Trigger {
    /// Asks every task holding a [`Shutdown`] to stop.
    pub fn fire(&self) {
        let _ = self.0.send(true);
    }
}

/// The shutdown signal every task shares (cheap to clone).
#[derive(Debug, Clone)]
pub struct Shutdown(watch::Receiver<bool>);

impl Shutdown {
    /// A signal and its trigger.
    pub fn new() -> (Trigger, Self) {
        let (tx, rx) = watch::channel(false);
        (Trigger(tx), Self(rx))
    }

    /// Resolves once shutdown was requested (or its trigger is gone).
    pub async fn wait(&mut self) {
        let _ = self.0.wait_for(|stop| *stop).await;
    }

    /// Whether shutdown was requested.
    pub fn is_set(&self) -> bool {
        *self.0.borrow()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn every_clone_wakes_on_fire_and_on_drop() {
        let (trigger, shutdown) = Shutdown::new();
        let mut a = shutdown.clone();
        let mut b = shutdown.clone();
        assert!(!a.is_set());
        let waiting = tokio::spawn(async move { a.wait().await });
        trigger.fire();
        tokio::time::timeout(Duration::from_secs(10), waiting)
            .await
            .expect("woken by fire")
            .expect("task");
        assert!(b.is_set());
        b.wait().await;

        let (trigger, mut c) = Shutdown::new();
        drop(trigger);
        tokio::time::timeout(Duration::from_secs(10), c.wait())
            .await
            .expect("woken by drop");
    }
}
