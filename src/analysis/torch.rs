//! Verdicts for PyTorch programs, from their flight recorders (`crate::torchfr`), matched per
//! process group in Flightdeck (PyTorch 2.11's own `fr_trace` refuses gloo dumps).
//!
//! Per group, from the members' dumps: the same sequence number entered with a different op,
//! sizes or dtype is a mismatch (the minority is the culprit); a member whose last enqueued
//! sequence is behind the group's is the culprit of a hang when it is inside no collective at
//! all (a member behind because it waits inside *another* group's collective is a victim, so
//! "the TP group of ranks 2–3 is stuck because rank 3 never entered" comes out, not "the world
//! waits on ranks 2 and 3"); every member inside the same collective, none completing it, is
//! stuck. The verdict names the group and its ranks, the sequence number, op, sizes and dtype,
//! and the call site in the user's script (from the recorder's frames), and where the culprit's
//! own main thread is (from the shim's stacks).
use super::classify::{culprit, verdict, who};
use super::RankState;
use crate::protocol::{CollectiveRef, Culprit, Verdict, VerdictKind};
use crate::torchfr::{Dump, Entry, Frame, Group};
use std::collections::BTreeMap;

/// The torch-side view of a hang or mismatch, or None when no rank has a dump to go by (or the
/// dumps show nothing wrong, e.g. all ranks outside any collective).
pub fn judge(ranks: &BTreeMap<u32, RankState>, since_ms: u64, now_ms: u64) -> Option<Verdict> {
    let dumps: BTreeMap<u32, &Dump> =
        ranks.iter().filter_map(|(k, r)| r.torch.as_ref().map(|t| (*k, &t.dump))).collect();
    if dumps.is_empty() {
        return None;
    }
    let groups = groups(&dumps);
    let findings: Vec<Finding> = groups.iter().filter_map(|g| examine(g, &dumps, ranks)).collect();
    // A mismatch first: it explains the hang that follows it. Then the most specific group
    // (fewest members) whose culprit is idle and, of groups as specific, the one waited on
    // longest: a rank asleep before its TP all-reduce holds its TP peer first, and its FSDP
    // peer only later, at the next block's all-gather. Then a group stuck as a whole.
    let waited_since = |f: &Finding| f.reference.map_or(u64::MAX, |e| e.created_ns);
    let pick = findings
        .iter()
        .find(|f| f.kind == VerdictKind::Mismatch)
        .or_else(|| {
            let never = findings.iter().filter(|f| f.kind == VerdictKind::NeverEntered);
            never.min_by_key(|f| (f.members.len(), waited_since(f)))
        })
        .or_else(|| findings.iter().find(|f| f.kind == VerdictKind::StuckInCollective))?;
    Some(pick.verdict(ranks, &dumps, since_ms, now_ms))
}

/// What went wrong in one group.
struct Finding<'a> {
    kind: VerdictKind,
    group: &'a Group,
    /// Its live members with a dump (the config's where it lists them, else those that know it).
    members: Vec<u32>,
    seq: u64,
    culprits: Vec<u32>,
    /// The members the culprits hold up.
    waiting: Vec<u32>,
    /// A member's record of the collective (a waiting one's, for a rank that never entered).
    reference: Option<&'a Entry>,
    /// For a mismatch: each culprit's own record.
    theirs: Vec<(u32, &'a Entry)>,
}

/// Every group any rank knows, once, with the members its config lists.
fn groups<'a>(dumps: &BTreeMap<u32, &'a Dump>) -> Vec<&'a Group> {
    let mut out: Vec<&Group> = Vec::new();
    for d in dumps.values() {
        for g in &d.groups {
            match out.iter_mut().find(|o| o.name == g.name) {
                Some(o) if o.ranks.is_empty() && !g.ranks.is_empty() => *o = g,
                Some(_) => {}
                None => out.push(g),
            }
        }
    }
    out
}

