//! verl (`verl/utils/logger/aggregate_logger.py` `concat_dict_to_str`, 0.9): the driver's console line per step, behind Ray's prefix.
//!
//! `(TaskRunner pid=4242) step:12 - actor/pg_loss:-0.0123 - critic/score/mean:0.5 -
//! timing_s/step:12.3 - response_length/mean:245.5` (the prefix goes in `clean.rs`); values
//! are `pprint.pformat` of numbers, numpy 2's `np.float64(0.5)` included.
use super::value::{count, number};
use super::{Record, RecordKind};

pub fn parse(line: u64, text: &str) -> Option<Record> {
    let rest = text.strip_prefix("step:")?;
    let mut parts = rest.split(" - ");
    let step = count(parts.next()?)?;
    let mut r = Record::at(line, RecordKind::Step);
    r.step = Some(step);
    for part in parts {
        let (k, v) = part.rsplit_once(':')?;
        r.metrics.push((k.trim().to_string(), number(v)?));
    }
    (!r.metrics.is_empty()).then_some(r)
}
