//! verl (volcengine/verl, now verl-project/verl): the console logger's line per step and the trainer's validation prints, 0.1 to 0.7 and main.
//!
//! The step line is `verl/utils/logger/aggregate_logger.py` `concat_dict_to_str`, printed by
//! `LocalLogger.log` (the `console` backend of `verl/utils/tracking.py`): `step:{step}` then
//! ` - {k}:{v}` for each numeric metric. 0.1 to 0.4 print `{v:.3f}`
//! (`step:5 - actor/pg_loss:-0.012 - actor/lr:0.000`); 0.5 on print `pprint.pformat(v)`, the
//! value's repr (`0.0123456789`, `12`, numpy 2's `np.float64(0.5)`, `True`). A bool is a
//! `numbers.Number` too: it gives no metric. The PPO trainer's metrics include its validation
//! ones at test steps; a line with only validation metrics (`val/`, `val-core/`, `val-aux/`:
//! the initial validation at step 0, the SFT trainer's `val/loss`) is a `validation` record.
//!
//! The PPO trainers also `pprint(f"Initial validation metrics: {val_metrics}")` and `Final
//! validation metrics`; pprint prints the string's repr, which it splits into several
//! literals over lines when it is longer than 80 columns:
//! `("Initial validation metrics: {'val-core/openai/gsm8k/reward/mean@1': "` then
//! ` '0.2835}')`. `Validation` joins them (a reader's state); the SFT trainers `print` the same
//! sentence on one line. Ray's `(TaskRunner pid=N)` / `(main_task pid=N)` prefix is the
//! cleaner's. Keys follow the one name rule (`value::name`): `mean@1` is not an identifier.
//! The workers' `log_gpu_memory_usage` lines (`After init model, memory allocated (GB): 1.2,
//! memory reserved (GB): 1.5`) are `memory` records.
use super::value::{count, name, number};
use super::{Label, Record, RecordKind};
use crate::adapters::value::Scan;

pub fn parse(line: u64, text: &str) -> Option<Record> {
    if let Some(rest) = text.strip_prefix("step:") {
        return step_line(line, rest);
    }
    // `Initial validation metrics: {`, `Final ...`, or pprint's repr of it on one line.
    if matches!(text.as_bytes().first(), Some(b'I' | b'F' | b'"' | b'\'')) && text.has("validation metrics: {") {
        let (when, metrics) = validation_sentence(text.trim())?;
        return Some(validation(line, when, metrics));
    }
    // A memory line ends with a number (`... (GB): 13.25` or `40.50/79.11`).
    if text.as_bytes().last().is_some_and(u8::is_ascii_digit) {
        if let Some(at) = text.at(", memory allocated (GB): ") {
            return memory(line, &text[..at], &text[at + 2..]);
        }
    }
    None
}

/// `log_gpu_memory_usage` / `GPUMemoryLogger` (`verl/utils/debug/performance.py`, later
/// `verl/utils/profiler/performance.py`): `{head}, memory allocated (GB): {a}, memory reserved
/// (GB): {r}` and, from 0.4, `, device memory used/total (GB): {u}/{t}` (the total is no metric).
fn memory(line: u64, head: &str, rest: &str) -> Option<Record> {
    let mut r = Record::at(line, RecordKind::Memory);
    for part in rest.split(", ") {
        let (label, value) = part.cut(": ")?;
        if !label.ends_with("(GB)") {
            return None;
        }
        let value = value.split_once('/').map_or(value, |(used, _)| used);
        r.metrics.push((name(label), number(value)?));
    }
    r.labels.push(("at".into(), Label::Text(head.trim().to_string())));
    Some(r)
}

/// `step:12 - actor/pg_loss:-0.0123 - critic/score/mean:0.5`: every segment `key:value`.
fn step_line(line: u64, rest: &str) -> Option<Record> {
    let mut parts = rest.split(" - ");
    let step = count(parts.next()?)?;
    let mut r = Record::at(line, RecordKind::Step);
    r.step = Some(step);
    let mut validation = true;
    for part in parts {
        let (k, v) = part.rsplit_once(':')?;
        let k = k.trim();
        if k.is_empty() {
            return None;
        }
        let v = v.trim();
        if v == "True" || v == "False" {
            continue;
        }
        validation &= is_validation_key(k);
        r.metrics.push((name(k), number(v)?));
    }
    if r.metrics.is_empty() {
        return None;
    }
    if validation {
        r.kind = RecordKind::Validation;
    }
    Some(r)
}

