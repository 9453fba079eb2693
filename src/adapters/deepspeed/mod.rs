//! DeepSpeed, every printing form since 0.3: step, timer, throughput, pipeline and ZeRO memory lines.
//!
//! The code it follows: `runtime/engine.py` `_report_progress`, `utils/timer.py`
//! (`SynchronizedWallClockTimer.log`, `ThroughputTimer.stop`), the pipeline engine's step line,
//! `runtime/utils.py` `see_memory_usage`, and the comms logger (`comms.rs`).
//!
//! Lines come behind DeepSpeed's logger header (`[%(asctime)s] [%(levelname)s]
//! [%(filename)s:%(lineno)d:%(funcName)s] %(message)s`, `utils/logging.py`, unchanged since 0.3)
//! and `log_dist`'s `[Rank N] ` (N is -1 before `torch.distributed` is up), or bare (`print`,
//! and `print_dist` since 0.18). Both are stripped here whether or not a generic stripper ran
//! first; the header is looked for anywhere in the line, since a tqdm bar redrawn without a
//! newline is often glued in front of it.
//!
//! | form | versions |
//! | --- | --- |
//! | `step=10, skipped=0, lr=[0.0001], mom=[(0.9, 0.999)]` | all |
//! | `rank=0 time (ms) \| forward_microstep: 1.23 \| ...` | 0.3.0–0.10.0 (bare until 0.3.11) |
//! | `time (ms) \| fwd_microstep: 1.23 \| ...` | 0.10.1– |
//! | `time (ms) \| forward: 1.23 (forward_moe: ..., 1st alltoall: ..., top-k: ...)` | MoE, 0.6– |
//! | `0/50, SamplesPerSec=12.3` | 0.3.0–0.5.10 |
//! | `0/50, SamplesPerSec=12.3, MemAllocated=1.2GB, MaxMemAllocated=3.4GB` | 0.6.x |
//! | `0/50, RunningAvgSamplesPerSec=..., CurrSamplesPerSec=..., MemAllocated=...GB, ...` | 0.7.x |
//! | `epoch=0/micro_step=10/global_step=10, RunningAvgSamplesPerSec=..., ...` | 0.8.0– |
//! | `steps: 10 loss: 2.3456 iter time (s): 0.123 samples/sec: 260.163` (pipeline) | all |
//! | `MA 1.23 GB         Max_MA 2.34 GB         CA 3.45 GB         Max_CA 4 GB` | 0.3.10– |
//! | `CPU Virtual Memory:  used = 12.3 GB, percent = 45.6%` | 0.3.12– |
//! | `comm op: ...` and the comms summary tables | 0.7.0– (`comms.rs`) |
use crate::adapters::value::Scan;
mod comms;

use super::value::{count, is_identifier, leading_count, leading_number, name, number};
use super::{Label, Record, RecordKind};
pub use comms::CommsTable;

pub fn parse(line: u64, text: &str) -> Option<Record> {
    let body = message(text);
    if let Some(rest) = body.strip_prefix("step=") {
        return step(line, rest);
    }
    if let Some(rest) = body.strip_prefix("steps: ") {
        return pipe_step(line, rest);
    }
    let unranked = strip_rank_eq(body);
    if let Some(rest) = unranked.strip_prefix("time (ms)") {
        return timers(line, rest);
    }
    if let Some(rest) = unranked.strip_prefix("| ").unwrap_or(unranked).strip_prefix("comm op: ") {
        return comms::comm_op(line, rest);
    }
    if body.starts_with("epoch=") || body.starts_with(|c: char| c.is_ascii_digit()) {
        return throughput(line, body);
    }
    if body.starts_with("MA ") {
        return see_memory_usage(line, body);
    }
    if let Some(rest) = body.strip_prefix("CPU Virtual Memory:") {
        return cpu_memory(line, rest);
    }
    // A throughput line behind a logger of the user's own (`[INFO 2020-06-08 06:02:19] 0/450,
    // SamplesPerSec=7.45`): its `, ...SamplesPerSec=` is specific enough to look for.
    let at = body.at(", SamplesPerSec=").or_else(|| body.at(", RunningAvgSamplesPerSec="))?;
    let start = body[..at].rfind([' ', ']']).map(|i| i + 1)?;
    throughput(line, &body[start..])
}

