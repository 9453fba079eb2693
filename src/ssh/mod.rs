//! The SSH launcher: reaches nodes with ssh2 (libssh2), one blocking session per thread.
//!
//! `config` resolves host specs through an OpenSSH config file, `trust` checks host keys against
//! known_hosts, `session` connects, authenticates and runs quoted commands, `deploy` installs this
//! binary on a node, `launch` starts a run's agents on every node at once (all or nothing), and
//! `bridge` carries one agent link over an exec channel, and `carry` brings a checkpoint to the
//! nodes of a resumed run. Nothing outside this module touches
//! ssh2. Every value that reaches a remote shell goes through `quote`.
pub mod bridge;
pub mod carry;
pub mod config;
pub mod deploy;
pub mod fanout;
pub mod launch;
pub mod quote;
pub mod session;
pub mod trust;

pub use config::Target;
use std::time::Duration;

/// Why something on one node failed. Every message names the host.
#[derive(Debug, thiserror::Error)]
pub enum SshError {
    #[error(transparent)]
    Config(#[from] config::ConfigError),
    #[error(transparent)]
    Quote(#[from] quote::QuoteError),
    #[error("{host}: cannot connect within {timeout_s} s: {detail}")]
    Connect { host: String, timeout_s: u64, detail: String },
    #[error("{host}: SSH handshake failed: {detail}")]
    Handshake { host: String, detail: String },
    #[error(transparent)]
    Trust(#[from] Box<trust::TrustError>),
    #[error("{host}: authentication as {user:?} failed; tried {}. Load a key into ssh-agent (ssh-add) or name one with IdentityFile in the SSH config", tried.join("; "))]
    Auth { host: String, user: String, tried: Vec<String> },
    #[error("{host}: {what}: no progress within {timeout_s} s (cluster.command_timeout_s)")]
    CommandTimeout { host: String, what: String, timeout_s: u64 },
    #[error("{host}: {what}: {detail}")]
    Command { host: String, what: String, detail: String },
    #[error("{host}: {what} exited with status {status}: {stderr}")]
    Failed { host: String, what: String, status: i32, stderr: String },
}

impl SshError {
    /// Wraps an ssh2 error of step `what` on `host`, telling a timeout apart.
    pub(crate) fn ssh(host: &str, what: &str, e: ssh2::Error, timeout: Duration) -> SshError {
        // LIBSSH2_ERROR_TIMEOUT
        if e.code() == ssh2::ErrorCode::Session(-9) {
            return SshError::CommandTimeout { host: host.into(), what: what.into(), timeout_s: timeout.as_secs() };
        }
        SshError::Command { host: host.into(), what: what.into(), detail: e.message().to_string() }
    }

    pub(crate) fn io(host: &str, what: &str, e: std::io::Error, timeout: Duration) -> SshError {
        if e.kind() == std::io::ErrorKind::TimedOut {
            return SshError::CommandTimeout { host: host.into(), what: what.into(), timeout_s: timeout.as_secs() };
        }
        SshError::Command { host: host.into(), what: what.into(), detail: e.to_string() }
    }
}

/// Per-host limits and trust policy, from the recipe's `[cluster]` keys.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Limits {
    /// TCP connect, handshake and authentication together.
    pub connect: Duration,
    /// The longest wait for progress in one remote command.
    pub command: Duration,
    /// How long an established link may stay silent before it counts as cut.
    pub link: Duration,
    /// Trust unknown host keys on first use (never changed ones).
    pub accept_new: bool,
}

impl Limits {
    pub fn from_recipe(c: &crate::recipe::Cluster) -> Limits {
        Limits {
            connect: Duration::from_secs(c.ssh.connect_timeout_s),
            command: Duration::from_secs(c.ssh.command_timeout_s),
            link: Duration::from_secs(c.ssh.link_timeout_s),
            accept_new: c.ssh.accept_new_host_keys,
        }
    }
}
