//! The ring listener's side of forming a link: every connection it accepts goes through the
//! run's handshake (`auth`, purpose `ring`) and then the ring hello, all of them at once in one
//! `poll`, so a peer that connects and says nothing holds up nobody, and the first connection
//! that proves the secret and names the previous rank becomes the link.
use super::{exchange, left, parse_hello, HELLO_BYTES};
use crate::collective::auth::{Challenge, Gate, HANDSHAKE_TIMEOUT, PROOF_BYTES, RESPONSE_BYTES};
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// The longest one wait in `poll` lasts, so a dial that failed on the other thread ends the
/// accept within this long instead of at the deadline.
const STOP_CHECK: Duration = Duration::from_millis(100);
/// Connections in their handshake at once; more are refused on arrival (a flood of them is a
/// denial of service, which docs/security.md leaves out of scope, but it must not exhaust fds).
const MAX_PENDING: usize = 256;

/// A connection that proved the secret and said who it is.
pub(super) struct Admitted {
    pub stream: TcpStream,
    pub from: SocketAddr,
    pub rank: u32,
    pub world: u32,
}

enum Stage {
    /// The challenge went out; waiting for the answer (gated listeners only).
    Answer(Challenge),
    /// Waiting for the ring hello.
    Hello,
}

struct Pending {
    stream: TcpStream,
    from: SocketAddr,
    stage: Stage,
    got: Vec<u8>,
    since: Instant,
}

enum Step {
    Wait,
    /// Not a peer of this run (or not a ring peer at all): dropped, with the reason.
    Refuse(String),
    /// Holds the secret but its hello is not one.
    Drop(String),
    Done(u32, u32),
}

impl Pending {
    fn need(&self) -> usize {
        match self.stage {
            Stage::Answer(_) => RESPONSE_BYTES,
            Stage::Hello => HELLO_BYTES,
        }
    }

    /// Reads what has arrived and moves the handshake on as far as it goes.
    fn step(&mut self, gate: &Gate) -> Step {
        loop {
            let need = self.need();
            let mut buf = [0u8; RESPONSE_BYTES + HELLO_BYTES];
            let want = need - self.got.len();
            match self.stream.read(&mut buf[..want]) {
                Ok(0) => return Step::Refuse("it closed the connection during the handshake".into()),
                Ok(n) => self.got.extend_from_slice(&buf[..n]),
                Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted) => {
                    return Step::Wait
                }
                Err(e) => return Step::Refuse(format!("reading its handshake failed: {e}")),
            }
            if self.got.len() < need {
                continue;
            }
            let got = std::mem::take(&mut self.got);
            match &self.stage {
                Stage::Answer(challenge) => {
                    let (Some(secret), Ok(answer)) = (gate.secret(), <[u8; RESPONSE_BYTES]>::try_from(&got[..])) else {
                        return Step::Refuse("internal: an answer without a secret".into());
                    };
                    let proof: [u8; PROOF_BYTES] = match challenge.check(secret, &answer) {
                        Ok(proof) => proof,
                        Err(e) => return Step::Refuse(e.to_string()),
                    };
                    // 32 bytes into a fresh socket's empty send buffer: written whole or failed.
                    if let Err(e) = self.stream.write_all(&proof) {
                        return Step::Refuse(format!("sending the proof failed: {e}"));
                    }
                    self.stage = Stage::Hello;
                }
                Stage::Hello => {
                    let hello = <[u8; HELLO_BYTES]>::try_from(&got[..]).ok().and_then(|h| parse_hello(&h));
                    return match (hello, gate.secret()) {
                        (Some((rank, world)), _) => Step::Done(rank, world),
                        (None, Some(_)) => Step::Drop("its hello is not a ring hello".into()),
                        (None, None) => Step::Refuse("not a ring hello".into()),
                    };
                }
            }
        }
    }
}

