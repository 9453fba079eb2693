//! tqdm bars (tqdm `std.py` `format_meter`, 4.0 → 4.67; HF Trainer's, Lightning's, datasets' bars): `desc: pct%|bar| n/total [elapsed<remaining, rate, k=v, ...]` and its other shapes.
//!
//! Every shape `format_meter` prints since 4.0:
//! - a total: `{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining},
//!   {rate_fmt}{postfix}]` (`Epoch 0:  50%|█████     | 50/100 [00:05<00:05,  9.80it/s, v_num=0,
//!   train_loss=2.340]`); before 4.16 the desc was printed as given, without the `: `;
//! - `ncols=0` (no room for a bar: Colab, SageMaker): `Epoch 0:  50% 1/2 [00:00<00:00,  6.54it/s]`;
//! - a `bar_format` without a total (Lightning's `BAR_FORMAT` on an iterable):
//!   `Epoch 0: |          | 10/? [00:01<?, 9.80it/s, v_num=0]`;
//! - no total: `{desc}: {n_fmt}{unit} [{elapsed}, {rate_fmt}{postfix}]`
//!   (`Map: 1000 examples [00:00, 5000.00 examples/s]`, `10it [00:01,  9.80it/s]`).
//!
//! The rate is `{rate:5.2f}{unit}/s`, `{1/rate:5.2f}s/{unit}` when slower than one a second,
//! `?{unit}/s` before the first update, and with `unit_scale` an SI prefix (`1.23kit/s`,
//! `98.5MB/s`, always by 1000): it gives `it/s` (or `s/it`, `B/s`, `examples/s`, `tokens/s`: the
//! unit as printed) with the prefix applied; a custom `bar_format` may leave it out (NeMo's bars).
//! `n` and `total` are labels when printed whole (`1.00k/10.0k` are not). The postfix's
//! `key=value` pairs with a numeric value are metrics (Lightning pads them: `2.340`; tqdm's
//! `format_num`: `1e-5`). Elapsed and remaining times are not metrics. A bar is `progress`: any
//! bar (a training loop's, a `Map:` or `Loading checkpoint shards` bar) reads the same; a bar with
//! no rate and no postfix number yet (`0%| | 0/10 [00:00<?, ?it/s]`) gives nothing.
use super::value::{count, name, number};
use super::{Label, Record, RecordKind};
use crate::adapters::value::Scan;

/// A parsed bar: its desc, n, total, rate and postfix.
pub struct Bar<'a> {
    pub desc: &'a str,
    /// The count printed (with `unit_scale`, `1.00k` is 1000 and `scaled` is set).
    pub n: u64,
    pub total: Option<u64>,
    /// `n`/`total` were printed with an SI prefix, so are approximate.
    pub scaled: bool,
    /// `it/s` (or `s/it`, `B/s`, ...) and its value, the SI prefix applied.
    pub rate: Option<(String, f64)>,
    pub postfix: Vec<(String, f64)>,
    /// Where the bar's closing `]` ends: what follows is another message glued to it.
    pub end: usize,
}

/// The bar at the start of `text` (anything may follow its closing `]`).
pub fn bar(text: &str) -> Option<Bar<'_>> {
    let (open, inside_start, close) = stats_bracket(text)?;
    let inside = &text[inside_start..close];
    let left = text[..open].trim_end();
    let (times, rest) = inside.cut(", ").map_or((inside, ""), |(t, r)| (t, r));
    let total_known = times.contains('<');
    let (desc, n, total, scaled) = if total_known { left_with_total(left)? } else { left_without_total(left)? };
    let mut parts = split_postfix(rest).into_iter().peekable();
    // A custom `bar_format` may leave the rate out (NeMo's `[{elapsed}<{remaining}, {postfix}]`).
    let rate = match parts.peek().map(|p| parse_rate(p)) {
        Some(Some(rate)) => {
            parts.next();
            rate
        }
        _ if parts.peek().is_some_and(|p| p.contains('=')) => None,
        _ => return None,
    };
    let postfix = parts
        .filter_map(|p| p.split_once('='))
        .filter_map(|(k, v)| Some((k.trim(), number(v)?)))
        .filter(|(k, _)| !k.is_empty())
        .map(|(k, v)| (name(k), v))
        .collect();
    Some(Bar { desc, n, total, scaled, rate, postfix, end: close + 1 })
}

