//! Turning the ranks' flight records and phases into a verdict that names the culprit.
use super::RankState;
use crate::protocol::{CollectiveRecord, CollectiveRef, Culprit, StackGroup, Verdict, VerdictKind};
use std::collections::BTreeMap;

/// No rank progressed since `since_ms`: who is behind, or is everyone inside one collective?
pub fn hang(ranks: &BTreeMap<u32, RankState>, since_ms: u64, now_ms: u64) -> Verdict {
    let secs = secs(now_ms - since_ms.min(now_ms));
    // The furthest collective any rank entered, finished ranks included (they waited for no one).
    let max_seq = ranks.values().map(|r| r.last_started).max().unwrap_or(0);
    let live: Vec<(&u32, &RankState)> = ranks.iter().filter(|(_, r)| r.live()).collect();
    let behind: Vec<u32> = live.iter().filter(|(_, r)| r.last_started < max_seq).map(|(k, _)| **k).collect();
    let inside: Vec<u32> = live
        .iter()
        .filter(|(_, r)| r.last_started == max_seq && r.last_completed < max_seq)
        .map(|(k, _)| **k)
        .collect();
    let record = ranks.values().find_map(|r| r.record(max_seq)).map(collective_ref);
    let what = record.as_ref().map(describe).unwrap_or_else(|| format!("collective #{max_seq}"));
    if max_seq > 0 && !behind.is_empty() {
        let culprits: Vec<Culprit> = behind
            .iter()
            .map(|k| {
                let r = &ranks[k];
                let phase = r.phase.map_or("-", |p| p.name());
                culprit(*k, r, format!("never entered {what}; last phase {phase} of step {}", r.step))
            })
            .collect();
        let phases: Vec<&str> = behind.iter().map(|k| ranks[k].phase.map_or("-", |p| p.name())).collect();
        let summary = format!(
            "{} never entered {what}; last phase {}; {} waiting {secs}",
            who(&culprits),
            phases.join("/"),
            count(inside.len())
        );
        return verdict(VerdictKind::NeverEntered, culprits, record, inside, since_ms, now_ms, summary);
    }
    if max_seq > 0 && !inside.is_empty() && inside.len() == live.len() {
        let culprits: Vec<Culprit> =
            inside.iter().map(|k| culprit(*k, &ranks[k], format!("inside {what}, not completed"))).collect();
        let summary = format!(
            "all {} entered {what} and none completed it in {secs}; the odd stack out is the culprit",
            count(inside.len())
        );
        return verdict(VerdictKind::StuckInCollective, culprits, record, Vec::new(), since_ms, now_ms, summary);
    }
    // No collective to go by (a program whose progress is its log): the ranks whose step fell
    // behind their peers' are the ones that stopped first; the others waited on them.
    let top = live.iter().map(|(_, r)| r.step).max().unwrap_or(0);
    let (lagging, ahead): (Vec<_>, Vec<_>) = live.iter().partition(|(_, r)| r.step < top);
    if max_seq == 0 && !lagging.is_empty() {
        let culprits: Vec<Culprit> = lagging
            .iter()
            .map(|(k, r)| culprit(**k, r, format!("stopped at step {} while its peers reached step {top}", r.step)))
            .collect();
        let steps: Vec<String> = lagging.iter().map(|(_, r)| r.step.to_string()).collect();
        let summary = format!(
            "{} stopped at step {}; {} reached step {top}, then no progress for {secs}",
            who(&culprits),
            steps.join("/"),
            count(ahead.len())
        );
        let waiting = ahead.iter().map(|(k, _)| **k).collect();
        return verdict(VerdictKind::NeverEntered, culprits, None, waiting, since_ms, now_ms, summary);
    }
    // Every live rank is outside any collective and none moves: name each with its phase.
    let culprits: Vec<Culprit> = live
        .iter()
        .map(|(k, r)| culprit(**k, r, format!("no progress in phase {}", r.phase.map_or("-", |p| p.name()))))
        .collect();
    let summary = format!("{} made no progress for {secs}, outside any collective (after #{max_seq})", who(&culprits));
    verdict(VerdictKind::NeverEntered, culprits, None, Vec::new(), since_ms, now_ms, summary)
}

