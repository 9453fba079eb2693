//! A client of the database's server: connects, starting the server on demand (like tmux).
use crate::paths::DbPaths;
use crate::protocol::{read_frame_async, write_frame_async, Hello, Reply, Request, Role, PROTOCOL_VERSION};
use anyhow::Context;
use std::process::Command;
use std::time::Duration;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::UnixStream;

pub struct Client {
    rd: OwnedReadHalf,
    wr: OwnedWriteHalf,
}

impl Client {
    /// Connects to the server of `db`, starting one if none is running.
    pub async fn connect(db: &DbPaths) -> anyhow::Result<Client> {
        let stream = match UnixStream::connect(db.server_socket()).await {
            Ok(s) => s,
            Err(_) => {
                let db2 = db.clone();
                tokio::task::spawn_blocking(move || start_server(&db2)).await??;
                connect_with_retry(db).await?
            }
        };
        let (mut rd, mut wr) = stream.into_split();
        write_frame_async(&mut wr, &Hello::new(Role::Client, "local")).await?;
        let hello: Hello = read_frame_async(&mut rd)
            .await?
            .ok_or_else(|| anyhow::anyhow!("the server closed the connection during the handshake"))?;
        if hello.protocol_version != PROTOCOL_VERSION {
            anyhow::bail!(
                "the server of {} speaks protocol {}, this client {PROTOCOL_VERSION}: stop it and retry",
                db.root.display(),
                hello.protocol_version
            );
        }
        Ok(Client { rd, wr })
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

    /// The next reply of a streamed request; None when the server hung up.
    pub async fn next(&mut self) -> anyhow::Result<Option<Reply>> {
        Ok(read_frame_async(&mut self.rd).await?)
    }
}

/// Starts `flightdeck server` in its own session and waits for its "ready" line. A server that
/// lost the race for the database lock prints nothing and exits: the winner is then connected.
fn start_server(db: &DbPaths) -> anyhow::Result<()> {
    std::fs::create_dir_all(&db.root).with_context(|| format!("creating {}", db.root.display()))?;
    let exe = std::env::current_exe().context("locating the flightdeck executable")?;
    let mut cmd = Command::new(exe);
    cmd.arg("--db").arg(&db.root).arg("server");
    let stderr_log = db.root.join("server.stderr");
    let ready = crate::detach::spawn_until_ready(cmd, &stderr_log).context("starting the flightdeck server")?;
    let stderr = std::fs::read_to_string(&stderr_log).unwrap_or_default();
    if !ready && !stderr.contains("already owns") {
        anyhow::bail!(
            "the server for {} did not start: {}",
            db.root.display(),
            crate::detach::log_tail(&stderr_log, 1)
        );
    }
    Ok(())
}

/// Only reached when another client's server won the race and may still be binding.
async fn connect_with_retry(db: &DbPaths) -> anyhow::Result<UnixStream> {
    let mut last_err = None;
    for _ in 0..100 {
        match UnixStream::connect(db.server_socket()).await {
            Ok(s) => return Ok(s),
            Err(e) => last_err = Some(e),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err(anyhow::anyhow!(
        "cannot reach the server at {}: {}",
        db.server_socket().display(),
        last_err.map(|e| e.to_string()).unwrap_or_default()
    ))
}
