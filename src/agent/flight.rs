//! Python ranks' flight recorders, as their shim (`assets/shim/sitecustomize.py`) writes them
//! into the run directory about once a second: read when the files change, off the async
//! thread, and sent upstream as `TorchFlight` snapshots (the analysis matches them per process
//! group) and, for the default group, as the rank's collective records (the collectives panel,
//! the heatmap, the straggler rule, the history).
use super::Input;
use crate::ids::{Rank, Step};
use crate::paths::RunDirPaths;
use crate::protocol::{AgentEvent, CollectiveRecord, CollectiveState, RankMsg};
use crate::sync::lock;
use crate::torchfr::{self, Dump, Entry, Snapshot};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};
use tokio::sync::mpsc;

/// How often the files are looked at; the shim writes them each second.
const POLL: Duration = Duration::from_millis(500);
/// Retired entries per group kept in a snapshot, besides the pending ones.
const KEEP_RETIRED: usize = 4;
/// Frames of the main thread kept in a snapshot.
const MAIN_FRAMES: usize = 32;
/// PyTorch's name for the default process group.
const DEFAULT_GROUP: &str = "0";
/// Completed collectives sent per dump read at most, besides the slow ones. A fast job ends
/// hundreds of collectives a second per rank, and each record is a frame through the agent,
/// the server and the store; past this, a sample is sent (see `stride`).
const RECORDS_PER_LOOK: usize = 64;
/// A timed collective this many times the read's median duration is always sent.
const SLOW_VS_MEDIAN: f64 = 2.0;

/// Starts the polling thread; it ends when the agent's input channel closes.
pub fn spawn(paths: RunDirPaths, pids: Arc<Mutex<Vec<(Rank, u32)>>>, tx: mpsc::Sender<Input>) {
    std::thread::spawn(move || {
        let mut ranks: HashMap<u32, Seen> = HashMap::new();
        loop {
            std::thread::sleep(POLL);
            let live: Vec<Rank> = lock(&pids).iter().map(|(r, _)| *r).collect();
            for rank in live {
                let seen = ranks.entry(rank.0).or_default();
                for event in seen.look(&paths, rank) {
                    if tx.blocking_send(Input::Event(event)).is_err() {
                        return;
                    }
                }
            }
        }
    });
}

/// What was already sent of one rank.
#[derive(Default)]
struct Seen {
    stamp: Option<(SystemTime, u64)>,
    /// Default-group sequence numbers seen (sent or sampled out), seen finished, and sent as
    /// scheduled (whose completion is then always sent); pruned to the recorder's ring.
    seen: HashSet<u64>,
    completed: HashSet<u64>,
    sent_scheduled: HashSet<u64>,
    complained: bool,
    /// The rank's groups as its full dumps named them, for its status-only dumps.
    groups: torchfr::GroupIds,
}

impl Seen {
    /// The events for `rank` if its dump changed since the last look.
    fn look(&mut self, paths: &RunDirPaths, rank: Rank) -> Vec<AgentEvent> {
        let path = paths.shim_dump(rank.0);
        let Ok(meta) = std::fs::metadata(&path) else { return Vec::new() };
        let stamp = (meta.modified().unwrap_or(SystemTime::UNIX_EPOCH), meta.len());
        if self.stamp == Some(stamp) {
            return Vec::new();
        }
        self.stamp = Some(stamp);
        let name = format!("fr/shim_rank_{}.pkl", rank.0);
        let dump = match std::fs::read(&path)
            .map_err(|e| e.to_string())
            .and_then(|b| torchfr::parse_with(&b, &name, &mut self.groups).map_err(|e| e.to_string()))
        {
            Ok(d) => d,
            Err(e) => return self.complain(rank, e),
        };
        let mut main_stack = std::fs::read(paths.shim_stacks(rank.0))
            .ok()
            .and_then(|b| torchfr::parse_main_stack(&b, "shim stacks").ok())
            .unwrap_or_default();
        main_stack.truncate(MAIN_FRAMES);
        let mut out: Vec<AgentEvent> = self
            .records(&dump)
            .into_iter()
            .map(|rec| AgentEvent::Rank { rank, msg: RankMsg::Collective(rec) })
            .collect();
        let snapshot = Box::new(Snapshot { dump: dump.recent(KEEP_RETIRED), main_stack });
        out.push(AgentEvent::TorchFlight { rank, snapshot });
        out
    }