/// The message: after DeepSpeed's logger header if the line has one, then after `[Rank N] `.
fn message(text: &str) -> &str {
    match after_header(text) {
        Some(msg) => strip_rank(msg).unwrap_or(msg),
        None => {
            // Without a header, `[Rank N] ` may still follow a glued tqdm bar.
            let trimmed = text.trim_start();
            if let Some(rest) = strip_rank(trimmed) {
                return rest;
            }
            match trimmed.at("[Rank ") {
                Some(at) => strip_rank(&trimmed[at..]).unwrap_or(trimmed),
                None => trimmed,
            }
        }
    }
}

const LEVELS: [&str; 5] = ["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"];

/// `[2024-05-01 12:00:00,123] [INFO] [logging.py:96:log_dist] ` anywhere in the line: what follows.
fn after_header(text: &str) -> Option<&str> {
    let mut from = 0;
    while let Some(i) = text[from..].at("] [") {
        let at = from + i;
        from = at + 3;
        let Some(open) = text[..at].rfind('[') else { continue };
        let stamp = &text[open + 1..at];
        let is_stamp = stamp.len() >= 19
            && stamp.as_bytes()[..4].iter().all(u8::is_ascii_digit)
            && stamp.as_bytes()[4] == b'-'
            && stamp.bytes().all(|b| b.is_ascii_digit() || matches!(b, b'-' | b':' | b',' | b'.' | b' '));
        if !is_stamp {
            continue;
        }
        let Some((level, rest)) = text[from..].cut("] [") else { continue };
        if !LEVELS.contains(&level) {
            continue;
        }
        let (site, msg) = match rest.cut("] ") {
            Some(split) => split,
            None => (rest.strip_suffix(']').unwrap_or(rest), ""),
        };
        let mut parts = site.split(':');
        let (Some(file), Some(lineno), Some(func), None) = (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        if !file.is_empty() && count(lineno).is_some() && !func.is_empty() && !func.contains(' ') {
            return Some(msg);
        }
    }
    None
}

/// `log_dist`'s `[Rank 0] ` (or `[Rank -1] `) at the start: what follows.
fn strip_rank(s: &str) -> Option<&str> {
    let rest = s.strip_prefix("[Rank ")?;
    let (rank, rest) = rest.split_once(']')?;
    count(rank.strip_prefix('-').unwrap_or(rank))?;
    Some(rest.strip_prefix(' ').unwrap_or(rest))
}

/// The timer and comms lines' `rank=0 ` before 0.10.1 (`rank=0 time (ms)`, `rank=0 | comm op:`).
fn strip_rank_eq(s: &str) -> &str {
    let Some(rest) = s.strip_prefix("rank=") else { return s };
    match leading_count(rest) {
        Some((_, tail)) if tail.starts_with(' ') => &tail[1..],
        _ => s,
    }
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

/// A list or tuple gives its first element, nested ones too: `[0.0001, 0.0001]` → 0.0001,
/// `[(0.9, 0.999)]` and `[[0.9, 0.95]]` → 0.9, `[tensor(0.0001)]` → 0.0001; `[]` → none.
fn first_number(v: &str) -> Option<f64> {
    let mut v = v.trim();
    while let Some(inner) = v.strip_prefix(['[', '(']) {
        let inner = inner.strip_suffix([']', ')']).unwrap_or(inner);
        v = top_level(inner).first().copied()?;
    }
    number(v)
}

/// `_report_progress`: `step=10, skipped=0, lr=[0.0001, 0.0001], mom=[(0.9, 0.999), ...]`.
fn step(line: u64, rest: &str) -> Option<Record> {
    let parts = top_level(rest);
    let mut r = Record::at(line, RecordKind::Step);
    r.step = Some(count(parts.first()?)?);
    if !parts.get(1)?.starts_with("skipped=") {
        return None;
    }
    for part in &parts[1..] {
        let (k, v) = part.split_once('=')?;
        if let Some(v) = first_number(v) {
            r.metrics.push((name(k), v));
        }
    }
    Some(r)
}

/// The pipeline engine's `train_batch`: `steps: {} loss: {:0.4f} ` then, since 0.14.1, `{name}:
/// {:0.4f} ` per additional loss, then `iter time (s): {:0.3f} samples/sec: {:0.3f}` (`print`).
fn pipe_step(line: u64, rest: &str) -> Option<Record> {
    // `N loss`, `2.3456 iter time (s)`, ..., `260.163`: each piece is the previous label's value
    // and the next label.
    let pieces: Vec<&str> = rest.split(": ").collect();
    let (last, inner) = pieces.split_last()?;
    let mut r = Record::at(line, RecordKind::Step);
    let mut label = "steps";
    for piece in inner {
        let (value, next) = piece.trim().split_once(' ')?;
        push_pipe(&mut r, label, value)?;
        label = next.trim();
    }
    push_pipe(&mut r, label, last)?;
    let has = |k: &str| r.metrics.iter().any(|(n, _)| n == k);
    (r.step.is_some() && has("loss") && has("iter_time_s")).then_some(r)
}

fn push_pipe(r: &mut Record, label: &str, value: &str) -> Option<()> {
    if label == "steps" {
        r.step = Some(count(value)?);
    } else {
        r.metrics.push((name(label), number(value)?));
    }
    Some(())
}

/// `SynchronizedWallClockTimer.log`, after `time (ms)`: ` | name: {:.2f}` per timer; the MoE
/// forward breakdown adds `(forward_moe: 1.2, 1st alltoall: 0.3, ...)` after its value.
fn timers(line: u64, rest: &str) -> Option<Record> {
    let rest = rest.strip_prefix(" | ")?;
    let mut r = Record::at(line, RecordKind::Timers);
    for seg in rest.split(" | ") {
        let (k, v) = seg.split_once(':')?;
        let (value, tail) = leading_number(v)?;
        r.metrics.push((ms_name(k.trim()), value));
        let tail = tail.trim();
        if tail.is_empty() {
            continue;
        }
        let inner = tail.strip_prefix('(')?.strip_suffix(')')?;
        for part in inner.split(", ") {
            let (k, v) = part.split_once(':')?;
            r.metrics.push((ms_name(k.trim()), number(v)?));
        }
    }
    Some(r)
}

/// A timer's name with the unit the line prints: `fwd_microstep` → `fwd_microstep_ms`,
/// `1st alltoall` → `1st_alltoall_ms`.
fn ms_name(k: &str) -> String {
    if is_identifier(k) {
        format!("{k}_ms")
    } else {
        name(&format!("{k} ms"))
    }
}

/// `ThroughputTimer.stop`: `0/50, SamplesPerSec=...` (to 0.7.x: epoch / steps in the epoch) or
/// `epoch=0/micro_step=10/global_step=10, RunningAvgSamplesPerSec=...` (0.8.0–), and the memory
/// monitor's `0/50, vm percent: 12.3, swap percent: 0.0` / `epoch=.../global_step=10, vm %: ...`.
fn throughput(line: u64, body: &str) -> Option<Record> {
    let (head, rest) = body.cut(", ")?;
    let mut r = Record::at(line, RecordKind::Step);
    if head.starts_with("epoch=") {
        for kv in head.split('/') {
            let (k, v) = kv.split_once('=')?;
            let v = count(v)?;
            match k {
                "epoch" | "micro_step" => r.labels.push((k.to_string(), Label::Int(v as i64))),
                "global_step" => r.step = Some(v),
                _ => return None,
            }
        }
    } else {
        let (epoch, step) = head.split_once('/')?;
        r.labels.push(("epoch".into(), Label::Int(count(epoch)? as i64)));
        r.step = Some(count(step)?);
    }
    r.step?;
    if rest.starts_with("vm ") {
        r.kind = RecordKind::Memory;
        for part in rest.split(", ") {
            let (k, v) = part.cut(": ")?;
            let k = match k.strip_suffix(" %") {
                Some(k) => format!("{k}_pct"),
                None => name(k),
            };
            r.metrics.push((k, number(v)?));
        }
        return Some(r);
    }
    for part in rest.split(", ") {
        let (k, v) = part.split_once('=')?;
        if !k.bytes().all(|b| b.is_ascii_alphanumeric()) {
            return None;
        }
        let (value, unit) = leading_number(v)?;
        match unit {
            "" => r.metrics.push((k.to_string(), value)),
            "GB" => r.metrics.push((format!("{k}_gb"), value)),
            _ => return None,
        }
    }
    r.metrics.iter().any(|(k, _)| k.ends_with("SamplesPerSec")).then_some(r)
}

/// `see_memory_usage`: `MA {} GB         Max_MA {} GB         CA {} GB         Max_CA {} GB `
/// (a string continued over lines, so the spaces are the source's indent).
fn see_memory_usage(line: u64, body: &str) -> Option<Record> {
    let words: Vec<&str> = body.split_whitespace().collect();
    let ["MA", ma, "GB", "Max_MA", max_ma, "GB", "CA", ca, "GB", "Max_CA", max_ca, "GB"] = words.as_slice() else {
        return None;
    };
    let mut r = Record::at(line, RecordKind::Memory);
    for (k, v) in [("MA_gb", ma), ("Max_MA_gb", max_ma), ("CA_gb", ca), ("Max_CA_gb", max_ca)] {
        r.metrics.push((k.into(), number(v)?));
    }
    Some(r)
}

/// `see_memory_usage`'s second line, after `CPU Virtual Memory:`: `  used = {} GB, percent = {}%`.
fn cpu_memory(line: u64, rest: &str) -> Option<Record> {
    let (used, percent) = rest.trim().cut(", ")?;
    let used = used.strip_prefix("used = ")?.strip_suffix(" GB")?;
    let percent = percent.strip_prefix("percent = ")?.strip_suffix('%')?;
    let mut r = Record::at(line, RecordKind::Memory);
    r.metrics.push(("cpu_virtual_memory_used_gb".into(), number(used)?));
    r.metrics.push(("cpu_virtual_memory_percent".into(), number(percent)?));
    Some(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[allow(clippy::type_complexity)] // a test's view of a record, spelled out where it is read
    fn metrics(text: &str) -> Option<(RecordKind, Option<u64>, Vec<(String, f64)>)> {
        parse(1, text).map(|r| (r.kind, r.step, r.metrics))
    }

    fn m(pairs: &[(&str, f64)]) -> Vec<(String, f64)> {
        pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    }

    #[test]
    fn the_header_and_the_rank_go_wherever_they_are() {
        let want = Some((RecordKind::Step, Some(40), m(&[("skipped", 2.0), ("lr", 5e-05), ("mom", 0.9)])));
        let msg = "step=40, skipped=2, lr=[5e-05], mom=[[0.9, 0.999]]";
        for prefix in [
            "[2022-03-11 02:06:58,985] [INFO] [logging.py:69:log_dist] [Rank 0] ",
            "[Rank 0] ",
            "[Rank -1] ",
            "",
            "stdout: [2022-03-11 02:06:58,985] [INFO] [logging.py:69:log_dist] [Rank 0] ",
            " 51%|█████     | 507/1000 [15:32<16:42,  2.03s/it][2022-03-11 02:06:58,985] [INFO] [logging.py:69:log_dist] [Rank 0] ",
            " 51%|█████     | 507/1000 [15:32<16:42,  2.03s/it][Rank 0] ",
        ] {
            assert_eq!(metrics(&format!("{prefix}{msg}")), want, "{prefix}");
        }
        assert_eq!(after_header("[2024-01-01 00:00:00,000] [INFO] [engine.py:1:f]"), Some(""));
        assert_eq!(after_header("[note] [INFO] [a.py:1:f] step=1, skipped=0"), None);
    }

    #[test]
    fn every_timer_form() {
        let old = "rank=0 time (ms) | forward_microstep: 316.02 | backward_microstep: 747.32 | step_microstep: 663.62";
        assert_eq!(
            metrics(old),
            Some((
                RecordKind::Timers,
                None,
                m(&[
                    ("forward_microstep_ms", 316.02),
                    ("backward_microstep_ms", 747.32),
                    ("step_microstep_ms", 663.62)
                ])
            ))
        );
        let moe = "[Rank 0] time (ms) | forward: 12.34 (forward_moe: 1.20, 1st alltoall: 0.30, 2nd alltoall: 0.31, top-k: 0.05)";
        assert_eq!(
            metrics(moe).map(|x| x.2),
            Some(m(&[
                ("forward_ms", 12.34),
                ("forward_moe_ms", 1.2),
                ("1st_alltoall_ms", 0.3),
                ("2nd_alltoall_ms", 0.31),
                ("top-k_ms", 0.05)
            ]))
        );
        assert_eq!(metrics("time (ms)"), None);
        assert_eq!(metrics("time (ms) | forward: slow"), None);
    }

    #[test]
    fn every_throughput_form() {
        let a = metrics("0/2000, SamplesPerSec=9.526738918021234").unwrap();
        assert_eq!((a.1, a.2), (Some(2000), m(&[("SamplesPerSec", 9.526738918021234)])));
        let b = metrics("0/40, SamplesPerSec=83.5, MemAllocated=0.26GB, MaxMemAllocated=9.02GB").unwrap();
        assert_eq!(b.2, m(&[("SamplesPerSec", 83.5), ("MemAllocated_gb", 0.26), ("MaxMemAllocated_gb", 9.02)]));
        let c = metrics("[INFO 2020-06-08 06:02:19] 0/450, SamplesPerSec=7.458824487454903").unwrap();
        assert_eq!(c.1, Some(450));
        let vm = metrics("epoch=0/micro_step=20/global_step=10, vm %: 40.1, swap %: 0.0").unwrap();
        assert_eq!((vm.0, vm.1, vm.2), (RecordKind::Memory, Some(10), m(&[("vm_pct", 40.1), ("swap_pct", 0.0)])));
        assert_eq!(metrics("0/40, loss=2.5"), None);
        assert_eq!(metrics("3/4, done"), None);
        assert_eq!(metrics("we measured SamplesPerSec=12 yesterday"), None);
    }

    #[test]
    fn pipeline_steps_and_memory() {
        let p = metrics("steps: 100 loss: 2.3456 moe_loss: 0.0123 iter time (s): 0.512 samples/sec: 250.031").unwrap();
        assert_eq!(
            (p.1, p.2),
            (Some(100), m(&[("loss", 2.3456), ("moe_loss", 0.0123), ("iter_time_s", 0.512), ("samples/sec", 250.031)]))
        );
        assert_eq!(metrics("steps: 100 of 1000 done"), None);
        let ma = metrics("MA 4.96 GB         Max_MA 5.09 GB         CA 6.39 GB         Max_CA 6 GB").unwrap();
        assert_eq!(ma.2, m(&[("MA_gb", 4.96), ("Max_MA_gb", 5.09), ("CA_gb", 6.39), ("Max_CA_gb", 6.0)]));
        let cpu = metrics("CPU Virtual Memory:  used = 50.45 GB, percent = 40.2%").unwrap();
        assert_eq!(cpu.2, m(&[("cpu_virtual_memory_used_gb", 50.45), ("cpu_virtual_memory_percent", 40.2)]));
    }

    #[test]
    fn comm_ops_old_and_new_and_in_debug_mode() {
        let old = "[Rank 0] rank=0 | comm op: all_reduce | time (ms): 1.23 | msg size: 512.0 KB | algbw (Gbps): 3.41  | busbw (Gbps): 5.97";
        let new = "[Rank 0] comm op: all_reduce | [Caller Func: allreduce_bucket] | time (ms): 1.23 | msg size: 512.0 KB | algbw (Gbps): 3.41 | busbw (Gbps): 5.97";
        for line in [old, new] {
            let r = parse(1, line).unwrap();
            assert_eq!(r.kind, RecordKind::CommOp);
            assert_eq!(r.label("op"), Some(&Label::Text("all_reduce".into())));
            assert_eq!(
                r.metrics,
                m(&[("time_ms", 1.23), ("msg_size_mb", 0.5), ("algbw_gbps", 3.41), ("busbw_gbps", 5.97)])
            );
        }
    }

    /// A generic stripper may take the logger's header (and `[Rank N] `) off before this adapter
    /// sees the line: every fixture line reads the same either way.
    #[test]
    fn fixtures_read_the_same_with_the_header_or_the_rank_stripped_first() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/logs/deepspeed");
        let mut compared = 0;
        for entry in std::fs::read_dir(dir).expect("fixtures") {
            let path = entry.expect("entry").path();
            if path.extension().is_none_or(|e| e != "log") {
                continue;
            }
            for (i, line) in std::fs::read_to_string(&path).expect("fixture").lines().enumerate() {
                // `[ts] [LEVEL] [file:line:func] ` at the very start, cut at its third `] `.
                let mut cut = line;
                if line.starts_with("[20") {
                    let ends: Vec<usize> = line.match_indices("] ").map(|(at, _)| at + 2).take(3).collect();
                    if ends.len() == 3 {
                        cut = &line[ends[2]..];
                    }
                }
                let unranked = strip_rank(cut).unwrap_or(cut);
                let want = parse(i as u64, line);
                assert_eq!(parse(i as u64, cut), want, "{}: {line}", path.display());
                assert_eq!(parse(i as u64, unranked), want, "{}: {line}", path.display());
                compared += usize::from(want.is_some());
            }
        }
        assert!(compared > 50, "{compared}");
    }

    #[test]
    fn config_dumps_and_sentences_give_nothing() {
        for t in [
            "[2021-04-29 09:07:25,567] [INFO] [config.py:745:print]   steps_per_print .............. 10",
            "[2021-04-29 09:07:25,567] [INFO] [config.py:745:print]   optimizer_params ............. {'lr': 0.0001}",
            "[2024-07-17 19:44:06,945] [INFO] [loss_scaler.py:183:update_scale] [deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 65536, reducing to 32768",
            "[2023-01-15 19:09:50,939] [INFO] [utils.py:827:see_memory_usage] Engine before forward",
            "step=3 is where it went wrong",
            "MA is short for memory allocated: 3 GB",
            "fwd latency:                                                            76.67 ms",
            "[Rank 0] DeepSpeed Flops Profiler Enabled: False",
        ] {
            assert_eq!(parse(1, t), None, "{t}");
        }
    }
}
