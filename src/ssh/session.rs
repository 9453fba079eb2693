//! One SSH session to one node: connect within a deadline, check trust, authenticate, run
//! commands. A `Node` belongs to the thread that made it (ssh2 sessions are never shared).
use super::config::Target;
use super::trust::{self, Verdict};
use super::{Limits, SshError};
use ssh2::Session;
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Instant;

pub struct Node {
    pub sess: Session,
    pub target: Target,
    pub limits: Limits,
    /// How the host key stood and how authentication succeeded, for progress lines.
    pub verdict: Verdict,
    pub auth: String,
}

/// What a remote command printed and how it exited.
#[derive(Debug)]
pub struct Output {
    pub status: i32,
    pub stdout: String,
    pub stderr: String,
}

/// Connects, checks the host key and authenticates, all within `limits.connect`.
pub fn connect(target: &Target, limits: &Limits) -> Result<Node, SshError> {
    let host = target.display();
    let deadline = Instant::now() + limits.connect;
    let fail = |detail: String| SshError::Connect { host: host.clone(), timeout_s: limits.connect.as_secs(), detail };
    let addrs: Vec<_> = (target.hostname.as_str(), target.port)
        .to_socket_addrs()
        .map_err(|e| fail(format!("resolving {}: {e}", target.hostname)))?
        .collect();
    let mut last = format!("{} resolves to no address", target.hostname);
    let mut tcp = None;
    for addr in addrs {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            last = format!("timed out connecting to {addr}");
            break;
        }
        match TcpStream::connect_timeout(&addr, left) {
            Ok(s) => {
                tcp = Some(s);
                break;
            }
            Err(e) => last = format!("{addr}: {e}"),
        }
    }
    let tcp = tcp.ok_or_else(|| fail(last))?;
    let _ = tcp.set_nodelay(true);
    let mut sess = Session::new().map_err(|e| fail(format!("creating a session: {e}")))?;
    sess.set_tcp_stream(tcp);
    sess.set_timeout(ms_left(deadline));
    sess.handshake().map_err(|e| match e.code() {
        ssh2::ErrorCode::Session(-9) => fail("no SSH greeting and key exchange in time".into()),
        _ => SshError::Handshake { host: host.clone(), detail: e.message().to_string() },
    })?;
    let verdict = trust::check(&sess, target, limits.accept_new)?;
    sess.set_timeout(ms_left(deadline));
    let auth = authenticate(&sess, target).map_err(|tried| {
        if Instant::now() >= deadline {
            return fail("authentication did not finish in time".into());
        }
        SshError::Auth { host: host.clone(), user: target.user.clone(), tried }
    })?;
    sess.set_timeout(limits.command.as_millis().min(u128::from(u32::MAX)) as u32);
    Ok(Node { sess, target: target.clone(), limits: limits.clone(), verdict, auth })
}

fn ms_left(deadline: Instant) -> u32 {
    deadline.saturating_duration_since(Instant::now()).as_millis().clamp(1, u128::from(u32::MAX)) as u32
}

/// ssh-agent first, then each identity file; returns how it succeeded, or what was tried.
fn authenticate(sess: &Session, t: &Target) -> Result<String, Vec<String>> {
    let mut tried = Vec::new();
    match &t.agent_socket {
        Some(socket) => match agent_auth(sess, &t.user, socket) {
            Ok(()) if sess.authenticated() => return Ok("ssh-agent".into()),
            Ok(()) => tried.push(format!("ssh-agent at {} (no key accepted)", socket.display())),
            Err(e) => tried.push(format!("ssh-agent at {} ({})", socket.display(), e.message())),
        },
        None => tried.push("ssh-agent (SSH_AUTH_SOCK is not set where the launch was asked)".to_string()),
    }
    for file in &t.identity_files {
        if !file.is_file() {
            tried.push(format!("{} (no such file)", file.display()));
            continue;
        }
        match sess.userauth_pubkey_file(&t.user, None, file, None) {
            Ok(()) if sess.authenticated() => return Ok(format!("key {}", file.display())),
            Ok(()) => tried.push(format!("{} (not accepted)", file.display())),
            // A passphrase-protected key lands here too: such keys belong in ssh-agent.
            Err(e) => tried.push(format!("{} ({})", file.display(), e.message())),
        }
    }
    Err(tried)
}

