//! slime (THUDM/slime, 0.1 to 0.3 and main): the metric dicts its training and rollout loops print, `NAME N: {dict}`.
//!
//! Each is `print` (to 0.1.x) or, from 2025-11, `logger.info` of `f"{name} {rollout_id}: {log_dict}"`:
//! - `step {accumulated_step_id}: {'train/loss': ..., 'train/grad_norm': ..., 'train/lr-pg_0': ...}`
//!   (`slime/backends/megatron_utils/model.py` `train`; `critic-step N` for the critic, and the
//!   FSDP backend's `step N` in 0.2): a training step.
//! - `rollout N`, `multi_turn N`, `passrate N` (`gather_log_data`: `rollout/...`,
//!   `multi_turn/...`, `passrate/...`) and `perf N` (`log_perf_data`, the trainer's `perf/*_time`,
//!   `perf/actor_train_tflops`, `perf/step_time`; the rollout manager's `perf/rollout_time`,
//!   `perf/tokens_per_gpu_per_sec` and `rollout/*`): the rollout's statistics at rollout `N`,
//!   training-step records too (slime's RL step is the rollout; with one optimizer step per
//!   rollout, the default, `N` is the same step).
//! - `eval N: {'eval/aime': ...}`: an `eval` record.
//!
//! Every key is namespaced (`train/`, `rollout/`, ...): a dict whose keys are not is not slime's.
//! The logger's prefix (`[2025-11-20 10:00:00] model.py:918 - `,
//! `slime/utils/logging_utils.py`) and Ray's actor prefix are the cleaner's.
use super::value::count;
use super::verl::py_dict;
use super::{Label, Record, RecordKind};
use crate::adapters::value::Scan;

pub fn parse(line: u64, text: &str) -> Option<Record> {
    // `NAME N: {`: the name, a space, digits, then `: {`, checked before anything is searched.
    let mut space = first_space(text)?;
    let mut text = text;
    if text.starts_with('[') || text[..space].has(".py:") {
        text = own_header(text);
        space = first_space(text)?;
    }
    let (what, rest) = (&text[..space], &text[space + 1..]);
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    if digits == 0 || !rest[digits..].starts_with(": {") {
        return None;
    }
    let (head, n) = (&text[..space + 1 + digits], &rest[..digits]);
    let kind = match what {
        "eval" => RecordKind::Eval,
        "step" | "rollout" | "perf" | "passrate" | "multi_turn" => RecordKind::Step,
        w if w.ends_with("-step")
            && w.len() > 5
            && w.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-') =>
        {
            RecordKind::Step
        }
        _ => return None,
    };
    let step = count(n)?;
    let dict = &text[head.len() + 2..];
    if !namespaced(dict) {
        return None;
    }
    let mut r = Record::at(line, kind);
    r.step = Some(step);
    r.metrics = py_dict(dict)?;
    if r.metrics.is_empty() {
        return None;
    }
    r.labels.push(("log".into(), Label::Text(what.to_string())));
    Some(r)
}

/// Where the first word ends, if within the first 32 bytes.
fn first_space(text: &str) -> Option<usize> {
    text.as_bytes().iter().take(32).position(|&b| b == b' ')
}

/// slime's logger header (`configure_logger`: `[%(asctime)s{prefix}] %(filename)s:%(lineno)d - `):
/// `[2025-12-02 09:15:07] model.py:654 - `, or its `model.py:654 - ` when the shared cleaner
/// took the bracketed time; taken off here, so a line reads the same either way.
pub(super) fn own_header(text: &str) -> &str {
    let mut t = text;
    if t.starts_with("[20") {
        match t.at("] ") {
            Some(end) if end < 64 => t = &t[end + 2..],
            _ => return text,
        }
    }
    // `model.py:654 - `: the first word, a file and line, then ` - `.
    let Some(space) = t.bytes().take(64).position(|b| b == b' ') else { return text };
    let Some((file, line)) = t[..space].cut(".py:") else { return text };
    let file_ok = !file.is_empty() && file.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    match t[space..].strip_prefix(" - ") {
        Some(message) if file_ok && count(line).is_some() => message,
        _ => text,
    }
}

/// Every key of the printed dict has a `/`: `{'train/loss': ...`. A cheap look at the keys'
/// text (the values are numbers), before the dict is read.
fn namespaced(dict: &str) -> bool {
    let mut keys = 0;
    let mut rest = dict;
    while let Some(at) = rest.find(['\'', '"']) {
        let q = rest.as_bytes()[at];
        let after = &rest[at + 1..];
        let Some(end) = after.find(q as char) else { return false };
        let quoted = &after[..end];
        rest = &after[end + 1..];
        // A quoted key is followed by `:`; a quoted value (a string) is skipped.
        if rest.trim_start().starts_with(':') {
            if !quoted.contains('/') {
                return false;
            }
            keys += 1;
        }
    }
    keys > 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_of_dict() {
        let r =
            parse(1, "step 3: {'train/loss': 0.5, 'train/grad_norm': 1.25, 'train/lr-pg_0': 1e-06, 'train/step': 3}")
                .unwrap();
        assert_eq!((r.kind, r.step, r.metrics.len()), (RecordKind::Step, Some(3), 4));
        let r = parse(1, "critic-step 3: {'train/critic-value_loss': 0.5}").unwrap();
        assert_eq!(r.kind, RecordKind::Step);
        let r = parse(1, "eval 10: {'eval/aime': 0.25, 'eval/aime-truncated_ratio': 0.0}").unwrap();
        assert_eq!((r.kind, r.step), (RecordKind::Eval, Some(10)));
        let r =
            parse(1, "perf 2: {'perf/rollout_time': np.float64(61.5), 'rollout/response_len/mean': 512.0}").unwrap();
        assert_eq!(r.metrics[0], ("perf/rollout_time".to_string(), 61.5));
    }

    #[test]
    fn its_logger_header_is_taken_off() {
        for t in [
            "[2025-12-02 09:15:07] model.py:654 - step 3: {'train/loss': 0.5}",
            "model.py:654 - step 3: {'train/loss': 0.5}",
        ] {
            assert_eq!(parse(1, t).unwrap().step, Some(3), "{t}");
        }
        assert_eq!(own_header("a.py:3 -x"), "a.py:3 -x");
    }

    #[test]
    fn dicts_that_are_not_slimes() {
        for t in [
            "step 3: {'loss': 0.5}",
            "load metadata: {'consumed': 3}",
            "step 3: {'train/loss': 'x'}",
            "Step 3: {'train/loss': 0.5}",
            "rollout 3 of 10: {'rollout/x': 1}",
        ] {
            assert!(parse(1, t).is_none(), "{t}");
        }
    }
}
