//! Megatron-LM and its forks (Megatron-DeepSpeed, Megatron-Bridge): the iteration line, validation, memory and timer lines, every version since v1.0 (2020).
//!
//! What `training.py`'s `training_log`, `evaluate_and_print_results`, `utils.report_memory` and
//! the timers (`global_vars.Timers` until 2022, then `timers.py`) print, by version
//! (`tests/fixtures/logs/megatron/SOURCES.md` cites each):
//! - the iteration line, ` iteration {:8d}/{:8d} | label: value | ... |`, since v1.0; core_v0.6
//!   (2024) put ` [%Y-%m-%d %H:%M:%S]` before it, core_v0.16 (2026) added `.%f`. Every `label:
//!   number` segment is a metric (`lm loss`, `load_balancing_loss`, `mtp_1 loss`, `throughput per
//!   GPU (TFLOP/s/GPU)`, `energy per GPU (J/iter/GPU)`, `num zeros`, Megatron-DeepSpeed's
//!   `consumed tokens`, `TFLOPs`, RL's `toks/s`, `packing_eff: 87.5%` as `packing_eff_pct`); the
//!   denominator is a total, not a metric.
//! - ` validation loss at iteration 100 | lm loss value: 2.345678E+00 | lm loss PPL: ... | `, at
//!   the end of training `... at the end of training for val data |` (until 2024) or `... at
//!   iteration 100 on validation set |` (since 2023-07), with several sets ` validation-NAME loss
//!   at ...`; BigScience's Megatron-DeepSpeed prints its split's name: `valid loss at ...`.
//! - `[Rank 0] (after 10 iterations) memory (MB) | allocated: ... | max reserved: ...` (v1.0 printed
//!   `after 10 iterations memory (MB) | ... | cached: ...` without the rank); Megatron-Bridge's
//!   `memory (GB) | mem-allocated-gigabytes: ...`, its names kept as printed.
//! - timers: `time (ms) | forward-compute: 193.77 | ...` until 2022, then `--timing-log-option`
//!   `minmax` (`    forward-backward ....: (1834.56, 1840.12)` under `(min, max) time across ranks
//!   (ms):`), `max` (`    forward-backward ....: 1840.12`) and `all` (`times across ranks (ms):`,
//!   then `  forward-backward:` and a `     rank  0: 1834.56` row per rank, read by `RankTimes`).
//!
//! Python prints NaN and infinity as `NAN`/`INF` under `{:.6E}` and Lightning pads them to
//! `nan.0`/`inf.0`: `num` reads both.
use super::value::{count, leading_count, name, number};
use super::{Label, Record, RecordKind};
use crate::adapters::value::Scan;

pub fn parse(line: u64, text: &str) -> Option<Record> {
    if text.has(" |") {
        let body = text.trim_start();
        if let Some(rest) = body.strip_prefix("time (ms) |") {
            return old_timers(line, rest);
        }
        if let Some((set, rest)) = body.cut(" loss at ") {
            if !set.contains(' ') {
                return validation(line, set, rest);
            }
        }
        if let Some(at) = text.at("iteration ") {
            let head = text[..at].trim();
            if head.is_empty() || head.starts_with('[') && head.ends_with(']') {
                return iteration(line, &text[at..]);
            }
        }
        if text.has(" memory (MB) |") || text.has(" memory (GB) |") {
            return memory(line, text);
        }
        return None;
    }
    timer_row(line, text)
}

/// A printed number, also as Python's `{:E}` (`NAN`, `INF`) and Lightning's padded bar (`nan.0`,
/// `inf.0`, `-inf.`) print NaN and infinities.
pub fn num(printed: &str) -> Option<f64> {
    match printed.trim() {
        "NAN" | "nan.0" | "nan." => Some(f64::NAN),
        "INF" | "inf.0" | "inf." => Some(f64::INFINITY),
        "-INF" | "-inf." | "-inf.0" => Some(f64::NEG_INFINITY),
        s => number(s),
    }
}

/// `label: value |` segments, numbers only; `87.5%` is the label's `_pct`.
pub fn segments(r: &mut Record, rest: &str) {
    for seg in rest.split('|') {
        let Some((label, value)) = seg.split_once(':') else { continue };
        let label = label.trim();
        if label.is_empty() {
            continue;
        }
        let value = value.trim();
        if let Some(pct) = value.strip_suffix('%') {
            if let Some(v) = num(pct) {
                r.metrics.push((name(&format!("{label} pct")), v));
            }
        } else if let Some(v) = num(value) {
            r.metrics.push((name(label), v));
        }
    }
}

