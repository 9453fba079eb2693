//! Grouping a stack dump: ranks with the same training-thread stack together, so the odd rank
//! out stands apart. Pure; the server's incident reports and the cockpit's Stacks panel read it.
use crate::ids::RunId;
use crate::record::{RankStacks, StackGroup, StackReport};

impl StackReport {
    /// The report of one dump: its ranks grouped, the ranks that gave no stacks, and each
    /// rank's tool and time.
    pub fn from_dumps(run: RunId, stacks: &[RankStacks]) -> StackReport {
        let (groups, failures) = group(stacks);
        let timings = stacks.iter().map(|s| (s.rank, s.pid, s.tool, s.elapsed_ms)).collect();
        StackReport { run, groups, failures, timings }
    }
}

/// Puts ranks whose main threads (the training thread: tid = pid) have identical stacks
/// together, largest group first; ranks without stacks come back as (rank, why). Helper threads
/// differ between healthy ranks (rank 0 alone has the checkpoint writer, PyTorch's rank 0 the
/// TCPStore server), so they are shown but never split a group.
pub fn group(stacks: &[RankStacks]) -> (Vec<StackGroup>, Vec<(u32, String)>) {
    let mut groups: Vec<(Vec<String>, StackGroup)> = Vec::new();
    let mut failures = Vec::new();
    for s in stacks {
        if s.threads.is_empty() {
            failures.push((s.rank, s.error.clone().unwrap_or_else(|| "no threads".into())));
            continue;
        }
        let main = s.threads.iter().find(|t| t.tid == s.pid).unwrap_or(&s.threads[0]);
        let key: Vec<String> = main.frames.iter().map(|f| f.function.clone()).collect();
        match groups.iter_mut().find(|(k, _)| *k == key) {
            Some((_, g)) => g.ranks.push(s.rank),
            None => groups.push((key, StackGroup { ranks: vec![s.rank], threads: s.threads.clone() })),
        }
    }
    let mut out: Vec<StackGroup> = groups.into_iter().map(|(_, g)| g).collect();
    out.sort_by_key(|g| (std::cmp::Reverse(g.ranks.len()), g.ranks.first().copied()));
    (out, failures)
}
