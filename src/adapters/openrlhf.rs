//! OpenRLHF (`trainer/ppo_trainer.py`, `sft_trainer.py`, `dpo_trainer.py`, 0.11): its training bars, whose postfix is the step's logs.
//!
//! OpenRLHF logs to wandb or TensorBoard; on the console it shows tqdm bars whose postfix is the
//! step's `logs_dict`: `Train step of epoch 0:  30%|███       | 3/10 [00:30<01:10, 10.0s/it,
//! policy_loss=0.123, kl=0.0012, reward=0.456, response_length=123]`. Such a bar is a training
//! step (`n` is the step); other bars are plain progress (`tqdm.rs`).
use super::{tqdm, Record, RecordKind};

const DESCS: [&str; 3] = ["Train step of epoch", "Train epoch", "Episode ["];

pub fn parse(line: u64, text: &str) -> Option<Record> {
    let b = tqdm::bar(text)?;
    if !DESCS.iter().any(|d| b.desc.starts_with(d)) || b.postfix.is_empty() {
        return None;
    }
    let mut r = Record::at(line, RecordKind::Step);
    r.step = Some(b.n);
    r.metrics = b.postfix;
    r.metrics.extend(b.rate.map(|(k, v)| (k.to_string(), v)));
    Some(r)
}