/// `iteration      10/     100 | consumed samples: 640 | ...`
fn iteration(line: u64, text: &str) -> Option<Record> {
    let (first, rest) = text.split_once('|')?;
    let (n, after) = leading_count(first.strip_prefix("iteration ")?.trim_start())?;
    // The denominator (train_iters) is a total, not a metric.
    count(after.trim_start().strip_prefix('/')?.trim())?;
    let mut r = Record::at(line, RecordKind::Step);
    r.step = Some(n);
    segments(&mut r, rest);
    (!r.metrics.is_empty()).then_some(r)
}

/// `validation loss at iteration 100 on validation set | lm loss value: ... | lm loss PPL: ... |`,
/// `validation-NAME loss at ...` (several sets, core_v0.14+), `validation loss at the end of
/// training for val data | ...` (until 2024), BigScience's Megatron-DeepSpeed `valid loss at ...`
/// (its split's name). A `K value:` segment is the check.
fn validation(line: u64, set: &str, rest: &str) -> Option<Record> {
    let (at, rest) = rest.split_once('|')?;
    if !rest.has(" value: ") {
        return None;
    }
    let at = at.trim();
    let mut r = Record::at(line, RecordKind::Validation);
    if let Some(n) = at.strip_prefix("iteration ") {
        let (n, after) = leading_count(n)?;
        r.step = Some(n);
        if let Some(split) = after.trim().strip_prefix("on ").filter(|s| !s.is_empty()) {
            r.labels.push(("split".into(), Label::Text(split.to_string())));
        }
    } else if let Some(split) = at.strip_prefix("the end of training for ") {
        r.labels.push(("split".into(), Label::Text(split.to_string())));
    } else {
        return None;
    }
    let set = set.strip_prefix("validation").map_or(Some(set), |named| named.strip_prefix('-'));
    if let Some(set) = set.filter(|s| !s.is_empty()) {
        r.labels.push(("set".into(), Label::Text(set.to_string())));
    }
    segments(&mut r, rest);
    (!r.metrics.is_empty()).then_some(r)
}

/// `[Rank 0] (after 10 iterations) memory (MB) | allocated: 4021.5 | ...`; v1.0's `after 10
/// iterations memory (MB) | ...`; `(before save_checkpoint for iteration 100)`; Megatron-Bridge's
/// `memory (GB) | mem-allocated-gigabytes: 12.3 | mem-alloc-retires: 0` (names carry their unit).
fn memory(line: u64, text: &str) -> Option<Record> {
    let (head, unit, rest) = match text.cut(" memory (MB) |") {
        Some((head, rest)) => (head, Some("MB"), rest),
        None => {
            let (head, rest) = text.cut(" memory (GB) |")?;
            (head, None, rest)
        }
    };
    let mut r = Record::at(line, RecordKind::Memory);
    let mut what = head.trim();
    if let Some(after) = what.strip_prefix("[Rank ") {
        let (rank, after) = leading_count(after)?;
        r.labels.push(("rank".into(), Label::Int(rank as i64)));
        what = after.strip_prefix(']')?.trim();
    }
    let what = what.strip_prefix('(').and_then(|w| w.strip_suffix(')')).unwrap_or(what);
    // `after 10 iterations`, `after save_checkpoint for iteration 100`.
    let after = what.strip_prefix("after ").and_then(leading_count).filter(|(_, t)| t.starts_with(" iteration"));
    r.step = after.map(|(n, _)| n).or_else(|| what.rsplit_once(" iteration ").and_then(|(_, n)| count(n)));
    for seg in rest.split('|') {
        let Some((label, value)) = seg.split_once(':') else { continue };
        if let Some(v) = num(value) {
            let label = label.trim();
            let metric = match unit {
                Some(unit) => name(&format!("{label} {unit}")),
                None => name(label),
            };
            r.metrics.push((metric, v));
        }
    }
    (!r.metrics.is_empty()).then_some(r)
}

/// Until 2022: `time (ms) | forward-compute: 193.77 | backward-compute: 73.02 | ...` (the same
/// line and record as DeepSpeed's timers).
fn old_timers(line: u64, rest: &str) -> Option<Record> {
    let mut r = Record::at(line, RecordKind::Timers);
    for seg in rest.split('|') {
        let Some((k, v)) = seg.split_once(':') else { continue };
        r.metrics.push((name(&format!("{} ms", k.trim())), number(v)?));
    }
    (!r.metrics.is_empty()).then_some(r)
}

