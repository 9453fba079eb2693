//! HF Trainer, TRL and accelerate (transformers 2.9 → 5.x `trainer.py` `log`/`_log`, `trainer_callback.py` `ProgressCallback.on_log`/`PrinterCallback`, `trainer_pt_utils.py` `log_metrics`; TRL's trainers; accelerate's and transformers' `no_trainer` examples): the printed log dicts and what surrounds them.
//!
//! The dict, as each version prints it (`SOURCES.md` in the fixtures has the code):
//! - 2.9–2.11: `json.dumps({**logs, "step": N})`:
//!   `{"loss": 2.3, "learning_rate": 4.9e-05, "epoch": 0.06, "step": 50}`;
//! - 3.0: `logger.info` of the dict with its step, 3.1–3.3 `print`: `{'loss': 2.3, ..., 'step': 50}`
//!   (TFTrainer kept the step through 4.x);
//! - 3.4 → 4.57: `ProgressCallback` writes `str(logs)` (`PrinterCallback` prints it without a
//!   bar): `{'loss': 2.3456, 'grad_norm': 1.234, 'learning_rate': 4.5e-05, 'epoch': 0.1}`, numpy 2
//!   scalars as `np.float64(0.5)`, a DeepSpeed grad norm in 4.38–4.39 as `tensor(0.87, device='cuda:0')`;
//! - 5.x: floats as strings (`f"{v:.4g}"`): `{'loss': '2.346', 'learning_rate': '4.5e-05', 'epoch': '0.1'}`.
//!
//! Its kind: the final summary has `train_runtime` and no training key (4.57+ also puts
//! `train_runtime` in a step's dict with `include_num_input_tokens_seen`); an eval has only
//! `eval_*` (`test_*`, any `metric_key_prefix`'s) keys besides the epoch and step; else a training
//! step. Keys are kept verbatim, TRL's too (`rewards/chosen`, `logps/rejected`,
//! `completions/mean_length`, `clip_ratio/low_mean`, `objective/kl`, `rewards/<fn>/mean`). A dict
//! is a log only if every value is a number and it has a key the Trainer adds to every log
//! (`epoch`, `step`) or logs itself (`loss`, `eval_loss`, `train_loss`, `*_runtime`), or all its
//! keys are an eval's (`{'test_acc': 0.9, 'test_loss': 0.2}`, Lightning 1.x's results): a config
//! dump (`{'model_name_or_path': 'gpt2', 'learning_rate': 5e-05}`) is not.
//!
//! Also read:
//! - a dict glued after a tqdm bar on the same line (stdout's dict flushed after stderr's bar:
//!   `  5%|▌  | 10/200 [00:10<03:10, 1.0it/s]{'loss': 2.1, ...}`): the dict's record;
//! - `log_metrics`' block (`***** train metrics *****`, then `  {key: <{w}} = {value:>{w}}` lines,
//!   4.x → 5.x, and the older examples' `***** Eval results *****` / `  eval_loss = 0.38`): each
//!   `train_*` line is a `train_summary`, each `eval_*`/`test_*`/`predict_*` line an `eval`, with
//!   its one value (`train_runtime = 0:01:23.45` in seconds, `train_mem_gpu_alloc_delta = 693MB`
//!   as `..._mb`); `epoch`, `total_flos` and unprefixed keys (`perplexity`) say nothing of their
//!   block on their own line, so give nothing;
//! - accelerate's examples (`accelerator.print(f"epoch {epoch}:", eval_metric)`) and
//!   transformers' `no_trainer` examples: `epoch 0: {'accuracy': 0.8, 'f1': 0.85}` and
//!   `epoch 0: perplexity: 25.3 eval_loss: 3.2`, an `eval` labelled `epoch`.
use super::value::{count, number};
use super::{Label, Record, RecordKind};
use crate::adapters::value::Scan;

/// Keys the Trainer adds to every log it prints, or logs itself.
const ANCHORS: [&str; 5] = ["epoch", "step", "loss", "eval_loss", "train_loss"];

