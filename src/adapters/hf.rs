//! HF Trainer and TRL (`trainer_callback.py` `ProgressCallback`/`PrinterCallback`, transformers 5.x; TRL's SFT, DPO and GRPO keys): the printed log dicts.
//!
//! `{'loss': 2.3456, 'grad_norm': 1.234, 'learning_rate': 4.5e-05, 'epoch': 0.1}`, the newer
//! string-valued form `{'loss': '2.346', 'grad_norm': '1.234', ...}`, TRL's keys as printed
//! (`rewards/chosen`, `completions/mean_length`, `clip_ratio/low_mean`), eval dicts
//! (`eval_loss`, ...) and the final `{'train_runtime': ..., 'train_loss': ...}`. A dict is a
//! log only if every value is a number and a key is one the Trainer or TRL logs: a config dump
//! (`{'model': 'gpt2', 'lr': 3e-4}`) is not.
use super::value::{count, number};
use super::{Record, RecordKind};

/// Keys the Trainer and TRL log; a dict with none of them is someone else's dict.
const KNOWN: [&str; 12] = [
    "loss",
    "grad_norm",
    "learning_rate",
    "epoch",
    "train_runtime",
    "train_loss",
    "reward",
    "kl",
    "entropy",
    "num_tokens",
    "mean_token_accuracy",
    "policy_loss",
];

pub fn parse(line: u64, text: &str) -> Option<Record> {
    let inner = text.trim().strip_prefix('{')?.strip_suffix('}')?;
    let mut r = Record::at(line, RecordKind::Step);
    let mut known = false;
    for entry in entries(inner) {
        let (key, value) = entry.split_once(':')?;
        let key = unquote(key.trim())?;
        let v = number(value.trim())?;
        known |= KNOWN.contains(&key) || key.starts_with("eval_") || key.contains('/');
        if key == "step" {
            r.step = count(value.trim().trim_matches(['\'', '"']));
            continue;
        }
        r.metrics.push((key.to_string(), v));
    }
    if !known || r.metrics.is_empty() {
        return None;
    }
    r.kind = kind_of(&r.metrics);
    Some(r)
}

/// What a Trainer's log dict is, printed or handed to `Trainer.log`: the final summary (it
/// has `train_runtime`), an eval (only `eval_*` keys and the epoch), else a training step.
pub fn kind_of(metrics: &[(String, f64)]) -> RecordKind {
    if metrics.iter().any(|(k, _)| k == "train_runtime") {
        RecordKind::TrainSummary
    } else if metrics.iter().all(|(k, _)| k.starts_with("eval_") || k == "epoch") {
        RecordKind::Eval
    } else {
        RecordKind::Step
    }
}

/// `'a': 1, 'b': np.float64(0.5)` → its entries (commas inside parentheses stay).
fn entries(s: &str) -> Vec<&str> {
    let (mut out, mut depth, mut quote, mut start) = (Vec::new(), 0i32, None::<char>, 0);
    for (i, c) in s.char_indices() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '\'' | '"') => quote = Some(c),
            (None, '(' | '[') => depth += 1,
            (None, ')' | ']') => depth -= 1,
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
