//! The stable JSON shapes of `runs --json` and `show --json` (documented in docs/json.md).
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
    })
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