fn is_validation_key(k: &str) -> bool {
    k.starts_with("val/") || k.starts_with("val-")
}

/// `Initial validation metrics: {...}` / `Final validation metrics: {...}`, bare (print) or as
/// its repr on one line (pprint of a short string): which, and the dict's metrics.
fn validation_sentence(text: &str) -> Option<(&'static str, Vec<(String, f64)>)> {
    let text = match text.as_bytes().first() {
        Some(b'"' | b'\'') => {
            let (inner, rest) = py_literal(text)?;
            return if rest.trim().is_empty() { validation_sentence(&inner) } else { None };
        }
        _ => text,
    };
    let (when, dict) = if let Some(d) = text.strip_prefix("Initial validation metrics: ") {
        ("initial", d)
    } else if let Some(d) = text.strip_prefix("Final validation metrics: ") {
        ("final", d)
    } else {
        return None;
    };
    let metrics = py_dict(dict)?;
    (!metrics.is_empty()).then_some((when, metrics))
}

fn validation(line: u64, when: &str, metrics: Vec<(String, f64)>) -> Record {
    let mut r = Record::at(line, RecordKind::Validation);
    r.labels.push(("when".into(), Label::Text(when.into())));
    r.metrics = metrics;
    r
}

/// pprint's repr of a long `Initial/Final validation metrics: {...}` string, one literal a
/// line: `("Initial validation metrics: {'val-core/...': "`, ` '0.28, 'val-aux/...': '`, ...,
/// ` '0.5}')`. Holds the literals read so far.
#[derive(Default)]
pub struct Validation {
    open: Option<Block>,
}

struct Block {
    line: u64,
    text: String,
    lines: u32,
}

/// A pprinted dict of a few hundred metrics spans some hundred lines; past this it is not ours.
const MAX_BLOCK_LINES: u32 = 2000;

impl Validation {
    /// Reads one line; `None` when it is not part of such a block (an open block ends there).
    pub fn push(&mut self, line: u64, text: &str) -> Option<Vec<Record>> {
        let t = text.trim();
        if let Some(block) = &mut self.open {
            let Some((lit, rest)) = py_literal(t) else {
                self.open = None;
                return None;
            };
            block.text.push_str(&lit);
            block.lines += 1;
            match rest.trim() {
                "" if block.lines < MAX_BLOCK_LINES => return Some(Vec::new()),
                ")" => {
                    let block = self.open.take()?;
                    let record = validation_sentence(&block.text).map(|(when, metrics)| {
                        let mut r = validation(block.line, when, metrics);
                        r.end_line = Some(line);
                        r
                    });
                    return Some(record.into_iter().collect());
                }
                _ => {
                    self.open = None;
                    return None;
                }
            }
        }
        // The first line: `(` and the first literal, which starts the sentence.
        let first = t.strip_prefix('(')?;
        let body = first.get(1..).unwrap_or("");
        if !(body.starts_with("Initial validation metrics:") || body.starts_with("Final validation metrics:")) {
            return None;
        }
        let (lit, rest) = py_literal(first)?;
        if !rest.trim().is_empty() {
            return None;
        }
        self.open = Some(Block { line, text: lit, lines: 1 });
        Some(Vec::new())
    }
}