/// `    {(name + ' ').ljust(48, '.')}: ({min:.2f}, {max:.2f})` (`minmax`) or `: {max:.2f}` (`max`).
/// The padding to 48 columns is the check (three bytes, so most lines cost nothing): an argument
/// dump (`  lr ....... 0.0003`) has no colon. A name of 47 characters or more has no dots: not read.
pub fn timer_row(line: u64, text: &str) -> Option<Record> {
    let t = text.trim_start();
    if t.as_bytes().get(47..50) != Some(b".: ".as_slice()) {
        return None;
    }
    let (padded, values) = (&t[..47], &t[50..]);
    let label = padded.trim_end_matches('.').strip_suffix(' ')?;
    if label.is_empty() {
        return None;
    }
    let values = values.trim_end();
    let mut r = Record::at(line, RecordKind::Timers);
    r.labels.push(("timer".into(), Label::Text(label.to_string())));
    if let Some(pair) = values.strip_prefix('(').and_then(|v| v.strip_suffix(')')) {
        let (min, max) = pair.cut(", ")?;
        r.metrics.push((name(&format!("{label} min ms")), number(min)?));
        r.metrics.push((name(&format!("{label} max ms")), number(max)?));
    } else {
        r.metrics.push((name(&format!("{label} max ms")), number(values)?));
    }
    Some(r)
}

/// `--timing-log-option all`: `times across ranks (ms):`, then per timer `  forward-backward:` and
/// a `     rank  0: 1834.56` row per rank that timed it. One record per row: kind `timers`, labels
/// `timer` and `rank`, the metric `{timer}_ms`. The block ends at the first other line.
#[derive(Default)]
pub struct RankTimes {
    open: bool,
    timer: Option<String>,
}

