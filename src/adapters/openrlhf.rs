//! OpenRLHF (`openrlhf/trainer/*.py`, 0.1 to 0.11): its training bars whose postfix is the step's logs, and the PPO trainer's `Global step N: {...}` lines.
//!
//! The SFT, DPO, KTO, KD, PRM and RM trainers show a tqdm bar per epoch whose postfix is the
//! micro-step's `logs_dict` (tqdm `set_postfix`, numbers by `format_num`: `5e-7`, `-.0123`):
//! `Train step of epoch 0:  30%|███       | 3/10 [00:30<01:10, 10.0s/it, gpt_loss=0.123, lr=5e-7]`,
//! a training step whose `n` is the step. Their `evaluate` ends its bar on the eval's logs:
//! `Eval stage of global_step 100: 100%|...| 8/8 [...]` (DPO, KTO) or `Eval stage of steps
//! 100` (SFT, RM, KD, PRM): an `eval` record at the step the description names. The PPO
//! trainer (to 0.8.4) puts the step's mean status on its `Episode [1/1]` bar (`n` is the global
//! step within the episode); from 0.8.5 it logs `✨ Global step 12: {'policy_loss': ...}` (the
//! async trainer, from 0.10, without the ✨) and `✨ Evaluation completed in 0:01:02,
//! global_step 10, eval_metrics: {...}`. The actor's and critic's `Train epoch [1/1]` bars
//! count micro-batches of one step, not steps: they stay plain progress (`tqdm.rs`), as do bars
//! without a postfix. The logger prefix (`INFO 05-20 10:11:12 ppo_trainer.py:525] `,
//! `openrlhf/utils/logging_utils.py`) and Ray's actor prefix are the cleaner's.
use super::value::count;
use super::verl::py_dict;
use super::{tqdm, Record, RecordKind};
use crate::adapters::value::Scan;

pub fn parse(line: u64, text: &str) -> Option<Record> {
    let text = own_header(text);
    let t = text.trim_start_matches(['✨', ' ']);
    if let Some(rest) = t.strip_prefix("Global step ") {
        let (n, dict) = rest.cut(": ")?;
        let mut r = Record::at(line, RecordKind::Step);
        r.step = Some(count(n)?);
        r.metrics = py_dict(dict)?;
        return (!r.metrics.is_empty()).then_some(r);
    }
    if let Some(rest) = t.strip_prefix("Evaluation completed in ") {
        // `0:01:02, global_step 10, eval_metrics: {...}`
        let (_, rest) = rest.cut(", global_step ")?;
        let (n, dict) = rest.cut(", eval_metrics: ")?;
        let mut r = Record::at(line, RecordKind::Eval);
        r.step = Some(count(n)?);
        r.metrics = py_dict(dict)?;
        return (!r.metrics.is_empty()).then_some(r);
    }
    bar(line, text)
}

/// OpenRLHF's logger header (`openrlhf/utils/logging_utils.py`, vLLM's format:
/// `"%(levelname)s %(asctime)s %(filename)s:%(lineno)d] %(message)s"`, `%m-%d %H:%M:%S`):
/// `INFO 05-20 10:10:03 ppo_trainer.py:532] `, taken off here too, so a line reads the same
/// whether or not the shared cleaner knows it.
pub(super) fn own_header(text: &str) -> &str {
    let Some(level_end) = text.bytes().take(9).position(|b| b == b' ') else { return text };
    if !matches!(&text[..level_end], "INFO" | "WARNING" | "DEBUG" | "ERROR" | "CRITICAL") {
        return text;
    }
    let rest = &text[level_end + 1..];
    // `05-20 10:10:03 `
    let b = rest.as_bytes();
    let stamp = b.len() > 15
        && b[..14].iter().enumerate().all(|(i, c)| match i {
            2 => *c == b'-',
            5 => *c == b' ',
            8 | 11 => *c == b':',
            _ => c.is_ascii_digit(),
        })
        && b[14] == b' ';
    if !stamp {
        return text;
    }
    let place = &rest[15..];
    match place.at("] ") {
        // `ppo_trainer.py:532`
        Some(end) if place[..end].rsplit_once(':').is_some_and(|(f, l)| !f.contains(' ') && count(l).is_some()) => {
            &place[end + 2..]
        }
        _ => text,
    }
}

fn bar(line: u64, text: &str) -> Option<Record> {
    if !(text.starts_with("Train step of epoch ")
        || text.starts_with("Episode [")
        || text.starts_with("Eval stage of "))
    {
        return None;
    }
    let b = tqdm::bar(text)?;
    if b.postfix.is_empty() {
        return None;
    }
    let (kind, step) = if b.desc.starts_with("Train step of epoch ") || b.desc.starts_with("Episode [") {
        (RecordKind::Step, b.n)
    } else if let Some(n) =
        b.desc.strip_prefix("Eval stage of global_step ").or_else(|| b.desc.strip_prefix("Eval stage of steps "))
    {
        (RecordKind::Eval, count(n)?)
    } else {
        return None;
    };
    let mut r = Record::at(line, kind);
    r.step = Some(step);
    r.metrics = b.postfix;
    r.metrics.extend(b.rate.map(|(k, v)| (k.to_string(), v)));
    Some(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn global_step_and_evaluation_lines() {
        let r = parse(1, "✨ Global step 12: {'policy_loss': -0.0123, 'actor_lr': 5e-07, 'generated': 'x'}").unwrap();
        assert_eq!((r.kind, r.step, r.metrics.len()), (RecordKind::Step, Some(12), 2));
        let r = parse(1, "Global step 3: {'timing/step_total': 12.5}").unwrap();
        assert_eq!(r.step, Some(3));
        let r = parse(1, "✨ Evaluation completed in 0:01:02, global_step 10, eval_metrics: {'eval_gsm8k_pass1': 0.5}")
            .unwrap();
        assert_eq!((r.kind, r.step), (RecordKind::Eval, Some(10)));
        assert!(parse(1, "✨ Evaluation start time: 2025-05-20 10:11:12").is_none());
        assert!(parse(1, "Global step 3 is done").is_none());
    }

    #[test]
    fn its_logger_header_is_taken_off() {
        let r = parse(1, "INFO 05-20 10:10:03 ppo_trainer.py:532] ✨ Global step 1: {'policy_loss': 0.5}").unwrap();
        assert_eq!(r.step, Some(1));
        assert_eq!(own_header("INFO 05-20 10:10:03 nothing here"), "INFO 05-20 10:10:03 nothing here");
        assert_eq!(own_header("INFO: fine"), "INFO: fine");
    }

    #[test]
    fn which_bars_are_steps() {
        let r = parse(1, "Eval stage of global_step 100: 100%|██████████| 8/8 [00:04<00:00,  1.95it/s, eval_loss=0.61, acc_mean=0.7]").unwrap();
        assert_eq!((r.kind, r.step), (RecordKind::Eval, Some(100)));
        let actor = "Train epoch [1/1]: 100%|██████████| 4/4 [00:10<00:00,  2.50s/it, act_loss=0.01, reward=0.5]";
        assert!(parse(1, actor).is_none());
        assert!(parse(1, "Train step of epoch 0:   0%|          | 0/10 [00:00<?, ?it/s]").is_none());
    }
}