pub fn parse(line: u64, text: &str) -> Option<Record> {
    let b = bar(text)?;
    let mut r = Record::at(line, RecordKind::Progress);
    if !b.desc.is_empty() {
        r.labels.push(("desc".into(), Label::Text(b.desc.to_string())));
    }
    if !b.scaled {
        r.labels.push(("n".into(), Label::Int(b.n as i64)));
        if let Some(t) = b.total {
            r.labels.push(("total".into(), Label::Int(t as i64)));
        }
    }
    r.metrics.extend(b.rate);
    r.metrics.extend(b.postfix);
    (!r.metrics.is_empty()).then_some(r)
}

/// The `[elapsed<remaining, ...]` (or `[elapsed, ...]`) bracket: the offset of its ` [`, where its
/// inside starts and its closing `]` (brackets inside the postfix nest).
fn stats_bracket(text: &str) -> Option<(usize, usize, usize)> {
    let mut from = 0;
    while let Some(at) = text[from..].at(" [").map(|i| from + i) {
        let start = at + 2;
        if let Some(after) = clock(&text[start..]) {
            let tail = &text[start + after..];
            let ok = tail.starts_with(", ") || tail.starts_with('<') && clock_or_unknown(&tail[1..]).is_some();
            if ok {
                let mut depth = 0i32;
                for (i, c) in text[start..].char_indices() {
                    match c {
                        '[' => depth += 1,
                        ']' if depth == 0 => return Some((at, start, start + i)),
                        ']' => depth -= 1,
                        _ => {}
                    }
                }
                return None;
            }
        }
        from = start;
    }
    None
}

/// `MM:SS` or `H:MM:SS` (tqdm's `format_interval`, a `-` when negative) at the start: its length.
fn clock(s: &str) -> Option<usize> {
    let b = s.as_bytes();
    let mut i = usize::from(b.first() == Some(&b'-'));
    let lead = b[i..].iter().take_while(|c| c.is_ascii_digit()).count();
    if lead == 0 {
        return None;
    }
    i += lead;
    let mut groups = 0;
    while groups < 2 && b.get(i) == Some(&b':') && b.get(i + 1..i + 3).is_some_and(|d| d.iter().all(u8::is_ascii_digit))
    {
        i += 3;
        groups += 1;
    }
    (groups >= 1).then_some(i)
}

fn clock_or_unknown(s: &str) -> Option<usize> {
    if s.starts_with('?') {
        Some(1)
    } else {
        clock(s)
    }
}

/// What precedes the stats when the total is known: `desc: pct%|bar| n/total`,
/// `desc: pct% n/total` (`ncols=0`) or `desc: |bar| n/?` (a `bar_format` without a total).
fn left_with_total(left: &str) -> Option<(&str, u64, Option<u64>, bool)> {
    let space = left.rfind(' ')?;
    let (n, total) = left[space + 1..].split_once('/')?;
    let (n, n_scaled) = amount(n)?;
    let (total, total_scaled) = if total == "?" { (None, false) } else { amount(total).map(|(t, s)| (Some(t), s))? };
    let head = left[..space].trim_end();
    let before = if let Some(inner) = head.strip_suffix('|') {
        let open = inner.rfind('|')?;
        if !inner[open + 1..].chars().all(is_bar_char) {
            return None;
        }
        &inner[..open]
    } else if head.ends_with('%') {
        head
    } else {
        return None;
    };
    let desc = match before.strip_suffix('%') {
        Some(p) => {
            let start = p.rfind(|c: char| !(c.is_ascii_digit() || c == '.')).map_or(0, |i| i + 1);
            number(&p[start..])?;
            &p[..start]
        }
        // No percentage: only a `bar_format` bar without a total prints `desc: |bar|`.
        None if total.is_none() => before,
        None => return None,
    };
    Some((clean_desc(desc), n, total, n_scaled || total_scaled))
}

