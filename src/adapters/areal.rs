//! AReaL (inclusionAI/AReaL): the realhf master worker's step line and RPC statistics (0.1 to 0.5), and the stats tables of both eras (realhf 0.3 on, areal-lite 0.3.0-lite to 1.x).
//!
//! - realhf `system/master_worker.py` prints, after each step, `Epoch 1/10 step 3/100 (global
//!   step 3) finishes. Average #tokens per batch is 1234. #End to end# execution time:
//!   *12.345*s. Total time consumption: 123.456s. Estimated remaining time: 1234.567s. TFLOP/s
//!   per GPU: 12.34, total TFLOP/s: 98.76.` (the token average to 0.2; TFLOP/s from 0.2): a
//!   training step.
//! - realhf 0.1 and 0.2 log the train RPCs' statistics as a dict: `RPC name actor_train returns
//!   {'ppo_approx_kl': 0.0012, ...}` (`master_worker.py`, then `model_function_call.py`): a
//!   training step's metrics without a step (label `rpc`).
//! - From 0.3, realhf prints them through `data_api.tabulate_stats` (tabulate's `fancy_grid`,
//!   four key/value pairs a row, `.4e`): `RPC name actor_train returns` (or `returns (1/2)`) and
//!   the table on the next lines; `Model rpc actor_train finished. Request-reply time 1.2345s.
//!   Detailed time stats:` and a table of times (`.2f`, ending `╛.`): a `timers` record.
//! - areal-lite (`areal/utils/stats_logger.py` `StatsLogger.commit`, 0.3.0-lite on) logs `Epoch
//!   1/5 Step 3/100 Train step 3/500 done.`, `Stats (1/1):` and the table: a training step
//!   at the train step printed above it.
//!
//! A table is read only right after one of those headers (`Tables`, a reader's state). The
//! logger's prefix (`20250301-12:00:00.123 master worker INFO: `, from 1.0 `(AReaL) ` before
//! it; `realhf/base/logging.py`, `areal/utils/logging.py`) is the cleaner's.
use super::value::{count, leading_number, name, number};
use super::verl::py_dict;
use super::{Label, Record, RecordKind};
use crate::adapters::value::Scan;

pub fn parse(line: u64, text: &str) -> Option<Record> {
    let text = own_header(text);
    match text.as_bytes().first()? {
        b'E' => finishes(line, text),
        b'R' => rpc_dict(line, text),
        _ => None,
    }
}

/// `Epoch 1/10 step 3/100 (global step 3) finishes. #End to end# execution time: *12.345*s. ...`
fn finishes(line: u64, text: &str) -> Option<Record> {
    let rest = text.strip_prefix("Epoch ")?;
    let (head, rest) = rest.cut(" (global step ")?;
    let (epoch, epoch_step) = head.cut(" step ")?;
    let (g, rest) = rest.cut(") finishes. ")?;
    let mut r = Record::at(line, RecordKind::Step);
    r.step = Some(count(g)?);
    r.labels.push(("epoch".into(), Label::Text(epoch.to_string())));
    r.labels.push(("epoch_step".into(), Label::Text(epoch_step.to_string())));
    for sentence in rest.trim_end_matches('.').split(". ") {
        let (label, value) = if let Some(v) = sentence.strip_prefix("Average #tokens per batch is ") {
            ("Average #tokens per batch", v)
        } else if let Some((l, v)) = sentence.cut(": ") {
            (l, v)
        } else {
            return None;
        };
        // `TFLOP/s per GPU: 12.34, total TFLOP/s: 98.76`
        if let Some((v, more)) = value.cut(", ") {
            let (l2, v2) = more.cut(": ")?;
            r.metrics.push((name(label), number(v)?));
            r.metrics.push((name(l2), number(v2)?));
            continue;
        }
        let value = value.trim_matches('*');
        let (v, unit) = leading_number(value)?;
        let unit = unit.trim_matches('*');
        match unit {
            "" => r.metrics.push((name(label), v)),
            "s" => r.metrics.push((name(&format!("{label} s")), v)),
            _ => return None,
        }
    }
    (!r.metrics.is_empty()).then_some(r)
}

/// `RPC name actor_train returns {'ppo_approx_kl': 0.0012, ...}` (realhf 0.1, 0.2).
fn rpc_dict(line: u64, text: &str) -> Option<Record> {
    let rest = text.strip_prefix("RPC name ")?;
    let (rpc, dict) = rest.cut(" returns {")?;
    let mut r = Record::at(line, RecordKind::Step);
    r.metrics = py_dict(&text[text.len() - dict.len() - 1..])?;
    r.labels.push(("rpc".into(), Label::Text(rpc.to_string())));
    (!r.metrics.is_empty()).then_some(r)
}

