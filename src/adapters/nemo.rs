//! NVIDIA NeMo: 2.x's `ProgressPrinter` lines, 1.x's and 2.x's Lightning bars, and the Megatron timers NeMo 2 prints.
//!
//! - NeMo 2.x (`nemo/lightning/pytorch/callbacks/progress_printer.py`, since 2024-08):
//!   `Training epoch 0, iteration 28/99 | lr: 1.499e-05 | global_step: 28 | reduced_train_loss:
//!   10.21 | train_step_timing in s: 0.6173 | consumed_samples: 232` (`f' | {metric}: {val:.4}'`, a
//!   whole float as an int). A training step: `global_step` is its step (else the iteration),
//!   `epoch` a label, every other `metric: number` a metric (`train_step_timing_in_s`); the
//!   total is not a metric. `Validation: iteration 3/10` and `Testing: ...` carry no metric.
//!   After them, `ProgressPrinter.log_megatron_timers` prints Megatron's timer block
//!   (`megatron::timer_row`, and `megatron::RankTimes` for `all`).
//! - NeMo 1.x Megatron models (Lightning's `TQDMProgressBar`: `Epoch 0:   1%|  | 795/77225
//!   [9:07:58<878:01:48, 41.36s/it, loss=3.1, v_num=, reduced_train_loss=3.090, global_step=794.0,
//!   consumed_samples=1.63e+6]`) and, from 1.21 (2023-10) and in 2.x's `MegatronProgressBar`,
//!   without the rate and with `train_step_timing in s=0.615` (`Epoch 0: :   3%|...`): the tqdm
//!   adapter's record (kind `progress`), read here too when the postfix has NeMo's own metrics,
//!   with Lightning's padded `nan.0`/`inf.0` read as NaN and infinity.
use super::megatron::{num, timer_row};
use super::value::{count, leading_count, name};
use super::{tqdm, Label, Record, RecordKind};
use crate::adapters::value::Scan;
use std::borrow::Cow;

pub fn parse(line: u64, text: &str) -> Option<Record> {
    let body = text.trim_start();
    if let Some(rest) = body.strip_prefix("Training epoch ") {
        return training(line, rest);
    }
    // A bar with a postfix ends with it: `..., consumed_samples=640.0]`.
    if text.ends_with(']') && text.has("%|") {
        return bar(line, text);
    }
    timer_row(line, text)
}

/// `0, iteration 28/99 | lr: 1.499e-05 | global_step: 28 | reduced_train_loss: 10.21 | ...`
fn training(line: u64, rest: &str) -> Option<Record> {
    let (epoch, rest) = leading_count(rest)?;
    let rest = rest.strip_prefix(", iteration ")?;
    let (n, rest) = leading_count(rest)?;
    let (total, rest) = rest.strip_prefix('/')?.cut(" | ")?;
    // The total is `max_steps - 1` or `num_training_batches - 1`, `inf` for an endless loader.
    if count(total).is_none() && total != "inf" {
        return None;
    }
    let mut r = Record::at(line, RecordKind::Step);
    r.labels.push(("epoch".into(), Label::Int(epoch as i64)));
    for seg in rest.split(" | ") {
        let Some((key, value)) = seg.cut(": ") else { continue };
        let Some(v) = num(value) else { continue };
        if key == "global_step" && v >= 0.0 && v.fract() == 0.0 {
            r.step = Some(v as u64);
        } else {
            r.metrics.push((name(key), v));
        }
    }
    r.step = r.step.or(Some(n));
    (!r.metrics.is_empty()).then_some(r)
}

/// The postfix keys only NeMo's models log (`nemo/utils/exp_manager.py` `TimingCallback`, the
/// Megatron models' and `MegatronStrategy`'s `self.log`).
const NEMO_KEYS: [&str; 3] = ["reduced_train_loss", "train_step_timing_in_s", "consumed_samples"];

/// A Lightning bar whose postfix holds NeMo's metrics: the tqdm adapter's record.
fn bar(line: u64, text: &str) -> Option<Record> {
    let text = lightning_padding(text);
    let r = tqdm::parse(line, &text)?;
    r.metrics.iter().any(|(k, _)| NEMO_KEYS.contains(&k.as_str())).then_some(r)
}

/// Lightning's `Tqdm.format_num` pads `nan` to `nan.0`, `inf` to `inf.0` and `-inf` to `-inf.`:
/// the plain words, so the postfix's values read.
fn lightning_padding(text: &str) -> Cow<'_, str> {
    if !(text.has("nan.") || text.has("inf.")) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len());
    for (i, part) in text.split(", ").enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        let (body, close) = part.strip_suffix(']').map_or((part, ""), |b| (b, "]"));
        match body.split_once('=') {
            Some((k, v)) if matches!(v, "nan.0" | "inf.0" | "-inf.") => {
                out.push_str(k);
                out.push('=');
                out.push_str(v.trim_end_matches(['.', '0']));
            }
            _ => out.push_str(body),
        }
        out.push_str(close);
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_progress_printer_line_is_a_step_at_its_global_step() {
        let r = parse(1, "Training epoch 1, iteration 3/99 | lr: 1.499e-05 | global_step: 103 | reduced_train_loss: 10.21 | train_step_timing in s: 0.6173 | consumed_samples: 832").unwrap();
        assert_eq!((r.kind, r.step), (RecordKind::Step, Some(103)));
        assert_eq!(r.label("epoch"), Some(&Label::Int(1)));
        let names: Vec<_> = r.metrics.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["lr", "reduced_train_loss", "train_step_timing_in_s", "consumed_samples"]);
        let r = parse(2, "Training epoch 0, iteration 7/inf | reduced_train_loss: nan").unwrap();
        assert_eq!(r.step, Some(7));
        assert!(r.metrics[0].1.is_nan());
    }

    #[test]
    fn a_nemo_bar_is_the_tqdm_record_with_lightnings_padding_read() {
        let line = "Epoch 0: :   3%|▎         | 9000/301500 [1:42:42<55:37:46, v_num=0-56, reduced_train_loss=nan.0, global_step=9e+3, consumed_samples=6.3e+5, train_step_timing in s=0.615, val_loss=-inf.]";
        let r = parse(1, line).unwrap();
        assert_eq!(r.kind, RecordKind::Progress);
        assert!(r.metrics[0].1.is_nan(), "{r:?}");
        assert_eq!(r.metrics.last().unwrap().1, f64::NEG_INFINITY);
        assert_eq!(
            parse(1, "Epoch 0:  50%|█████     | 50/100 [00:05<00:05,  9.80it/s, v_num=0, train_loss=2.340]"),
            None
        );
    }

    #[test]
    fn look_alikes_give_nothing() {
        for t in [
            "Validation: iteration 3/10",
            "Sanity checking Validation: iteration 1/2",
            "Training epoch 0, iteration 5/99",
            "Epoch 0, global step 9000: 'val_loss' reached 7.04238 (best 7.04238), saving model to '/ckpt/megatron_gpt--val_loss=7.04-step=9000.ckpt' as top 3",
            "Training epoch ended, loss | 1.0",
        ] {
            assert_eq!(parse(1, t), None, "{t}");
        }
    }
}
