//! PRIME-RL (PrimeIntellect-ai/prime-rl, zeroband to 0.8 and main): the trainer's and orchestrator's step lines, SFT validation and eval summaries.
//!
//! By era (loguru; `src/prime_rl/utils/logger.py` `setup_logger`, the cleaner's `HH:mm:ss LEVEL `):
//! - zeroband, 2024-09 to 2025-06 (`src/zeroband/train.py`): `step: 5, rollout_step: 5, loss:
//!   0.1234, sample_reward: 0.5000, , tokens_per_second: 1234.56, mfu: 12.34`, `key: value`
//!   pairs joined by `, ` (an empty one where the message was glued).
//! - 2025-07-01 to 07-04: `Finished training step 5 in 12.34s (Loss: 0.12, Entropy: 1.23,
//!   Clip Ratio: 0.01, Throughput: 1234.56 tokens/s, MFU: 1.23%)` and `Finished orchestrator
//!   step 5 in ...s (Avg. Reward: 0.50, ...)`.
//! - 2025-07-04 to 07-09: `Training     | step 5 | Time:12.34s | Loss: 0.12 | ... | 1234
//!   tokens/s | MFU: 1.2%`, `Orchestrator | step 5 | Time:...`.
//! - 2025-07-09 to 2026-06 (0.2 to 0.5): `Step 5 | Time: 12.34s | Loss: 0.1234 | Entropy: ... |
//!   Grad. Norm: 0.1234 | LR: 1.00e-06 | Throughput: 1234 tokens/s | MFU: 12.3% | Peak Mem.:
//!   45.6 GiB` (`trainer/rl/train.py`, `trainer/sft/train.py`: `Peak Mem.: 45.6/80.0 GiB
//!   (57.0%)`), the orchestrator's `Step 5 | Time: ...s | Reward: 0.5000 | Val. Reward: ... |
//!   Throughput: 1234.5 tokens/s | Seq. Length: 512.3 tokens/sample | Async Level: 1 | Max.
//!   Off-Policy Level: 1`, SFT's `Validation | Step 5 | Loss: 1.2345`.
//! - 2026-06 on (0.6 on): labels without colons and the step time by `format_time`, right-aligned:
//!   `Step 5 |   12.3s | Loss 0.1234 | ... | Peak Mem. 45.6 GiB`; the orchestrator's `Step 5 |
//!   1m 2s | Reward 0.5000 | Trainable 120/128 (93.8%) | Turns 1.0 | ... | Error 0.0%`, and
//!   `Evaluated gsm8k (Step 5) | Policy v4 |    9.2s | Reward 0.5000 | ...`.
//! - eval summaries (`eval/utils.py`, `orchestrator/eval_utils.py`, 0.2 to 0.5): `Evaluated
//!   gsm8k in 12.34s (Avg@4=0.5000, Pass@1: 0.5000, No-response: 0.0%, Completion Length:
//!   123.45 (±12.30, ∈[1.00, 512.00]), Truncated: 1.2%)`, an eval without a step.
//!
//! Names by the one rule with the printed unit: `time_s`, `loss`, `grad_norm`, `lr`,
//! `throughput_tokens_s`, `mfu_pct`, `peak_mem_gib` (+ `peak_mem_pct`), `seq_length_tokens_sample`,
//! `trainable` (+ `trainable_pct`). The micro-step debug lines and the per-environment lines
//! under a step (`╰─ env | Ratio ...`) give nothing.
use super::value::{count, leading_number, name, number};
use super::{Label, Record, RecordKind};
use crate::adapters::value::Scan;

