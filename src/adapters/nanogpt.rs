//! nanoGPT (`train.py`) and its speedrun fork modded-nanogpt (`train_gpt.py`, `records/`).
//!
//! nanoGPT: `iter {iter_num}: loss {lossf:.4f}, time {dt*1000:.2f}ms` (2022-12), `, mfu
//! {running_mfu*100:.2f}%` added 2023-02-05; `step {iter_num}: train loss {:.4f}, val loss
//! {:.4f}` at each eval (kind `eval`).
//! modded-nanogpt (2024-10 on): `step:{step}/{total} key:value key:value ...`, e.g.
//! `step:{step+1}/{n} train_loss:{:.4f} train_time:{:.0f}ms step_avg:{:.2f}ms` (train_loss
//! dropped 2024-12), `step:{step}/{n} val_loss:{:.4f} train_time:... step_avg:...` (kind
//! `eval`), `train_time:{:.3f}s` in later records, records' extra keys (`val_bpb`, `ema_beta`,
//! ...); `peak memory allocated: {} MiB reserved: {} MiB` at the end (kind `memory`).
//! Its first records (2024-06 to 2024-10) printed llm.c's lines, so those are read through `llmc`.
use super::value::{count, leading_number, name, number};
use super::{llmc, Record, RecordKind};
use crate::adapters::value::Scan;

pub fn parse(line: u64, text: &str) -> Option<Record> {
    let own = if let Some(rest) = text.strip_prefix("iter ") {
        nanogpt(line, RecordKind::Step, rest)
    } else if let Some(rest) = text.strip_prefix("step:") {
        speedrun(line, rest)
    } else if let Some(rest) = text.strip_prefix("step ") {
        nanogpt(line, RecordKind::Eval, rest)
    } else if let Some(rest) = text.strip_prefix("peak memory ") {
        peak_memory(line, rest)
    } else {
        None
    };
    own.or_else(|| llmc::parse(line, text))
}

/// `iter N: loss L, time Tms, mfu M%` and `step N: train loss L, val loss V`: `label number` fields.
fn nanogpt(line: u64, kind: RecordKind, rest: &str) -> Option<Record> {
    let (n, rest) = rest.cut(": ")?;
    let mut r = Record::at(line, kind);
    r.step = Some(count(n)?);
    for field in rest.split(", ") {
        // `loss 4.2345`, `time 123.45ms`, `mfu 12.34%`, `train loss 4.1`: the label, then the number.
        let at = field.rfind(' ')?;
        let (label, printed) = (&field[..at], &field[at + 1..]);
        if label.is_empty() || !label.bytes().all(|b| b.is_ascii_alphabetic() || b == b' ') {
            return None;
        }
        let (value, unit) = leading_number(printed)?;
        let unit = match unit {
            "" | "%" => "",
            "ms" => "ms",
            _ => return None,
        };
        let label = if unit.is_empty() { name(label) } else { name(&format!("{label} {unit}")) };
        r.metrics.push((label, value));
    }
    r.metrics.iter().any(|(k, _)| k.ends_with("loss")).then_some(r)
}

/// modded-nanogpt: `step:N/T key:value ...` (no spaces inside a pair). A value printed with `ms`
/// or `s` puts its unit in the name; one that is not a number (`handoff:keep`) is left out.
/// A `val_loss` makes it the eval line.
fn speedrun(line: u64, rest: &str) -> Option<Record> {
    let mut tokens = rest.split_whitespace();
    let (n, total) = tokens.next()?.split_once('/')?;
    count(total)?;
    let mut r = Record::at(line, RecordKind::Step);
    r.step = Some(count(n)?);
    for token in tokens {
        let (key, v) = token.split_once(':')?;
        if key.is_empty() || !key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') || v.is_empty() {
            return None;
        }
        let (v, unit) = if let Some(v) = v.strip_suffix("ms") {
            (v, "_ms")
        } else if let Some(v) = v.strip_suffix('s') {
            (v, "_s")
        } else {
            (v, "")
        };
        let Some(value) = number(v) else { continue };
        r.metrics.push((format!("{key}{unit}"), value));
    }
    let has = |k: &str| r.metrics.iter().any(|(m, _)| m == k);
    if has("val_loss") {
        r.kind = RecordKind::Eval;
    }
    let known = ["train_loss", "val_loss", "train_time_ms", "train_time_s", "step_avg_ms"];
    known.iter().any(|k| has(k)).then_some(r)
}

