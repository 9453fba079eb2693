//! Failures the ranks' logs reported (a watchdog timeout, a NCCL transport error, a CUDA error) turned into one `failure` verdict that names the root cause first.
//!
//! Each rank's first failure line is kept with when it arrived. The verdict waits `CONFIRM_MS`
//! after the first one, so that the lines the other ranks print because of it arrive too, then
//! orders the ranks by their first failure, as torchrun's report orders its children ("Root
//! Cause (first observed failure)"). A watchdog's work numbers sharpen that: when the ranks
//! report the same timed-out work and one rank's last completed work is behind the others',
//! that rank is the one that never finished, whatever the order the lines came in.
use super::classify::{culprit, verdict, who};
use super::RankState;
use crate::adapters::{Label, Record};
use crate::protocol::{Culprit, Verdict, VerdictKind};
use std::collections::BTreeMap;

/// Events that are no failure of a rank by themselves: a NaN loss has its own handling
/// (`recovery.on_nan`); the others are the aftermath of a failure elsewhere (a launcher closing
/// its other children, a watchdog taking its process down, a dump asked for, srun waiting).
const NOT_FAILURES: [&str; 7] = [
    "nan_loss",
    "closing_signal",
    "death_signal",
    "process_teardown",
    "nccl_ops_failed",
    "dump_signal",
    "slurm_step_aborted",
];

/// What one rank's log said first.
#[derive(Clone, Debug)]
struct Seen {
    at_ms: u64,
    /// Arrival order, for lines that arrived in one batch.
    order: u64,
    record: Record,
    name: String,
}

#[derive(Debug, Default)]
pub struct LogFailures {
    first: BTreeMap<u32, Seen>,
    arrived: u64,
    /// When the first failure arrived, while its verdict waits.
    pending: Option<u64>,
    given: bool,
}

impl LogFailures {
    /// A record from rank `printer`'s log: kept if it is that rank's (or the rank it names)
    /// first failure.
    pub fn observe(&mut self, now_ms: u64, printer: u32, record: &Record) {
        let Some((name, about)) = record.failure(printer) else { return };
        if NOT_FAILURES.contains(&name) {
            return;
        }
        self.arrived += 1;
        let name = name.to_string();
        let order = self.arrived;
        self.first.entry(about).or_insert_with(|| Seen { at_ms: now_ms, order, record: record.clone(), name });
        if !self.given && self.pending.is_none() {
            self.pending = Some(now_ms);
        }
    }

    /// The verdict, once its wait is over (`now_or_never`: the run ended, settle now). `hang`
    /// is the verdict the flight recorder and phases gave, if one holds: the failure verdict
    /// says whether it agrees.
    pub fn confirm(
        &mut self,
        ranks: &BTreeMap<u32, RankState>,
        now_ms: u64,
        now_or_never: bool,
        hang: Option<&Verdict>,
    ) -> Option<Verdict> {
        let since = self.pending?;
        if !now_or_never && now_ms.saturating_sub(since) < super::CONFIRM_MS {
            return None;
        }
        self.pending = None;
        self.given = true;
        Some(self.judge(ranks, since, now_ms, hang))
    }

    fn judge(&self, ranks: &BTreeMap<u32, RankState>, since: u64, now_ms: u64, hang: Option<&Verdict>) -> Verdict {
        let mut order: Vec<(&u32, &Seen)> = self.first.iter().collect();
        // torchrun's report marks its root cause (the first observed failure): it goes first.
        let root = |s: &Seen| int(&s.record, "root_cause") != Some(1);
        order.sort_by_key(|(rank, s)| (root(s), s.at_ms, s.order, **rank));
        let unfinished = never_finished(&order);
        if let Some((rank, _)) = &unfinished {
            // The rank that never finished the work the others timed out in goes first.
            order.sort_by_key(|(r, s)| (**r != *rank, s.at_ms, s.order, **r));
        }
        let empty = RankState::default();
        let culprits: Vec<Culprit> = order
            .iter()
            .map(|(rank, s)| {
                let r = ranks.get(rank).unwrap_or(&empty);
                let mut c = culprit(**rank, r, describe(&s.name, &s.record));
                if c.host.is_empty() {
                    c.host = text(&s.record, "host").unwrap_or_default();
                }
                if c.pid.is_none() {
                    c.pid = int(&s.record, "pid").and_then(|p| u32::try_from(p).ok());
                }
                c
            })
            .collect();
        let Some(first) = culprits.first() else {
            return verdict(VerdictKind::Failure, Vec::new(), None, Vec::new(), since, now_ms, "no failure".into());
        };
        let mut summary = match &unfinished {
            Some((_, seq)) => {
                format!("{} never finished work {seq}: {}", who(std::slice::from_ref(first)), first.detail)
            }
            None => format!("{} failed first: {}", who(std::slice::from_ref(first)), first.detail),
        };
        if culprits.len() > 1 {
            let rest: Vec<String> = culprits[1..]
                .iter()
                .map(|c| format!("{} ({})", c.rank, self.first[&c.rank].name.replace('_', " ")))
                .collect();
            summary.push_str(&format!("; then {} {}", if rest.len() == 1 { "rank" } else { "ranks" }, rest.join(", ")));
        }
        if let Some(h) = hang {
            let named: Vec<u32> = h.culprits.iter().map(|c| c.rank).collect();
            if named.contains(&first.rank) {
                summary.push_str(&format!("; the flight recorder agrees ({}: {})", h.kind.name(), h.summary));
            } else if !named.is_empty() {
                summary.push_str(&format!(
                    "; the flight recorder names {} instead ({})",
                    who(&h.culprits),
                    h.kind.name()
                ));
            }
        }
        let waiting: Vec<u32> =
            ranks.iter().filter(|(k, r)| r.live() && !self.first.contains_key(k)).map(|(k, _)| *k).collect();
        verdict(VerdictKind::Failure, culprits, None, waiting, since, now_ms, summary)
    }
}

