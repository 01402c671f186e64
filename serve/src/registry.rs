//! The open connections of one listener, ranked by how much they are worth
//! keeping, and the one rule that decides which goes when a newcomer needs
//! room ([`Registry::admit`]):
//!
//! - a connection starts unproven; it is proven once a complete request
//!   head arrived on it (a kubelet probe, a scrape, a webhook call: any
//!   client that speaks), vouched for once the service says who sent it
//!   (an authenticated node), demoted once the service refused it;
//! - one source address holds at most [`Limits::per_source`] connections
//!   not vouched for: a newcomer beyond it takes the place of that
//!   address's own, the demoted first, then the oldest unproven, then the
//!   oldest proven. An address flooding idle sockets competes with itself
//!   and leaves the rest of the cap to the others;
//! - at the cap ([`Limits::max_connections`]) a newcomer takes the place of
//!   the oldest demoted connection, else of the oldest unproven one from
//!   its own address, else (only for an address with none) of the oldest
//!   unproven one from any; with none of those it is closed at once. A
//!   proven or vouched connection is never shed for another address.
//!
//! [`Limits::per_source`]: crate::Limits::per_source
//! [`Limits::max_connections`]: crate::Limits::max_connections

use std::collections::{BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::Arc;

use tokio::sync::Notify;

/// What requests have shown of a connection's client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Class {
    /// No complete request head yet (idle, in its handshake, trickling).
    Unproven,
    /// A complete request head arrived; nobody vouched for it.
    Proven,
    /// A request the service vouched for: never shed, and not counted in
    /// its address's [`crate::Limits::per_source`].
    Vouched,
    /// Refused, or over its identity's limit: shed first.
    Demoted,
}

/// Why a connection was closed for a newcomer (or the newcomer itself).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reason {
    /// The newcomer's address held [`crate::Limits::per_source`]
    /// connections not vouched for.
    PerSource,
    /// The listener held [`crate::Limits::max_connections`].
    Cap,
}

impl Reason {
    /// The limit's name, for logs.
    pub(crate) fn limit(self) -> &'static str {
        match self {
            Reason::PerSource => "per source address",
            Reason::Cap => "connection cap",
        }
    }
}

/// The outcome of [`Registry::admit`].
#[derive(Debug)]
pub(crate) enum Admitted {
    /// Opened (`id`, the notice that sheds it), in the place of a
    /// connection closed for it when `shed` is set.
    Open {
        id: u64,
        kill: Arc<Notify>,
        shed: Option<Reason>,
    },
    /// Not opened: no connection could be spared.
    Refused(Reason),
}

#[derive(Debug)]
struct Entry {
    source: IpAddr,
    class: Class,
    identity: Option<Arc<str>>,
    kill: Arc<Notify>,
}

/// Ids of one class, oldest first: all, and by source address.
#[derive(Debug, Default)]
struct Ranked {
    all: BTreeSet<u64>,
    by_source: HashMap<IpAddr, BTreeSet<u64>>,
}

impl Ranked {
    fn insert(&mut self, source: IpAddr, id: u64) {
        self.all.insert(id);
        self.by_source.entry(source).or_default().insert(id);
    }

    fn remove(&mut self, source: IpAddr, id: u64) {
        self.all.remove(&id);
        if let Some(set) = self.by_source.get_mut(&source) {
            set.remove(&id);
            if set.is_empty() {
                self.by_source.remove(&source);
            }
        }
    }

    fn oldest(&self) -> Option<u64> {
        self.all.first().copied()
    }

    fn oldest_from(&self, source: IpAddr) -> Option<u64> {
        self.by_source.get(&source).and_then(|s| s.first()).copied()
    }

    fn count_from(&self, source: IpAddr) -> usize {
        self.by_source.get(&source).map_or(0, BTreeSet::len)
    }
}