pub fn parse(line: u64, text: &str) -> Option<Record> {
    let text = own_header(text);
    let first = *text.as_bytes().first()?;
    if !matches!(first, b'S' | b's' | b'V' | b'T' | b'O' | b'F' | b'E') {
        return None;
    }
    let text = strip_debug_suffix(text);
    match first {
        b'S' => {
            let rest = text.strip_prefix("Step ")?;
            piped(line, RecordKind::Step, rest, None)
        }
        b's' => zeroband(line, text),
        b'V' => piped(line, RecordKind::Validation, text.strip_prefix("Validation | Step ")?, None),
        b'T' | b'O' => {
            // `Training     | step 5 | ...`, `Orchestrator | step 5 | ...`
            let (who, rest) = text.cut(" | step ")?;
            if !matches!(who.trim_end(), "Training" | "Orchestrator") {
                return None;
            }
            piped(line, RecordKind::Step, rest, None)
        }
        b'F' => finished(line, text),
        b'E' => evaluated(line, text),
        _ => None,
    }
}

/// PRIME-RL's logger headers, taken off here so a line reads the same whether or not the shared
/// cleaner knows them: loguru's `{time:HH:mm:ss}` (or `UTC HH:mm:ss`), 2025-07's `[ Rank 1 ]`
/// glued after it, 2025-06's ` [PID=.. | file::line | Rank 0]`, then ` {level: >7} `
/// (`02:40:52 SUCCESS `, `02:40:54    INFO `); zeroband's `logging.Formatter` forms
/// `03:22:14 [INFO] [TRAIN] [Rank 0] `, `12:00:00 [INFO] [Rank 0] ` and
/// `05-20 12:00:00 [TRAIN] [INFO] `.
pub(super) fn own_header(text: &str) -> &str {
    let mut t = text.strip_prefix("UTC ").unwrap_or(text);
    // `05-20 ` (zeroband's 2025-05 datefmt `%m-%d %H:%M:%S`)
    let b = t.as_bytes();
    if b.len() > 6
        && b[2] == b'-'
        && b[5] == b' '
        && b[..5].iter().enumerate().all(|(i, c)| i == 2 || c.is_ascii_digit())
    {
        t = &t[6..];
    }
    let b = t.as_bytes();
    let clock = b.len() > 9
        && b[..8].iter().enumerate().all(|(i, c)| if i == 2 || i == 5 { *c == b':' } else { c.is_ascii_digit() });
    if !clock {
        return text;
    }
    let mut rest = &t[8..];
    if let Some(r) = rest.strip_prefix("[ Rank ") {
        let Some(end) = r.at(" ]") else { return text };
        rest = &r[end + 2..];
    }
    // Bracketed fields (`[INFO]`, `[TRAIN]`, `[Rank 0]`, `[PID=1 | f.py::3 | Rank 0]`, `[f.py:3]`).
    let mut level = false;
    loop {
        let r = rest.trim_start_matches(' ');
        let Some(inner) = r.strip_prefix('[') else { break };
        let Some(end) = inner.find(']') else { return text };
        level |= is_level(&inner[..end]);
        rest = &inner[end + 1..];
    }
    if level {
        return rest.strip_prefix(' ').unwrap_or(rest);
    }
    // loguru's right-aligned level.
    let r = rest.trim_start_matches(' ');
    match r.split_once(' ') {
        Some((lvl, message)) if is_level(lvl) && rest.len() - r.len() >= 1 => message,
        None if is_level(r) => "",
        _ => text,
    }
}

fn is_level(s: &str) -> bool {
    matches!(s, "TRACE" | "DEBUG" | "INFO" | "SUCCESS" | "WARNING" | "ERROR" | "CRITICAL")
}

/// loguru's ` [train.py::648]` after the message in debug mode.
fn strip_debug_suffix(text: &str) -> &str {
    if let Some(open) = text.strip_suffix(']').and_then(|t| t.rfind(" [")) {
        let inner = &text[open + 2..text.len() - 1];
        if inner.has("::") && inner.rsplit("::").next().is_some_and(|l| count(l).is_some()) {
            return &text[..open];
        }
    }
    text
}

/// `N | seg | seg ...` after `Step `: the step, then each segment's metrics.
fn piped(line: u64, kind: RecordKind, rest: &str, env: Option<&str>) -> Option<Record> {
    let mut segments = rest.split(" | ");
    let step = count(segments.next()?)?;
    let mut r = Record::at(line, kind);
    r.step = Some(step);
    if let Some(env) = env {
        r.labels.push(("env".into(), Label::Text(env.to_string())));
    }
    for seg in segments {
        segment(seg.trim(), &mut r.metrics)?;
    }
    let known = r.metrics.iter().any(|(k, _)| matches!(k.as_str(), "Loss" | "Reward" | "time_s" | "LR"));
    known.then_some(r)
}

