//! The rank's telemetry client: frames to the node agent's Unix socket, from a background thread.
//!
//! Training never waits on the socket: messages go through a bounded queue that a sender thread
//! drains; when the queue is full the message is dropped and counted. The socket being absent or
//! failing is said once on stderr, and training goes on.
use crate::ids::{unix_ms, Rank, Step};
use crate::protocol::frame::write_frame;
use crate::protocol::message::{CollectiveRecord, Hello, Phase, RankMsg, Role, StepMetrics};
use std::io::{BufWriter, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TryRecvError, TrySendError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A rank sends ~8 messages a step (phases, metrics, two records per collective bucket). 4096
/// holds hundreds of steps of a fast tiny run, enough to ride out an agent pause (a spool fsync,
/// a reconnect) of seconds, while capping the queue at well under a megabyte.
const QUEUE_CAPACITY: usize = 4096;
/// A stuck agent must not hold a rank's exit forever: after this the socket is given up.
const WRITE_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the final `Finished` may wait for room in a full queue.
const FINISH_DEADLINE: Duration = Duration::from_secs(5);

enum Out {
    Msg(RankMsg),
    /// Write everything queued before this, then stop.
    Close,
}

#[derive(Default)]
struct Stats {
    /// Queued and not yet written (or given up).
    pending: AtomicU64,
    sent: AtomicU64,
    /// Dropped because the queue was full.
    dropped: AtomicU64,
    /// Lost because the socket was unreachable or failed.
    lost: AtomicU64,
}

/// What left the rank, reported on stderr at exit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TelemetryReport {
    pub sent: u64,
    pub dropped: u64,
    pub lost: u64,
}

/// The cheap, cloneable sending side (the flight recorder's sink holds one).
#[derive(Clone)]
pub struct TelemetryTx {
    tx: Option<SyncSender<Out>>,
    stats: Arc<Stats>,
    /// `telemetry.enabled`: off = only `Register` and `Finished` leave the rank.
    detail: bool,
    step_interval: u64,
}

impl TelemetryTx {
    pub fn phase(&self, step: Step, phase: Phase) {
        if self.detail {
            self.send(RankMsg::Phase { step, phase, t_ms: unix_ms() });
        }
    }

    /// Sends every `step_interval`-th step's metrics, and the last step's.
    pub fn step(&self, metrics: &StepMetrics, last: bool) {
        if self.detail && (last || metrics.step.0.is_multiple_of(self.step_interval)) {
            self.send(RankMsg::Step(metrics.clone()));
        }
    }

    /// A trainer kind's own metrics at `step` (sent like the step's: not when telemetry is off).
    pub fn metrics(&self, step: Step, metrics: Vec<(String, f64)>) {
        if self.detail && !metrics.is_empty() {
            self.send(RankMsg::Metrics { step, metrics });
        }
    }

    pub fn collective(&self, record: &CollectiveRecord) {
        if self.detail {
            self.send(RankMsg::Collective(record.clone()));
        }
    }

    /// Checkpoint events from rank 0's writer: sent even with `telemetry.enabled` off, because
    /// the store indexes checkpoints from them.
    pub fn checkpoint(&self, msg: RankMsg) {
        self.send(msg);
    }

    /// A connection the rank's ring listener refused: sent even with `telemetry.enabled` off,
    /// because who knocked on the run's ports belongs in its history.
    pub fn refused(&self, refusal: crate::protocol::message::Refusal) {
        self.send(RankMsg::Refused(refusal));
    }

    /// For `FlightRecorder::new`: every record it reports goes out as `RankMsg::Collective`.
    pub fn sink(&self) -> Box<dyn FnMut(&CollectiveRecord) + Send> {
        let tx = self.clone();
        Box::new(move |r| tx.collective(r))
    }

