//! What the executor reads before it steps an attempt: the token Secret,
//! the Lease that fences its writes, the Slurm node, the node's hold, and
//! the NodeSets' models.

use super::*;

impl Executor {
    pub(super) async fn refresh_secret(&mut self, now: Timestamp, force: bool) {
        let due = force
            || self
                .secret_read_at
                .is_none_or(|t| now.duration_since(t) >= TOKEN_REFRESH);
        if !due {
            return;
        }
        let (obj, key) = match &self.secret {
            None => return,
            Some(SlurmCredential::Token(o, k)) => (o, k.as_str()),
            Some(SlurmCredential::JwtKey(o)) => (o, "jwt.key"),
        };
        let api: Api<Secret> = Api::namespaced(self.client.clone(), &obj.namespace);
        match api.get_opt(&obj.name).await {
            Ok(Some(s)) => {
                let v = s
                    .data
                    .as_ref()
                    .and_then(|d| d.get(key))
                    .map(|b| b.0.clone());
                if v.is_none() {
                    warn!(secret = %format!("{}/{}", obj.namespace, obj.name), key, "the Slurm token Secret has no such key");
                }
                self.secret_value.set(v);
                self.secret_read_at = Some(now);
            }
            Ok(None) => {
                warn!(secret = %format!("{}/{}", obj.namespace, obj.name), "the Slurm token Secret does not exist");
                self.secret_value.set(None);
                self.secret_read_at = Some(now);
            }
            Err(e) => {
                self.shared.metrics.api_error("get_secret");
                warn!(error = %e, "reading the Slurm token Secret failed");
            }
        }
    }
    /// Whether the Lease allows a write to start now (always, without
    /// leader election). Read again once the cached validity ran out.
    ///
    /// "Now" is the clock read here, never the round's time: a round's
    /// time was read before its reads of the API and slurmrestd, which can
    /// take long, and a process can be stopped between two steps (a
    /// frozen container, a starved node); the Lease may have been taken
    /// meanwhile by a replica that then acted on the same record.
    pub(super) async fn fence_state(&mut self) -> FenceState {
        let acting = self.shared.is_acting();
        let Some(f) = self.fence.as_mut() else {
            return FenceState::Held;
        };
        if !acting {
            // The leader task saw the Lease lost already.
            f.valid_until = None;
            f.transitions = None;
            return FenceState::Lost;
        }
        let now = Timestamp::now();
        if f.valid_until.is_some_and(|t| now < t) {
            return FenceState::Held;
        }
        f.valid_until = None;
        let lease = match tokio::time::timeout(Duration::from_secs(5), f.api.get_opt(&f.name)).await
        {
            Ok(Ok(Some(l))) => l,
            Ok(Ok(None)) => return FenceState::Lost,
            Ok(Err(e)) => {
                self.shared.metrics.api_error("get_lease");
                debug!(error = %e, "reading the Lease failed; no remediation write until it is confirmed");
                return FenceState::Unsure;
            }
            Err(_) => {
                self.shared.metrics.api_error("get_lease");
                debug!("reading the Lease timed out; no remediation write until it is confirmed");
                return FenceState::Unsure;
            }
        };
        let spec = lease.spec.unwrap_or_default();
        let margin = SignedDuration::from_secs(crate::leader::LEASE_GRACE_SECS as i64);
        match crate::leader::lease_valid_until(&spec, &f.identity, margin) {
            None => {
                f.transitions = None;
                FenceState::Lost
            }
            Some(_) if f.transitions.is_some() && f.transitions != spec.lease_transitions => {
                // Lost and taken again since: another leader may have acted.
                f.transitions = None;
                FenceState::Lost
            }
            Some(t) if now < t => {
                f.valid_until = Some(t);
                f.transitions = spec.lease_transitions;
                FenceState::Held
            }
            Some(_) => {
                debug!("the Lease is not renewed or about to expire; no remediation write now");
                FenceState::Unsure
            }
        }
    }
    /// Checks the fence before a write: false means do not write (and, when
    /// the Lease is lost, the round stops and everything is forgotten).
    pub(super) async fn may_write(&mut self) -> bool {
        match self.fence_state().await {
            FenceState::Held => true,
            FenceState::Unsure => false,
            FenceState::Lost => {
                self.lost = true;
                false
            }
        }
    }
    pub(super) async fn node(
        &self,
        cache: &mut HashMap<String, Result<crate::remediation::slurm::SlurmNode, SlurmError>>,
        name: &str,
    ) -> SlurmObservation {
        let Some(slurm) = &self.slurm else {
            return SlurmObservation::NotRead;
        };
        if !cache.contains_key(name) {
            let r = slurm.get_node(name).await;
            if let Err(e) = &r {
                self.shared.metrics.api_error("slurm_get_node");
                debug!(node = name, error = %e, "reading the Slurm node failed");
            }
            cache.insert(name.to_string(), r);
        }
        slurm_obs(&cache[name])
    }
    /// The cordon of Kubernetes node `name` as seen by group `group` (read
    /// once per round).
    pub(super) async fn cordon(
        &self,
        cache: &mut HashMap<String, Option<Node>>,
        name: &str,
        group: &str,
    ) -> NodeCordon {
        if !cache.contains_key(name) {
            let api: Api<Node> = Api::all(self.client.clone());
            let n = match api.get(name).await {
                Ok(n) => Some(n),
                Err(e) => {
                    self.shared.metrics.api_error("get_node");
                    debug!(node = name, error = %e, "reading the node failed");
                    None
                }
            };
            cache.insert(name.to_string(), n);
        }
        match &cache[name] {
            None => NodeCordon::NotRead,
            Some(n) => node_cordon(n, group),
        }
    }
}

pub(super) fn slurm_obs(
    r: &Result<crate::remediation::slurm::SlurmNode, SlurmError>,
) -> SlurmObservation {
    match r {
        Ok(n) => SlurmObservation::Node(n.to_state()),
        Err(SlurmError::NotFound { .. }) => SlurmObservation::NotFound,
        Err(e) => SlurmObservation::Error {
            transient: e.is_transient(),
            message: e.to_string(),
        },
    }
}

/// The group named by node `n`'s [`HOLD_TAINT_KEY`] taint, if any.
pub(super) fn hold_owner(n: &Node) -> Option<String> {
    n.spec
        .as_ref()?
        .taints
        .as_ref()?
        .iter()
        .find(|t| t.key == HOLD_TAINT_KEY)
        .map(|t| t.value.clone().unwrap_or_default())
}

/// How group `group` sees node `n`'s hold (its [`HOLD_TAINT_KEY`] taint).
pub(super) fn node_cordon(n: &Node, group: &str) -> NodeCordon {
    cordon_of(hold_owner(n).as_deref(), group)
}

pub(super) fn nodeset_models(snap: &EvaluationSnapshot) -> Vec<NodeSetModel> {
    snap.nodesets.iter().map(|n| n.model.clone()).collect()
}
