//! DeepSpeed (`runtime/engine.py` `_report_progress`, `utils/timer.py`, `utils/comms_logging.py`): step lines, timer rows, throughput, the comms logger.
//!
//! `[2026-12-03 10:00:00,000] [INFO] [logging.py:107:log_dist] [Rank 0] step=10, skipped=0,
//! lr=[0.0001, 0.0001], mom=[(0.9, 0.999), (0.9, 0.999)]`; `[Rank 0] time (ms) | fwd: 12.34 |
//! bwd: 23.45 | step: 3.21`; `epoch=0/micro_step=10/global_step=10, RunningAvgSamplesPerSec=12.3,
//! CurrSamplesPerSec=12.5, MemAllocated=1.2GB, MaxMemAllocated=3.4GB`; `comm op: all_reduce |
//! time (ms): 1.23 | msg size: 1.0 MB | algbw (Gbps): 12.34 | busbw (Gbps): 23.45`; and the comms
//! logger's summary table (`CommsLogger.log_all`, several lines: `CommsTable`).
use super::value::{count, leading_number, name, number};
use super::{Label, Record, RecordKind};

/// The comms logger's summary (`log_all`): a header of 20-wide columns, then per op its name on
/// a line of its own (`all_reduce`, or `all_reduce | [Caller Func: f]` in debug mode) and one
/// row per message size: `{' ': <20}{convert_size(size): <20}{count: <20}{total: <20.2f}...`.
/// With `show_straggler` a second table follows (`Breakdown with straggler effect`). Each row
/// is a `comms_summary` record; the state is the table and the op being read, nothing more.
#[derive(Debug, Default)]
pub struct CommsTable {
    table: Option<Table>,
    op: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Table {
    Summary,
    Straggler,
}

impl Table {
    fn name(self) -> &'static str {
        match self {
            Table::Summary => "summary",
            Table::Straggler => "straggler",
        }
    }

    /// Columns four to seven, named as `log_all(return_dict=True)` names them.
    fn columns(self) -> [&'static str; 4] {
        match self {
            Table::Summary => ["total_latency_ms", "avg_latency_ms", "tput_avg_gbps", "busbw_avg_gbps"],
            Table::Straggler => ["total_comm_lat_ms", "total_straggler_ms", "avg_comm_lat_ms", "avg_straggler_ms"],
        }
    }
}

/// The rules `log_all` prints between the two tables.
const STRAGGLER_RULES: [&str; 3] =
    ["_______________________________", "Breakdown with straggler effect", "-------------------------------"];

impl CommsTable {
    /// Reads one line; `None` when it is not the table's (the table, if open, ends there).
    pub fn push(&mut self, line: u64, text: &str) -> Option<Vec<Record>> {
        let trimmed = text.trim();
        if let Some(table) = header(trimmed) {
            *self = CommsTable { table: Some(table), op: None };
            return Some(Vec::new());
        }
        let table = self.table?;
        if STRAGGLER_RULES.contains(&trimmed) {
            return Some(Vec::new());
        }
        if let Some(row) = row(trimmed) {
            let Some(op) = &self.op else { return Some(Vec::new()) };
            return Some(vec![row.record(line, table, op)]);
        }
        // `record_name`: the op, or `op | [Caller Func: f]` when the logger is in debug mode.
        let op = trimmed.split_once(" | ").map_or(trimmed, |(op, _)| op);
        if !op.is_empty() && op.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
            self.op = Some(op.to_string());
            return Some(Vec::new());
        }
        *self = CommsTable::default();
        None
    }
}

fn header(trimmed: &str) -> Option<Table> {
    if !(trimmed.starts_with("Comm. Op") && trimmed.contains("Message Size")) {
        return None;
    }
    if trimmed.contains("Total Latency(ms)") {
        Some(Table::Summary)
    } else if trimmed.contains("Total straggler(ms)") {
        Some(Table::Straggler)
    } else {
        None
    }
}

/// One row: message size (`0B`, or `4.0 MB`), count, four numbers.
struct Row {
    /// As printed, the label: `4.0 MB`.
    size: String,
    size_mb: f64,
    count: f64,
    values: [f64; 4],
}

fn row(trimmed: &str) -> Option<Row> {
    let words: Vec<&str> = trimmed.split_whitespace().collect();
    let (size, size_mb, rest) = match words.as_slice() {
        ["0B", rest @ ..] => ("0B".to_string(), 0.0, rest),
        [value, unit, rest @ ..] => (format!("{value} {unit}"), number(value)? * size_scale_mb(unit)?, rest),
        _ => return None,
    };
    let [count_text, a, b, c, d] = rest else { return None };
    let count = count(count_text)? as f64;
    let values = [number(a)?, number(b)?, number(c)?, number(d)?];
    Some(Row { size, size_mb, count, values })
}

/// `convert_size`'s units (powers of 1024), in MB.
fn size_scale_mb(unit: &str) -> Option<f64> {
    Some(match unit {
        "B" => 1.0 / (1024.0 * 1024.0),
        "KB" => 1.0 / 1024.0,
        "MB" => 1.0,
        "GB" => 1024.0,
        "TB" => 1024.0 * 1024.0,
        _ => return None,
    })
}

impl Row {
    fn record(&self, line: u64, table: Table, op: &str) -> Record {
        let mut r = Record::at(line, RecordKind::CommsSummary);
        r.labels.push(("op".into(), Label::Text(op.to_string())));
        r.labels.push(("msg_size".into(), Label::Text(self.size.clone())));
        r.labels.push(("table".into(), Label::Text(table.name().into())));
        r.metrics.push(("msg_size_mb".into(), self.size_mb));
        r.metrics.push(("count".into(), self.count));
        for (name, value) in table.columns().into_iter().zip(self.values) {
            r.metrics.push((name.into(), value));
        }
        r
    }
}

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
            let scale = size_scale_mb(unit.trim())?;
            r.metrics.push(("msg_size_mb".into(), value * scale));
        } else {
            r.metrics.push((name(k), number(v)?));
        }
    }
    Some(r)
}
