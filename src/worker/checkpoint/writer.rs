//! Rank 0's background checkpoint writer: training hands it a snapshot and goes on; this
//! thread writes, hashes, fsyncs, commits, prunes and reports. One save is in flight at most,
//! so memory holds at most one snapshot besides the live model.
use crate::ids::Step;
use crate::protocol::message::{CheckpointSaved, RankMsg};
use crate::store::checkpoints::commit::{commit, prune, CommitInfo};
use crate::worker::telemetry::TelemetryTx;
use std::path::PathBuf;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

/// A snapshot: host copies of every tensor, and the small files, ready to write.
pub struct Job {
    pub info: CommitInfo,
    /// Parameters, then the optimizer's moments: f32 in the model's parameter order.
    pub model: Vec<f32>,
    pub optim: Vec<f32>,
    /// `state.json`, `recipe.json`, `rank-N.json`.
    pub small: Vec<(String, Vec<u8>)>,
    pub blocking_ms: f64,
}

/// What the last save came to: Ok(step) or the reason it failed.
type Outcome = Option<Result<u64, String>>;

#[derive(Default)]
struct Slot {
    busy: bool,
    last: Outcome,
    /// The last job's tensor buffers, handed back for the next snapshot: copying into pages
    /// already touched keeps page faults out of the time training blocks.
    spare: (Vec<f32>, Vec<f32>),
}

pub struct Writer {
    tx: Option<SyncSender<Job>>,
    thread: Option<JoinHandle<()>>,
    state: Arc<(Mutex<Slot>, Condvar)>,
}

fn lock(m: &Mutex<Slot>) -> std::sync::MutexGuard<'_, Slot> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Writer {
    pub fn start(root: PathBuf, keep: u32, tele: TelemetryTx) -> std::io::Result<Writer> {
        // Capacity 1 and `wait_idle` before each snapshot: a send never blocks.
        let (tx, rx) = sync_channel::<Job>(1);
        let state: Arc<(Mutex<Slot>, Condvar)> = Arc::default();
        let st = state.clone();
        let thread =
            std::thread::Builder::new().name("ckpt-writer".into()).spawn(move || run(rx, root, keep, tele, st))?;
        Ok(Writer { tx: Some(tx), thread: Some(thread), state })
    }

    /// Waits until no save is in flight; returns how the last one ended.
    pub fn wait_idle(&self) -> Outcome {
        let (m, cv) = &*self.state;
        let mut slot = lock(m);
        while slot.busy {
            slot = cv.wait(slot).unwrap_or_else(|e| e.into_inner());
        }
        slot.last.clone()
    }

    /// Buffers of the last save to snapshot into (empty the first time). Call `wait_idle` first.
    pub fn take_spare(&self) -> (Vec<f32>, Vec<f32>) {
        std::mem::take(&mut lock(&self.state.0).spare)
    }

    /// Hands a snapshot over. Call `wait_idle` first.
    pub fn submit(&self, job: Job) -> Result<(), String> {
        let (m, _) = &*self.state;
        lock(m).busy = true;
        let sent = self.tx.as_ref().map(|tx| tx.send(job).is_ok()).unwrap_or(false);
        if !sent {
            lock(m).busy = false;
            return Err("the checkpoint writer thread is gone".into());
        }
        Ok(())
    }

    /// Waits for the last save, stops the thread; returns how the last save ended.
    pub fn finish(mut self) -> Outcome {
        let last = self.wait_idle();
        self.tx.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        last
    }
}

fn run(rx: Receiver<Job>, root: PathBuf, keep: u32, tele: TelemetryTx, state: Arc<(Mutex<Slot>, Condvar)>) {
    while let Ok(job) = rx.recv() {
        let step = job.info.step;
        let (outcome, spare) = write(&root, keep, job, &tele);
        if let Err(reason) = &outcome {
            eprintln!("rank 0: checkpoint step {step} failed: {reason}");
            tele.checkpoint(RankMsg::CheckpointFailed { step: Step(step), reason: reason.clone() });
        }
        let (m, cv) = &*state;
        let mut slot = lock(m);
        slot.busy = false;
        slot.last = Some(outcome.map(|_| step));
        slot.spare = spare;
        cv.notify_all();
    }
}

/// Writes one job; hands its tensor buffers back for reuse.
fn write(
    root: &std::path::Path,
    keep: u32,
    job: Job,
    tele: &TelemetryTx,
) -> (Result<(), String>, (Vec<f32>, Vec<f32>)) {
    let outcome = commit_job(root, keep, &job, tele);
    (outcome, (job.model, job.optim))
}

fn commit_job(root: &std::path::Path, keep: u32, job: &Job, tele: &TelemetryTx) -> Result<(), String> {
    let t0 = Instant::now();
    let model = f32_bytes(&job.model);
    let optim = f32_bytes(&job.optim);
    let mut files: Vec<(&str, &[u8])> =
        vec![(crate::store::checkpoints::disk::MODEL, &model), (crate::store::checkpoints::disk::OPTIM, &optim)];
    files.extend(job.small.iter().map(|(n, b)| (n.as_str(), b.as_slice())));
    // A save that cannot fit is refused before it writes a byte: nothing partial to clean up.
    let need: u64 = files.iter().map(|(_, b)| b.len() as u64).sum();
    if let Ok(free) = crate::store::checkpoints::free_bytes(root) {
        if free < need {
            return Err(format!(
                "no space for checkpoint step {}: it needs {} and {} has {} free",
                job.info.step,
                crate::units::bytes(need),
                root.display(),
                crate::units::bytes(free)
            ));
        }
    }
    let manifest = commit(root, &job.info, &files).map_err(|e| e.to_string())?;
    let write_ms = t0.elapsed().as_secs_f64() * 1e3;
    let pruned = prune(root, keep).map_err(|e| format!("committed, then pruning failed: {e}"))?;
    let bytes = manifest.bytes();
    let write_gbps = if write_ms > 0.0 { bytes as f64 / (write_ms / 1e3) / 1e9 } else { 0.0 };
    let path = root.join(crate::store::checkpoints::disk::step_dir_name(job.info.step));
    println!(
        "rank 0 checkpoint step {}: {} in {write_ms:.1} ms ({}), training blocked {:.2} ms",
        job.info.step,
        crate::units::bytes(bytes),
        crate::units::gb_per_s(write_gbps),
        job.blocking_ms
    );
    tele.checkpoint(RankMsg::CheckpointSaved(CheckpointSaved {
        step: Step(job.info.step),
        path: path.display().to_string(),
        bytes,
        loss: job.info.loss,
        saved_ms: job.info.saved_ms,
        blocking_ms: job.blocking_ms,
        write_ms,
        write_gbps,
        pruned,
    }));
    Ok(())
}

/// The little-endian bytes of `xs`: the memory itself on a little-endian host (no copy).
fn f32_bytes(xs: &[f32]) -> std::borrow::Cow<'_, [u8]> {
    if cfg!(target_endian = "little") {
        // SAFETY: f32 has no padding and every byte of it is initialised; u8 has alignment 1;
        // the slice covers exactly the vector's elements and lives as long as `xs`.
        std::borrow::Cow::Borrowed(unsafe { std::slice::from_raw_parts(xs.as_ptr().cast::<u8>(), xs.len() * 4) })
    } else {
        std::borrow::Cow::Owned(xs.iter().flat_map(|x| x.to_le_bytes()).collect())
    }
}