/// The prefixes of an evaluation's keys (HF's `metric_key_prefix`s, Lightning's usual names).
const EVAL_PREFIXES: [&str; 8] = ["eval_", "eval/", "test_", "test/", "val_", "val/", "valid_", "validation_"];

/// Endings of configuration keys, never a metric (`eval_steps`, `val_check_interval`, `eval_batch_size`).
const CONFIG_ENDINGS: [&str; 12] = [
    "_size",
    "_steps",
    "_interval",
    "_strategy",
    "_delay",
    "_dir",
    "_path",
    "_file",
    "_every",
    "_freq",
    "_workers",
    "_epochs",
];

pub fn parse(line: u64, text: &str) -> Option<Record> {
    let t = text.trim();
    match t.as_bytes().first()? {
        b'{' => dict_record(line, t),
        b'e' if t.starts_with("epoch ") => epoch_eval(line, t),
        _ => after_bar(line, t).or_else(|| metrics_line(line, t)),
    }
}

/// What a Trainer's log dict is, printed or handed to `Trainer.log`: the final summary (it
/// has `train_runtime` and no training key), an eval (only eval keys besides what `Trainer.log`
/// adds to every log: the epoch, step, `total_flos` (3.x), `num_input_tokens_seen`), else a
/// training step.
pub fn kind_of(metrics: &[(String, f64)]) -> RecordKind {
    let has = |k: &str| metrics.iter().any(|(n, _)| n == k);
    let training = ["loss", "learning_rate", "lr", "grad_norm"].iter().any(|k| has(k));
    if has("train_runtime") && !training {
        return RecordKind::TrainSummary;
    }
    // What `Trainer.log` adds to every log, an eval's too.
    let added = |k: &str| matches!(k, "epoch" | "step" | "total_flos" | "num_input_tokens_seen");
    let keys: Vec<&str> = metrics.iter().map(|(k, _)| k.as_str()).filter(|k| !added(k)).collect();
    if !keys.is_empty() && keys.iter().all(|k| eval_key(k)) {
        return RecordKind::Eval;
    }
    // `evaluate(metric_key_prefix="dev")`: every key `dev_*`, one of them `dev_runtime`.
    if let Some((prefix, _)) = keys.first().and_then(|k| k.split_once('_')) {
        let runtime = format!("{prefix}_runtime");
        if prefix != "train"
            && has(&runtime)
            && keys.iter().all(|k| k.starts_with(prefix) && k[prefix.len()..].starts_with('_'))
        {
            return RecordKind::Eval;
        }
    }
    RecordKind::Step
}

fn eval_key(k: &str) -> bool {
    EVAL_PREFIXES.iter().any(|p| k.starts_with(p))
}

/// A configuration key (`eval_steps`, `val_check_interval`), never a metric.
pub fn configish(k: &str) -> bool {
    CONFIG_ENDINGS.iter().any(|e| k.ends_with(e))
}

/// A log dict's entries: `(key, value)`, `None` unless it is a `{...}` of numbers only.
pub fn dict(text: &str) -> Option<Vec<(&str, f64)>> {
    let inner = text.trim().strip_prefix('{')?.strip_suffix('}')?.trim();
    if inner.is_empty() {
        return None;
    }
    entries(inner)
        .into_iter()
        .map(|entry| {
            let (key, value) = split_entry(entry)?;
            Some((unquote(key.trim())?, value_of(value.trim())?))
        })
        .collect()
}

/// A printed dict's record (see the module's header), or `None` when it is no Trainer's log.
fn dict_record(line: u64, text: &str) -> Option<Record> {
    let entries = dict(text)?;
    let anchored = entries.iter().any(|(k, _)| ANCHORS.contains(k) || k.ends_with("_runtime"));
    let eval_only = entries.iter().all(|(k, _)| eval_key(k) && !configish(k));
    if !(anchored || eval_only) {
        return None;
    }
    let mut r = Record::at(line, RecordKind::Step);
    for (key, v) in entries {
        if key == "step" && v >= 0.0 && v.fract() == 0.0 {
            r.step = Some(v as u64);
            continue;
        }
        r.metrics.push((key.to_string(), v));
    }
    if r.metrics.iter().all(|(k, _)| k == "epoch") {
        return None;
    }
    r.kind = kind_of(&r.metrics);
    Some(r)
}

