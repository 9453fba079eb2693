//! The agent's upstream link: one server connection at a time, handshake, replay, acks, commands.
use super::{outbox, Input};
use crate::ids::RunId;
use crate::protocol::{read_frame_async, write_frame_async, AgentCommand, Hello, Role, PROTOCOL_VERSION};
use crate::sync::lock;
use std::sync::{Arc, Mutex};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{mpsc, watch, Notify};

/// Accepts server connections forever; a new connection replaces the old one (a restarted
/// server), which is how reattaching works.
pub async fn serve(
    listener: UnixListener,
    outbox: Arc<Mutex<outbox::Outbox>>,
    newest: watch::Receiver<u64>,
    acked: Arc<Notify>,
    tx: mpsc::Sender<Input>,
    run: RunId,
) {
    let mut current: Option<tokio::task::JoinHandle<()>> = None;
    let mut refused = 0;
    loop {
        let stream = match listener.accept().await {
            Ok((s, _)) => match crate::private_files::check_peer(&s) {
                Ok(()) => s,
                Err(who) => {
                    // Never taken for a server: a new connection would replace the real one.
                    refused += 1;
                    tracing::warn!("refused a connection to the agent socket: {who}");
                    let refusal = who.refusal("agent socket", refused);
                    let _ = tx.send(Input::Event(crate::protocol::AgentEvent::Refused(refusal))).await;
                    continue;
                }
            },
            Err(e) => {
                tracing::warn!("accept on the agent socket: {e}");
                continue;
            }
        };
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

struct Conn {
    outbox: Arc<Mutex<outbox::Outbox>>,
    newest: watch::Receiver<u64>,
    acked: Arc<Notify>,
    tx: mpsc::Sender<Input>,
}

impl Conn {
    async fn run(mut self, stream: UnixStream, run: RunId) -> anyhow::Result<()> {
        let (mut rd, mut wr) = stream.into_split();
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
                for frame in outbox::after(&self.outbox, sent) {
                    write_frame_async(&mut wr, &frame).await?;
                    sent = frame.seq;
                }
                if self.newest.changed().await.is_err() {
                    return Ok::<(), anyhow::Error>(());
                }
            }
        }
        .await;
        reader.abort();
        result
    }
}