/// One ` | `-separated segment: `Label: value unit`, `Label value unit`, a bare duration or
/// `1234 tokens/s`. `None` for a segment that is prose; a segment with no number (`Policy v4`)
/// gives nothing.
fn segment(seg: &str, out: &mut Vec<(String, f64)>) -> Option<()> {
    if let Some(secs) = duration(seg) {
        out.push(("time_s".into(), secs));
        return Some(());
    }
    // The label is everything before the first number that starts a word.
    let at = seg
        .char_indices()
        .find(|&(i, c)| {
            let word_start = i == 0 || seg[..i].ends_with([' ', ':']);
            word_start && (c.is_ascii_digit() || (c == '-' && seg[i + 1..].starts_with(|d: char| d.is_ascii_digit())))
        })
        .map(|(i, _)| i);
    let Some(at) = at else {
        // `Policy v4`: words only; a label of a few words with no value is no prose either.
        return (seg.split_whitespace().count() <= 3).then_some(());
    };
    let label = seg[..at].trim().trim_end_matches(':').trim();
    if label.split_whitespace().count() > 4 {
        return None;
    }
    if label.is_empty() && !seg.ends_with("tokens/s") {
        return None;
    }
    let label = if label.is_empty() { "Throughput" } else { label };
    let (value, unit, pct) = measure(&seg[at..])?;
    // The one rule: a bare one-word label is kept as printed (`Loss`, `LR`); with its unit
    // (`Time: 12.34s`, `Peak Mem.: 45.6 GiB`, `MFU: 12.3%`) it reads as words, lowercased.
    let base = name(label);
    if base.is_empty() {
        return None;
    }
    match unit {
        Some("%") => out.push((name(&format!("{label} pct")), value)),
        Some(u) => out.push((name(&format!("{label} {u}")), value)),
        None => out.push((base.clone(), value)),
    }
    if let Some(p) = pct {
        out.push((format!("{base}_pct"), p));
    }
    Some(())
}

/// `45.6 GiB`, `45.6/80.0 GiB (57.0%)`, `120/128 (93.8%)`, `12.3%`, `1.00e-06`, `1234 tokens/s`,
/// `12.34s`: the value (a fraction's numerator), its unit and a percentage in parentheses.
fn measure(s: &str) -> Option<(f64, Option<&str>, Option<f64>)> {
    let (value, mut rest) = leading_number(s)?;
    if let Some(after) = rest.strip_prefix('/') {
        // `/80.0`: the total is no metric.
        rest = leading_number(after)?.1;
    }
    let mut pct = None;
    let rest = rest.trim_start();
    let (unit, tail) = match rest.find('(') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    if !tail.is_empty() {
        pct = Some(number(tail.strip_prefix('(')?.strip_suffix("%)")?)?);
    }
    let unit = unit.trim();
    let unit = match unit {
        "" => None,
        "%" | "s" | "ms" | "GiB" | "GB" | "MiB" | "tokens/s" | "tokens/sample" | "samples/s" => Some(unit),
        _ => return None,
    };
    Some((value, unit, pct))
}

/// `format_time`'s `123ms`, `12.3s`, `2m 3s`, `1h 2m`, `1d 2h` (and `1m`): in seconds.
fn duration(seg: &str) -> Option<f64> {
    let mut total = 0.0;
    let mut parts = 0;
    for part in seg.split(' ') {
        let (v, unit) = leading_number(part)?;
        if part.starts_with(['-', '+']) {
            return None;
        }
        if unit == "ms" {
            total += v / 1000.0;
            parts += 1;
            continue;
        }
        total += v * match unit {
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            "d" => 86400.0,
            _ => return None,
        };
        parts += 1;
    }
    (parts > 0 && parts <= 2).then_some(total)
}