impl RankTimes {
    /// `Some` when the line is the block's (its records, maybe none), `None` when it is not.
    pub fn push(&mut self, line: u64, text: &str) -> Option<Vec<Record>> {
        if text.ends_with("times across ranks (ms):") {
            self.open = true;
            self.timer = None;
            return Some(Vec::new());
        }
        if !self.open {
            return None;
        }
        let body = text.trim();
        if let Some(row) = body.strip_prefix("rank ") {
            if let (Some(timer), Some((rank, value))) = (&self.timer, row.cut(": ")) {
                if let (Some(rank), Some(v)) = (count(rank.trim()), number(value)) {
                    let mut r = Record::at(line, RecordKind::Timers);
                    r.labels.push(("timer".into(), Label::Text(timer.clone())));
                    r.labels.push(("rank".into(), Label::Int(rank as i64)));
                    r.metrics.push((name(&format!("{timer} ms")), v));
                    return Some(vec![r]);
                }
            }
        } else if let Some(timer) = body.strip_suffix(':').filter(|t| !t.is_empty() && !t.contains(' ')) {
            self.timer = Some(timer.to_string());
            return Some(Vec::new());
        }
        self.open = false;
        self.timer = None;
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metrics(r: &Record) -> Vec<(&str, f64)> {
        r.metrics.iter().map(|(n, v)| (n.as_str(), *v)).collect()
    }

    #[test]
    fn iteration_lines_of_every_version() {
        // v1.0 (2020): no consumed samples, `{:.3E}` learning rate.
        let r = parse(1, " iteration      100/  500000 | elapsed time per iteration (ms): 1234.5 | learning rate: 1.500E-04 | lm loss: 7.123456E+00 | loss scale: 65536.0 |").unwrap();
        assert_eq!(r.step, Some(100));
        assert_eq!(metrics(&r)[3], ("loss_scale", 65536.0));
        // core_v0.16+: a timestamp with microseconds, MoE and MTP losses, energy.
        let r = parse(2, " [2026-03-01 12:00:00.123456] iteration       20/    1000 | consumed samples:        10240 | elapsed time per iteration (ms): 2100.3 | energy per GPU (J/iter/GPU): 1400.2 | learning rate: 2.000000E-05 | global batch size:   512 | lm loss: 8.716962E-01 | load_balancing_loss: 1.012345E+00 | mtp_1 loss: 1.115410E+00 | loss scale: 1.0 | grad norm: 0.852 | num zeros: 0 | number of skipped iterations:   0 | number of nan iterations:   0 |").unwrap();
        assert_eq!(r.step, Some(20));
        let m = metrics(&r);
        assert!(m.contains(&("energy_per_gpu_j_iter_gpu", 1400.2)));
        assert!(m.contains(&("load_balancing_loss", 1.012345)));
        assert!(m.contains(&("mtp_1_loss", 1.11541)));
        assert!(m.contains(&("num_zeros", 0.0)));
        // RL's packing efficiency is a percentage.
        let r = parse(3, " [2026-03-01 12:00:00] iteration        2/      10 | consumed samples:          128 | toks/s: 51234 | packing_eff: 87.5% |").unwrap();
        assert_eq!(metrics(&r), vec![("consumed_samples", 128.0), ("toks/s", 51234.0), ("packing_eff_pct", 87.5)]);
    }

    #[test]
    fn validation_memory_and_timers() {
        let r = parse(1, " validation-wiki loss at iteration 200 | lm loss value: NAN | lm loss PPL: 4.851652E+08 | ")
            .unwrap();
        assert_eq!((r.kind, r.step), (RecordKind::Validation, Some(200)));
        assert!(r.metrics[0].1.is_nan());
        assert_eq!(r.label("set"), Some(&Label::Text("wiki".into())));
        let r = parse(2, "valid loss at iteration 1000 | lm loss value: 2.000000E+00 | lm loss PPL: 7.389056E+00 | ")
            .unwrap();
        assert_eq!((r.step, r.label("set")), (Some(1000), Some(&Label::Text("valid".into()))));
        let r =
            parse(2, " validation loss at the end of training for test data | lm loss value: 2.000000E+00 | ").unwrap();
        assert_eq!((r.step, r.label("split")), (None, Some(&Label::Text("test data".into()))));
        let r = parse(3, "after 5 iterations memory (MB) | allocated: 10250.5693359375 | cached: 17482.0").unwrap();
        assert_eq!((r.kind, r.step), (RecordKind::Memory, Some(5)));
        assert_eq!(metrics(&r), vec![("allocated_mb", 10250.5693359375), ("cached_mb", 17482.0)]);
        let r = parse(4, "[Rank 3] (before save_checkpoint for iteration 100) memory (MB) | allocated: 1.00").unwrap();
        assert_eq!((r.step, r.label("rank")), (Some(100), Some(&Label::Int(3))));
        let row = format!(
            "    {}: {:.2}",
            format!("{} ", "forward-backward").chars().chain(std::iter::repeat('.')).take(48).collect::<String>(),
            12.5
        );
        let r = parse(5, &row).unwrap();
        assert_eq!(metrics(&r), vec![("forward_backward_max_ms", 12.5)]);
        let r = parse(6, "time (ms) | forward: 483.93 | batch generator: 3.45").unwrap();
        assert_eq!(metrics(&r), vec![("forward_ms", 483.93), ("batch_generator_ms", 3.45)]);
    }

    #[test]
    fn the_all_block_names_each_rank_and_ends_at_another_line() {
        let mut t = RankTimes::default();
        assert_eq!(t.push(1, "     rank  0: 1.00"), None, "no header, no block");
        assert_eq!(t.push(2, "times across ranks (ms):"), Some(vec![]));
        assert_eq!(t.push(3, "  forward-backward:"), Some(vec![]));
        let rows = t.push(4, "     rank 12: 1840.12").unwrap();
        assert_eq!(rows[0].label("rank"), Some(&Label::Int(12)));
        assert_eq!(metrics(&rows[0]), vec![("forward_backward_ms", 1840.12)]);
        assert_eq!(t.push(5, " iteration 3/ 10 | lm loss: 1.0 |"), None);
        assert_eq!(t.push(6, "     rank  0: 1.00"), None);
        assert_eq!(t.push(7, "(min, max) time across ranks (ms):"), None);
    }

    #[test]
    fn look_alikes_give_nothing() {
        for t in [
            "  lr .............................................. 0.0003",
            "  timing_log_option ............................... minmax",
            "(min, max) time across ranks (ms):",
            "    train:      12800",
            "[after dataloaders are built] datetime: 2022-10-31 08:35:51 ",
            "  saving checkpoint at iteration     100 to /ckpt in torch_dist format",
            "successfully saved checkpoint from iteration     100 to /ckpt [ t 1/1, p 1/1 ]",
            "Theoretical memory footprints: weight and optimizer=1234.56 MB, activation=2345.67 MB, total=3580.23 MB",
            "validation loss went up | check the learning rate |",
            "train loss at iteration 5 | lm loss: 1.0 |",
            "WARNING: iteration 5 | lm loss: 1.0 |",
            "note: x .....: (a, b)",
        ] {
            assert_eq!(parse(1, t), None, "{t}");
        }
    }
}
