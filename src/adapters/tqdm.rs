//! tqdm bars with a postfix (tqdm `format_meter`; HF Trainer's and Lightning's bars): `desc: pct%|bar| n/total [elapsed<remaining, rate, k=v, ...]`.
//!
//! `Epoch 0:  50%|█████     | 50/100 [00:05<00:05,  9.80it/s, v_num=0, train_loss=2.340]` gives
//! `it/s` = 9.8 and `train_loss` = 2.34, with `desc`, `n` and `total` as labels; a bar without a
//! postfix still gives its rate. The elapsed and remaining times are not metrics.
use super::value::{count, name, number};
use super::{Label, Record, RecordKind};

/// A parsed bar: its desc, n, total, rate and postfix.
pub struct Bar<'a> {
    pub desc: &'a str,
    pub n: u64,
    pub total: Option<u64>,
    pub rate: Option<(&'static str, f64)>,
    pub postfix: Vec<(String, f64)>,
}

pub fn bar(text: &str) -> Option<Bar<'_>> {
    let pct_at = text.find("%|")?;
    let left = text[..pct_at].trim_end();
    let pct_start = left.rfind(|c: char| !(c.is_ascii_digit() || c == '.')).map_or(0, |i| i + 1);
    number(&left[pct_start..])?;
    let desc = left[..pct_start].trim().trim_end_matches(':').trim();
    let after = &text[pct_at + 2..];
    let (_, counts) = after.split_once("| ")?;
    let (ns, bracket) = counts.split_once(" [")?;
    let (n, total) = ns.trim().split_once('/')?;
    let n = count(n)?;
    let total = count(total);
    let inside = bracket.strip_suffix(']')?;
    let mut parts = inside.split(", ");
    let times = parts.next()?;
    if !times.contains('<') {
        return None;
    }
    let mut rate = None;
    let mut postfix = Vec::new();
    for part in parts {
        let part = part.trim();
        if let Some(v) = part.strip_suffix("it/s") {
            rate = number(v).map(|v| ("it/s", v));
        } else if let Some(v) = part.strip_suffix("s/it") {
            rate = number(v).map(|v| ("s/it", v));
        } else if let Some((k, v)) = part.split_once('=') {
            if let Some(v) = number(v) {
                postfix.push((name(k), v));
            }
        }
    }
    Some(Bar { desc, n, total, rate, postfix })
}

pub fn parse(line: u64, text: &str) -> Option<Record> {
    let b = bar(text)?;
    let mut r = Record::at(line, RecordKind::Progress);
    if !b.desc.is_empty() {
        r.labels.push(("desc".into(), Label::Text(b.desc.to_string())));
    }
    r.labels.push(("n".into(), Label::Int(b.n as i64)));
    if let Some(t) = b.total {
        r.labels.push(("total".into(), Label::Int(t as i64)));
    }
    r.metrics.extend(b.rate.map(|(k, v)| (k.to_string(), v)));
    r.metrics.extend(b.postfix);
    (!r.metrics.is_empty()).then_some(r)
}