/// zeroband's `step: 5, rollout_step: 5, loss: 0.1234, , tokens_per_second: 1234.56, mfu: 12.34`.
fn zeroband(line: u64, text: &str) -> Option<Record> {
    let rest = text.strip_prefix("step: ")?;
    let mut pairs = rest.split(',').map(str::trim).filter(|p| !p.is_empty());
    let mut r = Record::at(line, RecordKind::Step);
    r.step = Some(count(pairs.next()?)?);
    for pair in pairs {
        let (k, v) = pair.cut(": ")?;
        if !super::value::is_identifier(k) {
            return None;
        }
        r.metrics.push((k.to_string(), number(v)?));
    }
    r.metrics.iter().any(|(k, _)| k == "loss").then_some(r)
}

/// `Finished training step 5 in 12.34s (Loss: 0.12, ..., MFU: 1.23%)` (2025-07-01 to 07-04).
fn finished(line: u64, text: &str) -> Option<Record> {
    let rest =
        text.strip_prefix("Finished training step ").or_else(|| text.strip_prefix("Finished orchestrator step "))?;
    let (n, rest) = rest.cut(" in ")?;
    let (time, rest) = rest.cut(" (")?;
    let mut r = Record::at(line, RecordKind::Step);
    r.step = Some(count(n)?);
    r.metrics.push(("time_s".into(), duration(time)?));
    for seg in rest.strip_suffix(')')?.split(", ") {
        segment(seg, &mut r.metrics)?;
    }
    Some(r)
}