/// A Python string literal at the start of `s` (`'...'` or `"..."`, with backslash escapes):
/// its value and what follows it.
pub(super) fn py_literal(s: &str) -> Option<(String, &str)> {
    let quote = s.chars().next().filter(|c| *c == '\'' || *c == '"')?;
    let mut out = String::new();
    let mut chars = s.char_indices().skip(1);
    while let Some((i, c)) = chars.next() {
        if c == quote {
            return Some((out, &s[i + 1..]));
        }
        if c != '\\' {
            out.push(c);
            continue;
        }
        let (_, e) = chars.next()?;
        match e {
            'n' => out.push('\n'),
            't' => out.push('\t'),
            'r' => out.push('\r'),
            '\\' | '\'' | '"' => out.push(e),
            'x' | 'u' | 'U' => {
                let width = match e {
                    'x' => 2,
                    'u' => 4,
                    _ => 8,
                };
                let mut hex = String::new();
                for _ in 0..width {
                    hex.push(chars.next()?.1);
                }
                out.push(char::from_u32(u32::from_str_radix(&hex, 16).ok()?)?);
            }
            other => {
                out.push('\\');
                out.push(other);
            }
        }
    }
    None
}

/// A Python dict as `str()` prints it (`{'actor/pg_loss': 0.5, 'n': 3, 'x': np.float64(1e-05)}`)
/// into its numeric entries, in order, names by the one rule. A list gives its first number;
/// strings, `None`, bools and nested dicts give nothing. `None` when `s` is not one dict whose
/// keys are quoted strings.
pub(super) fn py_dict(s: &str) -> Option<Vec<(String, f64)>> {
    let inner = s.trim().strip_prefix('{')?.strip_suffix('}')?;
    let mut out = Vec::new();
    if inner.trim().is_empty() {
        return Some(out);
    }
    for entry in entries(inner)? {
        let (key, rest) = py_literal(entry.trim_start())?;
        let value = rest.trim_start().strip_prefix(':')?.trim();
        if key.is_empty() {
            return None;
        }
        if let Some(v) = py_number(value) {
            out.push((name(&key), v));
        }
    }
    Some(out)
}

/// A printed Python value as a number: plain, numpy's or torch's repr, or a list's first element.
fn py_number(value: &str) -> Option<f64> {
    if let Some(list) = value.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
        return entries(list)?.first().and_then(|first| number(first));
    }
    if matches!(value, "True" | "False" | "None") {
        return None;
    }
    number(value)
}