/// The rank whose last completed work is behind the others' when every reporting rank timed
/// out in the same work: (rank, the work it never finished).
fn never_finished(order: &[(&u32, &Seen)]) -> Option<(u32, i64)> {
    let done: Vec<(u32, i64)> =
        order.iter().filter_map(|(rank, s)| int(&s.record, "last_completed").map(|c| (**rank, c))).collect();
    if done.len() < 2 {
        return None;
    }
    let low = done.iter().map(|(_, c)| *c).min()?;
    let behind: Vec<u32> = done.iter().filter(|(_, c)| *c == low).map(|(r, _)| *r).collect();
    (behind.len() == 1 && done.len() > behind.len()).then(|| (behind[0], low + 1))
}

/// One line on a failure: its name, reason and the work, group and error it names.
pub fn describe(name: &str, r: &Record) -> String {
    let mut out = name.replace('_', " ");
    if let Some(reason) = text(r, "reason") {
        out.push_str(&format!(": {reason}"));
    }
    let mut parts = Vec::new();
    if let Some(e) = text(r, "error") {
        parts.push(e);
    }
    match (int(r, "seq"), text(r, "op")) {
        (Some(seq), Some(op)) => parts.push(format!("{op} work {seq}")),
        (Some(seq), None) => parts.push(format!("work {seq}")),
        (None, Some(op)) => parts.push(op),
        (None, None) => {}
    }
    if let Some(e) = int(r, "last_enqueued") {
        parts.push(format!("last enqueued {e}"));
    }
    if let Some(c) = int(r, "last_completed") {
        parts.push(format!("last completed {c}"));
    }
    match (int(r, "pg_id"), text(r, "pg_desc")) {
        (Some(id), Some(d)) => parts.push(format!("PG {id} ({d})")),
        (Some(id), None) => parts.push(format!("PG {id}")),
        (None, Some(d)) => parts.push(format!("PG {d}")),
        (None, None) => {}
    }
    for (key, unit) in [("ran_for_ms", "ran for"), ("timeout_ms", "timeout")] {
        if let Some((_, v)) = r.metrics.iter().find(|(k, _)| k == key) {
            parts.push(format!("{unit} {:.0} s", v / 1000.0));
        }
    }
    if let Some(code) = int(r, "exit_code") {
        parts.push(format!("exit code {code}"));
    }
    if let Some(sig) = text(r, "signal_name").or_else(|| int(r, "signal").map(|s| format!("signal {s}"))) {
        parts.push(sig);
    }
    if !parts.is_empty() {
        out.push_str(&format!(" ({})", parts.join(", ")));
    }
    out.push_str(&match r.end_line {
        Some(end) => format!(", log lines {}-{end}", r.line),
        None => format!(", log line {}", r.line),
    });
    out
}

fn int(r: &Record, key: &str) -> Option<i64> {
    match r.label(key) {
        Some(Label::Int(i)) => Some(*i),
        Some(Label::Text(t)) => t.parse().ok(),
        None => None,
    }
}

fn text(r: &Record, key: &str) -> Option<String> {
    match r.label(key) {
        Some(Label::Text(t)) if !t.is_empty() => Some(t.clone()),
        Some(Label::Int(i)) => Some(i.to_string()),
        _ => None,
    }
}