fn examine<'a>(g: &'a Group, dumps: &BTreeMap<u32, &'a Dump>, ranks: &BTreeMap<u32, RankState>) -> Option<Finding<'a>> {
    let members: Vec<u32> = if g.ranks.is_empty() {
        dumps.iter().filter(|(_, d)| d.group(&g.name).is_some()).map(|(k, _)| *k).collect()
    } else {
        g.ranks.clone()
    };
    // Members with a dump that are still expected to take part.
    let members: Vec<u32> =
        members.into_iter().filter(|k| dumps.contains_key(k) && ranks.get(k).is_some_and(RankState::live)).collect();
    let status = |k: &u32| dumps[k].group(&g.name).map_or((0, 0), |s| (s.last_enqueued, s.last_completed));
    let top = members.iter().map(|k| status(k).0).max().unwrap_or(0);
    if members.len() < 2 || top == 0 {
        return None;
    }
    let low_done = members.iter().map(|k| status(k).1).min().unwrap_or(0);
    // Same sequence number, different collective: the earliest such among the open ones.
    for seq in low_done + 1..=top {
        let mut shapes: Vec<(&Entry, Vec<u32>)> = Vec::new();
        for k in &members {
            if let Some(e) = dumps[k].entry(&g.name, seq) {
                match shapes.iter_mut().find(|(s, _)| s.signature() == e.signature()) {
                    Some((_, m)) => m.push(*k),
                    None => shapes.push((e, vec![*k])),
                }
            }
        }
        if shapes.len() > 1 {
            // Largest first; a tie keeps the lowest rank's shape as the reference.
            shapes.sort_by_key(|(_, m)| std::cmp::Reverse(m.len()));
            let (reference, waiting) = (shapes[0].0, shapes[0].1.clone());
            let theirs: Vec<(u32, &Entry)> =
                shapes[1..].iter().flat_map(|(e, m)| m.iter().map(move |k| (*k, *e))).collect();
            let culprits = theirs.iter().map(|(k, _)| *k).collect();
            return Some(Finding {
                kind: VerdictKind::Mismatch,
                group: g,
                members,
                seq,
                culprits,
                waiting,
                reference: Some(reference),
                theirs,
            });
        }
    }
    let inside = |k: &u32| dumps[k].pending().next().is_some();
    let behind: Vec<u32> = members.iter().copied().filter(|k| status(k).0 < top).collect();
    let ahead: Vec<u32> = members.iter().copied().filter(|k| status(k).0 == top).collect();
    let reference = ahead.iter().find_map(|k| dumps[k].entry(&g.name, top));
    let idle: Vec<u32> = behind.iter().copied().filter(|k| !inside(k)).collect();
    if !idle.is_empty() {
        // Held up: every rank inside a collective, in this group or another.
        let waiting =
            dumps.keys().copied().filter(|k| inside(k) && ranks.get(k).is_some_and(RankState::live)).collect();
        return Some(Finding {
            kind: VerdictKind::NeverEntered,
            group: g,
            members,
            seq: top,
            culprits: idle,
            waiting,
            reference,
            theirs: Vec::new(),
        });
    }
    if behind.is_empty() && members.iter().all(|k| status(k).1 < top) {
        return Some(Finding {
            kind: VerdictKind::StuckInCollective,
            group: g,
            members: members.clone(),
            seq: top,
            culprits: members,
            waiting: Vec::new(),
            reference,
            theirs: Vec::new(),
        });
    }
    None
}