/// The ranks on `nodes` are unreachable: their agents are gone or silent (`why`) since `since_ms`.
/// Names the nodes by host and, as waiting, the live ranks elsewhere.
pub fn node_lost(ranks: &BTreeMap<u32, RankState>, nodes: &[usize], why: &str, since_ms: u64, now_ms: u64) -> Verdict {
    let (lost, others): (Vec<_>, Vec<_>) =
        ranks.iter().filter(|(_, r)| r.live()).partition(|(_, r)| nodes.contains(&r.node));
    let culprits: Vec<Culprit> =
        lost.iter().map(|(k, r)| culprit(**k, r, format!("on lost node {} ({why})", r.host))).collect();
    let mut hosts: Vec<&str> = culprits.iter().map(|c| c.host.as_str()).collect();
    hosts.sort_unstable();
    hosts.dedup();
    let waiting: Vec<u32> = others.iter().map(|(k, _)| **k).collect();
    let summary = format!(
        "node {} lost ({why}): {} unreachable; {} waiting",
        hosts.join(", "),
        who(&culprits),
        count(waiting.len())
    );
    verdict(VerdictKind::NodeLost, culprits, None, waiting, since_ms, now_ms, summary)
}

/// `rank`'s last saves all failed (`failed`: step, reason, when); the newest good one is
/// `last_saved`. Every live rank is held up: the run is stopped rather than trained on unprotected.
pub fn checkpoint_failing(
    ranks: &BTreeMap<u32, RankState>,
    rank: u32,
    failed: &[(u64, String, u64)],
    last_saved: Option<u64>,
    now_ms: u64,
) -> Verdict {
    let empty = RankState::default();
    let r = ranks.get(&rank).unwrap_or(&empty);
    let steps: Vec<String> = failed.iter().map(|(s, _, _)| s.to_string()).collect();
    let reason = failed.last().map(|(_, why, _)| why.as_str()).unwrap_or("");
    let since = failed.first().map_or(now_ms, |(_, _, at)| *at);
    let good = match last_saved {
        Some(s) => format!("the newest good checkpoint is step {s}"),
        None => "no checkpoint of this run has been saved".to_string(),
    };
    let c = culprit(rank, r, format!("{} saves in a row failed (steps {}): {reason}", failed.len(), steps.join(", ")));
    let waiting: Vec<u32> = ranks.iter().filter(|(k, r)| **k != rank && r.live()).map(|(k, _)| *k).collect();
    let summary = format!(
        "checkpoints failing: {} saves in a row failed on {} (steps {}): {reason}; {good}; stopping the run \
         rather than training on unprotected",
        failed.len(),
        who(std::slice::from_ref(&c)),
        steps.join(", ")
    );
    verdict(VerdictKind::CheckpointFailing, vec![c], None, waiting, since, now_ms, summary)
}

/// `rank` exited abnormally at `since_ms` while its peers still needed it.
/// `waiting` are the ranks that were live when it died (the agent may have stopped them since).
pub fn dead(ranks: &BTreeMap<u32, RankState>, rank: u32, waiting: Vec<u32>, since_ms: u64, now_ms: u64) -> Verdict {
    let empty = RankState::default();
    let r = ranks.get(&rank).unwrap_or(&empty);
    let mut how = r.exit.as_ref().map_or_else(|| "exited".to_string(), |e| e.describe());
    if let Some(said) = &r.last_error {
        how = format!("{how}: {said}");
    }
    let phase = r.phase.map_or("-", |p| p.name());
    let record = r.record(r.last_started).map(collective_ref);
    let last = record.as_ref().map(|c| format!(", last in {}", describe(c))).unwrap_or_default();
    let c = culprit(rank, r, format!("died ({how}) in phase {phase} of step {}{last}", r.step));
    let summary = format!(
        "{} died ({how}) in phase {phase} of step {}{last}; {} left waiting",
        who(std::slice::from_ref(&c)),
        r.step,
        count(waiting.len())
    );
    verdict(VerdictKind::Dead, vec![c], record, waiting, since_ms, now_ms, summary)
}

/// True when the ranks' records of `seq` disagree on op or size.
pub fn disagree(ranks: &BTreeMap<u32, RankState>, seq: u64) -> bool {
    let mut shapes = ranks.values().filter_map(|r| r.record(seq)).map(|r| (r.op, r.elements));
    match shapes.next() {
        Some(first) => shapes.any(|s| s != first),
        None => false,
    }
}