/// `a, b, (c, d), 'e, f'` → its top-level entries (commas inside brackets and quotes stay).
fn entries(s: &str) -> Option<Vec<&str>> {
    let (mut out, mut depth, mut quote, mut escaped, mut start) = (Vec::new(), 0i32, None::<char>, false, 0);
    for (i, c) in s.char_indices() {
        if let Some(q) = quote {
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == q {
                quote = None;
            }
            continue;
        }
        match c {
            '\'' | '"' => quote = Some(c),
            '(' | '[' | '{' => depth += 1,
            ')' | ']' | '}' => {
                depth -= 1;
                if depth < 0 {
                    return None;
                }
            }
            ',' if depth == 0 => {
                out.push(s[start..i].trim());
                start = i + 1;
            }
            _ => {}
        }
    }
    if quote.is_some() || depth != 0 {
        return None;
    }
    let last = s[start..].trim();
    if !last.is_empty() {
        out.push(last);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metrics(r: &Record) -> Vec<(&str, f64)> {
        r.metrics.iter().map(|(k, v)| (k.as_str(), *v)).collect()
    }

    #[test]
    fn both_value_forms_of_the_step_line() {
        let r = parse(1, "step:3 - actor/pg_loss:-0.012 - actor/lr:0.000 - timing_s/step:12.345").unwrap();
        assert_eq!(r.step, Some(3));
        assert_eq!(metrics(&r), vec![("actor/pg_loss", -0.012), ("actor/lr", 0.0), ("timing_s/step", 12.345)]);
        let r = parse(1, "step:4 - actor/pg_loss:np.float64(-0.0123) - actor/lr:1e-06 - flag:True - n:12").unwrap();
        assert_eq!(metrics(&r), vec![("actor/pg_loss", -0.0123), ("actor/lr", 1e-6), ("n", 12.0)]);
        assert_eq!(r.kind, RecordKind::Step);
    }

    #[test]
    fn a_step_of_validation_metrics_only_is_a_validation() {
        let r = parse(1, "step:0 - val-core/openai/gsm8k/reward/mean@1:0.25 - val-aux/num_turns/min:2").unwrap();
        assert_eq!(r.kind, RecordKind::Validation);
        assert_eq!(r.step, Some(0));
        assert_eq!(r.metrics[0].0, "val-core/openai/gsm8k/reward/mean@1");
        let r = parse(1, "step:20 - val/loss:1.25").unwrap();
        assert_eq!(r.kind, RecordKind::Validation);
        let r = parse(1, "step:20 - train/loss:1.5 - val/test_score/gsm8k:0.25").unwrap();
        assert_eq!(r.kind, RecordKind::Step);
    }

    #[test]
    fn prose_after_step_is_no_line() {
        for t in ["step:3 - something happened: oops", "step:3", "step:x - a:1", "step:3 - :1", "step: 3 - a:1 b"] {
            assert!(parse(1, t).is_none(), "{t}");
        }
    }

    #[test]
    fn the_validation_sentence_on_one_line_and_as_a_pprinted_block() {
        let r = parse(1, "Final validation metrics: {'val/loss': 1.25}").unwrap();
        assert_eq!((r.kind, r.step, metrics(&r)), (RecordKind::Validation, None, vec![("val/loss", 1.25)]));
        let r = parse(1, "\"Initial validation metrics: {'val/test_score/openai/gsm8k': 0.25}\"").unwrap();
        assert_eq!(metrics(&r), vec![("val/test_score/openai/gsm8k", 0.25)]);

        let mut v = Validation::default();
        assert_eq!(v.push(10, "(\"Final validation metrics: {'val-core/openai/gsm8k/reward/mean@1': \""), Some(vec![]));
        assert_eq!(v.push(11, " 'np.float64(0.5), '"), Some(vec![]));
        let records = v.push(12, " \"'val-aux/x/mean': 2}\")").unwrap();
        assert_eq!(records.len(), 1);
        assert_eq!((records[0].line, records[0].end_line), (10, Some(12)));
        assert_eq!(metrics(&records[0]), vec![("val-core/openai/gsm8k/reward/mean@1", 0.5), ("val-aux/x/mean", 2.0)]);
        // A line that is not a literal ends the block, and is someone else's.
        assert_eq!(v.push(20, "(\"Initial validation metrics: {'a': \""), Some(vec![]));
        assert_eq!(v.push(21, "step:1 - a:1"), None);
        assert_eq!(v.push(22, " '1}')"), None);
        // pprint may cut before the dict: the first literal is then single-quoted.
        assert_eq!(v.push(30, "('Initial validation metrics: '"), Some(vec![]));
        assert_eq!(v.push(31, " \"{'val-core/a_very_long_key/mean@1': 0.5}\")").unwrap().len(), 1);
        assert_eq!(v.push(32, "(é"), None);
    }

    #[test]
    fn memory_lines() {
        let r = parse(1, "After init model, memory allocated (GB): 12.5, memory reserved (GB): 13.25").unwrap();
        assert_eq!(
            (r.kind, metrics(&r)),
            (RecordKind::Memory, vec![("memory_allocated_gb", 12.5), ("memory_reserved_gb", 13.25)])
        );
        let r = parse(1, "actor After update_policy, memory allocated (GB): 20.11, memory reserved (GB): 31.02, device memory used/total (GB): 40.50/79.11").unwrap();
        assert_eq!(r.metrics[2], ("device_memory_used_total_gb".to_string(), 40.5));
        assert!(parse(1, "Oops, memory allocated (GB): unknown").is_none());
    }

    #[test]
    fn python_dicts() {
        let d =
            py_dict("{'a': 1, 'b c': [0.5, 2], 'd': 'x, y', 'e': None, 'f': {'g': 1}, 'h': np.float32(2.5)}").unwrap();
        assert_eq!(d, vec![("a".to_string(), 1.0), ("b_c".to_string(), 0.5), ("h".to_string(), 2.5)]);
        assert_eq!(py_dict("{}"), Some(vec![]));
        for bad in ["{a: 1}", "{'a': 1", "{'a': (1, 2}", "not a dict"] {
            assert!(py_dict(bad).is_none(), "{bad}");
        }
    }
}