impl Finding<'_> {
    fn verdict(
        &self,
        ranks: &BTreeMap<u32, RankState>,
        dumps: &BTreeMap<u32, &Dump>,
        since_ms: u64,
        now_ms: u64,
    ) -> Verdict {
        let empty = RankState::default();
        let state = |k: u32| ranks.get(&k).unwrap_or(&empty);
        let group = group_name(self.group, &self.members);
        let what = match self.reference {
            Some(e) => format!("{} #{} of {group}", e.shape(), self.seq),
            None => format!("collective #{} of {group}", self.seq),
        };
        let site = self.reference.and_then(Entry::call_site).map(|f| format!(", called at {}", place(f)));
        let site = site.unwrap_or_default();
        let secs = format!("{:.1} s", now_ms.saturating_sub(since_ms) as f64 / 1000.0);
        let culprits: Vec<Culprit> = match self.kind {
            VerdictKind::Mismatch => self
                .theirs
                .iter()
                .map(|(k, e)| {
                    let at = e.call_site().map(|f| format!(" at {}", place(f))).unwrap_or_default();
                    culprit(*k, state(*k), format!("entered #{} of {group} as {}{at}", self.seq, e.shape()))
                })
                .collect(),
            VerdictKind::NeverEntered => self
                .culprits
                .iter()
                .map(|k| {
                    let last = dumps[k].group(&self.group.name).map_or(0, |s| s.last_enqueued);
                    let now = where_now(state(*k)).map(|f| format!("; its main thread is at {}", place(f)));
                    let detail = format!("never entered {what}, its last was #{last}{}", now.unwrap_or_default());
                    culprit(*k, state(*k), detail)
                })
                .collect(),
            _ => {
                self.culprits.iter().map(|k| culprit(*k, state(*k), format!("inside {what}, not completed"))).collect()
            }
        };
        let summary = match self.kind {
            VerdictKind::Mismatch => {
                let mine: Vec<String> = self.theirs.iter().map(|(_, e)| e.shape()).collect();
                format!(
                    "mismatch at #{} of {group}: {} entered it as {}; {} as {}{site}",
                    self.seq,
                    who(&culprits),
                    mine.join(" / "),
                    ranks_text(&self.waiting),
                    self.reference.map_or_else(|| "?".to_string(), Entry::shape),
                )
            }
            VerdictKind::NeverEntered => {
                let now: Vec<String> = self
                    .culprits
                    .iter()
                    .filter_map(|k| where_now(state(*k)).map(|f| format!("rank {k} is at {}", place(f))))
                    .collect();
                let now = if now.is_empty() { String::new() } else { format!("; {}", now.join(", ")) };
                format!(
                    "{} never entered {what}{site}{now}; {} waiting {secs}",
                    who(&culprits),
                    ranks_text(&self.waiting)
                )
            }
            _ => format!(
                "all of {group} entered {what}{site} and none completed it in {secs}; the odd stack out is the culprit"
            ),
        };
        let collective = self.reference.and_then(|e| collective_ref(e, self.seq));
        verdict(self.kind, culprits, collective, self.waiting.clone(), since_ms, now_ms, summary)
    }
}

/// `process group 0 (default_pg, ranks 0-1)`: the config's ranks, else the members seen.
fn group_name(g: &Group, members: &[u32]) -> String {
    let desc = if g.desc.is_empty() || g.desc == "undefined" { String::new() } else { format!("{}, ", g.desc) };
    let ranks = if g.ranks.is_empty() { members } else { &g.ranks };
    format!("process group {} ({desc}{})", g.name, ranks_text(ranks))
}

/// `ranks 0-3`, `ranks 0, 2`, `rank 1`.
fn ranks_text(ranks: &[u32]) -> String {
    match ranks {
        [] => "no rank".into(),
        [one] => format!("rank {one}"),
        [first, .., last] if ranks.windows(2).all(|w| w[1] == w[0] + 1) => format!("ranks {first}-{last}"),
        _ => format!("ranks {}", ranks.iter().map(u32::to_string).collect::<Vec<_>>().join(", ")),
    }
}

/// `torch_ddp.py:57 (main)`.
fn place(f: &Frame) -> String {
    format!("{} ({})", f.site(), f.name)
}

/// The innermost frame of the user's program on the rank's main thread, from the shim.
fn where_now(r: &RankState) -> Option<&Frame> {
    r.torch.as_ref()?.main_stack.iter().find(|f| f.is_user())
}

fn collective_ref(e: &Entry, seq: u64) -> Option<CollectiveRef> {
    let op = e.collective_op()?;
    Some(CollectiveRef { seq, op, elements: e.elements(), bytes: e.bytes(), step: crate::ids::Step(0) })
}
