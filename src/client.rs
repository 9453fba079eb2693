//! A client of the database's server: connects, starting the server on demand (like tmux).
use crate::paths::DbPaths;
use crate::protocol::{read_frame_async, write_frame_async, Hello, Reply, Request, Role, PROTOCOL_VERSION};
use anyhow::Context;
use std::process::Command;
use std::time::Duration;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::UnixStream;

/// Reconnections in a row, with no progress between them, before a follower (headless or the
/// cockpit) gives up on a server that keeps dying.
pub const RECONNECTS: u32 = 3;

pub struct Client {
    rd: OwnedReadHalf,
    wr: OwnedWriteHalf,
}

impl Client {
    /// Connects to the server of `db`, starting one if none is running. A server that is
    /// exiting as we arrive (idle: no run, no client) refuses, or closes the connection before
    /// the handshake: then a new one is started, or the one another client is starting is
    /// waited for, and the connection is tried again.
    pub async fn connect(db: &DbPaths) -> anyhow::Result<Client> {
        let mut last = None;
        for attempt in 0..CONNECT_ATTEMPTS {
            match handshake(db).await {
                Ok(client) => return Ok(client),
                Err(Handshake::Version(theirs)) => anyhow::bail!(
                    "the server of {} speaks protocol {theirs}, this client {PROTOCOL_VERSION}: stop it and retry",
                    db.root.display()
                ),
                Err(Handshake::Unreachable(e)) => last = Some(e),
            }
            if attempt > 0 {
                tokio::time::sleep(CONNECT_RETRY).await;
            }
            let db2 = db.clone();
            tokio::task::spawn_blocking(move || start_server(&db2)).await??;
        }
        Err(anyhow::anyhow!(
            "cannot reach the server at {}: {}",
            db.server_socket().display(),
            last.map(|e| format!("{e:#}")).unwrap_or_default()
        ))
    }

    /// Sends a request and waits for its one reply.
    /// Sends `req` and returns its one answer (launch progress lines before it are skipped:
    /// whoever wants them reads the stream with `next`).
    pub async fn request(&mut self, req: &Request) -> anyhow::Result<Reply> {
        self.send(req).await?;
        loop {
            match self.next().await? {
                Some(Reply::LaunchProgress { .. }) => continue,
                Some(reply) => return Ok(reply),
                None => anyhow::bail!("the server closed the connection"),
            }
        }
    }

    pub async fn send(&mut self, req: &Request) -> anyhow::Result<()> {
        Ok(write_frame_async(&mut self.wr, req).await?)
    }

    /// The next reply of a streamed request, or why the connection broke (the server died or
    /// hung up): for followers that reconnect rather than fail.
    pub async fn next_or_lost(&mut self) -> Result<Reply, String> {
        match self.next().await {
            Ok(Some(reply)) => Ok(reply),
            Ok(None) => Err("it closed the connection".into()),
            Err(e) => Err(format!("{e:#}")),
        }
    }

    /// The next reply of a streamed request; None when the server hung up.
    pub async fn next(&mut self) -> anyhow::Result<Option<Reply>> {
        Ok(read_frame_async(&mut self.rd).await?)
    }
}

/// Starts `flightdeck server` in its own session and waits for its "ready" line. A server that
/// lost the race for the database lock (another is starting, or one is exiting) says so on its
/// last stderr line and exits: the caller then tries to connect again.
fn start_server(db: &DbPaths) -> anyhow::Result<()> {
    std::fs::create_dir_all(&db.root).with_context(|| format!("creating {}", db.root.display()))?;
    let exe = std::env::current_exe().context("locating the flightdeck executable")?;
    let mut cmd = Command::new(exe);
    cmd.arg("--db").arg(&db.root).arg("server");
    let stderr_log = db.root.join("server.stderr");
    let ready = crate::detach::spawn_until_ready(cmd, &stderr_log).context("starting the flightdeck server")?;
    match ready {
        crate::detach::Ready::Yes => Ok(()),
        // What it said on its way out needs no disk: the log may be on a full one.
        crate::detach::Ready::No(Some(why)) => {
            anyhow::bail!("the server for {} did not start: {why}", db.root.display())
        }
        crate::detach::Ready::No(None) if crate::detach::log_tail(&stderr_log, 1).contains("already owns") => Ok(()),
        crate::detach::Ready::No(None) => anyhow::bail!(
            "the server for {} did not start: {}",
            db.root.display(),
            crate::detach::log_tail(&stderr_log, 1)
        ),
    }
}

/// Why a connection attempt gave no client.
enum Handshake {
    /// No socket, refused, or closed before the handshake ended: worth another try.
    Unreachable(anyhow::Error),
    /// A server of another build: trying again will not help.
    Version(u32),
}

/// Tries for about five seconds: long enough for an exiting server to let go of the lock.
const CONNECT_ATTEMPTS: u32 = 100;
const CONNECT_RETRY: Duration = Duration::from_millis(50);

async fn handshake(db: &DbPaths) -> Result<Client, Handshake> {
    let unreachable = |e: anyhow::Error| Handshake::Unreachable(e);
    let stream = UnixStream::connect(db.server_socket()).await.map_err(|e| unreachable(e.into()))?;
    let (mut rd, mut wr) = stream.into_split();
    write_frame_async(&mut wr, &Hello::new(Role::Client, "local")).await.map_err(|e| unreachable(e.into()))?;
    let hello: Hello = read_frame_async(&mut rd)
        .await
        .map_err(|e| unreachable(e.into()))?
        .ok_or_else(|| unreachable(anyhow::anyhow!("the server closed the connection during the handshake")))?;
    if hello.protocol_version != PROTOCOL_VERSION {
        return Err(Handshake::Version(hello.protocol_version));
    }
    Ok(Client { rd, wr })
}
