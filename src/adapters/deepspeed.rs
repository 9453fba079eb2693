//! DeepSpeed (`runtime/engine.py` `_report_progress`, `utils/timer.py`, `utils/comms_logging.py`): step lines, timer rows, throughput, the comms logger.
//!
//! `[2026-12-03 10:00:00,000] [INFO] [logging.py:107:log_dist] [Rank 0] step=10, skipped=0,
//! lr=[0.0001, 0.0001], mom=[(0.9, 0.999), (0.9, 0.999)]`; `[Rank 0] time (ms) | fwd: 12.34 |
//! bwd: 23.45 | step: 3.21`; `epoch=0/micro_step=10/global_step=10, RunningAvgSamplesPerSec=12.3,
//! CurrSamplesPerSec=12.5, MemAllocated=1.2GB, MaxMemAllocated=3.4GB`; `comm op: all_reduce |
//! time (ms): 1.23 | msg size: 1.0 MB | algbw (Gbps): 12.34 | busbw (Gbps): 23.45`.
use super::value::{count, leading_number, name, number};
use super::{Label, Record, RecordKind};

pub fn parse(line: u64, text: &str) -> Option<Record> {
    let body = text.rsplit_once("] ").map_or(text, |(_, b)| b);
    if let Some(rest) = body.strip_prefix("step=") {
        return step(line, rest);
    }
    if let Some(rest) = body.strip_prefix("time (ms) |") {
        return timers(line, rest);
    }
    if let Some(rest) = body.strip_prefix("comm op: ") {
        return comm_op(line, rest);
    }
    if body.starts_with("epoch=") && body.contains("global_step=") {
        return throughput(line, body);
    }
    None
}

/// Splits `a=1, b=[x, y], c=(p, q)` at the commas outside brackets.
fn top_level(s: &str) -> Vec<&str> {
    let (mut out, mut depth, mut start) = (Vec::new(), 0i32, 0);
    for (i, c) in s.char_indices() {
        match c {
            '[' | '(' => depth += 1,
            ']' | ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(s[start..i].trim());
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(s[start..].trim());
    out
}

/// A list or tuple gives its first number: `[0.0001, 0.0001]` → 0.0001, `[(0.9, 0.999)]` → 0.9.
fn first_number(v: &str) -> Option<f64> {
    let inner = v.trim_start_matches(['[', '(']).trim();
    number(inner.split([',', ')', ']']).next()?.trim())
}

fn step(line: u64, rest: &str) -> Option<Record> {
    let parts = top_level(rest);
    let mut r = Record::at(line, RecordKind::Step);
    r.step = Some(count(parts.first()?)?);
    for part in &parts[1..] {
        let (k, v) = part.split_once('=')?;
        if let Some(v) = first_number(v) {
            r.metrics.push((name(k), v));
        }
    }
    Some(r)
}

fn timers(line: u64, rest: &str) -> Option<Record> {
    let mut r = Record::at(line, RecordKind::Timers);
    for seg in rest.split('|') {
        let Some((k, v)) = seg.split_once(':') else { continue };
        r.metrics.push((name(&format!("{} ms", k.trim())), number(v)?));
    }
    (!r.metrics.is_empty()).then_some(r)
}

fn throughput(line: u64, body: &str) -> Option<Record> {
    let mut r = Record::at(line, RecordKind::Step);
    for part in body.split(", ") {
        for kv in part.split('/') {
            let (k, v) = kv.split_once('=')?;
            match k {
                "global_step" => r.step = count(v),
                "epoch" | "micro_step" => r.labels.push((k.to_string(), Label::Int(count(v)? as i64))),
                _ => {
                    let (value, unit) = leading_number(v)?;
                    let unit = unit.trim();
                    let key =
                        if unit.is_empty() { k.to_string() } else { format!("{k}_{}", unit.to_ascii_lowercase()) };
                    r.metrics.push((key, value));
                }
            }
        }
    }
    (r.step.is_some() && !r.metrics.is_empty()).then_some(r)
}

/// `comm op: all_reduce | time (ms): 1.23 | msg size: 1.0 MB | algbw (Gbps): 12.34 | busbw (Gbps): 23.45`
fn comm_op(line: u64, rest: &str) -> Option<Record> {
    let mut segs = rest.split('|');
    let op = segs.next()?.trim();
    let mut r = Record::at(line, RecordKind::CommOp);
    r.labels.push(("op".into(), Label::Text(op.to_string())));
    for seg in segs {
        let (k, v) = seg.split_once(':')?;
        let k = k.trim();
        if k == "msg size" {
            // convert_size prints B, KB, MB, GB (powers of 1024): kept in MB.
            let (value, unit) = leading_number(v)?;
            let scale = match unit.trim() {
                "B" => 1.0 / (1024.0 * 1024.0),
                "KB" => 1.0 / 1024.0,
                "MB" => 1.0,
                "GB" => 1024.0,
                "TB" => 1024.0 * 1024.0,
                _ => return None,
            };
            r.metrics.push(("msg_size_mb".into(), value * scale));
        } else {
            r.metrics.push((name(k), number(v)?));
        }
    }
    Some(r)
}