    /// The default group's entries not sent yet in their present state, oldest first. An entry
    /// first seen finished is sent once, completed (its enqueue time is in that record too): a
    /// fast job's dump is mostly such entries, and a record each instead of two halves what the
    /// agent, the server and the store handle for it. Of more than `RECORDS_PER_LOOK` newly
    /// finished entries, those whose sequence number is a multiple of `stride` are sent, with
    /// every slow one and every one sent before as scheduled.
    fn records(&mut self, dump: &Dump) -> Vec<CollectiveRecord> {
        let entries: Vec<&Entry> = dump.entries.iter().filter(|e| e.group == DEFAULT_GROUP && !e.is_p2p).collect();
        let fresh = entries.iter().filter(|e| e.finished() && !self.completed.contains(&e.seq));
        let stride = stride(fresh.clone().count());
        let slow = slow_ms(fresh.filter_map(|e| e.duration_ms).collect());
        let mut out = Vec::new();
        for e in &entries {
            let Some(rec) = record(e) else { continue };
            let new = self.seen.insert(e.seq);
            if e.finished() {
                let wanted = e.seq.is_multiple_of(stride)
                    || self.sent_scheduled.contains(&e.seq)
                    || e.duration_ms.is_some_and(|ms| ms >= slow);
                if self.completed.insert(e.seq) && wanted {
                    out.push(rec);
                }
            } else if new {
                self.sent_scheduled.insert(e.seq);
                out.push(CollectiveRecord { state: CollectiveState::Scheduled, end_us: None, ..rec });
            }
        }
        // An entry that left the ring never comes back: what was kept of it can go.
        if let Some(oldest) = entries.iter().map(|e| e.seq).min() {
            for set in [&mut self.seen, &mut self.completed, &mut self.sent_scheduled] {
                set.retain(|seq| *seq >= oldest);
            }
        }
        out
    }

    fn complain(&mut self, rank: Rank, reason: String) -> Vec<AgentEvent> {
        if std::mem::replace(&mut self.complained, true) {
            return Vec::new();
        }
        vec![AgentEvent::Notice { text: format!("rank {rank}: flight recorder unread: {reason}") }]
    }
}

/// The sampling stride for `fresh` newly finished collectives: 1 up to `RECORDS_PER_LOOK`, else
/// the smallest power of two that brings them under it. Ranks that read at different moments
/// may choose different strides, but powers of two nest, so the collectives the larger stride
/// keeps are sent by every rank and their arrival skew (the straggler rule) is still whole.
fn stride(fresh: usize) -> u64 {
    let mut stride = 1u64;
    while fresh as u64 > RECORDS_PER_LOOK as u64 * stride {
        stride *= 2;
    }
    stride
}

/// The duration from which a timed collective counts as slow: `SLOW_VS_MEDIAN` times the
/// median of `durations_ms`; infinite when none were timed (gloo).
fn slow_ms(mut durations_ms: Vec<f64>) -> f64 {
    if durations_ms.is_empty() {
        return f64::INFINITY;
    }
    durations_ms.sort_by(f64::total_cmp);
    durations_ms[durations_ms.len() / 2] * SLOW_VS_MEDIAN
}

