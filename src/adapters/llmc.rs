//! llm.c (karpathy/llm.c): the C and CUDA trainers' step lines, their PyTorch reference's and `main.log`'s.
//!
//! `train_gpt2.c`, `train_gpt2.cu` / `train_gpt2_fp32.cu`, its PyTorch
//! reference `train_gpt2.py` / `train_llama3.py`, and the `main.log` its `llmc/logger.h` writes.
//!
//! The step line, by date (`%4d` pads the step):
//! - `step %d: train loss %f (took %f ms)` (train_gpt2.c, 2024-04 on);
//! - `step %d/%d: train loss %f (%f ms[, %d tok/s])`, `(acc %f)` after the loss (2024-04/05),
//!   then ` norm %.4f` (05-19) and ` lr %.2e` (05-23) before the parenthesis;
//! - `step %4d/%d | train loss %7.4f | norm %6.4f | lr %.2e | %.2f ms | %.1f%% A100 fp16 MFU | %.0f tok/s`
//!   (2024-05-25), `bf16 MFU` (05-29), `loss %7.6f (z %+.2f)|` (06-24), then
//!   `loss %7.6f (%+.2fz)| norm %6.4f (%+.2fz)|` (06-25 on, `+nanz` until the detector fills);
//! - the PyTorch reference: `iteration {i}, loss: {l}[, time: {t:.3f}ms][, tok/s: {s:.2f}][, norm: {n:.3f}]`
//!   (2024-04/05), then `step {s:4d}/{n} | train loss {l:.6f} | norm {n:.4f} | lr {lr:.2e} | ({t:.2f} ms | {s:.0f} tok/s)`
//!   (modded-nanogpt's first records: without `norm`, `lr_scale` for `lr`).
//!
//! Besides: `val loss %f` (kind `eval`), `HellaSwag: %d/%d = %f` (kind `eval`), `total average
//! iteration time: %f ms` (kind `train_summary`), train_gpt2.py's `peak memory consumption: {}
//! MiB` (kind `memory`); `main.log`'s `s:%d trl:%.4f[ lr:%.6f norm:%.2f]`, `s:%d tel:%.4f`,
//! `s:%d eval:%.4f`.
//!
//! Names: printed labels (`train_loss`, `norm`, `lr`, `acc`, `bf16_mfu`, `tok/s`, `trl`); a
//! z-score in parentheses is `{label}_z`; the unlabelled milliseconds are `time_ms`.
use super::value::{count, leading_count, leading_number, name, number};
use super::{Record, RecordKind};
use crate::adapters::value::Scan;

pub fn parse(line: u64, text: &str) -> Option<Record> {
    if let Some(rest) = text.strip_prefix("step ") {
        return step(line, rest);
    }
    if let Some(rest) = text.strip_prefix("s:") {
        return logfile(line, rest);
    }
    if let Some(rest) = text.strip_prefix("iteration ") {
        return iteration(line, rest);
    }
    if let Some(rest) = text.strip_prefix("val loss ") {
        let mut r = Record::at(line, RecordKind::Eval);
        r.metrics.push(("val_loss".into(), number(rest)?));
        return Some(r);
    }
    if let Some(rest) = text.strip_prefix("HellaSwag: ") {
        // `HellaSwag: 2489/10042 = 0.247859`: the accuracy (the counts are its numerator and total).
        let (counts, acc) = rest.cut(" = ")?;
        let (right, total) = counts.split_once('/')?;
        count(right)?;
        count(total)?;
        let mut r = Record::at(line, RecordKind::Eval);
        r.metrics.push(("HellaSwag".into(), number(acc)?));
        return Some(r);
    }
    if let Some(rest) = text.strip_prefix("peak memory consumption: ") {
        // train_gpt2.py's last line: `torch.cuda.max_memory_allocated() // 1024 // 1024`.
        let mut r = Record::at(line, RecordKind::Memory);
        r.metrics.push(("peak_memory_consumption_mib".into(), count(rest.strip_suffix(" MiB")?)? as f64));
        return Some(r);
    }
    if let Some(rest) = text.strip_prefix("total average iteration time: ") {
        let mut r = Record::at(line, RecordKind::TrainSummary);
        r.metrics.push(("total_average_iteration_time_ms".into(), number(rest.strip_suffix(" ms")?)?));
        return Some(r);
    }
    None
}

/// After `step `: the step (padded), an optional `/total`, then `: ...` (the early C and
/// Python forms) or ` | ...` (the later ones).
fn step(line: u64, rest: &str) -> Option<Record> {
    let (n, rest) = leading_count(rest.trim_start())?;
    let rest = match rest.strip_prefix('/') {
        Some(total) => leading_count(total)?.1,
        None => rest,
    };
    let mut r = Record::at(line, RecordKind::Step);
    r.step = Some(n);
    if let Some(body) = rest.strip_prefix(": ") {
        colon_form(&mut r, body)?;
    } else if let Some(body) = rest.strip_prefix(" | ") {
        for segment in body.split('|') {
            segment_into(&mut r, segment.trim())?;
        }
    } else {
        return None;
    }
    r.metrics.iter().any(|(k, _)| k == "loss" || k == "train_loss").then_some(r)
}

