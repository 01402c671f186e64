//! A NodeSet attempt whose Slurm node slurmctld does not know, under
//! [`AbsentNodePolicy::Replace`]: the pod is evicted without a drain
//! (there is nothing to drain, and no job of Slurm's runs on the node),
//! and the attempt succeeds when the replacement's slurmd has registered,
//! with no undrain. A node that shows up again before the eviction sends
//! the attempt back to Pending, to be drained like any other.

use super::attempt::Phase;
use super::observations::{AbsentNodePolicy, Observations, SlurmNodeState, SlurmObservation};
use super::stepper::Stepper;

impl Stepper<'_> {
    /// Pending, the node unknown for the whole grace: whether the policy
    /// replaces the pod (then the eviction is asked for now).
    pub(super) fn replace_absent(&mut self) -> bool {
        if self.cfg.absent_node != AbsentNodePolicy::Replace {
            return false;
        }
        let since = self.a.not_found_since.unwrap_or(self.now);
        self.a.slurm_absent = true;
        let what = format!(
            "slurmctld does not know Slurm node {} (slurmrestd has answered \"not found\" since {since}: a dynamic node whose slurmd cannot register on the current key); nothing to drain, evicting the pod",
            self.a.slurm_node,
        );
        self.start(Phase::Evicting, "", what);
        self.evict_pod();
        true
    }

    /// Evicting an attempt on an absent node: evict while the node is
    /// still unknown; back to Pending (a drain first) when it is known
    /// again; wait on a read error (never evict on what was not read).
    pub(super) fn evicting_absent(&mut self, obs: &Observations) {
        if self.evicted(obs) || self.eviction_timed_out(obs) || !self.due() {
            return;
        }
        match &obs.slurm {
            SlurmObservation::NotFound => self.evict_pod(),
            SlurmObservation::Node(_) => {
                self.a.slurm_absent = false;
                self.goto(Phase::Pending);
            }
            _ => self.read_error(obs),
        }
    }

    /// Verifying an attempt on an absent node, verified: the node exists
    /// again, by the replacement's own registration. Nothing of ours to
    /// release.
    pub(super) fn absent_verified(&mut self, n: &SlurmNodeState) {
        self.succeed(format!(
            ": replacement verified fresh; Slurm node {} registered by the replacement's slurmd ({:?}; it was absent from slurmctld, so it was never drained)",
            self.a.slurm_node, n.state
        ));
    }
}
