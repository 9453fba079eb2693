//! `flightdeck import` of TensorBoard event directories: what PyTorch's own writer wrote is what the history holds.
mod common;
use common::*;

/// A TensorBoard directory as PyTorch's own `SummaryWriter` writes it: two ranks' subdirectories,
/// old-style (`simple_value`) and new-style (tensor) scalars.
const WRITE_EVENTS: &str = r#"import sys
from torch.utils.tensorboard import SummaryWriter
root = sys.argv[1]
for rank in range(2):
    w = SummaryWriter(f"{root}/rank{rank}")
    for step in range(1, 21):
        w.add_scalar("train/loss", 4.0 - step * 0.125 + rank, step)
        w.add_scalar("train/lr", 1e-3 * step, step, new_style=True)
    w.close()
"#;

#[test]
fn an_imported_tensorboard_directory_has_the_scalars_pytorchs_summary_writer_wrote() {
    let Some(python) = venv_python() else {
        skipped(file!(), "FD_VENV is not set (make test sets it)");
        return;
    };
    let ok = std::process::Command::new(&python)
        .args(["-c", "import tensorboard"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        skipped(file!(), "the venv has no tensorboard package (make test installs it: bench-tensorboard)");
        return;
    }
    let db = Db::new();
    let tb = db.path().join("tb");
    let script = db.path().join("write_events.py");
    std::fs::write(&script, WRITE_EVENTS).unwrap();
    let out = std::process::Command::new(&python).arg(&script).arg(&tb).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let done = db.json(&["import", tb.to_str().unwrap(), "--json"]);
    assert_eq!((done["ranks"].as_u64(), done["status"].as_str()), (Some(2), Some("succeeded")), "{done}");
    let run = done["run"].as_str().unwrap().to_string();
    type Want = fn(u64, u32) -> f64;
    let loss: Want = |s, r| 4.0 - s as f64 * 0.125 + r as f64;
    let lr: Want = |s, _| 1e-3 * s as f64;
    for (key, value) in [("train/loss", loss), ("train/lr", lr)] {
        let csv = db.run(&["metrics", &run, "--key", key, "--format", "csv"]);
        let mut rows = csv_rows(&String::from_utf8_lossy(&csv.stdout));
        rows.sort_by_key(|r| (r.1, r.0));
        assert_eq!(rows.len(), 40, "{key}: 20 steps × 2 ranks: {rows:?}");
        for (step, rank, got) in rows {
            // SummaryWriter stores float32.
            let want = value(step, rank) as f32 as f64;
            assert_eq!(got, want, "{key} at step {step} of rank {rank}");
        }
    }
    db.finish();
}