/// A dict printed right after a tqdm bar on the same line (the bar on stderr, the dict on a
/// buffered stdout): the dict's record.
fn after_bar(line: u64, text: &str) -> Option<Record> {
    let brace = text.find('{')?;
    if !text[..brace].trim_end().ends_with(']') {
        return None;
    }
    let bar = super::tqdm::bar(text)?;
    let rest = text[bar.end..].trim_start();
    rest.starts_with('{').then(|| dict_record(line, rest))?
}

/// accelerate's and the `no_trainer` examples' `epoch 0: {'accuracy': 0.8}` and
/// `epoch 0: perplexity: 25.3 eval_loss: 3.2`: an eval of that epoch.
fn epoch_eval(line: u64, text: &str) -> Option<Record> {
    let rest = text.strip_prefix("epoch ")?;
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    let epoch = count(&rest[..digits])?;
    let rest = rest[digits..].strip_prefix(": ")?.trim_start();
    let mut r = Record::at(line, RecordKind::Eval);
    r.labels.push(("epoch".into(), Label::Int(epoch as i64)));
    if rest.starts_with('{') {
        r.metrics = dict(rest)?.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
        // An eval's metrics: a dict with a training key is some script's own epoch summary.
        let training = ["loss", "train_loss", "lr", "learning_rate", "grad_norm"];
        if r.metrics.iter().any(|(k, _)| training.contains(&k.as_str())) {
            return None;
        }
    } else {
        let mut s = rest;
        while !s.is_empty() {
            let key_len =
                s.bytes().take_while(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'/' | b'.' | b'-')).count();
            let key = &s[..key_len];
            let after = s[key_len..].strip_prefix(": ")?;
            let value_len = value_extent(after);
            let v = number(&after[..value_len])?;
            if key.is_empty() {
                return None;
            }
            r.metrics.push((key.to_string(), v));
            s = after[value_len..].trim_start();
        }
        // The `no_trainer` examples' `perplexity: ... eval_loss: ...`, not any `epoch N: loss: ...`.
        if !r.metrics.iter().any(|(k, _)| k == "perplexity" || k.starts_with("eval_")) {
            return None;
        }
    }
    (!r.metrics.is_empty()).then_some(r)
}

/// How far a printed value runs: to the next space, or a whole `tensor(...)` / `np.float64(...)`.
fn value_extent(s: &str) -> usize {
    if let Some(open) = s.find('(').filter(|&i| !s[..i].contains(' ')) {
        let mut depth = 0;
        for (i, c) in s[open..].char_indices() {
            match c {
                '(' => depth += 1,
                ')' => {
                    depth -= 1;
                    if depth == 0 {
                        return open + i + 1;
                    }
                }
                _ => {}
            }
        }
    }
    s.find(' ').unwrap_or(s.len())
}

/// One line of `log_metrics`' block: `  train_loss               =     1.2345` (the examples'
/// older `  eval_loss = 0.38` too).
fn metrics_line(line: u64, text: &str) -> Option<Record> {
    if !super::value::holds(text, b'=') {
        return None;
    }
    let (key, value) = text.cut(" = ").or_else(|| {
        // Padded: `key      =    value`.
        let eq = text.find('=')?;
        (text[..eq].ends_with(' ') && text[eq + 1..].starts_with(' ')).then(|| (&text[..eq], &text[eq + 1..]))
    })?;
    let (key, value) = (key.trim(), value.trim());
    if key.is_empty() || !key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') || configish(key) {
        return None;
    }
    let kind = if key.starts_with("train_") {
        RecordKind::TrainSummary
    } else if ["eval_", "test_", "predict_"].iter().any(|p| key.starts_with(p)) {
        RecordKind::Eval
    } else {
        return None;
    };
    let (name, v) = if key.has("_mem_") {
        let mb = value.strip_suffix("MB")?;
        (format!("{key}_mb"), number(mb)?)
    } else if key.ends_with("_runtime") && value.contains(':') {
        (key.to_string(), timedelta(value)?)
    } else {
        (key.to_string(), number(value)?)
    };
    let mut r = Record::at(line, kind);
    r.metrics.push((name, v));
    Some(r)
}

