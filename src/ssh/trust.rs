//! Host key trust: the node's key is checked against known_hosts before anything is sent.
//!
//! Unknown keys are refused with their fingerprint and the exact line that would trust them;
//! changed keys are refused loudly, whatever the options; `accept_new` trusts unknown keys on
//! first use and records them, like OpenSSH's `StrictHostKeyChecking accept-new`.
use super::config::Target;
use ssh2::{CheckResult, HashType, HostKeyType, KnownHostFileKind, Session};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum TrustError {
    #[error("{host}: the node offered no host key")]
    NoKey { host: String },
    #[error(
        "{host}: host key not known, refusing to connect. The node presents {key_type} key {fingerprint}. \
         If that is the node's key (on the node: ssh-keygen -lf /etc/ssh/ssh_host_{short}_key.pub), trust it by \
         adding this line to {file}:\n    {line}\nor launch once with --accept-new-host-keys (trusts keys on first \
         use, like OpenSSH's accept-new; a changed key is still refused)"
    )]
    Unknown { host: String, key_type: String, short: String, fingerprint: String, line: String, file: String },
    #[error(
        "{host}: @@@ WARNING: THE HOST KEY HAS CHANGED @@@ refusing to connect. The node now presents {key_type} \
         key {fingerprint}, which does not match the key recorded in {files}. Someone could be intercepting the \
         connection, or the node was reinstalled. If the change is expected, remove the old key with \
         `ssh-keygen -R '{pattern}' -f FILE` and trust the new one"
    )]
    Changed { host: String, key_type: String, fingerprint: String, files: String, pattern: String },
    #[error("{host}: cannot check the host key: {detail}")]
    Check { host: String, detail: String },
    #[error("{host}: recording the new host key in {file}: {source}")]
    Record { host: String, file: PathBuf, source: std::io::Error },
}

/// How a node's key stood against known_hosts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    Known,
    /// Unknown, and recorded because new keys are accepted: the fingerprint.
    AcceptedNew(String),
}

/// Serialises appends from the fan-out threads to one known_hosts file.
static RECORD: Mutex<()> = Mutex::new(());

/// Checks the session's host key (after the handshake, before authentication).
pub fn check(sess: &Session, t: &Target, accept_new: bool) -> Result<Verdict, Box<TrustError>> {
    let host = t.display();
    let (key, kind) = sess.host_key().ok_or_else(|| TrustError::NoKey { host: host.clone() })?;
    let fingerprint = fingerprint(sess);
    let (key_type, short) = key_names(kind);
    let mut known = sess.known_hosts().map_err(|e| TrustError::Check { host: host.clone(), detail: e.to_string() })?;
    for file in t.known_hosts.iter().filter(|f| f.is_file()) {
        known.read_file(file, KnownHostFileKind::OpenSSH).map_err(|e| TrustError::Check {
            host: host.clone(),
            detail: format!("reading {}: {e}", file.display()),
        })?;
    }
    let pattern = host_pattern(&t.hostname, t.port);
    match known.check_port(&t.hostname, t.port, key) {
        CheckResult::Match => Ok(Verdict::Known),
        CheckResult::Mismatch => Err(Box::new(TrustError::Changed {
            host,
            key_type: key_type.to_uppercase(),
            fingerprint,
            files: t.known_hosts.iter().map(|f| f.display().to_string()).collect::<Vec<_>>().join(", "),
            pattern,
        })),
        CheckResult::Failure => {
            Err(Box::new(TrustError::Check { host, detail: "libssh2 could not compare the key".into() }))
        }
        CheckResult::NotFound => {
            let line = format!("{pattern} {key_type} {}", base64(key));
            let Some(file) = t.known_hosts.first().cloned() else {
                let detail = "no known_hosts file to record its key in (UserKnownHostsFile is empty)".into();
                return Err(Box::new(TrustError::Check { host, detail }));
            };
            if accept_new || t.accept_new {
                record(&file, &line).map_err(|source| TrustError::Record { host, file, source })?;
                return Ok(Verdict::AcceptedNew(fingerprint));
            }
            Err(Box::new(TrustError::Unknown {
                host,
                key_type: short.to_uppercase(),
                short: short.to_string(),
                fingerprint,
                line,
                file: file.display().to_string(),
            }))
        }
    }
}

/// `SHA256:...` as OpenSSH prints it (unpadded base64 of the key's SHA-256).
pub fn fingerprint(sess: &Session) -> String {
    let hash = sess.host_key_hash(HashType::Sha256).unwrap_or_default();
    format!("SHA256:{}", base64(hash).trim_end_matches('='))
}

/// known_hosts' host field: `host` on port 22, else `[host]:port`.
pub fn host_pattern(host: &str, port: u16) -> String {
    if port == 22 {
        host.to_string()
    } else {
        format!("[{host}]:{port}")
    }
}

/// The key type as known_hosts spells it, and the short name of the host key file.
fn key_names(kind: HostKeyType) -> (&'static str, &'static str) {
    match kind {
        HostKeyType::Rsa => ("ssh-rsa", "rsa"),
        HostKeyType::Dss => ("ssh-dss", "dsa"),
        HostKeyType::Ecdsa256 => ("ecdsa-sha2-nistp256", "ecdsa"),
        HostKeyType::Ecdsa384 => ("ecdsa-sha2-nistp384", "ecdsa"),
        HostKeyType::Ecdsa521 => ("ecdsa-sha2-nistp521", "ecdsa"),
        HostKeyType::Ed25519 => ("ssh-ed25519", "ed25519"),
        HostKeyType::Unknown => ("unknown", "unknown"),
    }
}

/// Appends a line to known_hosts, creating the file (0600) and its directory (0700).
fn record(file: &Path, line: &str) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    let _guard = RECORD.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(dir) = file.parent() {
        std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
    }
    let mut f = std::fs::OpenOptions::new().create(true).append(true).mode(0o600).open(file)?;
    // A file that does not end in a newline would glue our line onto its last one.
    let ends_clean = std::fs::read(file).map(|b| b.last().is_none_or(|c| *c == b'\n')).unwrap_or(true);
    let sep = if ends_clean { "" } else { "\n" };
    f.write_all(format!("{sep}{line}\n").as_bytes())
}

/// Standard base64 with padding (key blobs in known_hosts).
pub fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [chunk[0], *chunk.get(1).unwrap_or(&0), *chunk.get(2).unwrap_or(&0)];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_the_rfc_vectors() {
        for (plain, enc) in
            [("", ""), ("f", "Zg=="), ("fo", "Zm8="), ("foo", "Zm9v"), ("foob", "Zm9vYg=="), ("foobar", "Zm9vYmFy")]
        {
            assert_eq!(base64(plain.as_bytes()), enc);
        }
    }

    #[test]
    fn patterns_and_recording() {
        assert_eq!(host_pattern("10.0.0.1", 22), "10.0.0.1");
        assert_eq!(host_pattern("10.0.0.1", 2222), "[10.0.0.1]:2222");
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("sub/known_hosts");
        record(&file, "a ssh-ed25519 AAAA").unwrap();
        std::fs::OpenOptions::new().append(true).open(&file).unwrap().write_all(b"# no newline").unwrap();
        record(&file, "b ssh-ed25519 BBBB").unwrap();
        let text = std::fs::read_to_string(&file).unwrap();
        assert_eq!(text, "a ssh-ed25519 AAAA\n# no newline\nb ssh-ed25519 BBBB\n");
    }
}
