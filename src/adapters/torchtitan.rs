//! torchtitan: the trainer's step line, its validation line and the RL experiment's console line.
//!
//! `MetricsProcessor.log` (`torchtitan/components/metrics.py`; `train.py` before 2025-02,
//! `torchtitan/metrics.py` in between) prints, coloured or not (`disable_color_printing`):
//! `step: {step:2}  loss: {loss:7.4f}  [grad_norm: {g:7.4f}  ]memory: {gib:5.2f}GiB({pct:.2f}%)  wps|tps: {round(t):,}  [tflops: {f:,.2f}  ]mfu: {m:.2f}%|N/A`
//! (`wps` until 2024-11, `tflops` from 2025-02, `grad_norm` from 2025-06, loss `8.5f` from
//! 2026-02, `mfu: N/A` with FP8/MX from 2026-02); `log_validation` (2025-07 on):
//! `validate step: {step:2}  loss: {loss:7.4f}  memory: ...GiB(...%)  tps: {round(t):,}`.
//! The RL experiment (`experiments/rl/observability/metrics/console.py`, 2026-05 on):
//! `Train | Step: {step:2}  key: value  key: value` and `Validation | Step: ...`.
//! The logger's header (`[titan] %(asctime)s - %(name)s - %(levelname)s - `, without `[titan] `
//! before 2025-02) is the shared cleaner's to strip.
use super::value::{count, name, number, with_percent};
use super::{Record, RecordKind};

pub fn parse(line: u64, text: &str) -> Option<Record> {
    if let Some(rest) = text.strip_prefix("step:") {
        return pairs(line, RecordKind::Step, rest);
    }
    if let Some(rest) = text.strip_prefix("validate step:") {
        return pairs(line, RecordKind::Validation, rest);
    }
    if let Some(rest) = text.strip_prefix("Train | Step:") {
        return console(line, RecordKind::Step, rest);
    }
    if let Some(rest) = text.strip_prefix("Validation | Step:") {
        return console(line, RecordKind::Validation, rest);
    }
    None
}

/// The trainer's lines after `step:`: the step, then `key: value` pairs, values padded to their
/// widths. Every key ends with `:` and has exactly one value, so verl's `step:N - ...` and prose
/// (`step: 10 of 1000 ...`) are not read. A loss must be among them.
fn pairs(line: u64, kind: RecordKind, rest: &str) -> Option<Record> {
    let mut tokens = rest.split_whitespace();
    let mut r = Record::at(line, kind);
    r.step = Some(count(tokens.next()?)?);
    while let Some(key) = tokens.next() {
        let key = key.strip_suffix(':').filter(|k| !k.is_empty() && !k.contains(':'))?;
        let v = tokens.next()?;
        if v == "N/A" {
            // `mfu: N/A` when FP8/MX quantization is on: no value, still the step's line.
            continue;
        }
        let (value, pct) = with_percent(v)?;
        let k = name(key);
        if let Some(pct) = pct {
            r.metrics.push((format!("{k}_pct"), pct));
        }
        r.metrics.push((k, value));
    }
    r.metrics.iter().any(|(k, _)| k == "loss").then_some(r)
}

/// The RL console's line after `Step:`: the step, then `key: value` pairs joined by two spaces,
/// keys the metrics' own (`loss/mean`, `perf/trainer/tokens_per_second_full_step`). A value
/// that is not a number (`True`, a string) is left out; the line needs one number.
fn console(line: u64, kind: RecordKind, rest: &str) -> Option<Record> {
    let mut tokens = rest.split_whitespace().peekable();
    let mut r = Record::at(line, kind);
    r.step = Some(count(tokens.next()?)?);
    while let Some(key) = tokens.next() {
        let key = key.strip_suffix(':').filter(|k| !k.is_empty())?;
        // A value is every token up to the next key; only a single number is a metric.
        let mut value: Vec<&str> = Vec::new();
        while let Some(t) = tokens.peek() {
            if t.ends_with(':') && !value.is_empty() {
                break;
            }
            value.push(tokens.next()?);
        }
        if let [v] = value.as_slice() {
            if let Some(v) = number(v) {
                r.metrics.push((name(key), v));
            }
        }
    }
    (!r.metrics.is_empty()).then_some(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metrics(r: &Record) -> Vec<(&str, f64)> {
        r.metrics.iter().map(|(k, v)| (k.as_str(), *v)).collect()
    }

    #[test]
    fn every_release_form_of_the_step_line_reads() {
        // v0.2.2 on (loss 8.5f), plain.
        let r = parse(1, "step:  4  loss:  7.62585  grad_norm: 26.6250  memory: 66.91GiB(37.51%)  tps: 10,050  tflops: 314.71  mfu: 13.99%").unwrap();
        assert_eq!(r.step, Some(4));
        assert_eq!(
            metrics(&r),
            [
                ("loss", 7.62585),
                ("grad_norm", 26.625),
                ("memory_pct", 37.51),
                ("memory", 66.91),
                ("tps", 10050.0),
                ("tflops", 314.71),
                ("mfu", 13.99)
            ]
        );
        // 2024: `wps`, no tflops.
        let r = parse(1, "step: 10  loss: 10.7798  memory: 41.18GiB(43.33%)  wps: 2,792  mfu: 16.35%").unwrap();
        assert_eq!(metrics(&r)[3], ("wps", 2792.0));
        // FP8: `mfu: N/A` is no value, the rest is the step.
        let r = parse(1, "step: 30  loss:  5.12345  grad_norm:  0.4000  memory: 20.00GiB(25.00%)  tps: 1,234,567  tflops: 1,002.50  mfu: N/A").unwrap();
        assert_eq!(r.metrics.last(), Some(&("tflops".to_string(), 1002.5)));
        let r = parse(1, "validate step: 100  loss:  3.2100  memory: 12.50GiB(15.63%)  tps: 52,011").unwrap();
        assert_eq!((r.kind, r.step), (RecordKind::Validation, Some(100)));
    }

    #[test]
    fn the_rl_console_line_reads_its_numbers() {
        let r =
            parse(1, "Train | Step:  1  loss/mean: 0.013  reward/_mean: 0.79  flag: True  train/grad_norm/mean: 0.46")
                .unwrap();
        assert_eq!(r.step, Some(1));
        assert_eq!(metrics(&r), [("loss/mean", 0.013), ("reward/_mean", 0.79), ("train/grad_norm/mean", 0.46)]);
        let r =
            parse(1, "Validation | Step:  0  validation/response_length/mean: 30.10  timing/validate: 29.13").unwrap();
        assert_eq!(r.kind, RecordKind::Validation);
    }

    #[test]
    fn prose_and_other_frameworks_give_nothing() {
        for t in [
            "step: 10 of 1000 warmup steps done, lr: 3e-4",
            "step:12 - actor/pg_loss:-0.0123",
            "step: 289, loss: 0.4310, tokens_per_second: 76477.73, mfu: 337.59",
            "step: 10         train loss: 3.11        test loss: 3.05",
            "step: 5  memory: 1.00GiB(1.00%)  tps: 10",
            "[GC] Peforming periodical GC collection. 0.06 seconds.",
            "Train | Step:  3",
            "Training starts at step 1",
        ] {
            assert_eq!(parse(1, t), None, "{t}");
        }
    }
}
