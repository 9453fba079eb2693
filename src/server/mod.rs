//! The server: one per database. Owns sled (through the ingest thread), the launchers and the
//! agent links, and serves clients on `server.sock`. Started on demand by clients; exits by
//! itself when no run is live and no client is connected.
mod clients;
mod import;
mod incident;
mod ingest;
mod init;
mod lag;
pub(crate) mod launch;
mod link;
mod placement;
mod queue;
pub(crate) mod recovery;
mod resume;
mod slurm_watch;
pub(crate) mod tracker;
mod transport;

use crate::ids::RunId;
use crate::paths::DbPaths;
use crate::protocol::{AgentCommand, Progress};
use crate::store::{Batch, RunStatus, Store};
use crate::sync::lock;
use anyhow::Context;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, watch};

/// What followers of a live run see.
#[derive(Clone, Debug)]
pub struct RunView {
    pub progress: Progress,
    /// Set once the run has ended: its final status and reason.
    pub ended: Option<(RunStatus, String)>,
}

/// A live run's handles: commands to its agent, and its view.
pub struct Live {
    pub commands: mpsc::Sender<AgentCommand>,
    pub view: watch::Receiver<RunView>,
    /// Each durable batch of frames, for watchers (the cockpit).
    pub frames: tokio::sync::broadcast::Sender<Arc<NodeFrames>>,
    /// Stack dump requests, answered with the ranks' stacks as the agents sent them.
    pub stacks: mpsc::Sender<StackAsk>,
}

/// A client's request for a live run's stacks (`rank` None = every rank).
pub struct StackAsk {
    pub rank: Option<u32>,
    pub native: bool,
    pub reply: tokio::sync::oneshot::Sender<Vec<crate::protocol::RankStacks>>,
}

/// A durable batch of one node's frames (sequence numbers count per node).
#[derive(Debug)]
pub struct NodeFrames {
    pub node: u32,
    pub frames: Vec<crate::protocol::AgentFrame>,
}

/// Live runs by id. Each run's link task inserts and removes its own entry.
pub type Registry = Arc<Mutex<HashMap<RunId, Live>>>;

/// Everything a client handler needs.
#[derive(Clone)]
pub struct Shared {
    pub db: DbPaths,
    pub store: Store,
    ingest: ingest::Ingest,
    pub registry: Registry,
    clients: Arc<AtomicUsize>,
    /// Runs recovery took up, and what became of them (followers go on to the child).
    restarts: recovery::Restarts,
    /// Restarts waiting out their backoff or launching: the server stays up for them.
    recovering: Arc<AtomicUsize>,
    /// Sweeps' points waiting for room (`queue.rs`): the server stays up while any wait.
    queue: Arc<queue::Queue>,
}

/// How long the server stays up with no live run and no client (env override for tests).
fn idle_grace() -> Duration {
    let ms = std::env::var("FLIGHTDECK_SERVER_IDLE_MS").ok().and_then(|v| v.parse().ok()).unwrap_or(3000);
    Duration::from_millis(ms)
}

/// `flightdeck server`: prints "ready" once it serves, or exits quietly if another server
/// already owns this database.
pub fn main(db: DbPaths, foreground: bool) -> anyhow::Result<()> {
    std::fs::create_dir_all(&db.root).with_context(|| format!("creating {}", db.root.display()))?;
    let Some(lock) = take_lock(&db)? else {
        eprintln!("a server already owns {}", db.root.display());
        return Ok(());
    };
    init_logging(&db, foreground);
    let store = match Store::open(&db.sled()) {
        Ok(store) => store,
        Err(e) => {
            let message = if e.is_no_space() {
                crate::store::db::no_space_text(&db.root, false)
            } else {
                format!("opening {}: {e}", db.sled().display())
            };
            // The client reads this line where it waits for `ready`: it needs no disk (the
            // stderr log is on the database's own filesystem, which may be the full one).
            println!("error: {message}");
            anyhow::bail!(message);
        }
    };
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let served = rt.block_on(serve(db, store));
    // sled's own threads may hold the database's file lock a moment past the store's drop: the
    // server lock goes with the process's exit, after them, so a new server never finds the
    // lock free and the database still held.
    std::mem::forget(lock);
    served
}

/// An exclusive flock on `server.lock`, held for the life of the process.
fn take_lock(db: &DbPaths) -> anyhow::Result<Option<std::fs::File>> {
    use std::os::fd::AsRawFd;
    let f = std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(db.server_lock())?;
    // SAFETY: flock on a descriptor we own.
    let r = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if r != 0 {
        return Ok(None);
    }
    // The owner's pid, for people (and tests) who need to signal the server.
    use std::io::Write;
    f.set_len(0)?;
    (&f).write_all(format!("{}\n", std::process::id()).as_bytes())?;
    Ok(Some(f))
}

fn init_logging(db: &DbPaths, foreground: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("FLIGHTDECK_LOG").unwrap_or_else(|_| "info".into());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_ansi(false);
    if foreground {
        builder.with_writer(std::io::stderr).init();
    } else if let Ok(file) = std::fs::OpenOptions::new().create(true).append(true).open(db.server_log()) {
        builder.with_writer(Mutex::new(file)).init();
    }
}

