//! How the server reaches one node's agent (its Unix socket, an SSH exec channel bridged to
//! it, or its TCP port under Slurm), and the task that keeps that link up: handshake, attach after the last frame received,
//! acks and commands down, frames up, and reconnecting when an SSH link is cut.
use crate::ids::RunId;
use crate::protocol::frame::whole_frame_at_front;
use crate::protocol::tcp_link::LinkStream;
use crate::protocol::{read_frame_async, write_frame_async, AgentCommand, AgentFrame, Hello, Role, PROTOCOL_VERSION};
use crate::ssh::bridge::BridgeEnd;
use crate::ssh::launch::RemoteAgent;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::WriteHalf;
use tokio::net::UnixStream;
use tokio::sync::{mpsc, oneshot, watch};

/// Batches of frames read ahead of the run's link task, per node.
const READ_AHEAD: usize = 64;
/// Frames per batch at most: what one read brought, so a busy node's frames take one trip
/// through the channels per read rather than one each.
const BATCH_MAX: usize = 1024;
/// A reconnect window is this many link timeouts: long enough to ride out a switch reboot,
/// short enough that a node that is gone for good marks the run interrupted.
const WINDOW_LINK_TIMEOUTS: u32 = 20;

#[derive(Clone, Debug)]
pub enum Transport {
    Local(PathBuf),
    Ssh(Arc<RemoteAgent>),
    Tcp(Arc<TcpAgent>),
}

/// An agent that listens on TCP (started by Slurm on a compute node).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct TcpAgent {
    /// The node's name (Slurm's), for messages.
    pub node: String,
    /// `address:port` as the server dials it.
    pub addr: String,
    pub secret: crate::collective::auth::RunSecret,
    /// An established link silent this long counts as cut (`cluster.link_timeout_s`).
    pub link_timeout_s: u64,
}

/// Why a link could not be (re)opened; `permanent` when the agent is known to be gone.
#[derive(Debug)]
pub struct OpenError {
    pub permanent: bool,
    pub message: String,
}

impl std::fmt::Display for OpenError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl Transport {
    pub fn describe(&self) -> String {
        match self {
            Transport::Local(p) => p.display().to_string(),
            Transport::Ssh(a) => a.target.display(),
            Transport::Tcp(a) => format!("{} ({})", a.node, a.addr),
        }
    }

    /// Whether the link crosses a network (its cuts are news; a local socket's are not).
    fn remote(&self) -> bool {
        !matches!(self, Transport::Local(_))
    }

    /// How long to keep trying after a link is cut; zero = one immediate try.
    fn window(&self) -> Duration {
        match self {
            Transport::Local(_) => Duration::ZERO,
            Transport::Ssh(a) => a.limits.link * WINDOW_LINK_TIMEOUTS,
            Transport::Tcp(a) => Duration::from_secs(a.link_timeout_s) * WINDOW_LINK_TIMEOUTS,
        }
    }

    async fn open(&self) -> Result<(LinkStream, Option<oneshot::Receiver<BridgeEnd>>), OpenError> {
        match self {
            Transport::Local(path) => UnixStream::connect(path)
                .await
                .map(|s| (Box::new(s) as LinkStream, None))
                .map_err(|e| OpenError { permanent: true, message: format!("{}: {e}", path.display()) }),
            Transport::Tcp(agent) => {
                let limit = Duration::from_secs(agent.link_timeout_s);
                match crate::protocol::tcp_link::dial(&agent.addr, &agent.secret, limit).await {
                    Ok(stream) => Ok((stream, None)),
                    // The node answered, and nothing listens on the agent's port: its agent has
                    // exited (or the node rebooted), and never comes back there.
                    Err(e) if e.refused => Err(OpenError {
                        permanent: true,
                        message: format!("the agent on {} is gone: {}", agent.node, e.message),
                    }),
                    Err(e) => Err(OpenError { permanent: false, message: e.message }),
                }
            }
            Transport::Ssh(agent) => {
                let agent = agent.clone();
                let opened = tokio::task::spawn_blocking(move || crate::ssh::bridge::open(&agent)).await;
                let (std_stream, end) = opened
                    .map_err(|e| OpenError { permanent: false, message: e.to_string() })?
                    .map_err(|e| OpenError { permanent: false, message: e.to_string() })?;
                let _ = std_stream.set_nonblocking(true);
                let stream = UnixStream::from_std(std_stream)
                    .map_err(|e| OpenError { permanent: false, message: e.to_string() })?;
                Ok((Box::new(stream) as LinkStream, Some(end)))
            }
        }
    }
}

/// One open, attached link.
pub struct Conn {
    frames: mpsc::Receiver<Vec<AgentFrame>>,
    wr: WriteHalf<LinkStream>,
    end: Option<oneshot::Receiver<BridgeEnd>>,
}

