//! DeepSpeed's comms logger (`utils/comms_logging.py`, since 0.7.0): the per-op line and the summary tables.
//!
//! `CommsLogger.append` (verbose): 0.7.0–0.10.0 `rank=0 | comm op: all_reduce | time (ms): 1.23 |
//! msg size: 512.0 KB | algbw (Gbps): 3.41  | busbw (Gbps): 5.97 `, since 0.10.1 `comm op:
//! all_reduce | time (ms): 1.23 | msg size: 512.0 KB | algbw (Gbps): 3.41 | busbw (Gbps): 5.97`
//! (both through `log_dist`, so after `[Rank 0] `); in debug mode the op is `all_reduce | [Caller
//! Func: f]`. `log_all` prints the summary table (several lines: `CommsTable`).
use super::super::value::{count, leading_number, name, number};
use super::super::{Label, Record, RecordKind};
use crate::adapters::value::Scan;

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
        let op = trimmed.cut(" | ").map_or(trimmed, |(op, _)| op);
        if !op.is_empty() && op.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
            self.op = Some(op.to_string());
            return Some(Vec::new());
        }
        *self = CommsTable::default();
        None
    }
}

fn header(trimmed: &str) -> Option<Table> {
    if !(trimmed.starts_with("Comm. Op") && trimmed.has("Message Size")) {
        return None;
    }
    if trimmed.has("Total Latency(ms)") {
        Some(Table::Summary)
    } else if trimmed.has("Total straggler(ms)") {
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

/// `convert_size`'s units (`round(size / 1024**i, 2)` and `B`, `KB`, ... `YB`), in MB.
fn size_scale_mb(unit: &str) -> Option<f64> {
    let i = ["B", "KB", "MB", "GB", "TB", "PB", "EB", "ZB", "YB"].iter().position(|u| *u == unit)?;
    Some(1024f64.powi(i as i32 - 2))
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

/// The per-op line after `comm op: `: `all_reduce | time (ms): 1.23 | msg size: 512.0 KB | algbw
/// (Gbps): 3.41 | busbw (Gbps): 5.97`, the op possibly followed by `| [Caller Func: f]`. Every
/// other segment is `label: number` (the size in MB); anything else is not this line.
pub fn comm_op(line: u64, rest: &str) -> Option<Record> {
    let mut segs = rest.split('|');
    let op = segs.next()?.trim();
    if op.is_empty() || op.contains(':') {
        return None;
    }
    let mut r = Record::at(line, RecordKind::CommOp);
    r.labels.push(("op".into(), Label::Text(op.to_string())));
    for seg in segs {
        let seg = seg.trim();
        if seg.starts_with("[Caller Func:") && seg.ends_with(']') {
            continue;
        }
        let (k, v) = seg.split_once(':')?;
        let k = k.trim();
        if k == "msg size" {
            let (value, unit) = leading_number(v)?;
            r.metrics.push(("msg_size_mb".into(), value * size_scale_mb(unit.trim())?));
        } else {
            r.metrics.push((name(k), number(v)?));
        }
    }
    r.metrics.iter().any(|(k, _)| k == "time_ms").then_some(r)
}
