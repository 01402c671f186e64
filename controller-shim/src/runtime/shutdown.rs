//! The one shutdown signal every task stops on.

use tokio::sync::watch as tokio_watch;

/// One shutdown signal shared by every task.
#[derive(Debug, Clone)]
pub struct Shutdown(tokio_watch::Receiver<bool>);

impl Shutdown {
    /// A signal and its trigger.
    pub fn new() -> (tokio_watch::Sender<bool>, Self) {
        let (tx, rx) = tokio_watch::channel(false);
        (tx, Self(rx))
    }

    /// Resolves when shutdown was requested (or the trigger dropped).
    pub async fn wait(&mut self) {
        let _ = self.0.wait_for(|v| *v).await;
    }

    /// Whether shutdown was requested.
    pub fn is_set(&self) -> bool {
        *self.0.borrow()
    }
}

/// A timer of `period` for a task's housekeeping: a tick missed while the
/// task was busy is delayed, not made up in a burst.
pub fn ticker(period: std::time::Duration) -> tokio::time::Interval {
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick
}