/// AReaL's logger header (`LOG_FORMAT = "%(asctime)s.%(msecs)03d %(name)s %(levelname)s:
/// %(message)s"`, `DATE_FORMAT = "%Y%m%d-%H:%M:%S"`; from 1.0 `(AReaL) ` before it, and
/// `merged.log`'s `[main]    ` before that): `20250301-12:00:01.123 master worker INFO: `. The
/// logger's name may hold spaces. Taken off here, so a line reads the same whether or not the
/// shared cleaner knows it.
pub(super) fn own_header(text: &str) -> &str {
    let mut t = text;
    if t.starts_with('[') {
        // merged.log's `"[main]".ljust(10)`
        match t.find(']') {
            Some(end) if end < 16 && t[1..end].bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') => {
                t = t[end + 1..].trim_start();
            }
            _ => return text,
        }
    }
    if let Some(rest) = t.strip_prefix("(AReaL) ") {
        t = rest;
    }
    // `20250301-12:00:01.123 `
    let b = t.as_bytes();
    let stamp = b.len() > 22
        && b[..21].iter().enumerate().all(|(i, c)| match i {
            8 => *c == b'-',
            11 | 14 => *c == b':',
            17 => *c == b'.',
            _ => c.is_ascii_digit(),
        })
        && b[21] == b' ';
    if !stamp {
        return text;
    }
    let rest = &t[22..];
    for level in [" INFO:", " WARNING:", " DEBUG:", " ERROR:", " CRITICAL:"] {
        if let Some(at) = rest.find(level) {
            if at > 0 && at < 64 {
                let message = &rest[at + level.len()..];
                return message.strip_prefix(' ').unwrap_or(message);
            }
        }
    }
    text
}

/// The tables `tabulate_stats` prints under a header line, read into one record each.
#[derive(Default)]
pub struct Tables {
    /// The last `Train step G/M done.` (areal-lite): the step of the stats that follow.
    train_step: Option<u64>,
    /// The record a header announced (its `line` the header's), waiting for its table's top
    /// rule on one of the next two lines. Changed only by lines it takes, so a line read twice
    /// (whole, then without a pdsh host) reads the same.
    pending: Option<Record>,
    /// The table being read.
    open: Option<Record>,
}

impl Tables {
    /// Reads one line; `None` when it is neither a header nor a table's (an open table is
    /// dropped there, unfinished).
    pub fn push(&mut self, line: u64, text: &str) -> Option<Vec<Record>> {
        let t = own_header(text).trim();
        if let Some(mut r) = self.open.take() {
            if let Some(row) = t.strip_prefix('│') {
                cells(row, &mut r.metrics)?;
                self.open = Some(r);
                return Some(Vec::new());
            }
            if t.starts_with('├') && t.ends_with('┤') {
                self.open = Some(r);
                return Some(Vec::new());
            }
            if t.starts_with('╘') && t.trim_end_matches('.').ends_with('╛') {
                r.end_line = Some(line);
                return Some(if r.metrics.is_empty() { Vec::new() } else { vec![r] });
            }
            return None;
        }
        if t.starts_with('╒') && t.ends_with('╕') {
            // The top rule right under its header (the logger's own header line of
            // `logger.info("\n" + table)` may come between).
            let mut r = self.pending.take().filter(|r| line <= r.line + 2)?;
            r.line = line;
            self.open = Some(r);
            return Some(Vec::new());
        }
        if t.is_empty() && self.pending.as_ref().is_some_and(|r| line <= r.line + 1) {
            return Some(Vec::new());
        }
        let header = self.header(line, t)?;
        self.pending = header;
        Some(Vec::new())
    }

