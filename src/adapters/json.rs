//! A record as `parse-log` prints it (`docs/json.md`): NaN and infinities as strings, `kind` absent for a training step.
use super::{Label, Record, RecordKind};
use serde_json::Value;

pub fn to_json(r: &Record) -> Value {
    serde_json::to_value(Written(r)).unwrap_or(Value::Null)
}

/// The record written straight to `out` without building a `Value` (what `parse-log` does a
/// record at a time): keys sorted, a repeated metric or label name keeping its last value.
pub fn write(out: &mut impl std::io::Write, r: &Record) -> serde_json::Result<()> {
    serde_json::to_writer(out, &Written(r))
}

struct Written<'a>(&'a Record);

impl serde::Serialize for Written<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let r = self.0;
        let mut m = s.serialize_map(None)?;
        if let Some(end) = r.end_line {
            m.serialize_entry("end_line", &end)?;
        }
        if r.kind != RecordKind::Step {
            m.serialize_entry("kind", &r.kind)?;
        }
        m.serialize_entry("labels", &Sorted(&r.labels))?;
        m.serialize_entry("line", &r.line)?;
        m.serialize_entry("metrics", &Sorted(&r.metrics))?;
        m.serialize_entry("step", &r.step)?;
        m.end()
    }
}

/// Pairs as a JSON object sorted by name, the last of a repeated name kept (a map's order).
struct Sorted<'a, V>(&'a [(String, V)]);

impl<V: Entry> serde::Serialize for Sorted<'_, V> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut order: Vec<usize> = (0..self.0.len()).collect();
        order.sort_by(|a, b| self.0[*a].0.cmp(&self.0[*b].0).then(a.cmp(b)));
        let mut m = s.serialize_map(None)?;
        for (i, at) in order.iter().enumerate() {
            let (name, value) = &self.0[*at];
            if order.get(i + 1).is_some_and(|next| self.0[*next].0 == *name) {
                continue; // a later one of the same name wins
            }
            m.serialize_key(name)?;
            value.put(&mut m)?;
        }
        m.end()
    }
}

/// A metric's or label's value as `to_json` writes it.
trait Entry {
    fn put<M: serde::ser::SerializeMap>(&self, m: &mut M) -> Result<(), M::Error>;
}

impl Entry for f64 {
    fn put<M: serde::ser::SerializeMap>(&self, m: &mut M) -> Result<(), M::Error> {
        let v = *self;
        if v.is_nan() {
            m.serialize_value("nan")
        } else if v.is_infinite() {
            m.serialize_value(if v > 0.0 { "inf" } else { "-inf" })
        } else {
            m.serialize_value(&v)
        }
    }
}

impl Entry for Label {
    fn put<M: serde::ser::SerializeMap>(&self, m: &mut M) -> Result<(), M::Error> {
        match self {
            Label::Int(i) => m.serialize_value(i),
            Label::Text(t) => m.serialize_value(t),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn written_records_are_to_json_byte_for_byte() {
        let mut r = Record::at(7, RecordKind::Event);
        r.end_line = Some(9);
        r.step = Some(3);
        r.metrics = vec![("z".into(), 1.5), ("a".into(), f64::NAN), ("z".into(), 2.0), ("m".into(), f64::NEG_INFINITY)];
        r.labels = vec![("rank".into(), Label::Int(3)), ("event".into(), Label::Text("nccl \"x\"".into()))];
        let mut step = Record::at(1, RecordKind::Step);
        step.metrics = vec![("loss".into(), 0.1 + 0.2), ("n".into(), 1e21)];
        for r in [r, step, Record::at(2, RecordKind::Info)] {
            let mut out = Vec::new();
            write(&mut out, &r).expect("written");
            assert_eq!(String::from_utf8(out).expect("utf-8"), to_json(&r).to_string());
        }
    }
}