/// `Evaluated gsm8k (Step 5) | Policy v4 | 9.2s | Reward 0.5 | ...` (0.6 on) and `Evaluated
/// gsm8k in 12.34s (Avg@4=0.5000, Pass@1: 0.5000, No-response: 0.0%, Completion Length: 123.45
/// (±12.30, ∈[1.00, 512.00]), Truncated: 1.2%)` (0.2 to 0.5).
fn evaluated(line: u64, text: &str) -> Option<Record> {
    let rest = text.strip_prefix("Evaluated ")?;
    if let Some((env, rest)) = rest.cut(" (Step ") {
        let (n, rest) = rest.split_once(')')?;
        let rest = format!("{n}{rest}");
        let mut r = piped(line, RecordKind::Eval, &rest, Some(env))?;
        r.line = line;
        return Some(r);
    }
    let (env, rest) = rest.cut(" in ")?;
    let (time, rest) = rest.cut(" (")?;
    let mut r = Record::at(line, RecordKind::Eval);
    r.labels.push(("env".into(), Label::Text(env.to_string())));
    r.metrics.push(("time_s".into(), duration(time)?));
    let rest = rest.strip_suffix(')')?;
    // Drop the completion length's `(±std, ∈[min, max])`, whose commas would split it.
    let rest = match rest.at(" (±") {
        Some(i) => {
            let close = rest[i..].at("])")? + i + 2;
            format!("{}{}", &rest[..i], &rest[close..])
        }
        None => rest.to_string(),
    };
    for seg in rest.split(", ") {
        if let Some((k, v)) = seg.split_once('=') {
            r.metrics.push((name(k), number(v)?));
        } else {
            segment(seg, &mut r.metrics)?;
        }
    }
    Some(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metrics(r: &Record) -> Vec<(&str, f64)> {
        r.metrics.iter().map(|(k, v)| (k.as_str(), *v)).collect()
    }

    #[test]
    fn the_colon_and_plain_step_lines() {
        let r = parse(1, "Step 5 | Time: 12.34s | Loss: 0.1234 | Grad. Norm: 0.5000 | LR: 1.00e-06 | Throughput: 1234 tokens/s | MFU: 12.3% | Peak Mem.: 45.6/80.0 GiB (57.0%)").unwrap();
        assert_eq!(r.step, Some(5));
        assert_eq!(
            metrics(&r),
            vec![
                ("time_s", 12.34),
                ("Loss", 0.1234),
                ("grad_norm", 0.5),
                ("LR", 1e-6),
                ("throughput_tokens_s", 1234.0),
                ("mfu_pct", 12.3),
                ("peak_mem_gib", 45.6),
                ("peak_mem_pct", 57.0)
            ]
        );
        let r = parse(1, "Step 7 |  1m 2s | Reward 0.5000 | Trainable 120/128 (93.8%) | Max Off-Policy 1 | Error 0.0%")
            .unwrap();
        assert_eq!(
            metrics(&r),
            vec![
                ("time_s", 62.0),
                ("Reward", 0.5),
                ("Trainable", 120.0),
                ("Trainable_pct", 93.8),
                ("max_off_policy", 1.0),
                ("error_pct", 0.0)
            ]
        );
        let r = parse(1, "Step 8 |   950ms | Loss 0.1000 [train.py::648]").unwrap();
        assert_eq!(metrics(&r), vec![("time_s", 0.95), ("Loss", 0.1)]);
    }

    #[test]
    fn prose_about_steps_is_nothing() {
        for t in [
            "Step 5 failed after 3 consecutive empty batches",
            "Step 5: empty train batch after 4 finalized episodes",
            "Step 5 | this went wrong because the server returned 503 errors",
            "step: 10 of 1000 warmup steps done, lr: 3e-4",
            "Starting from step 5 (total_tokens=10, total_samples=2)",
        ] {
            assert!(parse(1, t).is_none(), "{t}");
        }
    }

    #[test]
    fn its_logger_headers_are_taken_off() {
        for (t, m) in [
            ("02:40:52 SUCCESS Step 0 | Time: 5.13s", "Step 0 | Time: 5.13s"),
            ("02:40:54    INFO Peak memory: 5.2 GiB", "Peak memory: 5.2 GiB"),
            ("UTC 12:00:02 SUCCESS x", "x"),
            ("12:00:01[ Rank 1 ] SUCCESS x", "x"),
            ("12:00:01 [PID=12 | train.py::3 | Rank 0]    INFO x", "x"),
            ("03:22:14 [INFO] [TRAIN] [Rank 0] step: 289", "step: 289"),
            ("05-20 12:00:00 [TRAIN] [INFO] step: 1", "step: 1"),
            ("12:00:00 nothing", "12:00:00 nothing"),
            ("Step 1 | Time: 1s", "Step 1 | Time: 1s"),
        ] {
            assert_eq!(own_header(t), m, "{t}");
        }
    }

    #[test]
    fn older_forms() {
        let r = parse(
            1,
            "step: 5, rollout_step: 5, loss: 0.1234, sample_reward: 0.5000, , tokens_per_second: 1234.56, mfu: 12.34",
        )
        .unwrap();
        assert_eq!(r.step, Some(5));
        assert_eq!(r.metrics.len(), 5);
        let r = parse(1, "Training     | step 3 | Time:12.34s | Loss: 0.12 | 1234 tokens/s | MFU: 1.2%").unwrap();
        assert_eq!(
            metrics(&r),
            vec![("time_s", 12.34), ("Loss", 0.12), ("throughput_tokens_s", 1234.0), ("mfu_pct", 1.2)]
        );
        let r = parse(1, "Finished training step 2 in 12.34s (Loss: 0.12, Clip Ratio: 0.01, Throughput: 1234.56 tokens/s, MFU: 1.23%)").unwrap();
        assert_eq!(r.metrics[2], ("clip_ratio".to_string(), 0.01));
        assert_eq!(r.metrics[1], ("Loss".to_string(), 0.12));
        let r = parse(1, "Evaluated gsm8k in 12.34s (Avg@4=0.5000, Pass@1: 0.5000, Completion Length: 123.45 (±12.30, ∈[1.00, 512.00]), Truncated: 1.2%)").unwrap();
        assert_eq!(
            metrics(&r),
            vec![
                ("time_s", 12.34),
                ("Avg@4", 0.5),
                ("Pass@1", 0.5),
                ("completion_length", 123.45),
                ("truncated_pct", 1.2)
            ]
        );
    }
}