/// `_secs2timedelta`'s `0:01:23.45` (and `1 day, 2:03:04.56`) in seconds.
fn timedelta(s: &str) -> Option<f64> {
    let (days, clock) = match s.cut(", ") {
        Some((d, c)) => (count(d.strip_suffix(" days").or_else(|| d.strip_suffix(" day"))?)?, c),
        None => (0, s),
    };
    let mut parts = clock.split(':');
    let (h, m, sec) = (count(parts.next()?)?, count(parts.next()?)?, parts.next()?);
    if parts.next().is_some() {
        return None;
    }
    let sec: f64 = number(sec)?;
    Some(days as f64 * 86400.0 + h as f64 * 3600.0 + m as f64 * 60.0 + sec)
}

/// A dict value: what `value::number` reads, and JSON's `Infinity` (2.x's `json.dumps`).
fn value_of(s: &str) -> Option<f64> {
    match s {
        "Infinity" => Some(f64::INFINITY),
        "-Infinity" => Some(f64::NEG_INFINITY),
        _ => number(s),
    }
}

/// `'key': value` (or `"key": value`) at the first colon after the quoted key.
fn split_entry(entry: &str) -> Option<(&str, &str)> {
    let q = entry.chars().next()?;
    if !matches!(q, '\'' | '"') {
        return None;
    }
    let close = entry[1..].find(q)? + 1;
    let rest = entry[close + 1..].trim_start().strip_prefix(':')?;
    Some((&entry[..=close], rest))
}

/// `'a': 1, 'b': np.float64(0.5)` → its entries (commas inside parentheses stay).
fn entries(s: &str) -> Vec<&str> {
    let (mut out, mut depth, mut quote, mut start) = (Vec::new(), 0i32, None::<char>, 0);
    for (i, c) in s.char_indices() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '\'' | '"') => quote = Some(c),
            (None, '(' | '[' | '{') => depth += 1,
            (None, ')' | ']' | '}') => depth -= 1,
            (None, ',') if depth == 0 => {
                out.push(s[start..i].trim());
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(s[start..].trim());
    out
}

fn unquote(s: &str) -> Option<&str> {
    let q = s.chars().next()?;
    (matches!(q, '\'' | '"') && s.len() >= 2 && s.ends_with(q)).then(|| &s[1..s.len() - 1])
}

#[cfg(test)]
mod tests {
    use super::*;

    type Read = (RecordKind, Option<u64>, Vec<(String, f64)>);

    fn read(text: &str) -> Option<Read> {
        parse(1, text).map(|r| (r.kind, r.step, r.metrics))
    }

    fn m(pairs: &[(&str, f64)]) -> Vec<(String, f64)> {
        pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    }