impl Conn {
    /// How the SSH bridge ended, if this is one.
    async fn bridge_end(&mut self) -> Option<BridgeEnd> {
        wait_end(self.end.take()).await
    }
}

/// Waits briefly for an SSH bridge's word on how it ended (it closes the link, then the channel).
async fn wait_end(end: Option<oneshot::Receiver<BridgeEnd>>) -> Option<BridgeEnd> {
    tokio::time::timeout(Duration::from_secs(3), end?).await.ok()?.ok()
}

/// Opens the link, exchanges hellos and asks for the frames after `after_seq`.
pub async fn connect(t: &Transport, run: &RunId, after_seq: u64) -> Result<Conn, OpenError> {
    let (stream, end) = t.open().await?;
    let mut conn_end = end;
    let handshake = async {
        let (mut rd, mut wr) = tokio::io::split(stream);
        write_frame_async(&mut wr, &Hello::new(Role::Server, "local")).await?;
        let hello: Hello = read_frame_async(&mut rd)
            .await?
            .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "the agent closed before hello"))?;
        if hello.protocol_version != PROTOCOL_VERSION {
            let msg = format!("agent speaks protocol {}, this server {PROTOCOL_VERSION}", hello.protocol_version);
            return Err(std::io::Error::other(msg));
        }
        write_frame_async(&mut wr, &AgentCommand::Attach { run: run.clone(), after_seq }).await?;
        Ok((rd, wr))
    };
    // An SSH node can accept TCP and then say nothing; the handshake is bounded too.
    let limit = match t {
        Transport::Local(_) => Duration::from_secs(30),
        Transport::Ssh(a) => a.limits.command,
        Transport::Tcp(a) => Duration::from_secs(a.link_timeout_s.max(30)),
    };
    let result = tokio::time::timeout(limit, handshake).await;
    let (rd, wr) = match result {
        Ok(Ok(x)) => x,
        other => {
            let message = match other {
                Ok(Err(e)) => e.to_string(),
                _ => format!("no handshake within {} s", limit.as_secs()),
            };
            let end = wait_end(conn_end.take()).await;
            let permanent = matches!(t, Transport::Local(_)) || end.as_ref().is_some_and(|e| e.agent_gone);
            let detail = end.map(|e| format!(" ({})", e.detail)).unwrap_or_default();
            return Err(OpenError { permanent, message: format!("{message}{detail}") });
        }
    };
    // Reading on its own task keeps the link's select loop cancel-safe.
    let (tx, frames) = mpsc::channel(READ_AHEAD);
    tokio::spawn(async move {
        // Buffered: a frame is a few dozen bytes, and unbuffered each took two reads.
        let mut rd = tokio::io::BufReader::with_capacity(64 * 1024, rd);
        while let Ok(Some(f)) = read_frame_async::<AgentFrame, _>(&mut rd).await {
            let mut batch = vec![f];
            // Every further frame the read already brought: no waiting for more.
            while batch.len() < BATCH_MAX && whole_frame_at_front(rd.buffer()) {
                match read_frame_async::<AgentFrame, _>(&mut rd).await {
                    Ok(Some(f)) => batch.push(f),
                    _ => break,
                }
            }
            if tx.send(batch).await.is_err() {
                break;
            }
        }
    });
    Ok(Conn { frames, wr, end: conn_end })
}

/// `connect`, tried again with backoff until the transport's window closes (SSH), or once
/// (local), unless the agent is known to be gone.
pub async fn connect_within(t: &Transport, run: &RunId, after_seq: u64) -> Result<Conn, OpenError> {
    let deadline = tokio::time::Instant::now() + t.window();
    let mut backoff = Duration::from_millis(250);
    loop {
        match connect(t, run, after_seq).await {
            Ok(c) => return Ok(c),
            Err(e) if e.permanent || tokio::time::Instant::now() >= deadline => return Err(e),
            Err(e) => tracing::info!("run {run}: connecting to {} failed, retrying: {e}", t.describe()),
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(2));
    }
}

/// What a node's task tells the run's link task.
#[derive(Debug)]
pub enum Incoming {
    /// Frames from node `k`, in order.
    Frames(usize, Vec<AgentFrame>),
    /// The link was cut; reconnecting.
    Down(usize, String),
    /// Reconnected; the agent replays after this sequence number.
    Up(usize, u64),
    /// Gave up on this node: its agent is gone or unreachable for the whole window.
    Lost(usize, String),
}

/// The run's side of a node task.
pub struct NodeHandle {
    /// The node's last durable frame; every change is sent to the agent as an ack.
    pub acks: watch::Sender<u64>,
    pub cmds: mpsc::Sender<AgentCommand>,
    /// Set once the node's RunEnded frame arrived: its agent's exit is then expected.
    pub ended: Arc<AtomicBool>,
    /// The node task: it ends once the last ack is delivered (or the link is gone).
    pub task: tokio::task::JoinHandle<()>,
}