    /// A header line: `Some(record)` for one that announces a table, `Some(None)` for the
    /// `Train step ... done.` line, `None` for any other line.
    fn header(&mut self, line: u64, t: &str) -> Option<Option<Record>> {
        match t.as_bytes().first()? {
            b'R' => {
                let rest = t.strip_prefix("RPC name ")?;
                let (rpc, tail) = rest.cut(" returns")?;
                let tail = tail.trim();
                // `returns` or `returns (1/2)`.
                if !(tail.is_empty() || tail.starts_with('(') && tail.ends_with(')')) {
                    return None;
                }
                let mut r = Record::at(line, RecordKind::Step);
                r.labels.push(("rpc".into(), Label::Text(rpc.to_string())));
                Some(Some(r))
            }
            b'M' => {
                let rest = t.strip_prefix("Model rpc ")?;
                let (rpc, tail) = rest.cut(" finished. ")?;
                if !tail.ends_with("Detailed time stats:") {
                    return None;
                }
                let mut r = Record::at(line, RecordKind::Timers);
                r.labels.push(("rpc".into(), Label::Text(rpc.to_string())));
                Some(Some(r))
            }
            b'S' => {
                // `Stats (1/1):`
                let inner = t.strip_prefix("Stats (")?.strip_suffix("):")?;
                let (i, n) = inner.split_once('/')?;
                count(i)?;
                count(n)?;
                let mut r = Record::at(line, RecordKind::Step);
                r.step = self.train_step;
                Some(Some(r))
            }
            b'E' => {
                // `Epoch 1/5 Step 3/100 Train step 3/500 done.`
                let rest = t.strip_prefix("Epoch ")?.strip_suffix(" done.")?;
                let (_, g) = rest.cut(" Train step ")?;
                let (g, _) = g.split_once('/')?;
                self.train_step = Some(count(g)?);
                Some(None)
            }
            _ => None,
        }
    }
}

/// `│ key │ 1.2345e-01 │ key2 │ 5 │` (the leading `│` gone): its key/value pairs; empty
/// cells (the last row's padding) give nothing, a value that is no number none either.
fn cells(row: &str, out: &mut Vec<(String, f64)>) -> Option<()> {
    let row = row.trim_end().strip_suffix('│')?;
    let cells: Vec<&str> = row.split('│').map(str::trim).collect();
    if !cells.len().is_multiple_of(2) {
        return None;
    }
    for pair in cells.chunks(2) {
        let (k, v) = (pair[0], pair[1]);
        if k.is_empty() {
            continue;
        }
        if let Some(v) = number(v) {
            out.push((name(k), v));
        }
    }
    Some(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_master_workers_step_line() {
        let r = parse(1, "Epoch 1/10 step 3/100 (global step 3) finishes. #End to end# execution time: *12.345*s. Total time consumption: 123.456s. Estimated remaining time: 1234.567s. TFLOP/s per GPU: 12.34, total TFLOP/s: 98.76.").unwrap();
        assert_eq!(r.step, Some(3));
        let names: Vec<&str> = r.metrics.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            names,
            [
                "end_to_end_execution_time_s",
                "total_time_consumption_s",
                "estimated_remaining_time_s",
                "tflop_s_per_gpu",
                "total_tflop_s"
            ]
        );
        assert!(parse(1, "Epoch 1/10 step 3/100 (global step 3) finishes. Something else happened.").is_none());
    }

    #[test]
    fn its_logger_headers_are_taken_off() {
        assert_eq!(own_header("20250301-12:00:01.123 master worker INFO: RPC name a returns"), "RPC name a returns");
        assert_eq!(own_header("(AReaL) 20251230-10:00:00.125 StatsLogger INFO:"), "");
        assert_eq!(own_header("[main]    (AReaL) 20251230-10:00:01.000 RLTrainer INFO: x"), "x");
        assert_eq!(own_header("20250301 nothing"), "20250301 nothing");
    }

    #[test]
    fn a_table_after_its_header() {
        let mut t = Tables::default();
        let lines = [
            "Epoch 1/5 Step 3/100 Train step 3/500 done.",
            "Stats (1/1):",
            "╒══════════════╤════════════╤══════════╤═════╕",
            "│ ppo_actor/a  │ 1.2345e-01 │ time/b   │ 5   │",
            "├──────────────┼────────────┼──────────┼─────┤",
            "│ ppo_actor/c  │ nan        │          │     │",
            "╘══════════════╧════════════╧══════════╧═════╛",
        ];
        let mut out = Vec::new();
        for (i, l) in lines.iter().enumerate() {
            out.extend(t.push(i as u64 + 1, l).expect("ours"));
        }
        assert_eq!(out.len(), 1);
        assert_eq!((out[0].step, out[0].line, out[0].end_line), (Some(3), 3, Some(7)));
        assert_eq!(out[0].metrics.len(), 3);
        // A table with no header above it is someone else's.
        assert_eq!(t.push(8, lines[2]), None);
    }
}