/// What precedes the stats without a total: `desc: {n_fmt}{unit}` (`Map: 1000 examples`, `10it`,
/// before 4.19 `batches1200it`).
fn left_without_total(left: &str) -> Option<(&str, u64, Option<u64>, bool)> {
    let mut unit_len = left.bytes().rev().take_while(|b| b.is_ascii_alphabetic() || *b == b'_').count();
    // `1.23kit`: the unit's first letter is the count's SI prefix when a fraction precedes it.
    let unit_start = left.len() - unit_len;
    if unit_len > 1
        && si_scale(left[unit_start..].chars().next()?).is_some()
        && left[..unit_start].ends_with(|c: char| c.is_ascii_digit())
        && left[..unit_start].contains('.')
    {
        unit_len -= 1;
    }
    let mut rest = &left[..left.len() - unit_len];
    rest = rest.strip_suffix(' ').unwrap_or(rest);
    let num_len = rest
        .bytes()
        .rev()
        .take_while(|b| {
            b.is_ascii_digit() || matches!(b, b'.' | b'k' | b'K' | b'M' | b'G' | b'T' | b'P' | b'E' | b'Z' | b'Y')
        })
        .count();
    let (head, n) = rest.split_at(rest.len() - num_len);
    let (n, scaled) = amount(n)?;
    // Before 4.19 the desc was glued to the count (`batches1200it`).
    Some((clean_desc(head), n, None, scaled))
}

fn clean_desc(desc: &str) -> &str {
    let d = desc.trim();
    d.strip_suffix(':').unwrap_or(d).trim()
}

/// A count as `format_meter` prints it: `50`, or with `unit_scale` `1.00k`, `548M`.
fn amount(s: &str) -> Option<(u64, bool)> {
    if let Some(n) = count(s) {
        return Some((n, false));
    }
    let (digits, scale) = si(s)?;
    let v = digits.parse::<f64>().ok()?;
    (v.is_finite() && v >= 0.0).then(|| ((v * scale).round() as u64, true))
}

/// `1.23k` → ("1.23", 1000): a number and its SI prefix (tqdm's `format_sizeof`).
fn si(s: &str) -> Option<(&str, f64)> {
    let last = s.chars().last()?;
    let scale = si_scale(last)?;
    let digits = &s[..s.len() - 1];
    (!digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit() || b == b'.')).then_some((digits, scale))
}

fn si_scale(c: char) -> Option<f64> {
    let power = match c {
        // Before 4.20 `format_sizeof` printed a capital K.
        'k' | 'K' => 1,
        'M' => 2,
        'G' => 3,
        'T' => 4,
        'P' => 5,
        'E' => 6,
        'Z' => 7,
        'Y' => 8,
        _ => return None,
    };
    Some(1000f64.powi(power))
}

/// The characters tqdm draws a bar with (UTF blocks, ASCII `#` and digits, blanks) or a
/// custom `ascii=` string's: anything but the bar's own `|`.
fn is_bar_char(c: char) -> bool {
    c != '|'
}

/// The stats after the times, split at `, ` outside brackets.
fn split_postfix(s: &str) -> Vec<&str> {
    let (mut out, mut depth, mut start) = (Vec::new(), 0i32, 0);
    let b = s.as_bytes();
    for i in 0..b.len() {
        match b[i] {
            b'[' | b'(' | b'{' => depth += 1,
            b']' | b')' | b'}' => depth -= 1,
            b',' if depth == 0 && b.get(i + 1) == Some(&b' ') => {
                out.push(&s[start..i]);
                start = i + 2;
            }
            _ => {}
        }
    }
    if start < s.len() || !s.is_empty() {
        out.push(&s[start..]);
    }
    out
}

