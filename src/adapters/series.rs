//! The series a record writes into the history: the framework's own names, and the cockpit's standard ones they mean.
//!
//! A training step's, an eval's, a progress bar's and the final summary's metrics keep their
//! printed names (`lm_loss`, `rewards/chosen`, `eval_loss`, `it/s`); the others are prefixed
//! with their kind (`validation/lm_loss_value`, `memory/allocated_mb`, `timers/forward_compute`),
//! so a name means one thing per run. A collective's records are also named by their op (and the
//! summary's by message size): `comm_op/all_reduce/time_ms`,
//! `comms_summary/all_reduce/4.0MB/avg_latency_ms`. A training step also writes `standard()`'s series
//! (`loss`, `step_time_ms`, ...), which the default layout charts for every framework.
use super::{standard, Label, Record, RecordKind};
use std::borrow::Cow;

pub fn series(record: &Record) -> Vec<(Cow<'static, str>, f64)> {
    let prefix = match record.kind {
        RecordKind::Step | RecordKind::Eval | RecordKind::Progress | RecordKind::TrainSummary => None,
        RecordKind::Event | RecordKind::Info => return Vec::new(),
        RecordKind::Validation => Some("validation"),
        RecordKind::Memory => Some("memory"),
        RecordKind::Timers => Some("timers"),
        RecordKind::CommOp | RecordKind::CommsSummary => return collective(record),
    };
    let mut out: Vec<(Cow<'static, str>, f64)> = record
        .metrics
        .iter()
        .map(|(name, v)| match prefix {
            Some(p) => (Cow::Owned(format!("{p}/{name}")), *v),
            None => (Cow::Owned(name.clone()), *v),
        })
        .collect();
    if record.kind == RecordKind::Step {
        for (name, v) in standard(record) {
            // A framework that already prints `loss` or `lr` writes it once.
            if !out.iter().any(|(n, _)| n == name) {
                out.push((Cow::Borrowed(name), v));
            }
        }
    }
    out
}

/// `comm_op/OP/METRIC`, `comms_summary/OP/SIZE/METRIC` (the size, in the name, is no metric).
fn collective(record: &Record) -> Vec<(Cow<'static, str>, f64)> {
    let text = |key: &str| match record.label(key) {
        Some(Label::Text(t)) => t.replace(' ', ""),
        _ => "unknown".to_string(),
    };
    let prefix = match record.kind {
        RecordKind::CommsSummary => format!("comms_summary/{}/{}", text("op"), text("msg_size")),
        _ => format!("comm_op/{}", text("op")),
    };
    let size_is_named = record.kind == RecordKind::CommsSummary;
    record
        .metrics
        .iter()
        .filter(|(name, _)| !(size_is_named && name == "msg_size_mb"))
        .map(|(name, v)| (Cow::Owned(format!("{prefix}/{name}")), *v))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(kind: RecordKind, metrics: &[(&str, f64)]) -> Record {
        let metrics = metrics.iter().map(|(n, v)| (n.to_string(), *v)).collect();
        Record { line: 1, end_line: None, step: Some(3), kind, metrics, labels: Vec::new() }
    }

    #[test]
    fn step_names_are_kept_and_other_kinds_are_prefixed() {
        let names = |r: &Record| series(r).into_iter().map(|(n, _)| n.into_owned()).collect::<Vec<_>>();
        let step = record(RecordKind::Step, &[("rewards/chosen", 0.5)]);
        assert_eq!(names(&step)[0], "rewards/chosen");
        let mem = record(RecordKind::Memory, &[("allocated_mb", 10.0)]);
        assert_eq!(names(&mem), vec!["memory/allocated_mb"]);
        assert!(series(&record(RecordKind::Event, &[("tried_mib", 1.0)])).is_empty(), "failures are events");
        let mut op = record(RecordKind::CommOp, &[("time_ms", 1.0), ("msg_size_mb", 4.0)]);
        op.labels.push(("op".into(), Label::Text("all_reduce".into())));
        assert_eq!(names(&op), vec!["comm_op/all_reduce/time_ms", "comm_op/all_reduce/msg_size_mb"]);
        op.kind = RecordKind::CommsSummary;
        op.labels.push(("msg_size".into(), Label::Text("4.0 MB".into())));
        assert_eq!(names(&op), vec!["comms_summary/all_reduce/4.0MB/time_ms"], "one series per op and size");
    }
}