/// `train loss L[ (acc A)][ norm N][ lr R] (T ms[, S tok/s])` or `train loss L (took T ms)`.
fn colon_form(r: &mut Record, body: &str) -> Option<()> {
    let rest = body.strip_prefix("train loss ")?;
    let (loss, mut rest) = word(rest)?;
    r.metrics.push(("train_loss".into(), number(loss)?));
    if let Some(tail) = rest.strip_prefix(" (acc ") {
        let (acc, tail) = tail.split_once(')')?;
        r.metrics.push(("acc".into(), number(acc)?));
        rest = tail;
    }
    for label in ["norm", "lr"] {
        if let Some(tail) = rest.strip_prefix(' ').and_then(|t| t.strip_prefix(label)).and_then(|t| t.strip_prefix(' '))
        {
            let (v, tail) = word(tail)?;
            r.metrics.push((label.into(), number(v)?));
            rest = tail;
        }
    }
    let inner = rest.strip_prefix(" (")?.strip_suffix(')')?;
    let inner = inner.strip_prefix("took ").unwrap_or(inner);
    let mut parts = inner.split(", ");
    let ms = parts.next()?.strip_suffix(" ms")?;
    r.metrics.push(("time_ms".into(), number(ms)?));
    if let Some(tps) = parts.next() {
        r.metrics.push(("tok/s".into(), number(tps.strip_suffix(" tok/s")?)?));
    }
    parts.next().is_none().then_some(())
}

/// One ` | `-separated segment: `label value[ (z-score)]`, `T ms`, `M% <which> MFU`, `S tok/s`,
/// and the PyTorch reference's `(T ms` / `S tok/s)`.
fn segment_into(r: &mut Record, segment: &str) -> Option<()> {
    let segment = segment.strip_prefix('(').unwrap_or(segment);
    let segment = segment.strip_suffix(')').filter(|s| !s.ends_with('z') && !s.contains('(')).unwrap_or(segment);
    if segment.starts_with(|c: char| c.is_ascii_digit() || c == '-' || c == '+' || c == '.') {
        let (value, unit) = leading_number(segment)?;
        let metric = match unit {
            " ms" => "time_ms".to_string(),
            " tok/s" => "tok/s".to_string(),
            _ => {
                let label = unit.strip_prefix("% ")?;
                if !label.ends_with("MFU") {
                    return None;
                }
                name(label)
            }
        };
        r.metrics.push((metric, value));
        return Some(());
    }
    // `train loss 4.5`, `loss 3.2 (+0.12z)`, `loss 3.2 (z +0.12)`, `norm 1.48 (+nanz)`, `lr_scale 1.00e+00`.
    let (head, z) = match segment.cut(" (") {
        Some((head, z)) => (head, Some(z.strip_suffix(')')?)),
        None => (segment, None),
    };
    let at = head.rfind(' ')?;
    let (label, value) = (&head[..at], &head[at + 1..]);
    if label.is_empty() || !label.bytes().all(|b| b.is_ascii_alphabetic() || b == b' ' || b == b'_') {
        return None;
    }
    let label = name(label);
    r.metrics.push((label.clone(), number(value)?));
    if let Some(z) = z {
        let z = z.strip_suffix('z').or_else(|| z.strip_prefix("z "))?;
        r.metrics.push((format!("{label}_z"), signed(z)?));
    }
    Some(())
}

/// `+0.12`, `-1.50`, `+nan`, `-nan` (C's `%+.2f`).
fn signed(s: &str) -> Option<f64> {
    match s.strip_prefix('+') {
        Some(rest) => number(rest),
        None if s == "-nan" => Some(f64::NAN),
        None => number(s),
    }
}

/// The PyTorch reference's first form: `iteration 3, loss: 4.5[, time: 12.345ms][, tok/s: 1234.56][, norm: 1.234]`.
fn iteration(line: u64, rest: &str) -> Option<Record> {
    let mut fields = rest.split(", ");
    let mut r = Record::at(line, RecordKind::Step);
    r.step = Some(count(fields.next()?)?);
    for field in fields {
        let (label, v) = field.cut(": ")?;
        let (metric, v) = match label {
            "loss" | "norm" | "tok/s" => (label.to_string(), v),
            "time" => ("time_ms".to_string(), v.strip_suffix("ms")?),
            _ => return None,
        };
        r.metrics.push((metric, number(v)?));
    }
    r.metrics.iter().any(|(k, _)| k == "loss").then_some(r)
}