async fn serve(db: DbPaths, store: Store) -> anyhow::Result<()> {
    let socket = db.server_socket();
    let _ = std::fs::remove_file(&socket);
    let listener = tokio::net::UnixListener::bind(&socket).with_context(|| format!("binding {}", socket.display()))?;
    let shared = Shared {
        ingest: ingest::Ingest::start(&store, db.root.clone()),
        store,
        db,
        registry: Arc::new(Mutex::new(HashMap::new())),
        clients: Arc::new(AtomicUsize::new(0)),
        restarts: Arc::new(Mutex::new(HashMap::new())),
        recovering: Arc::new(AtomicUsize::new(0)),
        queue: Arc::new(queue::Queue::default()),
    };
    recover(&shared).await;
    // After the reattaches: the queue counts the runs that are still live before it adds more.
    queue::start(&shared);
    println!("ready");
    tracing::info!("serving {}", socket.display());

    let mut idle_check = tokio::time::interval(Duration::from_millis(250));
    let mut idle_since = tokio::time::Instant::now();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => match crate::private_files::check_peer(&stream) {
                    Err(who) => tracing::warn!("refused a client: {who}"),
                    Ok(()) => {
                        // A client that comes and goes between two idle checks still counts.
                        idle_since = tokio::time::Instant::now();
                        let shared = shared.clone();
                        shared.clients.fetch_add(1, Ordering::SeqCst);
                        tokio::spawn(async move {
                            if let Err(e) = clients::serve(stream, &shared).await {
                                tracing::info!("client: {e:#}");
                            }
                            shared.clients.fetch_sub(1, Ordering::SeqCst);
                        });
                    }
                },
                Err(e) => tracing::warn!("accept: {e}"),
            },
            _ = idle_check.tick() => {
                if let Some(failure) = shared.ingest.failed() {
                    // Never idle out with history unsaved: wait for room, then start afresh.
                    if failure.no_space && room_again(&shared.db) {
                        let _ = std::fs::remove_file(&socket);
                        return Err(reopen(&shared.db));
                    }
                    continue;
                }
                let busy = shared.clients.load(Ordering::SeqCst) > 0
                    || shared.recovering.load(Ordering::SeqCst) > 0
                    || shared.queue.is_busy()
                    || !lock(&shared.registry).is_empty();
                if busy {
                    idle_since = tokio::time::Instant::now();
                } else if idle_since.elapsed() >= idle_grace() {
                    tracing::info!("no live run and no client: exiting");
                    let _ = std::fs::remove_file(&socket);
                    return Ok(());
                }
            }
        }
    }
}

/// Free space at which a server whose database filled up reopens it.
const REOPEN_FREE_BYTES: u64 = 16 << 20;

fn room_again(db: &DbPaths) -> bool {
    crate::store::checkpoints::free_bytes(&db.root).is_ok_and(|free| free >= REOPEN_FREE_BYTES)
}

/// Replaces this process with a fresh server on the same database (sled refuses every write
/// after a failed one, so only a reopen cures it): the locks and sockets close with the old
/// image, the new one takes them and reattaches to the live runs' agents from their last
/// acknowledged frame, as after a crash. Returns only if the exec failed.
fn reopen(db: &DbPaths) -> anyhow::Error {
    use std::os::unix::process::CommandExt;
    tracing::warn!("there is room on {} again: restarting the server to reopen the history", db.root.display());
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => return anyhow::anyhow!("locating the flightdeck executable to reopen the history: {e}"),
    };
    // Nobody reads the first server's stdout any more: the new one's `ready` goes nowhere.
    let mut cmd = std::process::Command::new(exe);
    cmd.arg("--db").arg(&db.root).arg("server").stdin(std::process::Stdio::null()).stdout(std::process::Stdio::null());
    anyhow::anyhow!("restarting the server to reopen the history: {}", cmd.exec())
}

/// After a restart: reattach to the agents of runs that were live, or mark them interrupted.
async fn recover(shared: &Shared) {
    let runs = match shared.store.list_runs() {
        Ok(r) => r,
        Err(e) => {
            tracing::error!("listing runs for recovery: {e}");
            return;
        }
    };
    for record in runs.into_iter().filter(|r| r.status.is_live()) {
        let ranks = shared.store.ranks(&record.id).unwrap_or_default();
        let mut tracker = tracker::Tracker::new(record.clone(), ranks);
        // SSH runs keep their nodes' addresses in nodes.json; local runs, the agent socket.
        let transports = match placement::transports(&shared.db, &record) {
            Ok(t) if t.is_empty() => Err(anyhow::anyhow!("no agent socket recorded")),
            other => other,
        };
        let attached = match transports {
            Ok(t) => {
                link::attach_nodes(tracker_clone(&record, shared), t, Some(shared.db.run_dir(&record.id)), shared).await
            }
            Err(e) => Err(e),
        };
        match attached {
            Ok(()) => tracing::info!("run {}: reattached to its agent", record.id),
            Err(e) => {
                let mut batch = Batch::default();
                let reason = format!("the server restarted and the run's agent was unreachable ({e})");
                tracker.end_without_agent(RunStatus::Interrupted, reason, &mut batch);
                if let Err(e) = shared.ingest.write(batch).await {
                    tracing::error!("marking {} interrupted: {e}", record.id);
                }
            }
        }
    }
}

fn tracker_clone(record: &crate::store::RunRecord, shared: &Shared) -> tracker::Tracker {
    let mut tracker = tracker::Tracker::new(record.clone(), shared.store.ranks(&record.id).unwrap_or_default());
    tracker.continue_log_lines(shared.store.log_line_counts(&record.id).unwrap_or_default());
    tracker
}
