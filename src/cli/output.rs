//! The stable JSON shapes of `runs --json`, `show --json` and `queue --json` (documented in docs/json.md).
use crate::store::{RunDetail, RunRecord};
use serde_json::{json, Value};

/// Bumped when a field changes meaning or disappears; new fields may appear without a bump.
pub const JSON_VERSION: u32 = 1;

pub fn run_json(r: &RunRecord) -> Value {
    let duration_s = r.ended_ms.unwrap_or_else(crate::ids::unix_ms).saturating_sub(r.created_ms) as f64 / 1000.0;
    json!({
        "id": r.id.as_str(),
        "name": r.name,
        "recipe": r.recipe_name,
        "recipe_path": r.recipe_path,
        "status": r.status.name(),
        "reason": r.reason,
        "world_size": r.world_size,
        "hosts": r.hosts,
        "steps": r.step,
        "steps_planned": r.steps_planned,
        "last_loss": r.last_loss,
        "created_ms": r.created_ms,
        "ended_ms": r.ended_ms,
        "duration_s": duration_s,
        "parent": r.parent.as_ref().map(|p| p.as_str()),
        "resumed_from": r.resumed_from.as_ref().map(|p| json!({"step": p.step, "path": p.path})),
        "init_from": r.init_from.as_ref().map(|i| json!({"run": i.run.as_ref().map(|r| r.as_str()), "step": i.step, "path": i.path})),
        "restart": r.restart,
        // Points count from 1 here, as `flightdeck queue` shows them.
        "sweep": r.sweep.as_ref().map(|p| json!({"sweep": p.sweep, "point": p.point + 1})),
    })
}

/// `queue --json`: each sweep with its points (numbered from 1), their values and states.
pub fn queue_json(sweeps: &[crate::record::SweepStatus]) -> Value {
    let sweeps: Vec<Value> = sweeps
        .iter()
        .map(|s| {
            let points: Vec<Value> = s
                .points
                .iter()
                .zip(&s.sweep.points)
                .enumerate()
                .map(|(i, (p, spec))| {
                    let (run, reason) = match &p.state {
                        crate::record::PointState::Run { run, .. } => (Some(run.as_str()), None),
                        crate::record::PointState::LaunchFailed { reason } => (None, Some(reason.as_str())),
                        _ => (None, None),
                    };
                    let values: serde_json::Map<String, Value> =
                        s.sweep.keys.iter().zip(&spec.values).map(|(k, v)| (k.clone(), toml_json(v))).collect();
                    json!({
                        "point": i + 1,
                        "values": values,
                        "state": p.state.word(),
                        "restarting": p.restarting,
                        "run": run,
                        "run_name": spec.run_name,
                        "reason": reason,
                        "world_size": spec.world_size,
                        "step": p.step,
                        "steps_planned": p.steps,
                        "last_loss": p.last_loss,
                        "attempts": p.attempts,
                    })
                })
                .collect();
            json!({
                "id": s.sweep.id,
                "name": s.sweep.name,
                "recipe_path": s.sweep.recipe_path,
                "created_ms": s.sweep.created_ms,
                "keys": s.sweep.keys,
                "max_parallel": s.sweep.max_parallel,
                "max_ranks": s.sweep.max_ranks,
                "points": points,
            })
        })
        .collect();
    json!({ "version": JSON_VERSION, "sweeps": sweeps })
}

/// A swept value (TOML text) as JSON: numbers and booleans as themselves, the rest as text.
fn toml_json(text: &str) -> Value {
    use serde::Deserialize;
    match toml::Value::deserialize(toml::de::ValueDeserializer::new(text)) {
        Ok(v) => serde_json::to_value(v).unwrap_or_else(|_| Value::String(text.to_string())),
        Err(_) => Value::String(text.to_string()),
    }
}

pub fn runs_json(runs: &[RunRecord]) -> Value {
    json!({ "version": JSON_VERSION, "runs": runs.iter().map(run_json).collect::<Vec<_>>() })
}

pub fn show_json(d: &RunDetail) -> Value {
    let recipe: Value = serde_json::from_str(&d.run.recipe_json).unwrap_or(Value::Null);
    json!({
        "version": JSON_VERSION,
        "run": run_json(&d.run),
        "recipe": recipe,
        "ranks": d.ranks.iter().map(|r| json!({
            "rank": r.rank,
            "host": r.host,
            "pid": r.pid,
            "step": r.step,
            "phase": r.phase.map(|p| p.name()),
            "last_loss": r.last_loss,
            "cpu_pct": r.cpu_pct,
            "rss_bytes": r.rss_bytes,
            "exit": r.exit.as_ref().map(|e| match e {
                crate::protocol::ExitStatus::Code(c) => json!({"code": c}),
                crate::protocol::ExitStatus::Signal(s) => json!({"signal": s, "signal_name": crate::protocol::signal_name(*s)}),
            }),
        })).collect::<Vec<_>>(),
        "events": d.events.iter().map(|e| json!({
            "t_ms": e.t_ms, "kind": e.kind, "rank": e.rank, "text": e.text,
        })).collect::<Vec<_>>(),
        "metrics": d.metrics,
        "summary": d.summary,
        "verdicts": d.verdicts.iter().map(|v| json!({
            "kind": v.verdict.kind.name(),
            "summary": v.verdict.summary,
            "culprits": v.verdict.culprits,
            "collective": v.verdict.collective,
            "waiting": v.verdict.waiting,
            "since_ms": v.verdict.since_ms,
            "detected_ms": v.verdict.detected_ms,
            "duration_ms": v.verdict.duration_ms(),
            "report_path": v.report_path,
        })).collect::<Vec<_>>(),
        "attempts": d.attempts,
        "goodput": d.goodput,
    })
}
