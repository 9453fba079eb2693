//! A record as `parse-log` prints it (`docs/json.md`): NaN and infinities as strings, `kind` absent for a training step.
use super::{Label, Record, RecordKind};
use serde_json::{json, Map, Value};

pub fn to_json(r: &Record) -> Value {
    let number = |v: f64| {
        if v.is_nan() {
            json!("nan")
        } else if v.is_infinite() {
            json!(if v > 0.0 { "inf" } else { "-inf" })
        } else {
            json!(v)
        }
    };
    let metrics: Map<String, Value> = r.metrics.iter().map(|(k, v)| (k.clone(), number(*v))).collect();
    let labels: Map<String, Value> = r
        .labels
        .iter()
        .map(|(k, v)| {
            let v = match v {
                Label::Int(i) => json!(i),
                Label::Text(t) => json!(t),
            };
            (k.clone(), v)
        })
        .collect();
    let mut out = Map::new();
    out.insert("line".into(), json!(r.line));
    out.insert("step".into(), json!(r.step));
    out.insert("metrics".into(), Value::Object(metrics));
    if r.kind != RecordKind::Step {
        out.insert("kind".into(), serde_json::to_value(r.kind).unwrap_or(Value::Null));
    }
    out.insert("labels".into(), Value::Object(labels));
    if let Some(end) = r.end_line {
        out.insert("end_line".into(), json!(end));
    }
    Value::Object(out)
}
