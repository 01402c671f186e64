//! Fault injection for the crash and chaos tests, compiled in only with the
//! cargo feature `failpoints` (the release binaries and images are built
//! without it; without it every function here does nothing).
//!
//! `FAILPOINTS=remediation-persisted=return(<Phase>)` (the `fail` crate's
//! syntax, read once at start by `main`): the first time this process has
//! persisted a remediation attempt in `<Phase>` (`Draining`, `Evicting`,
//! ...), it kills itself with SIGKILL before the step's next action, the
//! write the record was persisted for. No shutdown path runs, as when a
//! node's OOM killer or a forced pod deletion stops the controller between
//! its two writes: the tests then check that the next controller finishes
//! the attempt once from the record alone.
//!
//! `return(<Phase>:stop)` stops the process (SIGSTOP) at the same point
//! instead, once (continued, the process goes on unharmed), as a long
//! pause would (a starved or frozen container): the test breaks something
//! meanwhile (the API server, etcd, the Lease) and sends SIGCONT; the write
//! the step goes on with must then be judged again.

/// The fail point after a successful persist of an attempt.
pub const PERSISTED: &str = "remediation-persisted";

/// What the fail point does, from its argument `<Phase>[:stop]`.
#[derive(Debug, PartialEq, Eq)]
pub enum Fault<'a> {
    /// SIGKILL after a persist in this phase.
    Kill(&'a str),
    /// SIGSTOP after a persist in this phase.
    Stop(&'a str),
}

impl<'a> Fault<'a> {
    /// Parses the fail point's argument; `None` for an empty one.
    pub fn parse(arg: &'a str) -> Option<Self> {
        match arg.split_once(':') {
            Some((phase, "stop")) if !phase.is_empty() => Some(Fault::Stop(phase)),
            Some(_) => None,
            None if !arg.is_empty() => Some(Fault::Kill(arg)),
            None => None,
        }
    }

    /// The phase after whose persist the fault happens.
    pub fn phase(&self) -> &str {
        match self {
            Fault::Kill(p) | Fault::Stop(p) => p,
        }
    }
}

/// Called after attempt `attempt` was persisted in `phase`.
pub(crate) fn after_persist(phase: &str, attempt: &str) {
    #[cfg(feature = "failpoints")]
    {
        use nix::sys::signal::{Signal, raise};
        let Some(arg) = fail::eval(PERSISTED, |arg| arg).flatten() else {
            return;
        };
        let fault = Fault::parse(&arg);
        let Some(fault) = fault.filter(|f| f.phase() == phase) else {
            return;
        };
        // Once per process: a continued process goes on unharmed.
        static FIRED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
        if FIRED.swap(true, std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        let signal = match fault {
            Fault::Kill(_) => Signal::SIGKILL,
            Fault::Stop(_) => Signal::SIGSTOP,
        };
        tracing::warn!(
            failpoint = PERSISTED,
            phase,
            attempt,
            %signal,
            "fail point: signalling this process after the persist, before the write"
        );
        let _ = raise(signal);
        if signal == Signal::SIGSTOP {
            tracing::warn!(
                failpoint = PERSISTED,
                phase,
                attempt,
                "fail point: continued"
            );
        }
    }
    #[cfg(not(feature = "failpoints"))]
    let _ = (phase, attempt);
}

/// Reads `FAILPOINTS`; the configuration lasts while the guard lives.
#[cfg(feature = "failpoints")]
pub fn setup() -> fail::FailScenario<'static> {
    fail::FailScenario::setup()
}

#[cfg(test)]
mod tests {
    use super::Fault;

    #[test]
    fn the_argument_names_a_phase_and_optionally_a_stop() {
        assert_eq!(Fault::parse("Evicting"), Some(Fault::Kill("Evicting")));
        assert_eq!(Fault::parse("Drained:stop"), Some(Fault::Stop("Drained")));
        assert_eq!(Fault::parse(""), None);
        assert_eq!(Fault::parse(":stop"), None);
        assert_eq!(Fault::parse("Drained:pause"), None);
    }
}