/// Ranks disagree at `seq`: the minority is the culprit (all but the group of the lowest rank
/// when there is no majority, as with two ranks).
pub fn mismatch(ranks: &BTreeMap<u32, RankState>, seq: u64, since_ms: u64, now_ms: u64) -> Verdict {
    type Shape = (crate::protocol::CollectiveOp, u64, u64);
    let mut groups: Vec<(Shape, Vec<u32>)> = Vec::new();
    for (k, r) in ranks {
        if let Some(rec) = r.record(seq) {
            let shape = (rec.op, rec.elements, rec.bytes);
            match groups.iter_mut().find(|(s, _)| *s == shape) {
                Some((_, members)) => members.push(*k),
                None => groups.push((shape, vec![*k])),
            }
        }
    }
    // Largest first; ties keep rank order, so the lowest rank's group counts as the reference.
    groups.sort_by_key(|(_, members)| std::cmp::Reverse(members.len()));
    let (reference, rest) = groups.split_first().map_or((None, &[][..]), |(a, b)| (Some(a), b));
    let shape = |(op, n, b): Shape| format!("{} of {n} elements ({})", op.name(), bytes(b));
    let culprits: Vec<Culprit> = rest
        .iter()
        .flat_map(|(s, members)| members.iter().map(move |k| (*s, *k)))
        .map(|(s, k)| culprit(k, &ranks[&k], format!("entered #{seq} as {}", shape(s))))
        .collect();
    let record = reference.and_then(|(_, m)| m.first()).and_then(|k| ranks[k].record(seq)).map(collective_ref);
    let waiting = reference.map(|(_, m)| m.clone()).unwrap_or_default();
    let theirs = reference.map(|(s, m)| format!("{} {}", ranks_list(m), shape(*s))).unwrap_or_default();
    let mine: Vec<String> = rest.iter().map(|(s, _)| shape(*s)).collect();
    let summary =
        format!("mismatch at collective #{seq}: {} entered it as {}; {theirs}", who(&culprits), mine.join(" / "));
    verdict(VerdictKind::Mismatch, culprits, record, waiting, since_ms, now_ms, summary)
}

/// For a collective every rank entered: the rank whose stack stands alone against a group of
/// two or more identical ones.
pub fn single_out(current: &Verdict, groups: &[StackGroup], ranks: &BTreeMap<u32, RankState>) -> Option<Verdict> {
    let singles: Vec<u32> = groups.iter().filter(|g| g.ranks.len() == 1).map(|g| g.ranks[0]).collect();
    let crowd = groups.iter().map(|g| g.ranks.len()).max().unwrap_or(0);
    let [odd] = singles[..] else { return None };
    if crowd < 2 {
        return None;
    }
    let r = ranks.get(&odd)?;
    let what = current.collective.as_ref().map(describe).unwrap_or_else(|| "the collective".into());
    let c = culprit(odd, r, format!("stopped inside {what}: its stack differs from the other ranks'"));
    let waiting: Vec<u32> = current.culprits.iter().map(|c| c.rank).filter(|k| *k != odd).collect();
    let summary = format!(
        "{} stopped inside {what} while {} wait in it ({}); found by its stack, unlike the others'",
        who(std::slice::from_ref(&c)),
        count(waiting.len()),
        secs(current.duration_ms())
    );
    let mut v = verdict(
        VerdictKind::StuckInCollective,
        vec![c],
        current.collective.clone(),
        waiting,
        current.since_ms,
        current.detected_ms,
        summary,
    );
    v.detected_ms = current.detected_ms;
    Some(v)
}

pub(super) fn verdict(
    kind: VerdictKind,
    culprits: Vec<Culprit>,
    collective: Option<CollectiveRef>,
    waiting: Vec<u32>,
    since_ms: u64,
    detected_ms: u64,
    summary: String,
) -> Verdict {
    Verdict { kind, culprits, collective, waiting, since_ms, detected_ms, summary }
}

pub fn culprit(rank: u32, r: &RankState, detail: String) -> Culprit {
    Culprit { rank, host: r.host.clone(), pid: r.pid, phase: r.phase, step: r.step, last_seq: r.last_started, detail }
}

fn collective_ref(r: &CollectiveRecord) -> CollectiveRef {
    CollectiveRef { seq: r.seq, op: r.op, elements: r.elements, bytes: r.bytes, step: r.step }
}

/// `all_reduce #34 (4.0 MiB, step 5)`.
pub fn describe(c: &CollectiveRef) -> String {
    format!("{} #{} ({}, step {})", c.op.name(), c.seq, bytes(c.bytes), c.step.0)
}

/// `rank 1 (local, pid 4121)` or `ranks 1 (local, pid 4121), 3 (...)`.
pub fn who(culprits: &[Culprit]) -> String {
    let one = |c: &Culprit| match c.pid {
        Some(pid) => format!("{} ({}, pid {pid})", c.rank, if c.host.is_empty() { "?" } else { &c.host }),
        None => format!("{} ({})", c.rank, c.host),
    };
    let all: Vec<String> = culprits.iter().map(one).collect();
    match all.len() {
        0 => "no rank".into(),
        1 => format!("rank {}", all[0]),
        _ => format!("ranks {}", all.join(", ")),
    }
}

fn ranks_list(ranks: &[u32]) -> String {
    let names: Vec<String> = ranks.iter().map(u32::to_string).collect();
    format!("{} {}", if ranks.len() == 1 { "rank" } else { "ranks" }, names.join(", "))
}

fn count(n: usize) -> String {
    format!("{n} {}", if n == 1 { "rank" } else { "ranks" })
}

pub fn secs(ms: u64) -> String {
    format!("{:.1} s", ms as f64 / 1000.0)
}

pub use crate::units::bytes;