/// Tries each key of the ssh-agent at `socket` (the asking client's, not this process's own
/// `SSH_AUTH_SOCK`, which libssh2 would read).
fn agent_auth(sess: &Session, user: &str, socket: &std::path::Path) -> Result<(), ssh2::Error> {
    let mut agent = sess.agent()?;
    agent.set_identity_path(socket)?;
    agent.connect()?;
    agent.list_identities()?;
    for id in agent.identities()? {
        if agent.userauth(user, &id).is_ok() && sess.authenticated() {
            break;
        }
    }
    // Disconnecting only closes the agent socket; the session stays authenticated.
    let _ = agent.disconnect();
    Ok(())
}

impl Node {
    pub fn host(&self) -> String {
        self.target.display()
    }

    /// Runs a command line (already quoted), feeding `stdin`, and collects its output. It runs
    /// under umask 077, whatever the node's: what the launcher's own `mkdir` and `cat >` make on
    /// the node (the run directory, the spec with the run's secret) is owner-only from the start.
    pub fn run(&self, what: &str, command: &str, stdin: Option<&[u8]>) -> Result<Output, SshError> {
        let (host, t) = (self.host(), self.limits.command);
        let mut ch = self.sess.channel_session().map_err(|e| SshError::ssh(&host, what, e, t))?;
        ch.exec(&format!("umask 077; {command}")).map_err(|e| SshError::ssh(&host, what, e, t))?;
        if let Some(data) = stdin {
            // Chunked so the per-call timeout measures progress, not the whole upload.
            for chunk in data.chunks(1 << 20) {
                ch.write_all(chunk).map_err(|e| SshError::io(&host, what, e, t))?;
            }
        }
        ch.send_eof().map_err(|e| SshError::ssh(&host, what, e, t))?;
        let mut stdout = String::new();
        ch.read_to_string(&mut stdout).map_err(|e| SshError::io(&host, what, e, t))?;
        let mut stderr = String::new();
        ch.stderr().read_to_string(&mut stderr).map_err(|e| SshError::io(&host, what, e, t))?;
        ch.wait_close().map_err(|e| SshError::ssh(&host, what, e, t))?;
        let status = ch.exit_status().map_err(|e| SshError::ssh(&host, what, e, t))?;
        Ok(Output { status, stdout, stderr })
    }

    /// Starts a command line (already quoted, under umask 077 like `run`) and hands back its
    /// channel, for a stream the caller reads or writes itself; `finish` it afterwards.
    pub fn exec(&self, what: &str, command: &str) -> Result<ssh2::Channel, SshError> {
        let (host, t) = (self.host(), self.limits.command);
        let mut ch = self.sess.channel_session().map_err(|e| SshError::ssh(&host, what, e, t))?;
        ch.exec(&format!("umask 077; {command}")).map_err(|e| SshError::ssh(&host, what, e, t))?;
        Ok(ch)
    }

    /// Like `run`, but a non-zero exit is an error quoting the command's stderr.
    pub fn check(&self, what: &str, command: &str, stdin: Option<&[u8]>) -> Result<String, SshError> {
        let out = self.run(what, command, stdin)?;
        if out.status != 0 {
            let stderr = out.stderr.trim().lines().rev().take(5).collect::<Vec<_>>().join(" | ");
            return Err(SshError::Failed { host: self.host(), what: what.into(), status: out.status, stderr });
        }
        Ok(out.stdout)
    }
}

/// Waits for an `exec` channel's command to end (its stdout read or its stdin closed by the
/// caller); a non-zero exit is an error quoting its stderr.
pub fn finish(mut ch: ssh2::Channel, host: &str, what: &str, t: std::time::Duration) -> Result<(), SshError> {
    let mut rest = Vec::new();
    ch.read_to_end(&mut rest).map_err(|e| SshError::io(host, what, e, t))?;
    let mut stderr = String::new();
    ch.stderr().read_to_string(&mut stderr).map_err(|e| SshError::io(host, what, e, t))?;
    ch.wait_close().map_err(|e| SshError::ssh(host, what, e, t))?;
    let status = ch.exit_status().map_err(|e| SshError::ssh(host, what, e, t))?;
    if status != 0 {
        let stderr = stderr.trim().lines().rev().take(5).collect::<Vec<_>>().join(" | ");
        return Err(SshError::Failed { host: host.into(), what: what.into(), status, stderr });
    }
    Ok(())
}