    fn send(&self, msg: RankMsg) {
        // No socket (run by hand, or unreachable and already said): nothing to count.
        let Some(tx) = &self.tx else { return };
        self.stats.pending.fetch_add(1, Ordering::Relaxed);
        if let Err(e) = tx.try_send(Out::Msg(msg)) {
            self.stats.pending.fetch_sub(1, Ordering::Relaxed);
            let counter = match e {
                TrySendError::Full(_) => &self.stats.dropped,
                TrySendError::Disconnected(_) => &self.stats.lost,
            };
            counter.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Waits (at most `timeout`) until everything queued so far is on the socket. Used before a
    /// deliberate crash, so the agent knows how far the rank got.
    pub fn flush(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while self.stats.pending.load(Ordering::Relaxed) > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// The client: owns the sender thread. `finish` must be called to deliver the tail.
pub struct Telemetry {
    tx: TelemetryTx,
    thread: Option<JoinHandle<()>>,
}

impl Telemetry {
    /// Connects to the agent at `socket` (None: run by hand, nothing is sent), says `Hello` and
    /// `Register`, and starts the sender thread. Never fails: an unreachable socket is reported
    /// once on stderr.
    pub fn connect(socket: Option<&Path>, node: &str, rank: Rank, cfg: &crate::recipe::Telemetry) -> Telemetry {
        let stats = Arc::new(Stats::default());
        let mut tel = Telemetry {
            tx: TelemetryTx {
                tx: None,
                stats: stats.clone(),
                detail: cfg.enabled,
                step_interval: cfg.step_interval.max(1),
            },
            thread: None,
        };
        let Some(path) = socket else { return tel };
        let stream = match open(path, node, rank) {
            Ok(s) => s,
            Err(e) => {
                eprintln!(
                    "rank {rank}: telemetry socket {} unreachable ({e}); training without telemetry",
                    path.display()
                );
                return tel;
            }
        };
        stats.sent.store(1, Ordering::Relaxed); // Register, written by `open`.
        let (tx, rx) = sync_channel(QUEUE_CAPACITY);
        let path = path.to_path_buf();
        let spawned = std::thread::Builder::new()
            .name("telemetry".into())
            .spawn(move || pump(rx, BufWriter::new(stream), &path, rank, &stats));
        match spawned {
            Ok(handle) => {
                tel.tx.tx = Some(tx);
                tel.thread = Some(handle);
            }
            Err(e) => eprintln!("rank {rank}: cannot start the telemetry thread ({e}); training without telemetry"),
        }
        tel
    }

    /// No socket at all (tests, or run by hand).
    pub fn disabled() -> Telemetry {
        Telemetry::connect(
            None,
            "local",
            Rank(0),
            &crate::recipe::Telemetry { step_interval: 1, sample_interval_ms: 1000, enabled: false },
        )
    }

    pub fn tx(&self) -> &TelemetryTx {
        &self.tx
    }

    /// Sends `Finished` when training completed (`done` = steps and final loss), then writes
    /// everything still queued and joins the sender thread, so the agent has it all before the
    /// process exits.
    pub fn finish(mut self, done: Option<(u64, f64)>) -> TelemetryReport {
        if let Some(tx) = self.tx.tx.take() {
            if let Some((steps, final_loss)) = done {
                self.tx.stats.pending.fetch_add(1, Ordering::Relaxed);
                if !send_by(&tx, Out::Msg(RankMsg::Finished { steps, final_loss })) {
                    self.tx.stats.pending.fetch_sub(1, Ordering::Relaxed);
                    self.tx.stats.dropped.fetch_add(1, Ordering::Relaxed);
                }
            }
            // If even Close finds no room, the thread still ends: dropping `tx` below leaves it
            // only the clones (recorder sink), so it is detached rather than joined.
            if send_by(&tx, Out::Close) {
                if let Some(t) = self.thread.take() {
                    let _ = t.join();
                }
            }
        }
        let s = &self.tx.stats;
        TelemetryReport {
            sent: s.sent.load(Ordering::Relaxed),
            dropped: s.dropped.load(Ordering::Relaxed),
            lost: s.lost.load(Ordering::Relaxed),
        }
    }
}

fn send_by(tx: &SyncSender<Out>, mut out: Out) -> bool {
    let deadline = Instant::now() + FINISH_DEADLINE;
    loop {
        match tx.try_send(out) {
            Ok(()) => return true,
            Err(TrySendError::Disconnected(_)) => return false,
            Err(TrySendError::Full(back)) if Instant::now() < deadline => {
                out = back;
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(TrySendError::Full(_)) => return false,
        }
    }
}

fn open(path: &Path, node: &str, rank: Rank) -> std::io::Result<UnixStream> {
    let mut stream = UnixStream::connect(path)?;
    stream.set_write_timeout(Some(WRITE_TIMEOUT))?;
    write_frame(&mut stream, &Hello::new(Role::Rank, node))?;
    write_frame(&mut stream, &RankMsg::Register { rank, pid: std::process::id() })?;
    Ok(stream)
}

/// The sender thread: writes frames, flushing whenever the queue runs empty (one syscall per
/// burst, not per message). After a write error it keeps draining so senders never block.
fn pump(rx: Receiver<Out>, mut w: BufWriter<UnixStream>, path: &Path, rank: Rank, stats: &Stats) {
    let mut broken = false;
    let mut unflushed = 0u64;
    loop {
        let out = match rx.try_recv() {
            Ok(out) => out,
            Err(TryRecvError::Empty) => {
                settle(&mut w, &mut broken, &mut unflushed, path, rank, stats);
                match rx.recv() {
                    Ok(out) => out,
                    Err(_) => break,
                }
            }
            Err(TryRecvError::Disconnected) => break,
        };
        let msg = match out {
            Out::Msg(m) => m,
            Out::Close => break,
        };
        if broken {
            stats.lost.fetch_add(1, Ordering::Relaxed);
            stats.pending.fetch_sub(1, Ordering::Relaxed);
            continue;
        }
        match write_frame(&mut w, &msg) {
            Ok(()) => unflushed += 1,
            Err(e) => fail(&mut broken, &mut unflushed, 1, e, path, rank, stats),
        }
    }
    settle(&mut w, &mut broken, &mut unflushed, path, rank, stats);
}

fn settle(
    w: &mut BufWriter<UnixStream>,
    broken: &mut bool,
    unflushed: &mut u64,
    path: &Path,
    rank: Rank,
    stats: &Stats,
) {
    if *unflushed == 0 {
        return;
    }
    match w.flush() {
        Ok(()) => {
            stats.sent.fetch_add(*unflushed, Ordering::Relaxed);
            stats.pending.fetch_sub(*unflushed, Ordering::Relaxed);
            *unflushed = 0;
        }
        Err(e) => fail(broken, unflushed, 0, e, path, rank, stats),
    }
}

/// Gives the socket up: what was buffered (`unflushed`, plus `extra` not yet counted) is lost.
fn fail(broken: &mut bool, unflushed: &mut u64, extra: u64, e: std::io::Error, path: &Path, rank: Rank, stats: &Stats) {
    if !*broken {
        eprintln!("rank {rank}: telemetry socket {} failed ({e}); training without telemetry", path.display());
    }
    *broken = true;
    let n = *unflushed + extra;
    stats.lost.fetch_add(n, Ordering::Relaxed);
    stats.pending.fetch_sub(n, Ordering::Relaxed);
    *unflushed = 0;
}

#[cfg(test)]
#[path = "telemetry_tests.rs"]
mod tests;
