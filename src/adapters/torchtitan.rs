//! torchtitan (`torchtitan/components/metrics.py` `MetricsProcessor.log`): `step: N  loss: L  grad_norm: G  memory: 9.46GiB(64.99%)  tps: 193,831  tflops: T  mfu: M%`, coloured.
use super::value::{count, name, with_percent};
use super::{Record, RecordKind};

pub fn parse(line: u64, text: &str) -> Option<Record> {
    if !text.starts_with("step:") {
        return None;
    }
    // `key: value` pairs, values padded to their widths: keys end with `:`, each is followed by
    // exactly one value. verl's `step:N - ...` and prose (`step: 10 of 1000 ...`) fail that.
    let mut tokens = text.split_whitespace();
    let mut r = Record::at(line, RecordKind::Step);
    while let Some(key) = tokens.next() {
        let key = key.strip_suffix(':')?;
        let v = tokens.next()?;
        if key == "step" {
            r.step = Some(count(v)?);
            continue;
        }
        let (value, pct) = with_percent(v)?;
        let k = name(key);
        if let Some(pct) = pct {
            r.metrics.push((format!("{k}_pct"), pct));
        }
        r.metrics.push((k, value));
    }
    (r.step.is_some() && r.metrics.iter().any(|(k, _)| k == "loss")).then_some(r)
}
