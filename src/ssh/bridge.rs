//! One agent link over SSH: an exec channel running `flightdeck agent connect`, pumped to a
//! local socket pair so the server's link code reads the same byte stream as from a local agent.
//!
//! The pump thread owns the session (made on that thread, never shared) and runs libssh2 in
//! non-blocking mode under `poll`, so both directions flow at once. A cut network is noticed
//! within `limits.link`: keepalives keep data in flight and TCP_USER_TIMEOUT makes the kernel
//! fail the socket when that data goes unacknowledged.
use super::launch::RemoteAgent;
use super::{session, SshError};
use std::io::{ErrorKind, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

/// How a bridge ended, for the server's reconnect decision.
#[derive(Debug, Clone)]
pub struct BridgeEnd {
    /// `agent connect` found no agent: the run's agent has exited; reconnecting is pointless.
    pub agent_gone: bool,
    pub detail: String,
}

/// Bytes buffered per direction before the pump stops reading that side (backpressure).
const BUF_BYTES: usize = 1 << 20;

/// Connects to the node and starts the bridge; returns the server's end of the link and a
/// receiver told how the bridge ended.
pub fn open(agent: &RemoteAgent) -> Result<(UnixStream, tokio::sync::oneshot::Receiver<BridgeEnd>), SshError> {
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let (end_tx, end_rx) = tokio::sync::oneshot::channel();
    let agent = agent.clone();
    let host = agent.target.display();
    let spawned = std::thread::Builder::new().name(format!("ssh-link-{}", agent.index)).spawn(move || {
        let (node, ch, (mine, server_end)) = match connect(&agent) {
            Ok(x) => x,
            Err(e) => {
                let _ = ready_tx.send(Err(e));
                return;
            }
        };
        let _ = ready_tx.send(Ok(server_end));
        let end = pump(&node, ch, mine, agent.limits.link);
        let _ = end_tx.send(end);
    });
    spawned.map_err(|e| SshError::Command {
        host: host.clone(),
        what: "starting a link thread".into(),
        detail: e.to_string(),
    })?;
    let stream = ready_rx.recv().map_err(|_| SshError::Command {
        host,
        what: "opening the link".into(),
        detail: "the link thread ended without a word".into(),
    })??;
    Ok((stream, end_rx))
}

type Opened = (session::Node, ssh2::Channel, (UnixStream, UnixStream));

fn connect(agent: &RemoteAgent) -> Result<Opened, SshError> {
    let node = session::connect(&agent.target, &agent.limits)?;
    let host = node.host();
    let what = "starting `agent connect`";
    tune_socket(node.sess.as_raw_fd(), agent.limits.link);
    let cmd = agent.layout.command(&[
        ("", "agent"),
        ("", "connect"),
        ("", "--run-dir"),
        ("the node's run directory", &agent.run_dir),
    ])?;
    let mut ch = node.sess.channel_session().map_err(|e| SshError::ssh(&host, what, e, agent.limits.command))?;
    ch.exec(&cmd).map_err(|e| SshError::ssh(&host, what, e, agent.limits.command))?;
    let pair = UnixStream::pair().map_err(|e| SshError::io(&host, "socket pair", e, agent.limits.command))?;
    Ok((node, ch, pair))
}

/// TCP keepalive and a user timeout, so a silent network fails the socket within `link`.
fn tune_socket(fd: i32, link: Duration) {
    let set = |level: i32, opt: i32, v: i32| {
        // SAFETY: setsockopt on a descriptor the session owns, with a valid int.
        unsafe {
            libc::setsockopt(fd, level, opt, (&v as *const i32).cast(), std::mem::size_of::<i32>() as libc::socklen_t)
        }
    };
    let secs = link.as_secs().clamp(1, 3600) as i32;
    set(libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1);
    set(libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, (secs / 3).max(1));
    set(libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, (secs / 3).max(1));
    set(libc::IPPROTO_TCP, libc::TCP_KEEPCNT, 3);
    set(libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT, link.as_millis().clamp(1000, 3_600_000) as i32);
}

/// Moves bytes both ways until either side ends or the network fails.
fn pump(node: &session::Node, mut ch: ssh2::Channel, local: UnixStream, link: Duration) -> BridgeEnd {
    let sess = &node.sess;
    let keepalive_every = (link / 3).max(Duration::from_millis(500));
    sess.set_keepalive(true, keepalive_every.as_secs().max(1) as u32);
    sess.set_blocking(false);
    if let Err(e) = local.set_nonblocking(true) {
        return BridgeEnd { agent_gone: false, detail: format!("socket pair: {e}") };
    }
    let mut local = local;
    let (mut up, mut down, mut stderr) = (Vec::new(), Vec::new(), Vec::new());
    let mut buf = vec![0u8; 64 * 1024];
    let mut last_keepalive = Instant::now();
    let reason = loop {
        let mut moved = false;
        // The server's bytes to the node.
        if up.len() < BUF_BYTES {
            match local.read(&mut buf) {
                Ok(0) => break "the server closed the link".to_string(),
                Ok(n) => {
                    up.extend_from_slice(&buf[..n]);
                    moved = true;
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(e) => break format!("local side: {e}"),
            }
        }
        if !up.is_empty() {
            match ch.write(&up) {
                Ok(n) => {
                    up.drain(..n);
                    moved |= n > 0;
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(e) => break format!("sending to the node: {e}"),
            }
        }
        if !down.is_empty() {
            match local.write(&down) {
                Ok(n) => {
                    down.drain(..n);
                    moved |= n > 0;
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(e) => break format!("local side: {e}"),
            }
        }
        if last_keepalive.elapsed() >= keepalive_every {
            last_keepalive = Instant::now();
            if let Err(e) = sess.keepalive_send() {
                if e.code() != ssh2::ErrorCode::Session(-37) {
                    break format!("keepalive: {}", e.message());
                }
            }
        }
        // Reads from the channel last: any call above may have pulled its data off the socket
        // into libssh2's buffers, where poll would not see it.
        if down.len() < BUF_BYTES {
            match ch.read(&mut buf) {
                Ok(0) if ch.eof() => break "the node closed the link".to_string(),
                Ok(n) => {
                    down.extend_from_slice(&buf[..n]);
                    moved |= n > 0;
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(e) => break format!("receiving from the node: {e}"),
            }
        }
        match ch.stderr().read(&mut buf) {
            Ok(n) if stderr.len() < 4096 => stderr.extend_from_slice(&buf[..n]),
            _ => {}
        }
        if moved {
            continue;
        }
        wait(sess, &local, up.len() < BUF_BYTES, !down.is_empty(), keepalive_every);
    };
    // Flush what the node sent last (e.g. the final frames before it closed), then say why.
    let _ = local.set_nonblocking(false);
    let _ = local.write_all(&down);
    drop(local);
    let status = finish(sess, &mut ch);
    let text = String::from_utf8_lossy(&stderr).trim().to_string();
    BridgeEnd {
        agent_gone: status == Some(crate::protocol::spec::NO_AGENT_EXIT),
        detail: if text.is_empty() { reason } else { format!("{reason}; the node said: {text}") },
    }
}

/// Sleeps until the session's socket or the local socket is ready, or the keepalive is due.
fn wait(sess: &ssh2::Session, local: &UnixStream, want_up: bool, want_down: bool, cap: Duration) {
    let dirs = sess.block_directions();
    let mut tcp_events = libc::POLLIN;
    if matches!(dirs, ssh2::BlockDirections::Outbound | ssh2::BlockDirections::Both) {
        tcp_events |= libc::POLLOUT;
    }
    let mut local_events = 0;
    if want_up {
        local_events |= libc::POLLIN;
    }
    if want_down {
        local_events |= libc::POLLOUT;
    }
    let mut fds = [
        libc::pollfd { fd: sess.as_raw_fd(), events: tcp_events, revents: 0 },
        libc::pollfd { fd: local.as_raw_fd(), events: local_events, revents: 0 },
    ];
    let ms = cap.as_millis().clamp(10, 1000) as i32;
    // SAFETY: two valid pollfd structs for the duration of the call.
    unsafe { libc::poll(fds.as_mut_ptr(), 2, ms) };
}

/// Closes the channel briefly and blocking; the remote command's exit status if it came.
fn finish(sess: &ssh2::Session, ch: &mut ssh2::Channel) -> Option<i32> {
    sess.set_blocking(true);
    sess.set_timeout(1000);
    let _ = ch.send_eof();
    let _ = ch.close();
    ch.wait_close().ok()?;
    ch.exit_status().ok()
}