/// `9.80it/s`, `12.03s/it`, `?it/s`, `1.23kit/s`, `98.5MB/s`, `5000.00 examples/s`: the rate's
/// name and value (`Some(None)`: not known yet); `None` when the token is no rate at all.
fn parse_rate(tok: &str) -> Option<Option<(String, f64)>> {
    let tok = tok.trim();
    if let Some(unit) = tok.strip_prefix('?') {
        let unit = unit.trim_start();
        return (unit.ends_with("/s") || unit.starts_with("s/")).then_some(None);
    }
    let len = tok.bytes().take_while(|b| b.is_ascii_digit() || *b == b'.').count();
    let value: f64 = tok[..len].parse().ok()?;
    let mut rest = &tok[len..];
    let mut scale = 1.0;
    if let Some(c) = rest.chars().next() {
        if let Some(s) = si_scale(c) {
            let after = &rest[1..];
            if after.starts_with("s/") || after.ends_with("/s") && after.len() > 2 {
                scale = s;
                rest = after;
            }
        }
    }
    let rest = rest.trim_start();
    let (unit, inverse) =
        if let Some(u) = rest.strip_prefix("s/") { (u, true) } else { (rest.strip_suffix("/s")?, false) };
    let unit = unit.trim();
    if unit.is_empty() || !unit.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
        return None;
    }
    let name = if inverse { format!("s/{unit}") } else { format!("{unit}/s") };
    Some(Some((name, value * scale)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// desc, n, total (unless scaled), rate and postfix.
    type Read = (String, Option<u64>, Option<u64>, Vec<(String, f64)>);

    fn read(text: &str) -> Option<Read> {
        let b = bar(text)?;
        let n = (!b.scaled).then_some(b.n);
        let total = if b.scaled { None } else { b.total };
        Some((b.desc.to_string(), n, total, b.rate.into_iter().chain(b.postfix).collect()))
    }

    fn m(pairs: &[(&str, f64)]) -> Vec<(String, f64)> {
        pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    }

    #[test]
    fn every_shape_format_meter_prints() {
        assert_eq!(
            read("Epoch 0:  50%|█████     | 50/100 [00:05<00:05,  9.80it/s, v_num=0, train_loss=2.340]"),
            Some(("Epoch 0".into(), Some(50), Some(100), m(&[("it/s", 9.8), ("v_num", 0.0), ("train_loss", 2.34)])))
        );
        // ncols=0.
        assert_eq!(
            read("Epoch 0:  50% 1/2 [00:00<00:00,  6.54it/s, loss=2.29, v_num=0]"),
            Some(("Epoch 0".into(), Some(1), Some(2), m(&[("it/s", 6.54), ("loss", 2.29), ("v_num", 0.0)])))
        );
        // Lightning's bar_format without a total.
        assert_eq!(
            read("Epoch 0: |          | 10/? [00:01<?, 9.80it/s, v_num=0]"),
            Some(("Epoch 0".into(), Some(10), None, m(&[("it/s", 9.8), ("v_num", 0.0)])))
        );
        // No total.
        assert_eq!(
            read("Map: 1000 examples [00:00, 5000.00 examples/s]"),
            Some(("Map".into(), Some(1000), None, m(&[("examples/s", 5000.0)])))
        );
        assert_eq!(read("10it [00:01,  9.80it/s]"), Some(("".into(), Some(10), None, m(&[("it/s", 9.8)]))));
        // unit_scale: n and total approximate, the rate's prefix applied.
        assert_eq!(
            read("model.safetensors: 100%|██████████| 548M/548M [00:05<00:00, 98.5MB/s]"),
            Some(("model.safetensors".into(), None, None, m(&[("B/s", 98_500_000.0)])))
        );
        assert_eq!(read(" 10%|#         | 1.00k/10.0k [00:01<00:09, 1.23kit/s]").unwrap().3, m(&[("it/s", 1230.0)]));
        // Slower than one a second; unknown.
        assert_eq!(
            read("Validation DataLoader 0:   5%|▌         | 1/20 [00:12<03:48, 12.03s/it]").unwrap().3,
            m(&[("s/it", 12.03)])
        );
        assert_eq!(read("  0%|          | 0/10 [00:00<?, ?it/s]").unwrap().3, vec![]);
        // Old tqdm (before 4.19) printed the desc as given.
        assert_eq!(read("Iteration 50%|#####     | 50/100 [00:05<00:05,  9.80it/s]").unwrap().0, "Iteration");
        // Something glued after the bar.
        let b = bar("100%|██████████| 4/4 [00:02<00:00,  1.95it/s][INFO|trainer.py:1341] 2021-05-20 20:16:41,214 >>")
            .unwrap();
        assert_eq!(b.end, "100%|██████████| 4/4 [00:02<00:00,  1.95it/s]".len());
        // No rate (NeMo 1.21+'s `MegatronProgressBar`).
        assert_eq!(
            read("Epoch 0: :   0%|          | 10/301500 [00:06<52:45:38, v_num=0-56, reduced_train_loss=10.60]")
                .unwrap()
                .3,
            m(&[("reduced_train_loss", 10.6)])
        );
        // Hours in the times.
        assert_eq!(read("  8%|▊         | 1999/24128 [1:52:09<20:27:23,  3.33s/it]").unwrap().3, m(&[("s/it", 3.33)]));
    }

    #[test]
    fn what_only_looks_like_a_bar_is_none() {
        for t in [
            "Loading: 100%|██████████| 2/2",
            "lr [0.001, 0.002] at 50%",
            "Epoch 00000: val_loss reached 0.67374 (best 0.67374), saving model to ../checkpoints/epoch=0.ckpt as top 1████▍  | 137/139 [00:17<00:00,  9.99it/s]",
            "results [12:30, done]",
            "step 5 [00:01<00:02]",
        ] {
            assert!(parse(1, t).is_none(), "{t}");
        }
    }
}
