//! PyTorch Lightning (0.7 → 2.6: `callbacks/progress/tqdm_progress.py`, `rich_progress.py`, `loops/evaluation_loop.py` `_print_results`): its bars and its results tables.
//!
//! - The tqdm bar (`TQDMProgressBar`), read as tqdm's (`tqdm.rs`) when its desc is one
//!   Lightning gives (`Epoch 3`, `Validation DataLoader 0`, `Validating`, `Sanity Checking`,
//!   `Testing`, `Predicting`, ...): `Epoch 0:  50%|█████ | 50/100 [00:05<00:05, 9.80it/s, v_num=0,
//!   train_loss=2.340]`. Through 1.9 the postfix starts with the running `loss=4.501`; 2.x drops
//!   it; 2.1+ always prints `it/s` (`rate_noinv_fmt`); `Tqdm.format_num` pads floats to 5
//!   characters (`2.340`).
//! - The Rich bar (`RichProgressBar`, 1.5+), as it reaches a log file (Rich prints its final
//!   state when the output is not a terminal; without colours the bar's unfilled part is blank,
//!   and metrics too long for the console's width wrap onto lines of their own, not read):
//!   `Epoch 0/9  ━━━━━━━━━━      50/100 0:00:05 • 0:00:05 9.80it/s v_num: 0.000
//!   train_loss: 2.340` (1.5–2.1: `loss: 2.34 v_num: 0`, rounded to 3 places; 2.2+ `.3f`): a `progress` record like
//!   a tqdm bar's (labels `desc`, `n`, `total`; `it/s` and the metrics).
//! - The results of `validate`/`test` (1.6+, `_print_results`): a row of the plain table,
//!   `{:^{w}}` columns (`        test_acc            0.8999999761581421`), or of the Rich table
//!   (`│         test_acc          │    0.8999999761581421     │`), with one dataloader: an
//!   `eval` record of that one metric, when its name is an evaluation's (`test_*`, `val_*`,
//!   `valid_*`, `validation_*`, `test/*`, `val/*`). 1.0–1.5 printed `DATALOADER:0 TEST RESULTS`
//!   and the dict (`{'test_acc': 0.9, 'test_loss': 0.23}`), read as HF's eval dicts (`hf.rs`).
use super::value::{count, is_identifier, name, number};
use super::{hf, tqdm, Label, Record, RecordKind};
use crate::adapters::value::Scan;

const EVAL_PREFIXES: [&str; 6] = ["test_", "test/", "val_", "val/", "valid_", "validation_"];

pub fn parse(line: u64, text: &str) -> Option<Record> {
    let t = text.trim();
    let first = t.chars().next()?;
    if first == '{' {
        return hf::parse(line, t).filter(|r| r.kind == RecordKind::Eval);
    }
    if first == '│' {
        return rich_row(line, t);
    }
    if t.has(" • ") {
        if let Some(r) = rich_bar(line, t) {
            return Some(r);
        }
    }
    if t.has(" [") {
        if let Some(r) = tqdm::parse(line, t) {
            if let Some(Label::Text(desc)) = r.label("desc") {
                if is_lightning_desc(desc) {
                    return Some(r);
                }
            }
            return None;
        }
    }
    plain_row(line, t)
}

/// The descs Lightning's bars print.
fn is_lightning_desc(desc: &str) -> bool {
    if let Some(n) = desc.strip_prefix("Epoch ") {
        return count(n).is_some();
    }
    let base = desc.split(" DataLoader ").next().unwrap_or(desc);
    let dl = desc.len() == base.len() || count(&desc[base.len() + " DataLoader ".len()..]).is_some();
    dl && matches!(
        base,
        "Validation"
            | "Validating"
            | "Validation sanity check"
            | "Sanity Checking"
            | "Testing"
            | "Predicting"
            | "Training"
    )
}

/// The Rich bar's plain text: `desc bar n/total elapsed • remaining rate [name: value ...]`.
fn rich_bar(line: u64, text: &str) -> Option<Record> {
    let (left, right) = text.cut(" • ")?;
    let (rest, elapsed) = last_word(left)?;
    let (head, counts) = last_word(rest)?;
    let head = head.trim_end();
    if !is_rich_clock(elapsed) {
        return None;
    }
    let (n, total) = counts.split_once('/')?;
    let n = count(n)?;
    let total = if total == "--" { None } else { Some(count(total.strip_suffix(".0").unwrap_or(total))?) };
    let bar_len =
        head.chars().rev().take_while(|c| matches!(c, '━' | '╸' | '╺' | '-' | ' ')).map(char::len_utf8).sum::<usize>();
    // Without colours the bar's unfilled part is blank, and a bar without a total all blank.
    let desc = head[..head.len() - bar_len].trim();
    let mut right_tokens = right.split_whitespace();
    if !is_rich_clock(right_tokens.next()?) {
        return None;
    }
    let speed = right_tokens.next()?.strip_suffix("it/s")?;
    let mut r = Record::at(line, RecordKind::Progress);
    if !desc.is_empty() {
        r.labels.push(("desc".into(), Label::Text(desc.to_string())));
    }
    r.labels.push(("n".into(), Label::Int(n as i64)));
    if let Some(t) = total {
        r.labels.push(("total".into(), Label::Int(t as i64)));
    }
    r.metrics.push(("it/s".into(), number(speed)?));
    let rest: Vec<&str> = right_tokens.collect();
    let mut i = 0;
    while i + 1 < rest.len() {
        let Some(key) = rest[i].strip_suffix(':') else { break };
        if let Some(v) = number(rest[i + 1]) {
            r.metrics.push((name(key), v));
        }
        i += 2;
    }
    Some(r)
}

