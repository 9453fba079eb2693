//! `flightdeck export` end to end: a 2-rank run and a resume of it, exported as CSV, JSON lines,
//! Parquet and TensorBoard, and every point of every rank read back against `metrics`, with the
//! formats' own readers where the PyTorch venv has them (pyarrow, TensorBoard's
//! EventAccumulator) and the Rust ones always; then the lineage as one set, and bad input.
mod common;

use common::{ok, recipe, run_id, venv_python, Db};
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

/// (run, metric, rank, step) → value: what the history holds, or what an export says.
type Points = BTreeMap<(String, String, u32, u64), f64>;

/// Every point of `run` through `flightdeck metrics`, metric by metric.
fn history(db: &Db, run: &str) -> Points {
    let show = db.json(&["show", run, "--json"]);
    let mut out = Points::new();
    for m in show["metrics"].as_array().expect("metrics") {
        let m = m.as_str().expect("name");
        let text = ok(&db.run(&["metrics", run, "--key", m, "--format", "jsonl"]));
        for line in text.lines() {
            let v: serde_json::Value = serde_json::from_str(line).expect("jsonl");
            let key = (run.to_string(), m.to_string(), v["rank"].as_u64().unwrap() as u32, v["step"].as_u64().unwrap());
            out.insert(key, v["value"].as_f64().unwrap_or(f64::NAN));
        }
    }
    out
}

fn bits(p: &Points) -> BTreeMap<(String, String, u32, u64), u64> {
    p.iter().map(|(k, v)| (k.clone(), v.to_bits())).collect()
}

/// The wall time each format gave each point, to check they agree.
type Walls = BTreeMap<(String, String, u32, u64), f64>;

fn read_csv(path: &Path) -> (Points, Walls) {
    let text = std::fs::read_to_string(path).expect("metrics.csv");
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some("run,name,attempt,metric,rank,step,wall_time_s,value"));
    let (mut points, mut walls) = (Points::new(), Walls::new());
    for l in lines {
        let c: Vec<&str> = l.split(',').collect();
        let key = (c[0].to_string(), c[3].to_string(), c[4].parse().unwrap(), c[5].parse().unwrap());
        walls.insert(key.clone(), c[6].parse().unwrap());
        points.insert(key, c[7].parse().unwrap());
    }
    (points, walls)
}

fn read_jsonl(path: &Path) -> (Points, Walls, BTreeMap<String, u64>) {
    let text = std::fs::read_to_string(path).expect("metrics.jsonl");
    let (mut points, mut walls, mut attempts) = (Points::new(), Walls::new(), BTreeMap::new());
    for l in text.lines() {
        let v: serde_json::Value = serde_json::from_str(l).expect("a JSON object");
        let run = v["run"].as_str().unwrap().to_string();
        let key = (
            run.clone(),
            v["metric"].as_str().unwrap().into(),
            v["rank"].as_u64().unwrap() as u32,
            v["step"].as_u64().unwrap(),
        );
        walls.insert(key.clone(), v["wall_time_s"].as_f64().unwrap());
        points.insert(key, v["value"].as_f64().unwrap_or(f64::NAN));
        attempts.insert(run, v["attempt"].as_u64().unwrap());
    }
    (points, walls, attempts)
}

fn read_parquet_rust(path: &Path) -> Points {
    use parquet::file::reader::{FileReader, SerializedFileReader};
    use parquet::record::RowAccessor;
    let reader = SerializedFileReader::new(std::fs::File::open(path).expect("open")).expect("a parquet file");
    let mut out = Points::new();
    for row in reader.get_row_iter(None).expect("rows") {
        let row = row.expect("row");
        let key = (
            row.get_string(0).unwrap().clone(),
            row.get_string(3).unwrap().clone(),
            row.get_int(4).unwrap() as u32,
            row.get_long(5).unwrap() as u64,
        );
        out.insert(key, row.get_double(7).unwrap());
    }
    out
}

/// Runs `script` on the venv's python with `arg`, if the venv has `module`; its stdout is
/// JSON. None (and a skip line) where it cannot run.
fn python_json(module: &str, script: &str, arg: &Path) -> Option<serde_json::Value> {
    let Some(py) = venv_python().filter(|p| p.exists()) else {
        common::skipped(file!(), &format!("no PyTorch venv (FD_VENV; `make test` sets it): {module} not read back"));
        return None;
    };
    let probe = Command::new(&py).args(["-c", &format!("import {module}")]).output().expect("python");
    if !probe.status.success() {
        common::skipped(file!(), &format!("the venv has no {module} (make python-deps installs it)"));
        return None;
    }
    let out = Command::new(&py).args(["-c", script]).arg(arg).output().expect("python");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    Some(serde_json::from_slice(&out.stdout).expect("JSON from python"))
}