/// Starts the task that keeps node `k`'s link up.
pub fn spawn_node(
    k: usize,
    t: Transport,
    run: RunId,
    conn: Conn,
    after_seq: u64,
    incoming: mpsc::Sender<Incoming>,
    queued: Arc<AtomicUsize>,
) -> NodeHandle {
    let (acks, acks_rx) = watch::channel(after_seq);
    // Commands are few (stop, kill); 8 is plenty.
    let (cmds, cmds_rx) = mpsc::channel(8);
    let ended = Arc::new(AtomicBool::new(false));
    let task = NodeTask {
        k,
        t,
        run,
        incoming,
        queued,
        acks: acks_rx,
        cmds: cmds_rx,
        ended: ended.clone(),
        last_seq: after_seq,
        unsent: None,
    };
    let task = tokio::spawn(task.run(conn));
    NodeHandle { acks, cmds, ended, task }
}

struct NodeTask {
    k: usize,
    t: Transport,
    run: RunId,
    incoming: mpsc::Sender<Incoming>,
    /// Frames sent on `incoming` and not yet taken by the run's link task (all nodes).
    queued: Arc<AtomicUsize>,
    acks: watch::Receiver<u64>,
    cmds: mpsc::Receiver<AgentCommand>,
    ended: Arc<AtomicBool>,
    last_seq: u64,
    /// A command whose write failed: sent again on the next link.
    unsent: Option<AgentCommand>,
}

enum Served {
    /// The run's link task is gone: nothing more to do.
    RunOver,
    Cut(String),
}

impl NodeTask {
    async fn run(mut self, mut conn: Conn) {
        loop {
            let why = match self.serve(&mut conn).await {
                Served::RunOver => return,
                Served::Cut(why) => why,
            };
            if self.ended.load(Ordering::SeqCst) {
                return; // the agent exited after its run ended
            }
            if let Some(end) = conn.bridge_end().await {
                if end.agent_gone {
                    let _ = self.incoming.send(Incoming::Lost(self.k, end.detail)).await;
                    return;
                }
            }
            tracing::warn!("run {} node {} ({}): link cut: {why}", self.run, self.k, self.t.describe());
            // A local agent's link is only cut when the agent dies: no news until we know.
            let remote = self.t.remote();
            if remote {
                let _ = self.incoming.send(Incoming::Down(self.k, why)).await;
            }
            match self.reconnect().await {
                Ok(c) => {
                    conn = c;
                    if remote {
                        let _ = self.incoming.send(Incoming::Up(self.k, self.last_seq)).await;
                    }
                }
                Err(e) => {
                    let _ = self.incoming.send(Incoming::Lost(self.k, e)).await;
                    return;
                }
            }
        }
    }

    async fn reconnect(&mut self) -> Result<Conn, String> {
        connect_within(&self.t, &self.run, self.last_seq).await.map_err(|e| e.message)
    }

    async fn serve(&mut self, conn: &mut Conn) -> Served {
        // A fresh link first hears what is already durable, and any command that was cut off.
        let first = [Some(AgentCommand::Ack { seq: *self.acks.borrow_and_update() }), self.unsent.take()];
        for cmd in first.into_iter().flatten() {
            if let Err(e) = write_frame_async(&mut conn.wr, &cmd).await {
                self.unsent = Some(cmd).filter(|c| !matches!(c, AgentCommand::Ack { .. }));
                return Served::Cut(e.to_string());
            }
        }
        let mut cmds_open = true;
        loop {
            tokio::select! {
                f = conn.frames.recv() => match f {
                    Some(frames) => {
                        self.last_seq = frames.last().map_or(self.last_seq, |f| f.seq);
                        self.queued.fetch_add(frames.len(), Ordering::SeqCst);
                        if self.incoming.send(Incoming::Frames(self.k, frames)).await.is_err() {
                            return Served::RunOver;
                        }
                    }
                    None => return Served::Cut("the link ended".into()),
                },
                changed = self.acks.changed() => {
                    if changed.is_err() {
                        return Served::RunOver;
                    }
                    let seq = *self.acks.borrow_and_update();
                    if let Err(e) = write_frame_async(&mut conn.wr, &AgentCommand::Ack { seq }).await {
                        return Served::Cut(format!("sending ack {seq}: {e}"));
                    }
                }
                cmd = self.cmds.recv(), if cmds_open => match cmd {
                    Some(cmd) => {
                        if let Err(e) = write_frame_async(&mut conn.wr, &cmd).await {
                            self.unsent = Some(cmd);
                            return Served::Cut(e.to_string());
                        }
                    }
                    None => cmds_open = false,
                },
            }
        }
    }
}