/// Accepts connections on `listener` until one passes the handshake and `take` keeps it
/// (`Ok(true)`); `take` sees each admitted peer and may end the wait with an error. `stop`
/// ends it early (the other half of the link failed).
pub(super) fn admit(
    listener: &TcpListener,
    gate: &Gate,
    name: &str,
    deadline: Instant,
    stop: &AtomicBool,
    mut take: impl FnMut(&Admitted) -> Result<bool, String>,
) -> Result<Admitted, String> {
    let io_err = |e: io::Error| format!("{name}: accepting failed: {e}");
    // Non-blocking, so that a connection that vanished between poll and accept cannot block us
    // past the deadline.
    listener.set_nonblocking(true).map_err(io_err)?;
    let mut pending: Vec<Pending> = Vec::new();
    loop {
        let now = Instant::now();
        pending.retain(|p| {
            let expired = now.duration_since(p.since) >= HANDSHAKE_TIMEOUT;
            if expired {
                gate.refuse(
                    name,
                    &p.from.to_string(),
                    &format!("it did not finish the handshake within {HANDSHAKE_TIMEOUT:?}"),
                );
            }
            !expired
        });
        let soonest = pending.iter().map(|p| p.since + HANDSHAKE_TIMEOUT).min().map_or(deadline, |t| t.min(deadline));
        let wait_ms = i32::try_from(left(soonest).min(STOP_CHECK).as_millis()).unwrap_or(i32::MAX);
        if left(deadline).is_zero() {
            return Err("did not connect before the timeout".into());
        }
        if stop.load(Ordering::Relaxed) {
            return Err("abandoned: this rank could not link to the next one".into());
        }
        let mut fds: Vec<libc::pollfd> = std::iter::once(listener.as_raw_fd())
            .chain(pending.iter().map(|p| p.stream.as_raw_fd()))
            .map(|fd| libc::pollfd { fd, events: libc::POLLIN, revents: 0 })
            .collect();
        if exchange::poll(&mut fds, wait_ms.max(1)).map_err(io_err)? == 0 {
            continue;
        }
        // The pending ones first (their indices match `fds[1..]`), newest last so removal by
        // index from the back keeps the others' places.
        for i in (0..pending.len()).rev() {
            if fds[i + 1].revents == 0 {
                continue;
            }
            match pending[i].step(gate) {
                Step::Wait => {}
                Step::Refuse(reason) => {
                    let p = pending.swap_remove(i);
                    gate.refuse(name, &p.from.to_string(), &reason);
                }
                Step::Drop(reason) => {
                    let p = pending.swap_remove(i);
                    tracing::warn!("{name}: dropping a connection from {}: {reason}", p.from);
                }
                Step::Done(rank, world) => {
                    let p = pending.swap_remove(i);
                    let admitted = Admitted { stream: p.stream, from: p.from, rank, world };
                    if take(&admitted)? {
                        return Ok(admitted);
                    }
                }
            }
        }
        if fds[0].revents != 0 {
            accept_all(listener, gate, name, &mut pending).map_err(io_err)?;
        }
    }
}

/// Takes every connection waiting on the listener and sends each its challenge.
fn accept_all(listener: &TcpListener, gate: &Gate, name: &str, pending: &mut Vec<Pending>) -> io::Result<()> {
    loop {
        let (mut stream, from) = match listener.accept() {
            Ok(conn) => conn,
            // WouldBlock: all taken; Interrupted: the graceful stop's SIGUSR1.
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if pending.len() >= MAX_PENDING {
            gate.refuse(name, &from.to_string(), &format!("{MAX_PENDING} connections are in their handshake already"));
            continue;
        }
        stream.set_nonblocking(true)?;
        let stage = match gate.secret() {
            Some(_) => {
                let (challenge, bytes) = Challenge::new(crate::collective::auth::Purpose::Ring)?;
                if let Err(e) = stream.write_all(&bytes) {
                    gate.refuse(name, &from.to_string(), &format!("sending the challenge failed: {e}"));
                    continue;
                }
                Stage::Answer(challenge)
            }
            None => Stage::Hello,
        };
        pending.push(Pending { stream, from, stage, got: Vec::new(), since: Instant::now() });
    }
}
