//! `flightdeck ckpts RUN [--json] [--verify]`: a run's checkpoints, checked on disk.
use super::EXIT_BAD_INPUT;
use crate::client::Client;
use crate::paths::DbPaths;
use crate::protocol::{Reply, Request};
use crate::store::CheckpointRecord;
use serde_json::{json, Value};

/// Bumped when a field changes meaning or disappears (docs/checkpoints.md).
pub const JSON_VERSION: u32 = 1;

pub async fn ckpts(db: &DbPaths, run: &str, json: bool, verify: bool) -> anyhow::Result<i32> {
    let mut client = Client::connect(db).await?;
    let (id, dir, latest, list) = match client.request(&Request::Checkpoints { run: run.into(), verify }).await? {
        Reply::Checkpoints { run, dir, latest, checkpoints } => (run, dir, latest, checkpoints),
        Reply::Error { message } => {
            eprintln!("flightdeck: {message}");
            return Ok(EXIT_BAD_INPUT);
        }
        other => anyhow::bail!("unexpected reply: {other:?}"),
    };
    let now = crate::ids::unix_ms();
    if json {
        let doc = json!({
            "version": JSON_VERSION,
            "run": id.as_str(),
            "dir": dir,
            "latest": latest,
            "checkpoints": list.iter().map(|c| entry_json(c, latest, now)).collect::<Vec<_>>(),
        });
        println!("{}", serde_json::to_string_pretty(&doc)?);
        return Ok(0);
    }
    println!("run {id}: {} checkpoint(s) in {dir}", list.len());
    if list.is_empty() {
        return Ok(0);
    }
    println!("{:>8} {:>9} {:>10} {:>8} {:>10} {:>10}  VERIFIED", "STEP", "LOSS", "SIZE", "AGE", "BLOCKED", "WRITE");
    // Newest first, as the cockpit lists them (the JSON keeps the server's order, oldest first).
    for c in list.iter().rev() {
        let loss = c.loss.map(|l| format!("{l:.4}")).unwrap_or_else(|| "-".into());
        let verdict = match (&c.problem, c.verified) {
            (_, true) => format!("yes ({})", c.checked),
            (Some(p), false) => format!("NO: {p}"),
            (None, false) => "NO".into(),
        };
        let mark = if latest == Some(c.step) { " (LATEST)" } else { "" };
        // A multi-node run's copies: which nodes hold this step.
        let nodes = if c.nodes.len() > 1 { format!(" on {}", c.nodes.join(", ")) } else { String::new() };
        println!(
            "{:>8} {:>9} {:>10} {:>8} {:>10} {:>10}  {verdict}{mark}{nodes}",
            c.step,
            loss,
            crate::units::bytes(c.bytes),
            age(c.saved_ms, now),
            if c.saved_ms > 0 { format!("{:.1} ms", c.blocking_ms) } else { "-".into() },
            if c.saved_ms > 0 { format!("{:.0} ms", c.write_ms) } else { "-".into() },
        );
    }
    Ok(0)
}

fn entry_json(c: &CheckpointRecord, latest: Option<u64>, now: u64) -> Value {
    json!({
        "step": c.step,
        "path": c.path,
        "bytes": c.bytes,
        "loss": c.loss,
        "saved_ms": (c.saved_ms > 0).then_some(c.saved_ms),
        "age_s": (c.saved_ms > 0).then(|| now.saturating_sub(c.saved_ms) as f64 / 1000.0),
        "blocking_ms": c.blocking_ms,
        "write_ms": c.write_ms,
        "verified": c.verified,
        "checked": c.checked,
        "problem": c.problem,
        "latest": latest == Some(c.step),
        "nodes": c.nodes,
    })
}

fn age(saved_ms: u64, now: u64) -> String {
    if saved_ms == 0 {
        return "-".into();
    }
    let s = now.saturating_sub(saved_ms) / 1000;
    match s {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s if s < 172_800 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}
