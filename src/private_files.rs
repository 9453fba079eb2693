//! Everything Flightdeck writes is its user's alone. Each flightdeck process (cockpit, server,
//! agent, worker, on this machine and on every node) sets its umask to 077 as it starts,
//! whatever the user's, so the database, run directories, sockets, logs and checkpoints it
//! creates are 0700 and 0600. The user's own umask travels in `FLIGHTDECK_USER_UMASK` to the
//! programs a `kind = "command"` run starts: their own outputs are theirs to decide (inside a
//! run directory they are private either way, since its directories are 0700).

/// The environment variable that keeps the user's umask (octal) for their own programs.
pub const USER_UMASK_ENV: &str = "FLIGHTDECK_USER_UMASK";

/// Sets this process's umask to 077; the first flightdeck process of a tree records the one it
/// replaced. Call first thing in `main`, before any thread starts.
pub fn restrict() {
    // SAFETY: umask only sets this process's file mode mask.
    let before = unsafe { libc::umask(0o077) };
    if std::env::var_os(USER_UMASK_ENV).is_none() {
        std::env::set_var(USER_UMASK_ENV, format!("{before:03o}"));
    }
}

/// The umask the user had (for their programs), else the usual 022.
pub fn user_umask() -> libc::mode_t {
    std::env::var(USER_UMASK_ENV)
        .ok()
        .and_then(|v| libc::mode_t::from_str_radix(v.trim(), 8).ok())
        .map_or(0o022, |m| m & 0o777)
}

/// The mode of `path` when others (group or world) may read, write or enter it; None when it
/// is owner-only or cannot be read.
pub fn open_to_others(path: &std::path::Path) -> Option<u32> {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(path).ok()?.permissions().mode() & 0o777;
    (mode & 0o077 != 0).then_some(mode)
}

/// Whether the process at the other end of a Unix socket is this user (or root, which no file
/// mode keeps out anyway), from `SO_PEERCRED`: a socket left open to others by its mode (a
/// database on a shared filesystem) still lets nobody else in. Err: who it was.
pub fn check_peer(stream: &tokio::net::UnixStream) -> Result<(), Stranger> {
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    let cred = stream.peer_cred().map_err(|e| Stranger::Unknown(e.to_string()))?;
    match cred.uid() {
        uid if uid == me || uid == 0 => Ok(()),
        uid => Err(Stranger::OtherUser { uid, pid: cred.pid().unwrap_or(0), me }),
    }
}

/// A Unix-socket peer turned away by `check_peer`.
#[derive(Debug)]
pub enum Stranger {
    OtherUser {
        uid: u32,
        pid: i32,
        me: u32,
    },
    /// Its credentials could not be read.
    Unknown(String),
}

impl Stranger {
    /// As a refusal of `listener` (an agent's sockets say so as events, not only in their log).
    pub fn refusal(&self, listener: &str, count: u64) -> crate::protocol::message::Refusal {
        let (peer, reason) = match self {
            Stranger::OtherUser { uid, pid, me } => {
                (format!("uid {uid} (pid {pid})"), format!("another user (this is uid {me})"))
            }
            Stranger::Unknown(e) => ("an unknown process".to_string(), format!("its credentials cannot be read ({e})")),
        };
        crate::protocol::message::Refusal { listener: listener.into(), peer, reason, count }
    }
}

impl std::fmt::Display for Stranger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Stranger::OtherUser { uid, pid, me } => {
                write!(f, "uid {uid} (pid {pid}) is another user (this is uid {me})")
            }
            Stranger::Unknown(e) => write!(f, "its credentials cannot be read ({e})"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_others_can_enter_is_named_with_its_mode() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
        assert_eq!(open_to_others(dir.path()), Some(0o755));
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).expect("chmod");
        assert_eq!(open_to_others(dir.path()), None);
    }
}
