//! Records the telemetry fixtures the cockpit's snapshot tests replay (tests/fixtures/telemetry).
//! Not part of the suite: re-record with
//! `cargo test --release --test ui_record_fixtures -- --ignored`, then review the snapshots.
mod common;

use common::{recipe, Db};
use flightdeck::client::Client;
use flightdeck::paths::DbPaths;
use flightdeck::protocol::{AgentFrame, Reply, Request};
use std::path::PathBuf;

fn out_dir() -> PathBuf {
    common::repo().join("tests/fixtures/telemetry")
}

/// Launches a headless run, opens it through the server once it reached `open_at` steps, and
/// records the snapshot and every frame batch after it until the run ends.
fn record(db: &Db, name: &str, sets: &[&str], open_at: u64) -> (serde_json::Value, Vec<AgentFrame>) {
    record_recipe(db, "tiny-gpt.toml", name, sets, open_at)
}

/// `record` for any shipped recipe.
fn record_recipe(db: &Db, file: &str, name: &str, sets: &[&str], open_at: u64) -> (serde_json::Value, Vec<AgentFrame>) {
    let r = recipe(file);
    let mut args = vec!["run", r.to_str().unwrap(), "--headless", "--ranks-per-node", "2", "--name", name];
    for s in sets {
        args.extend(["--set", s]);
    }
    let mut child = db.spawn(&args);
    let mut lines = common::stdout_lines(&mut child);
    let first = common::read_until(&mut lines, |l| l.starts_with("run "));
    let id = first.split_whitespace().nth(1).unwrap().trim_end_matches(':').to_string();
    common::read_until(&mut lines, |l| common::progress_step(l).is_some_and(|s| s >= open_at));
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let (snap, frames) = rt.block_on(async {
        let mut c = Client::connect(&DbPaths::new(db.path().to_path_buf())).await.unwrap();
        c.send(&Request::Open { run: id.clone() }).await.unwrap();
        let mut snap = None;
        let mut frames = Vec::new();
        while let Some(reply) = c.next().await.unwrap() {
            match reply {
                Reply::Snapshot(s) => snap = Some(serde_json::to_value(&*s).unwrap()),
                Reply::Frames { frames: f, .. } => frames.extend(f),
                Reply::Ended { .. } => break,
                other => panic!("unexpected {other:?}"),
            }
        }
        (snap.expect("a snapshot"), frames)
    });
    for l in lines.by_ref() {
        let _ = l;
    }
    assert!(child.wait().unwrap().success());
    (snap, frames)
}

#[test]
#[ignore = "records fixtures; run by hand"]
fn record_telemetry_fixtures() {
    let db = Db::new();
    let (snap, frames) = record(&db, "tiny-gpt", &["train.steps=40"], 12);
    let (snap_b, _) = record(&db, "tiny-gpt-lr1e-3", &["train.steps=40", "train.lr=1e-3"], 40);
    let dir = out_dir();
    std::fs::create_dir_all(&dir).unwrap();
    let write = |name: &str, v: &serde_json::Value| {
        std::fs::write(dir.join(name), serde_json::to_string(v).unwrap() + "\n").unwrap();
    };
    write("open-snapshot.json", &snap);
    write("open-frames.json", &serde_json::to_value(&frames).unwrap());
    write("finished-snapshot.json", &snap_b);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let mut c = Client::connect(&DbPaths::new(db.path().to_path_buf())).await.unwrap();
        let Reply::Runs { runs } = c.request(&Request::ListRuns).await.unwrap() else { panic!("runs") };
        write("runs.json", &serde_json::to_value(&runs).unwrap());
        let mut compare = Vec::new();
        for r in &runs {
            let req = Request::Metrics { run: r.id.to_string(), key: Some("loss".into()), rank: None };
            let Reply::Metrics { points } = c.request(&req).await.unwrap() else { panic!("metrics") };
            compare.push((r.id.clone(), points));
        }
        write("compare-points.json", &serde_json::to_value(&compare).unwrap());
    });
    db.finish();
}

/// The `rl` layout's fixture: a short GRPO run from a short tiny-gpt run, in a database of its
/// own (the other fixtures' run list stays as it was), opened once it has finished.
#[test]
#[ignore = "records fixtures; run by hand"]
fn record_grpo_fixture() {
    let db = Db::new();
    record(&db, "tiny-gpt", &["train.steps=60", "checkpoint.every=60"], 60);
    let sets = ["init.from=tiny-gpt", "train.steps=30", "eval.every=10", "train.batch_per_rank=4"];
    let (snap, _) = record_recipe(&db, "grpo-arith.toml", "grpo-arith", &sets, 30);
    let path = out_dir().join("grpo-snapshot.json");
    std::fs::write(path, serde_json::to_string(&snap).unwrap() + "\n").unwrap();
    db.finish();
}