    #[test]
    fn every_versions_dict() {
        assert_eq!(
            read(r#"{"loss": 3.3087, "learning_rate": 4.9e-05, "epoch": 0.0625, "step": 50}"#),
            Some((RecordKind::Step, Some(50), m(&[("loss", 3.3087), ("learning_rate", 4.9e-05), ("epoch", 0.0625)])))
        );
        assert_eq!(read("{'eval_loss': 2.1, 'epoch': 1.0, 'step': 500}").unwrap().0, RecordKind::Eval);
        assert_eq!(
            read("{'loss': '2.346', 'grad_norm': np.float64(1.5), 'learning_rate': tensor(4e-05, device='cuda:0'), 'epoch': '0.1'}"),
            Some((RecordKind::Step, None, m(&[("loss", 2.346), ("grad_norm", 1.5), ("learning_rate", 4e-05), ("epoch", 0.1)])))
        );
        // 4.57+ with include_num_input_tokens_seen: a step with train_runtime.
        assert_eq!(
            read("{'loss': 2.1, 'learning_rate': 1e-05, 'epoch': 0.5, 'num_input_tokens_seen': 5120, 'train_runtime': 12.3, 'train_tokens_per_second': 416.2}").unwrap().0,
            RecordKind::Step
        );
        assert_eq!(
            read("{'train_runtime': 2.185, 'train_samples_per_second': 1.831, 'epoch': 1.0}").unwrap().0,
            RecordKind::TrainSummary
        );
        assert_eq!(
            read("{'dev_loss': 0.5, 'dev_runtime': 1.2, 'dev_samples_per_second': 9.0, 'epoch': 1.0}").unwrap().0,
            RecordKind::Eval
        );
        assert_eq!(read("{'test_acc': 0.9, 'test_loss': 0.23}").unwrap().0, RecordKind::Eval);
    }

    #[test]
    fn a_dict_after_a_bar_epoch_lines_and_log_metrics() {
        assert_eq!(
            read(
                "  5%|▌         | 10/200 [00:10<03:10,  1.00it/s]{'loss': 2.1, 'learning_rate': 5e-05, 'epoch': 0.05}"
            ),
            Some((RecordKind::Step, None, m(&[("loss", 2.1), ("learning_rate", 5e-05), ("epoch", 0.05)])))
        );
        let r = parse(1, "epoch 2: {'accuracy': 0.8284313725490197, 'f1': 0.8809523809523809}").unwrap();
        assert_eq!((r.kind, r.labels.clone()), (RecordKind::Eval, vec![("epoch".into(), Label::Int(2))]));
        assert_eq!(
            read("epoch 0: perplexity: 25.31 eval_loss: tensor(3.2311, device='cuda:0')").unwrap().2,
            m(&[("perplexity", 25.31), ("eval_loss", 3.2311)])
        );
        assert_eq!(
            read("  train_runtime            = 0:01:23.45").unwrap(),
            (RecordKind::TrainSummary, None, m(&[("train_runtime", 83.45)]))
        );
        assert_eq!(
            read("  train_mem_gpu_alloc_delta  =      693MB").unwrap().2,
            m(&[("train_mem_gpu_alloc_delta_mb", 693.0)])
        );
        assert_eq!(read("  eval_loss               =     2.2531").unwrap().0, RecordKind::Eval);
        assert_eq!(read("  eval_runtime = 1 day, 0:00:01.50").unwrap().2, m(&[("eval_runtime", 86401.5)]));
    }

    #[test]
    fn what_is_no_trainer_log_gives_nothing() {
        for t in [
            "{'model_name_or_path': 'gpt2', 'learning_rate': 5e-05, 'num_train_epochs': 3}",
            "{'learning_rate': 5e-05, 'num_train_epochs': 3, 'per_device_train_batch_size': 8}",
            "{'lr': 0.0003, 'batch_size': 32}",
            "{'eval_steps': 500, 'eval_batch_size': 8}",
            "{'epoch': 1.0}",
            "UserWarning: the loss is {'loss': 'not a number'}",
            "{'loss': None, 'epoch': 0.1}",
            "  Num examples = 1000",
            "  Total train batch size (w. parallel, distributed & accumulation) = 32",
            "  epoch                    =        3.0",
            "  perplexity               =    12.3456",
            "  total_flos               =  2150843GF",
            "  eval_batch_size = 8",
            "epoch 0: 85.23",
            "epoch 3: done",
            "epoch 5: loss: 0.2341 acc: 0.91",
            "epoch 5: {'loss': 0.2341, 'acc': 0.91}",
            "Map: 100%|██████████| 1000/1000 [00:00<00:00, 5000.00 examples/s]",
        ] {
            assert!(parse(1, t).is_none(), "{t}");
        }
    }
}
