//! nanoGPT (`train.py`): `iter N: loss L, time T ms, mfu M%` per step, and `step N: train loss L, val loss V` at each eval.
use super::value::{count, leading_number, name};
use super::{Record, RecordKind};

pub fn parse(line: u64, text: &str) -> Option<Record> {
    let (kind, rest) = if let Some(rest) = text.strip_prefix("iter ") {
        (RecordKind::Step, rest)
    } else if let Some(rest) = text.strip_prefix("step ") {
        (RecordKind::Eval, rest)
    } else {
        return None;
    };
    let (n, rest) = rest.split_once(": ")?;
    let mut r = Record::at(line, kind);
    r.step = Some(count(n)?);
    for field in rest.split(", ") {
        // `loss 4.2345`, `time 123.45ms`, `mfu 12.34%`, `train loss 4.1`: the label, then the number.
        let at = field.rfind(' ')?;
        let (label, printed) = (&field[..at], &field[at + 1..]);
        let (value, unit) = leading_number(printed)?;
        let unit = unit.trim_end_matches('%');
        let label = if unit.is_empty() { name(label) } else { name(&format!("{label} {unit}")) };
        r.metrics.push((label, value));
    }
    r.metrics.iter().any(|(k, _)| k.ends_with("loss")).then_some(r)
}