/// The open connections of one listener (see the module comment).
#[derive(Debug, Default)]
pub(crate) struct Registry {
    next: u64,
    conns: HashMap<u64, Entry>,
    unproven: Ranked,
    proven: Ranked,
    demoted: Ranked,
    per_identity: HashMap<Arc<str>, usize>,
}

impl Registry {
    fn ranked(&mut self, class: Class) -> Option<&mut Ranked> {
        match class {
            Class::Unproven => Some(&mut self.unproven),
            Class::Proven => Some(&mut self.proven),
            Class::Demoted => Some(&mut self.demoted),
            Class::Vouched => None,
        }
    }

    /// Connections not vouched for from `source`.
    fn held_by(&self, source: IpAddr) -> usize {
        self.unproven.count_from(source)
            + self.proven.count_from(source)
            + self.demoted.count_from(source)
    }

    /// Opens a connection from `source`, shedding one in its place when
    /// `source` holds `per_source` connections not vouched for (0: no
    /// limit) or the listener holds `cap`, as the module comment says.
    pub(crate) fn admit(&mut self, source: IpAddr, cap: usize, per_source: usize) -> Admitted {
        let mut shed = None;
        if per_source > 0 && self.held_by(source) >= per_source {
            let own = self
                .demoted
                .oldest_from(source)
                .or_else(|| self.unproven.oldest_from(source))
                .or_else(|| self.proven.oldest_from(source));
            match own {
                Some(id) => {
                    self.shed(id);
                    shed = Some(Reason::PerSource);
                }
                None => return Admitted::Refused(Reason::PerSource),
            }
        }
        if self.conns.len() >= cap.max(1) {
            let victim = self
                .demoted
                .oldest()
                .or_else(|| self.unproven.oldest_from(source))
                .or_else(|| self.unproven.oldest());
            match victim {
                Some(id) => {
                    self.shed(id);
                    shed = Some(Reason::Cap);
                }
                None => return Admitted::Refused(Reason::Cap),
            }
        }
        let id = self.next;
        self.next += 1;
        let kill = Arc::new(Notify::new());
        self.unproven.insert(source, id);
        self.conns.insert(
            id,
            Entry {
                source,
                class: Class::Unproven,
                identity: None,
                kill: kill.clone(),
            },
        );
        Admitted::Open { id, kill, shed }
    }

    /// Closes `id` for a newcomer: its task is told, and its place freed
    /// now.
    fn shed(&mut self, id: u64) {
        if let Some(e) = self.conns.get(&id) {
            e.kill.notify_one();
        }
        self.close(id);
    }

    /// Forgets `id`'s class and identity.
    fn unclass(&mut self, id: u64) {
        let Some(e) = self.conns.get_mut(&id) else {
            return;
        };
        let (source, class, identity) = (e.source, e.class, e.identity.take());
        if let Some(r) = self.ranked(class) {
            r.remove(source, id);
        }
        if let Some(who) = identity
            && let Some(n) = self.per_identity.get_mut(&who)
        {
            *n -= 1;
            if *n == 0 {
                self.per_identity.remove(&who);
            }
        }
    }

    /// Puts `id` (already unclassed) in `class`.
    fn reclass(&mut self, id: u64, class: Class) {
        let Some(e) = self.conns.get_mut(&id) else {
            return;
        };
        e.class = class;
        let source = e.source;
        if let Some(r) = self.ranked(class) {
            r.insert(source, id);
        }
    }

    pub(crate) fn close(&mut self, id: u64) {
        self.unclass(id);
        self.conns.remove(&id);
    }

    /// A complete request head arrived on `id`: an unproven connection is
    /// proven (others keep their class).
    pub(crate) fn prove(&mut self, id: u64) {
        if self
            .conns
            .get(&id)
            .is_some_and(|e| e.class == Class::Unproven)
        {
            self.unclass(id);
            self.reclass(id, Class::Proven);
        }
    }