/// A recorder entry as the rank's collective record (None for an op the records do not name).
/// Where PyTorch timed it (NCCL with `TORCH_NCCL_ENABLE_TIMING=1`), the record spans that
/// duration from its enqueue, so the collectives panel shows its latency and bus bandwidth;
/// PyTorch gives the length, not when on the GPU it began.
fn record(e: &Entry) -> Option<CollectiveRecord> {
    let op = e.collective_op()?;
    let enqueue_us = e.created_ns / 1000;
    let start_us = e.duration_ms.map(|_| enqueue_us);
    let end_us = e.duration_ms.map(|ms| enqueue_us + (ms * 1000.0) as u64);
    Some(CollectiveRecord {
        seq: e.seq,
        op,
        dtype: e.input_dtypes.first().cloned().unwrap_or_default(),
        elements: e.elements(),
        bytes: e.bytes(),
        enqueue_us,
        start_us,
        end_us,
        state: if e.finished() { CollectiveState::Completed } else { CollectiveState::Scheduled },
        step: Step(0),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::torchfr::EntryState;

    fn entry(duration_ms: Option<f64>) -> Entry {
        Entry {
            seq: 3,
            name: "nccl:all_reduce".into(),
            input_sizes: vec![vec![1024]],
            input_dtypes: vec!["Float".into()],
            state: EntryState::Completed,
            created_ns: 5_000_000_000,
            duration_ms,
            ..Entry::default()
        }
    }

    #[test]
    fn a_timed_nccl_entry_spans_its_duration_and_an_untimed_one_has_no_span() {
        let timed = record(&entry(Some(2.5))).expect("an all_reduce");
        assert_eq!((timed.enqueue_us, timed.start_us, timed.end_us), (5_000_000, Some(5_000_000), Some(5_002_500)));
        assert_eq!((timed.elements, timed.bytes), (1024, 4096));
        let untimed = record(&entry(None)).expect("an all_reduce");
        assert_eq!((untimed.start_us, untimed.end_us), (None, None));
    }

    #[test]
    fn past_the_budget_a_nested_power_of_two_sample_is_sent_with_every_slow_and_announced_one() {
        assert_eq!([stride(0), stride(64), stride(65), stride(128), stride(129), stride(2000)], [1, 1, 2, 2, 4, 32]);
        let dump = |entries: Vec<Entry>| Dump { version: "2.10".into(), groups: Vec::new(), entries };
        let at = |seq: u64, state, ms| Entry { seq, group: DEFAULT_GROUP.into(), state, ..entry(ms) };
        let mut seen = Seen::default();
        // Seq 1000 is pending at the first read, so it is announced.
        let first =
            seen.records(&dump(vec![at(999, EntryState::Completed, None), at(1000, EntryState::Scheduled, None)]));
        assert_eq!(first.len(), 2);
        // 300 finished at the next read (1000 among them), two of them slow: stride 8.
        let ring: Vec<Entry> = (999..1300)
            .map(|seq| at(seq, EntryState::Completed, Some(if seq == 1001 || seq == 1201 { 9.0 } else { 1.0 })))
            .collect();
        let sent: Vec<u64> = seen.records(&dump(ring.clone())).iter().map(|r| r.seq).collect();
        let mut want: Vec<u64> = (1000..1300).filter(|s| s % 8 == 0).collect();
        want.extend([1001, 1201]);
        want.sort();
        assert_eq!(sent, want, "multiples of 8, the announced 1000, and the two slow ones");
        assert!(seen.records(&dump(ring)).is_empty(), "nothing twice");
        // Entries that left the ring are forgotten; the newest are still known.
        let tail = seen.records(&dump(vec![at(1299, EntryState::Completed, Some(1.0))]));
        assert!(tail.is_empty());
        assert_eq!((seen.seen.len(), seen.completed.len()), (1, 1), "kept only what the ring still holds");
    }

    #[test]
    fn an_entry_is_sent_scheduled_while_pending_then_completed_and_once_if_first_seen_done() {
        let dump = |entries: Vec<Entry>| Dump { version: "2.10".into(), groups: Vec::new(), entries };
        let at = |seq, state| Entry { seq, group: DEFAULT_GROUP.into(), state, ..entry(None) };
        let mut seen = Seen::default();
        let states = |recs: Vec<CollectiveRecord>| recs.iter().map(|r| (r.seq, r.state)).collect::<Vec<_>>();
        let first = seen.records(&dump(vec![at(1, EntryState::Completed), at(2, EntryState::Scheduled)]));
        assert_eq!(states(first), [(1, CollectiveState::Completed), (2, CollectiveState::Scheduled)]);
        let again = seen.records(&dump(vec![at(1, EntryState::Completed), at(2, EntryState::Completed)]));
        assert_eq!(states(again), [(2, CollectiveState::Completed)], "nothing twice; seq 2 now done");
    }
}