/// `main.log`: `s:N trl:L lr:R norm:G`, `s:N tel:V`, `s:N eval:A`.
fn logfile(line: u64, rest: &str) -> Option<Record> {
    let mut tokens = rest.split(' ');
    let mut r = Record::at(line, RecordKind::Step);
    r.step = Some(count(tokens.next()?)?);
    for token in tokens {
        let (key, v) = token.split_once(':')?;
        if !matches!(key, "trl" | "tel" | "eval" | "lr" | "norm") {
            return None;
        }
        r.metrics.push((key.to_string(), number(v)?));
    }
    match r.metrics.first().map(|(k, _)| k.as_str()) {
        Some("trl") => {}
        Some("tel" | "eval") if r.metrics.len() == 1 => r.kind = RecordKind::Eval,
        _ => return None,
    }
    Some(r)
}

/// The printed word at the start of `s` and the rest from the space after it.
fn word(s: &str) -> Option<(&str, &str)> {
    let end = s.find(' ').unwrap_or(s.len());
    (end > 0).then(|| (&s[..end], &s[end..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metrics(r: &Record) -> Vec<(&str, f64)> {
        r.metrics.iter().map(|(k, v)| (k.as_str(), *v)).collect()
    }

    #[test]
    fn the_step_line_of_every_era() {
        let r = parse(1, "step 12: train loss 4.512345 (took 1234.567890 ms)").unwrap();
        assert_eq!((r.step, metrics(&r)), (Some(12), vec![("train_loss", 4.512345), ("time_ms", 1234.56789)]));
        let r = parse(1, "step    3/37: train loss 4.000000 (acc 4.100000) (80.123456 ms, 51234 tok/s)").unwrap();
        assert_eq!(metrics(&r), [("train_loss", 4.0), ("acc", 4.1), ("time_ms", 80.123456), ("tok/s", 51234.0)]);
        let r = parse(1, "step    3/37: train loss 4.000000 norm 1.2345 lr 6.00e-04 (80.12 ms, 51234 tok/s)").unwrap();
        assert_eq!(metrics(&r)[1..3], [("norm", 1.2345), ("lr", 6e-4)]);
        let r = parse(1, "step   61/74 | loss 3.208939 (+nanz)| norm 1.4800 (+nanz)| lr 3.00e-04 | 44.57 ms | -100.0% bf16 MFU | 91886 tok/s").unwrap();
        assert_eq!((r.step, r.metrics.len()), (Some(61), 8));
        assert!(r.metrics[1].1.is_nan());
        assert_eq!(metrics(&r)[5..], [("time_ms", 44.57), ("bf16_mfu", -100.0), ("tok/s", 91886.0)]);
        let r = parse(1, "step    1/50 | loss 11.010586 (z +1.25)| norm 15.3674 | lr 6.00e-06 | 120.50 ms | 30.1% bf16 MFU | 4351 tok/s").unwrap();
        assert_eq!(metrics(&r)[..2], [("loss", 11.010586), ("loss_z", 1.25)]);
        let r = parse(1, "step    9/100 | train loss 4.9000 | norm 1.2000 | lr 6.00e-04 | 75.00 ms | 40.0% A100 fp16 MFU | 6990 tok/s").unwrap();
        assert_eq!(metrics(&r)[4], ("a100_fp16_mfu", 40.0));
        let r = parse(1, "step    2/5100 | train loss 10.914062 | lr_scale 1.00e+00 | (1234.56 ms | 424242 tok/s)")
            .unwrap();
        assert_eq!(
            metrics(&r),
            [("train_loss", 10.914062), ("lr_scale", 1.0), ("time_ms", 1234.56), ("tok/s", 424242.0)]
        );
        let r = parse(1, "iteration 4, loss: 9.1234, time: 130.120ms, tok/s: 31475.22, norm: 2.500").unwrap();
        assert_eq!(r.metrics.len(), 4);
    }

    #[test]
    fn evals_summaries_and_the_log_file() {
        assert_eq!(parse(1, "val loss 3.298231").unwrap().kind, RecordKind::Eval);
        assert_eq!(metrics(&parse(1, "HellaSwag: 2489/10042 = 0.247859").unwrap()), [("HellaSwag", 0.247859)]);
        assert_eq!(parse(1, "total average iteration time: 44.571000 ms").unwrap().kind, RecordKind::TrainSummary);
        let r = parse(1, "s:12 trl:9.7924 lr:0.000011 norm:3.01").unwrap();
        assert_eq!((r.kind, r.step, r.metrics.len()), (RecordKind::Step, Some(12), 3));
        assert_eq!(parse(1, "s:250 tel:6.3097").unwrap().kind, RecordKind::Eval);
    }

    #[test]
    fn lookalikes_give_nothing() {
        for t in [
            "step 3 finished",
            "step 3: saving checkpoint",
            "step    5/20 | loss went up | norm 1.0",
            "val loss went up",
            "s:3 x:4",
            "s:3 lr:0.1",
            "iteration 3, took a while",
            "HellaSwag eval not found at x, skipping its evaluation",
            "step 100: train loss 4.1234, val loss 4.2345",
            "                  compute 45.2% | memory: 67.1% | fan: 30% | 1980 MHz / 1980 MHz",
        ] {
            assert_eq!(parse(1, t), None, "{t}");
        }
    }
}
