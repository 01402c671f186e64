//! Remediation's settings, checked from the flags, and what they prepare
//! before the executor starts (the slurmrestd client and its credential).

use std::sync::Arc;
use std::time::Duration;

use mountguard_core::remediation::machine::MachineConfig;
use mountguard_core::remediation::plan::{Mode, PlanConfig};

use crate::Error;
use crate::remediation::slurm::{JwtMinter, SecretToken, SharedSecret, SlurmClient, TokenSource};

/// Lifetime of minted tokens.
const MINTED_TTL: Duration = Duration::from_secs(300);

/// Remediation's settings (`--remediation dry-run` or `on`), checked from
/// the flags by the one conversion
/// ([`Settings::try_from`](crate::settings::Settings)).
#[derive(Debug, Clone, PartialEq)]
pub struct RemediationSettings {
    /// The mode.
    pub mode: Mode,
    /// The planner's configuration (delay, budgets).
    pub plan: PlanConfig,
    /// The state machine's configuration (timeouts, failure policy).
    pub machine: MachineConfig,
    /// slurmrestd, for NodeSets (`None`: workloads only; no NodeSet is
    /// remediated and no NodeSet record is read).
    pub slurm: Option<SlurmSettings>,
}

/// How remediation reaches slurmrestd.
#[derive(Debug, Clone, PartialEq)]
pub struct SlurmSettings {
    /// slurmrestd base URL.
    pub url: String,
    /// The CA bundle (PEM bytes, read from `--slurmrestd-ca-file`) trusted
    /// for slurmrestd; `None`: the system roots.
    pub ca: Option<Vec<u8>>,
    /// Where the slurmrestd credential is read from.
    pub credential: SlurmCredential,
    /// Slurm user of minted tokens.
    pub user: String,
}

/// `<namespace>/<name>` of an object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectName {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
}

impl std::str::FromStr for ObjectName {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.split_once('/') {
            Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
                Ok(Self {
                    namespace: ns.to_string(),
                    name: name.to_string(),
                })
            }
            _ => Err(format!("{s:?} is not <namespace>/<name>")),
        }
    }
}

/// The Secret holding the slurmrestd credential.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SlurmCredential {
    /// A token, under this key.
    Token(ObjectName, String),
    /// `jwt.key`, to mint short-lived HS256 tokens.
    JwtKey(ObjectName),
}

/// What remediation starts with, built from its settings before the
/// controller binds a socket or calls the API: the settings and the
/// slurmrestd client (its URL and CA checked; no request is made).
pub struct Prepared {
    pub(super) settings: RemediationSettings,
    pub(super) secret_value: SharedSecret,
    pub(super) slurm: Option<SlurmClient>,
}

impl std::fmt::Debug for Prepared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prepared")
            .field("mode", &self.settings.mode)
            .field("url", &self.settings.slurm.as_ref().map(|s| &s.url))
            .finish_non_exhaustive()
    }
}

impl Prepared {
    /// Builds the slurmrestd client of `settings`.
    pub fn new(settings: RemediationSettings) -> Result<Self, Error> {
        let secret_value = SharedSecret::default();
        let slurm = match &settings.slurm {
            None => None,
            Some(s) => {
                let token: Arc<dyn TokenSource> = match &s.credential {
                    SlurmCredential::Token(..) => Arc::new(SecretToken {
                        value: secret_value.clone(),
                    }),
                    SlurmCredential::JwtKey(_) => Arc::new(JwtMinter {
                        key: secret_value.clone(),
                        user: s.user.clone(),
                        ttl: MINTED_TTL,
                    }),
                };
                let client =
                    SlurmClient::new(&s.url, s.ca.as_deref(), token, Duration::from_secs(10))
                        .map_err(|e| Error::Config(e.to_string()))?;
                Some(client)
            }
        };
        Ok(Self {
            settings,
            secret_value,
            slurm,
        })
    }

    /// The settings it was built from.
    pub fn settings(&self) -> &RemediationSettings {
        &self.settings
    }
}