    pub(crate) fn demote(&mut self, id: u64) {
        if self
            .conns
            .get(&id)
            .is_none_or(|e| e.class == Class::Demoted)
        {
            return;
        }
        self.unclass(id);
        self.reclass(id, Class::Demoted);
    }

    pub(crate) fn vouch(&mut self, id: u64, identity: &str, limit: usize) -> bool {
        let Some(e) = self.conns.get(&id) else {
            return false;
        };
        if e.class == Class::Vouched && e.identity.as_deref() == Some(identity) {
            return true;
        }
        let held = self.per_identity.get(identity).copied().unwrap_or(0);
        if limit > 0 && held >= limit {
            self.demote(id);
            return false;
        }
        self.unclass(id);
        self.reclass(id, Class::Vouched);
        let who: Arc<str> = Arc::from(identity);
        *self.per_identity.entry(who.clone()).or_insert(0) += 1;
        if let Some(e) = self.conns.get_mut(&id) {
            e.identity = Some(who);
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn open(r: &mut Registry, from: &str, cap: usize, per_source: usize) -> (u64, Option<Reason>) {
        match r.admit(ip(from), cap, per_source) {
            Admitted::Open { id, shed, .. } => (id, shed),
            Admitted::Refused(why) => panic!("refused: {why:?}"),
        }
    }

    /// An address at its limit sheds its own: demoted, then the oldest
    /// unproven, then the oldest proven; vouched ones do not count.
    #[test]
    fn an_address_at_its_limit_competes_with_itself() {
        let mut r = Registry::default();
        let (a0, _) = open(&mut r, "10.0.0.1", 100, 3);
        let (a1, _) = open(&mut r, "10.0.0.1", 100, 3);
        let (a2, _) = open(&mut r, "10.0.0.1", 100, 3);
        let (other, _) = open(&mut r, "10.0.0.2", 100, 3);
        r.prove(a0);
        r.demote(a2);
        // The demoted one goes first.
        let (a3, shed) = open(&mut r, "10.0.0.1", 100, 3);
        assert_eq!(shed, Some(Reason::PerSource));
        assert!(!r.conns.contains_key(&a2));
        // Then the oldest unproven (a1), not the older proven a0.
        let (_a4, _) = open(&mut r, "10.0.0.1", 100, 3);
        assert!(!r.conns.contains_key(&a1) && r.conns.contains_key(&a0));
        // Vouched: no longer counted.
        assert!(r.vouch(a3, "node", 0));
        let (_a5, shed) = open(&mut r, "10.0.0.1", 100, 3);
        assert_eq!(shed, None);
        assert!(r.conns.contains_key(&other) && r.conns.contains_key(&a3));
        assert_eq!(r.held_by(ip("10.0.0.1")), 3);
    }

    /// At the cap a newcomer from an address with nothing to shed of its
    /// own takes an unproven connection's place; proven and vouched ones
    /// are kept, and with only those the newcomer is refused.
    #[test]
    fn at_the_cap_proven_connections_are_kept() {
        let mut r = Registry::default();
        let (idle, _) = open(&mut r, "10.0.0.1", 3, 0);
        let (probe, _) = open(&mut r, "10.0.0.1", 3, 0);
        let (agent, _) = open(&mut r, "10.0.0.3", 3, 0);
        r.prove(probe);
        assert!(r.vouch(agent, "node", 0));
        let (next, shed) = open(&mut r, "10.0.0.2", 3, 0);
        assert_eq!(shed, Some(Reason::Cap));
        assert!(!r.conns.contains_key(&idle));
        r.prove(next);
        assert!(matches!(
            r.admit(ip("10.0.0.4"), 3, 0),
            Admitted::Refused(Reason::Cap)
        ));
        assert_eq!(r.conns.len(), 3);
        for id in [probe, agent, next] {
            r.close(id);
        }
        assert_eq!(r.conns.len(), 0);
        assert!(r.unproven.all.is_empty() && r.proven.all.is_empty());
        assert!(r.per_identity.is_empty());
    }
}