/// `text` without its last whitespace-separated word, and the word.
fn last_word(text: &str) -> Option<(&str, &str)> {
    let t = text.trim_end();
    let at = t.rfind(' ')?;
    Some((&t[..at], &t[at + 1..]))
}

/// Rich's `CustomTimeColumn`: `0:00:05` (a `timedelta`) or `-:--:--`.
fn is_rich_clock(s: &str) -> bool {
    if s == "-:--:--" {
        return true;
    }
    let mut parts = s.rsplitn(3, ':');
    let (sec, min, hours) = (parts.next(), parts.next(), parts.next());
    matches!((sec, min, hours), (Some(s), Some(m), Some(h)) if s.len() == 2 && m.len() == 2 && count(s).is_some() && count(m).is_some() && !h.is_empty())
}

/// A plain results row: `metric` and its one value in centred columns.
fn plain_row(line: u64, text: &str) -> Option<Record> {
    // Its metric is an eval's (`val_loss`, `test_acc`): told before the line is searched.
    if !EVAL_PREFIXES.iter().any(|p| text.starts_with(p)) {
        return None;
    }
    let gap = text.at("  ")?;
    let (metric, value) = (&text[..gap], text[gap..].trim_start());
    if value.contains(char::is_whitespace) {
        return None;
    }
    row(line, metric, value)
}

/// A Rich results row: `│ metric │ value │`.
fn rich_row(line: u64, text: &str) -> Option<Record> {
    let inner = text.strip_prefix('│')?.strip_suffix('│')?;
    let mut cells = inner.split('│');
    let (metric, value) = (cells.next()?.trim(), cells.next()?.trim());
    if cells.next().is_some() {
        return None;
    }
    row(line, metric, value)
}

fn row(line: u64, metric: &str, value: &str) -> Option<Record> {
    if !EVAL_PREFIXES.iter().any(|p| metric.starts_with(p)) || !is_identifier(metric) || hf::configish(metric) {
        return None;
    }
    let v = number(value)?;
    let mut r = Record::at(line, RecordKind::Eval);
    r.metrics.push((name(metric), v));
    Some(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rich_bars_rows_and_lightnings_own_tqdm_bars() {
        let r = parse(1, "Epoch 0/9  ━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━ 50/100 0:00:05 • 0:00:05 9.80it/s v_num: 0.000 train_loss: 2.340").unwrap();
        assert_eq!(r.label("desc"), Some(&Label::Text("Epoch 0/9".into())));
        assert_eq!(r.metrics, vec![("it/s".into(), 9.8), ("v_num".into(), 0.0), ("train_loss".into(), 2.34)]);
        let r =
            parse(1, "Validation ━━━━━━━━━━━━╺━━━━━━━━━━━━━━━━━━━━━━━━━━━ 10/--  0:00:01 • -:--:-- 9.50it/s").unwrap();
        assert_eq!((r.label("total"), r.metrics.len()), (None, 1));
        let r = parse(1, "        test_acc            0.8999999761581421").unwrap();
        assert_eq!((r.kind, r.metrics.clone()), (RecordKind::Eval, vec![("test_acc".into(), 0.8999999761581421)]));
        assert!(parse(1, "│         val_loss          │    0.2345     │").is_some());
        assert!(parse(1, "Epoch 3:  40%|████      | 40/100 [00:04<00:06, 9.9it/s, loss=0.5, v_num=1]").is_some());
        assert!(parse(1, "Map:  40%|████      | 40/100 [00:04<00:06, 9.9it/s]").is_none(), "not Lightning's bar");
        assert!(parse(1, "{'test_acc': 0.9, 'test_loss': 0.23}").is_some());
        assert!(parse(1, "Epoch 2: 10it [00:01,  9.80it/s, loss=2.340, v_num=0]").is_some(), "1.x, no total");
    }

    #[test]
    fn tables_and_banners_that_are_no_results_give_nothing() {
        for t in [
            "       Test metric             DataLoader 0",
            "────────────────────────────────────────────────────────────────────────────────",
            "┃        Test metric        ┃       DataLoader 0        ┃",
            "  | Name  | Type   | Params",
            "0 | model | Linear | 1.2 K ",
            "│ │ The sky is │  blue.       │        0.12 │   0.79 │      0.99 │ dataset_A │ │",
            "        test_acc            0.9      0.8",
            "        accuracy            0.9",
            "val_loss 0.5",
            "val_check_interval:  1.0",
            "  val_check_interval    1.0",
            "Epoch 0, global step 100: 'val_loss' reached 0.12345 (best 0.12345), saving model to '/ckpt/epoch=0-step=100.ckpt' as top 1",
            "Metric val_loss improved. New best score: 0.123",
            "{'loss': 2.1, 'epoch': 0.5}",
        ] {
            assert!(parse(1, t).is_none(), "{t}");
        }
    }
}
