//! The agent's upstream link: one server connection at a time, handshake, replay, acks, commands.
//! A server reaches it on the agent socket or, when the agent listens on TCP, on its port.
use super::{outbox, Input};
use crate::collective::auth::Gate;
use crate::ids::RunId;
use crate::protocol::tcp_link::LinkStream;
use crate::protocol::{read_frame_async, write_frame_async, AgentCommand, Hello, Role, PROTOCOL_VERSION};
use crate::sync::lock;
use std::sync::{Arc, Mutex};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::{mpsc, watch, Notify};

/// Bytes of frames per write at most: everything new since the last write goes in one, and a
/// replayed backlog in pieces of this size.
const WRITE_BYTES: usize = 256 * 1024;
/// How long the link waits after news before writing, to gather what follows it; small next
/// to the server's 100 ms batches, so it adds nothing a reader of the run could see.
const COALESCE: std::time::Duration = std::time::Duration::from_millis(20);

/// Accepts server connections forever, on the agent socket and (under Slurm) the agent's TCP
/// port; a new connection replaces the old one (a restarted server), which is how reattaching
/// works.
pub async fn serve(
    listener: UnixListener,
    tcp: Option<(TcpListener, Gate)>,
    outbox: Arc<Mutex<outbox::Outbox>>,
    newest: watch::Receiver<u64>,
    acked: Arc<Notify>,
    tx: mpsc::Sender<Input>,
    run: RunId,
) {
    let (accepted_tx, mut accepted) = mpsc::channel::<LinkStream>(4);
    tokio::spawn(accept_unix(listener, accepted_tx.clone(), tx.clone()));
    if let Some((listener, gate)) = tcp {
        tokio::spawn(accept_tcp(listener, gate, accepted_tx));
    } else {
        drop(accepted_tx);
    }
    let mut current: Option<tokio::task::JoinHandle<()>> = None;
    while let Some(stream) = accepted.recv().await {
        if let Some(old) = current.take() {
            old.abort();
        }
        let conn = Conn { outbox: outbox.clone(), newest: newest.clone(), acked: acked.clone(), tx: tx.clone() };
        let run = run.clone();
        current = Some(tokio::spawn(async move {
            if let Err(e) = conn.run(stream, run).await {
                tracing::info!("server link ended: {e}");
            }
        }));
    }
}

/// The agent socket: only this user (or root) may take the link.
async fn accept_unix(listener: UnixListener, accepted: mpsc::Sender<LinkStream>, tx: mpsc::Sender<Input>) {
    let mut refused = 0;
    loop {
        match listener.accept().await {
            Ok((s, _)) => match crate::private_files::check_peer(&s) {
                Ok(()) => {
                    if accepted.send(Box::new(s)).await.is_err() {
                        return;
                    }
                }
                Err(who) => {
                    // Never taken for a server: a new connection would replace the real one.
                    refused += 1;
                    tracing::warn!("refused a connection to the agent socket: {who}");
                    let refusal = who.refusal("agent socket", refused);
                    let _ = tx.send(Input::Event(crate::protocol::AgentEvent::Refused(refusal))).await;
                }
            },
            Err(e) => tracing::warn!("accept on the agent socket: {e}"),
        }
    }
}

/// The agent's TCP port: only a peer that proves the run's secret may take the link.
async fn accept_tcp(listener: TcpListener, gate: Gate, accepted: mpsc::Sender<LinkStream>) {
    loop {
        match listener.accept().await {
            Ok((s, _)) => {
                let (gate, accepted) = (gate.clone(), accepted.clone());
                // Each handshake on its own task: a silent peer holds up nobody else.
                tokio::spawn(async move {
                    if let Ok(stream) = crate::protocol::tcp_link::accept(s, gate).await {
                        let _ = accepted.send(stream).await;
                    }
                });
            }
            Err(e) => tracing::warn!("accept on the agent port: {e}"),
        }
    }
}

struct Conn {
    outbox: Arc<Mutex<outbox::Outbox>>,
    newest: watch::Receiver<u64>,
    acked: Arc<Notify>,
    tx: mpsc::Sender<Input>,
}

impl Conn {
    async fn run(mut self, stream: LinkStream, run: RunId) -> anyhow::Result<()> {
        let (mut rd, mut wr) = tokio::io::split(stream);
        let hello: Hello = read_frame_async(&mut rd).await?.ok_or_else(|| anyhow::anyhow!("closed before hello"))?;
        write_frame_async(&mut wr, &Hello::new(Role::Agent, "local")).await?;
        if hello.protocol_version != PROTOCOL_VERSION {
            anyhow::bail!(
                "refused a peer speaking protocol {} (this agent speaks {PROTOCOL_VERSION})",
                hello.protocol_version
            );
        }
        let mut sent = match read_frame_async::<AgentCommand, _>(&mut rd).await? {
            Some(AgentCommand::Attach { run: asked, after_seq }) if asked == run => after_seq,
            Some(AgentCommand::Attach { run: asked, .. }) => {
                anyhow::bail!("asked for run {asked}, this agent runs {run}")
            }
            other => anyhow::bail!("expected Attach first, got {other:?}"),
        };
        tracing::info!("server attached, replaying after seq {sent}");
        // Reads commands on their own task so a slow writer never delays an ack.
        let (outbox, acked, tx) = (self.outbox.clone(), self.acked.clone(), self.tx.clone());
        let reader = tokio::spawn(async move {
            while let Ok(Some(cmd)) = read_frame_async::<AgentCommand, _>(&mut rd).await {
                match cmd {
                    AgentCommand::Ack { seq } => {
                        lock(&outbox).ack(seq);
                        acked.notify_one();
                    }
                    AgentCommand::Stop => {
                        let _ = tx.send(Input::Stop).await;
                    }
                    AgentCommand::Kill => {
                        let _ = tx.send(Input::Kill).await;
                    }
                    AgentCommand::DumpStacks { request, rank, native } => {
                        let _ = tx.send(Input::DumpStacks { request, rank, native }).await;
                    }
                    AgentCommand::Attach { .. } => {
                        tracing::warn!("second Attach on one connection ignored")
                    }
                }
            }
        });
        let result = async {
            loop {
                while let Some((bytes, last)) = outbox::encode_after(&self.outbox, sent, WRITE_BYTES) {
                    wr.write_all(&bytes).await?;
                    sent = last;
                }
                if self.newest.changed().await.is_err() {
                    return Ok::<(), anyhow::Error>(());
                }
                // What the ranks print in the next few milliseconds goes in the same write: a
                // node of 8 ranks at 10 steps/s makes about 50 writes a second, not 160.
                tokio::time::sleep(COALESCE).await;
            }
        }
        .await;
        reader.abort();
        result
    }
}
