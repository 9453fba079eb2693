//! The link between a server and an agent that listens on TCP (the Slurm placement: agents on
//! compute nodes the server reaches over the cluster network). The bytes are the same frames as
//! on the agent's Unix socket; the connection first passes the run secret's handshake
//! (`collective::auth`, purpose `agent`), the agent accepting.
use crate::collective::auth::{self, AuthError, Gate, Purpose, RunSecret};
use std::net::ToSocketAddrs;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};

/// A byte stream one server–agent link runs over: a Unix socket, a bridged SSH channel, or an
/// authenticated TCP connection.
pub trait LinkIo: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> LinkIo for T {}
pub type LinkStream = Box<dyn LinkIo>;

/// Why a dial failed; `refused` when the address answered that nothing listens there (the
/// agent has exited: it never comes back on the same port).
#[derive(Debug)]
pub struct DialError {
    pub refused: bool,
    pub message: String,
}

/// Connects to an agent's TCP port and proves the run's secret; each step bounded by `limit`.
pub async fn dial(addr: &str, secret: &RunSecret, limit: Duration) -> Result<LinkStream, DialError> {
    let (addr, secret) = (addr.to_string(), secret.clone());
    let dialed = tokio::task::spawn_blocking(move || -> Result<std::net::TcpStream, DialError> {
        let other = |message: String| DialError { refused: false, message };
        let target = addr
            .to_socket_addrs()
            .map_err(|e| other(format!("{addr}: {e}")))?
            .next()
            .ok_or_else(|| other(format!("{addr}: no address")))?;
        let mut stream = std::net::TcpStream::connect_timeout(&target, limit).map_err(|e| DialError {
            refused: e.kind() == std::io::ErrorKind::ConnectionRefused,
            message: format!("{addr}: {e}"),
        })?;
        let _ = stream.set_nodelay(true);
        keepalive(&stream, limit);
        stream
            .set_read_timeout(Some(limit))
            .and_then(|()| stream.set_write_timeout(Some(limit)))
            .map_err(|e| other(e.to_string()))?;
        auth::dial(&mut stream, &secret, Purpose::Agent).map_err(|e| other(format!("{addr}: {e}")))?;
        stream
            .set_read_timeout(None)
            .and_then(|()| stream.set_write_timeout(None))
            .map_err(|e| other(e.to_string()))?;
        Ok(stream)
    })
    .await
    .map_err(|e| DialError { refused: false, message: e.to_string() })??;
    into_tokio(dialed).map_err(|e| DialError { refused: false, message: e.to_string() })
}

/// The agent's side: the handshake on a fresh connection; Err (reported through `gate`) for a
/// peer without the secret.
pub async fn accept(stream: tokio::net::TcpStream, gate: Gate) -> Result<LinkStream, AuthError> {
    let peer = stream.peer_addr().map(|a| a.to_string()).unwrap_or_else(|_| "an unknown peer".into());
    let mut std_stream = stream.into_std()?;
    let checked = tokio::task::spawn_blocking(move || {
        std_stream.set_nonblocking(false)?;
        std_stream.set_read_timeout(Some(auth::HANDSHAKE_TIMEOUT))?;
        std_stream.set_write_timeout(Some(auth::HANDSHAKE_TIMEOUT))?;
        match gate.accept(&mut std_stream, Purpose::Agent) {
            Ok(()) => {
                std_stream.set_read_timeout(None)?;
                std_stream.set_write_timeout(None)?;
                Ok(std_stream)
            }
            Err(e) => {
                // On a blocking thread: the gate's report may block on the agent's queue.
                gate.refuse("agent port", &peer, &e.to_string());
                Err(e)
            }
        }
    })
    .await
    .map_err(|e| AuthError::Io(std::io::Error::other(e)))??;
    Ok(into_tokio(checked)?)
}

fn into_tokio(stream: std::net::TcpStream) -> std::io::Result<LinkStream> {
    let _ = stream.set_nodelay(true);
    stream.set_nonblocking(true)?;
    Ok(Box::new(tokio::net::TcpStream::from_std(stream)?))
}

/// TCP keepalive probes after `idle`, three of them `idle / 3` apart: a node that died without
/// a word (power, network) cuts the link within about twice `idle`, and the server reconnects
/// or gives the node up. Best effort: without it a dead peer is found by the run's own frames.
fn keepalive(stream: &std::net::TcpStream, idle: Duration) {
    use std::os::fd::AsRawFd;
    let fd = stream.as_raw_fd();
    let idle_s = idle.as_secs().clamp(1, 3600) as libc::c_int;
    let options = [
        (libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1),
        (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, idle_s),
        (libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, (idle_s / 3).max(1)),
        (libc::IPPROTO_TCP, libc::TCP_KEEPCNT, 3),
    ];
    for (level, name, value) in options {
        // SAFETY: setsockopt on an open socket with a pointer to a live c_int and its size.
        unsafe {
            libc::setsockopt(
                fd,
                level,
                name,
                (&value as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            );
        }
    }
}
