//! Megatron-LM (`megatron/training/training.py` `training_log`, `evaluate_and_print_results`, `utils.report_memory`, `timers.py`): iteration, validation, memory and timer lines.
//!
//! ` [2026-12-03 10:00:00] iteration       10/     100 | consumed samples:          640 | elapsed
//! time per iteration (ms): 1234.5 | learning rate: 1.000000E-04 | global batch size:    64 | lm
//! loss: 9.876543E+00 | loss scale: 1.0 | grad norm: 1.234 | number of skipped iterations:   0 |
//! number of nan iterations:   0 |` (one line), ` validation loss at iteration 100 | lm loss
//! value: 2.345678E+00 | lm loss PPL: 1.043960E+01 | `, `[Rank 0] (after 10 iterations) memory
//! (MB) | allocated: 1234.5 | max allocated: ...`, and the timer rows under `(min, max) time
//! across ranks (ms):`: `    forward-backward ....: (1234.56, 1240.12)`.
use super::value::{count, leading_count, name, number};
use super::{Label, Record, RecordKind};

pub fn parse(line: u64, text: &str) -> Option<Record> {
    if text.contains(" | ") {
        if let Some(at) = text.find("iteration ") {
            let head = &text[..at];
            if head.trim().is_empty() || head.trim_end().ends_with(']') {
                return iteration(line, &text[at..]);
            }
        }
        if let Some(at) = text.find("validation loss at ") {
            return validation(line, &text[at + "validation loss at ".len()..]);
        }
        if text.contains(") memory (MB) | ") {
            return memory(line, text);
        }
    }
    timer_row(line, text)
}

/// `name: value |` segments after the first, numbers only.
fn segments(r: &mut Record, rest: &str, suffix: &str) {
    for seg in rest.split('|') {
        let Some((label, value)) = seg.split_once(':') else { continue };
        let label = label.trim().strip_suffix(suffix).unwrap_or(label.trim());
        if let Some(v) = number(value) {
            r.metrics.push((name(label), v));
        }
    }
}

fn iteration(line: u64, text: &str) -> Option<Record> {
    let (first, rest) = text.split_once('|')?;
    let (n, after) = leading_count(first.strip_prefix("iteration ")?.trim_start())?;
    // The denominator (train_iters) is a total, not a metric.
    count(after.trim_start().strip_prefix('/')?.trim())?;
    let mut r = Record::at(line, RecordKind::Step);
    r.step = Some(n);
    segments(&mut r, rest, "");
    (!r.metrics.is_empty()).then_some(r)
}

fn validation(line: u64, text: &str) -> Option<Record> {
    let (first, rest) = text.split_once('|')?;
    let mut r = Record::at(line, RecordKind::Validation);
    if let Some(n) = first.trim().strip_prefix("iteration ") {
        r.step = leading_count(n).map(|(n, _)| n);
    }
    let split = first.split_once(" on ").map(|(_, s)| s.trim().to_string());
    if let Some(split) = split.filter(|s| !s.is_empty()) {
        r.labels.push(("split".into(), Label::Text(split)));
    }
    segments(&mut r, rest, "");
    (!r.metrics.is_empty()).then_some(r)
}

fn memory(line: u64, text: &str) -> Option<Record> {
    let mut r = Record::at(line, RecordKind::Memory);
    if let Some(rank) = text.strip_prefix("[Rank ").and_then(|t| leading_count(t)) {
        r.labels.push(("rank".into(), Label::Int(rank.0 as i64)));
    }
    if let Some(after) = text.split_once("(after ").and_then(|(_, t)| leading_count(t)) {
        r.step = Some(after.0);
    }
    let (_, rest) = text.split_once(") memory (MB) |")?;
    for seg in rest.split('|') {
        let Some((label, value)) = seg.split_once(':') else { continue };
        if let Some(v) = number(value) {
            r.metrics.push((name(&format!("{} MB", label.trim())), v));
        }
    }
    (!r.metrics.is_empty()).then_some(r)
}

/// `    forward-backward ...............................: (1234.56, 1240.12)`
fn timer_row(line: u64, text: &str) -> Option<Record> {
    if !text.starts_with("    ") || !text.ends_with(')') {
        return None;
    }
    let (label, values) = text.trim().split_once(" ..")?;
    let values = values.trim_start_matches('.').strip_prefix(": (")?.strip_suffix(')')?;
    let (min, max) = values.split_once(", ")?;
    let mut r = Record::at(line, RecordKind::Timers);
    r.labels.push(("timer".into(), Label::Text(label.trim().to_string())));
    r.metrics.push((name(&format!("{} min ms", label.trim())), number(min)?));
    r.metrics.push((name(&format!("{} max ms", label.trim())), number(max)?));
    Some(r)
}