const PYARROW: &str = r#"
import json, sys, pyarrow.parquet as pq
t = pq.read_table(sys.argv[1]).to_pydict()
print(json.dumps([[t["run"][i], t["metric"][i], t["rank"][i], t["step"][i], t["value"][i]] for i in range(len(t["run"]))]))
"#;

/// Every rank directory's scalars as TensorBoard's own loader reads them.
const EVENT_ACCUMULATOR: &str = r#"
import json, os, sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
out = []
for run_dir in sorted(os.listdir(sys.argv[1])):
    for part in sorted(os.listdir(os.path.join(sys.argv[1], run_dir))):
        ea = EventAccumulator(os.path.join(sys.argv[1], run_dir, part), size_guidance={"scalars": 0, "tensors": 0})
        ea.Reload()
        for tag in ea.Tags()["scalars"]:
            for s in ea.Scalars(tag):
                out.append([run_dir, part, tag, s.step, s.wall_time, s.value])
        texts = [t.tensor_proto.string_val[0].decode() for t in ea.Tensors("events")] if "events" in ea.Tags()["tensors"] else []
        out.append([run_dir, part, "@events", len(texts), 0, 0])
print(json.dumps(out))
"#;

#[test]
fn every_point_of_every_rank_comes_back_from_each_format_and_a_lineage_is_one_set() {
    let db = Db::new();
    let r = recipe("tiny-gpt.toml");
    let sets = ["train.steps=30", "checkpoint.every=10", "cluster.ranks_per_node=2"];
    let mut args = vec!["run", r.to_str().unwrap(), "--headless"];
    for s in &sets {
        args.extend(["--set", s]);
    }
    let parent = run_id(&ok(&db.run(&args)));
    let child = run_id(&ok(&db.run(&["resume", &parent, "--step", "20", "--headless"])));
    let want = history(&db, &parent);
    assert!(want.len() > 2 * 30 * 10, "a point per step, rank and metric: {}", want.len());
    let out = tempfile::tempdir().expect("tempdir");
    let export = |format: &str, extra: &[&str]| {
        let dir = out.path().join(format);
        let mut a = vec!["export", &parent, "--format", format, "--out", dir.to_str().unwrap()];
        a.extend(extra);
        let said = ok(&db.run(&a));
        assert!(said.starts_with(&format!("exported {} points", want.len())), "{said}");
        dir
    };

    let csv = export("csv", &[]);
    let (got, walls) = read_csv(&csv.join("metrics.csv"));
    assert_eq!(bits(&got), bits(&want), "csv");
    let events = std::fs::read_to_string(csv.join("events.csv")).unwrap();
    assert!(events.lines().any(|l| l.contains(",run_started,")) && events.contains(",checkpoint_saved,"), "{events}");
    let ckpts = std::fs::read_to_string(csv.join("checkpoints.csv")).unwrap();
    assert_eq!(ckpts.lines().count(), 1 + 3, "header and steps 10, 20, 30:\n{ckpts}");
    // Each rank's clock runs forward with its steps.
    for ((run, metric, rank, step), t) in &walls {
        if let Some(next) = walls.get(&(run.clone(), metric.clone(), *rank, step + 1)) {
            assert!(next >= t, "{metric} rank {rank}: {step} at {t}, {} at {next}", step + 1);
        }
    }

    let jsonl = export("jsonl", &[]);
    let (got, jwalls, _) = read_jsonl(&jsonl.join("metrics.jsonl"));
    assert_eq!(bits(&got), bits(&want), "jsonl");
    assert_eq!(jwalls, walls, "the same wall times in every format");

    let pq = export("parquet", &[]);
    assert_eq!(bits(&read_parquet_rust(&pq.join("metrics.parquet"))), bits(&want), "parquet (Rust reader)");
    if let Some(rows) = python_json("pyarrow", PYARROW, &pq.join("metrics.parquet")) {
        let got: Points = rows
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                let key = (
                    r[0].as_str().unwrap().into(),
                    r[1].as_str().unwrap().into(),
                    r[2].as_u64().unwrap() as u32,
                    r[3].as_u64().unwrap(),
                );
                (key, r[4].as_f64().unwrap_or(f64::NAN))
            })
            .collect();
        assert_eq!(bits(&got), bits(&want), "parquet (pyarrow)");
    }

    let tb = export("tensorboard", &[]);
    // TensorBoard keeps scalars as 32-bit floats: each value comes back as its f32.
    let want_f32: BTreeMap<_, _> = want.iter().map(|(k, v)| (k.clone(), (*v as f32).to_bits())).collect();
    let run_dir = tb.join(format!("tiny-gpt-{parent}"));
    let mut ours = BTreeMap::new();
    for rank in 0..2u32 {
        let dir = run_dir.join(format!("rank_{rank}"));
        let file = std::fs::read_dir(&dir).unwrap().next().unwrap().unwrap().path();
        let read = flightdeck::tensorboard::read_file(&file).expect("our reader");
        for s in read.scalars {
            let key = (parent.clone(), s.tag.clone(), rank, s.step as u64);
            assert_eq!(s.wall_time_s, walls[&key], "{key:?}");
            ours.insert(key, (s.value as f32).to_bits());
        }
    }
    assert_eq!(ours, want_f32, "tensorboard (Rust reader)");
    if let Some(rows) = python_json("tensorboard", EVENT_ACCUMULATOR, &tb) {
        let mut got = BTreeMap::new();
        let mut texts = 0;
        for r in rows.as_array().unwrap() {
            let part = r[1].as_str().unwrap();
            if r[2] == "@events" {
                texts += r[3].as_u64().unwrap();
                continue;
            }
            let Some(rank) = part.strip_prefix("rank_").map(|n| n.parse::<u32>().unwrap()) else { continue };
            let key = (parent.clone(), r[2].as_str().unwrap().to_string(), rank, r[3].as_u64().unwrap());
            assert_eq!(r[4].as_f64().unwrap(), walls[&key], "wall time of {key:?}");
            got.insert(key, (r[5].as_f64().unwrap() as f32).to_bits());
        }
        assert_eq!(got, want_f32, "tensorboard (EventAccumulator)");
        assert!(texts >= 3, "the run's events as text: {texts}");
    }

    // The resume's lineage is one set: the parent as attempt 0, the child as attempt 1.
    let dir = out.path().join("lineage");
    ok(&db.run(&[
        "export",
        &child,
        "--lineage",
        "--format",
        "jsonl",
        "--out",
        dir.to_str().unwrap(),
        "--metrics",
        "loss",
    ]));
    let (got, _, attempts) = read_jsonl(&dir.join("metrics.jsonl"));
    assert_eq!(attempts, BTreeMap::from([(parent.clone(), 0), (child.clone(), 1)]));
    let child_loss = history(&db, &child).into_iter().filter(|(k, _)| k.1 == "loss");
    let want_loss: Points =
        want.iter().filter(|(k, _)| k.1 == "loss").map(|(k, v)| (k.clone(), *v)).chain(child_loss).collect();
    assert_eq!(bits(&got), bits(&want_loss), "both attempts' losses, every rank");

    // Bad input: named, exit 2, nothing written.
    let bad = |args: &[&str], says: &str| {
        let o = db.run(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        let e = String::from_utf8_lossy(&o.stderr);
        assert!(e.contains(says), "{args:?}: {e}");
    };
    let fresh = out.path().join("fresh");
    let fresh = fresh.to_str().unwrap();
    bad(
        &["export", &parent, "--format", "csv", "--out", fresh, "--metrics", "los"],
        "no run has a metric \"los\"; their metrics: ",
    );
    bad(
        &["export", &parent, "--format", "csv", "--out", fresh, "--ranks", "2"],
        "rank 2 is not in any run (ranks 0 to 1)",
    );
    bad(&["export", "nope", "--format", "csv", "--out", fresh], "nope");
    assert!(!Path::new(fresh).exists(), "a refused export writes nothing");
    bad(&["export", &parent, "--format", "csv", "--out", csv.to_str().unwrap()], "is not empty");
    bad(&["export", &parent, &child, "--format", "csv"], "--out DIR is needed to export 2 runs");

    // Without --out, one run goes where the cockpit's `E` puts it: NAME-ID-FORMAT, here.
    let here = out.path().join("here");
    std::fs::create_dir_all(&here).unwrap();
    let o = db.cmd(&["export", &parent, "--format", "jsonl"]).current_dir(&here).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let name = db.json(&["show", &parent, "--json"])["run"]["name"].as_str().unwrap().to_string();
    let dir = here.join(format!("{name}-{parent}-jsonl"));
    assert!(dir.join("metrics.jsonl").is_file(), "{}", String::from_utf8_lossy(&o.stdout));
    db.finish();
}