/// `peak memory allocated: 30617 MiB reserved: 46572 MiB` (llm.c's `peak memory consumption:
/// 2510 MiB`, which the first records printed, is read through `llmc`).
fn peak_memory(line: u64, rest: &str) -> Option<Record> {
    let (allocated, reserved) = rest.strip_prefix("allocated: ")?.cut(" MiB reserved: ")?;
    let mut r = Record::at(line, RecordKind::Memory);
    r.metrics.push(("peak_memory_allocated_mib".into(), count(allocated)? as f64));
    r.metrics.push(("reserved_mib".into(), count(reserved.strip_suffix(" MiB")?)? as f64));
    Some(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metrics(r: &Record) -> Vec<(&str, f64)> {
        r.metrics.iter().map(|(k, v)| (k.as_str(), *v)).collect()
    }

    #[test]
    fn nanogpt_lines_with_and_without_mfu() {
        let r = parse(1, "iter 10: loss 9.3812, time 1201.33ms").unwrap();
        assert_eq!(metrics(&r), [("loss", 9.3812), ("time_ms", 1201.33)]);
        let r = parse(1, "iter 0: loss 4.2648, time 9371.81ms, mfu -100.00%").unwrap();
        assert_eq!(metrics(&r)[2], ("mfu", -100.0));
        let r = parse(1, "step 250: train loss 1.5440, val loss 1.7220").unwrap();
        assert_eq!((r.kind, r.step), (RecordKind::Eval, Some(250)));
    }

    #[test]
    fn speedrun_lines_of_every_record_era() {
        let r = parse(1, "step:125/1480 train_loss:4.3719 train_time:29736ms step_avg:258.57ms").unwrap();
        assert_eq!((r.kind, r.step), (RecordKind::Step, Some(125)));
        assert_eq!(metrics(&r), [("train_loss", 4.3719), ("train_time_ms", 29736.0), ("step_avg_ms", 258.57)]);
        let r = parse(1, "step:0/1480 val_loss:7.7109 train_time:0ms step_avg:nanms").unwrap();
        assert_eq!(r.kind, RecordKind::Eval);
        assert!(r.metrics[2].1.is_nan());
        let r = parse(1, "step:1/1630 train_time:45.123s step_avg:45123.00ms").unwrap();
        assert_eq!(metrics(&r), [("train_time_s", 45.123), ("step_avg_ms", 45123.0)]);
        let r = parse(1, "step:500/5960 val_loss:3.90000 train_time:111.111s step_avg:222.22ms extrap_count:3 extrap_rel:0.5 handoff:keep").unwrap();
        assert_eq!(r.metrics.len(), 5, "handoff:keep is no number");
        let r = parse(1, "peak memory allocated: 30617 MiB reserved: 46572 MiB").unwrap();
        assert_eq!(metrics(&r), [("peak_memory_allocated_mib", 30617.0), ("reserved_mib", 46572.0)]);
    }

    #[test]
    fn lookalikes_give_nothing() {
        for t in [
            "step 3 finished",
            "step:12 - actor/pg_loss:-0.0123",
            "step:3/10 the loss went up",
            "step:3/10 gamma:0.5",
            "iter 5: loss went up, time to stop",
            "iteration limit reached",
            "captured_ref_extrap_state step:12",
            "step 500: train loss 4.3931, val loss 4.4297 (best)",
            "peak memory allocated: a lot",
        ] {
            assert_eq!(parse(1, t), None, "{t}");
        }
    }
}
