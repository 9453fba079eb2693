//! The history's points on a real sled database: blocks and the journal round-trip every
//! point, rollups agree with the points, readers never see a compaction half done, a database
//! of schema 1 is migrated with every point, and a writer killed mid-write loses nothing it
//! acknowledged.
use flightdeck::ids::RunId;
use flightdeck::store::rollup::LEVELS;
use flightdeck::store::{Batch, Point, RunMeta, RunRecord, RunStatus, Store};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};

/// Opens a database, waiting while a handle just dropped (here, or by a killed child) still
/// holds sled's file lock: sled releases it only when its background threads end.
fn open_store(path: &Path) -> Result<Store, flightdeck::store::StoreError> {
    loop {
        match Store::open(path) {
            Err(e) if e.to_string().contains("could not acquire lock") => std::thread::yield_now(),
            other => return other,
        }
    }
}

const METRICS: [&str; 3] = ["loss", "lr", "step_time_ms"];

fn run_record(id: &str, world: u32) -> RunRecord {
    let meta = RunMeta {
        name: id.into(),
        recipe_name: "t".into(),
        recipe_path: String::new(),
        recipe_json: "{}".into(),
        world_size: world,
        steps_planned: 0,
    };
    let mut run = RunRecord::starting(RunId(id.into()), meta, vec!["local".into()], Vec::new(), None);
    run.status = RunStatus::Running;
    run
}

/// Exactly representable, different per (metric, rank, step), so a point in the wrong place shows.
fn value(metric: usize, rank: u32, step: u64) -> f64 {
    step as f64 * 4.0 + f64::from(rank) * 1e6 + metric as f64 + 0.5
}

/// Steps `from..to` of every rank, `per_batch` steps a batch, as the tracker sends them.
fn write_steps(
    w: &mut flightdeck::store::Writer,
    run: &RunRecord,
    ranks: u32,
    steps: std::ops::Range<u64>,
    per_batch: u64,
) {
    let mut step = steps.start;
    while step < steps.end {
        let mut b = Batch::default();
        b.runs.push(run.clone());
        for s in step..(step + per_batch).min(steps.end) {
            for rank in 0..ranks {
                for (m, name) in METRICS.iter().enumerate() {
                    b.points.push((run.id.clone(), (*name).into(), Point { step: s, rank, value: value(m, rank, s) }));
                }
            }
        }
        w.write(b).expect("write");
        step += per_batch;
    }
}

fn assert_every_point(store: &Store, run: &RunId, ranks: u32, steps: std::ops::Range<u64>) {
    for (m, name) in METRICS.iter().enumerate() {
        let got = store.series(run, name, None).expect("series");
        let want: Vec<(u32, u64, f64)> =
            (0..ranks).flat_map(|r| steps.clone().map(move |s| (r, s, value(m, r, s)))).collect();
        let got: Vec<(u32, u64, f64)> = got.iter().map(|p| (p.rank, p.step, p.value)).collect();
        assert_eq!(got.len(), want.len(), "{name}: point count");
        assert!(got == want, "{name}: points differ");
        let one = store.series(run, name, Some(ranks - 1)).expect("series of one rank");
        assert_eq!(one.len() as u64, steps.end - steps.start, "{name}: one rank");
        assert!(one.iter().all(|p| p.rank == ranks - 1));
    }
}

/// Every rollup level of one rank's metric, recomputed from its points.
fn assert_rollups(store: &Store, run: &RunId, metric: &str, rank: u32) {
    let points = store.series(run, metric, Some(rank)).expect("series");
    for (level, width) in LEVELS.iter().enumerate() {
        let mut want: BTreeMap<u64, (f64, f64, f64, u64, f64)> = BTreeMap::new();
        for p in &points {
            let e = want.entry(p.step / width).or_insert((f64::INFINITY, f64::NEG_INFINITY, 0.0, 0, 0.0));
            e.0 = e.0.min(p.value);
            e.1 = e.1.max(p.value);
            e.2 += p.value;
            e.3 += 1;
            e.4 = p.value;
        }
        let got: BTreeMap<u64, (f64, f64, f64, u64, f64)> = store
            .rollups(run, metric, rank, level as u8)
            .expect("rollups")
            .into_iter()
            .map(|(no, b)| (no, (b.min, b.max, b.sum, b.count, b.last)))
            .collect();
        assert_eq!(got, want, "{metric} rank {rank} level {level}");
    }
}

#[test]
fn blocks_and_the_journal_round_trip_every_point_while_live_and_after_the_end() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_store(dir.path()).unwrap();
    let mut w = store.writer();
    let run = run_record("20261206-000000-blocks", 8);
    // 8 ranks × 3 metrics × 3,000 steps = 72,000 points: one compaction on the way (at 65,536),
    // the rest in the journal until the end.
    write_steps(&mut w, &run, 8, 1..3001, 7);
    assert_every_point(&store, &run.id, 8, 1..3001);
    assert_rollups(&store, &run.id, "loss", 3);
    assert_eq!(store.metric_names(&run.id).unwrap(), vec!["loss", "lr", "step_time_ms"]);
    w.close_run(&run.id).unwrap();
    assert_every_point(&store, &run.id, 8, 1..3001);
    assert_rollups(&store, &run.id, "loss", 3);
    assert_rollups(&store, &run.id, "lr", 7);
    assert_eq!(store.metric_names(&run.id).unwrap(), vec!["loss", "lr", "step_time_ms"]);
    drop((w, store));
    // Reopened: the same points, from blocks only.
    let store = open_store(dir.path()).unwrap();
    assert_every_point(&store, &run.id, 8, 1..3001);
}

#[test]
fn a_step_written_again_replaces_the_first_and_steps_going_back_are_kept_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_store(dir.path()).unwrap();
    let mut w = store.writer();
    let run = run_record("20261206-000000-again", 1);
    let point = |step, value| (run.id.clone(), "loss".into(), Point { step, rank: 0, value });
    w.write(Batch { points: (10..20).map(|s| point(s, s as f64)).collect(), ..Default::default() }).unwrap();
    w.close_run(&run.id).unwrap();
    // After the blocks are written: one step again, one before them, one between, and one
    // twice in the same batch (the later wins).
    let again = vec![point(15, -15.0), point(3, 3.0), point(21, 21.0), point(21, 22.0)];
    w.write(Batch { points: again, ..Default::default() }).unwrap();
    let live: Vec<(u64, f64)> =
        store.series(&run.id, "loss", None).unwrap().iter().map(|p| (p.step, p.value)).collect();
    w.close_run(&run.id).unwrap();
    let closed: Vec<(u64, f64)> =
        store.series(&run.id, "loss", None).unwrap().iter().map(|p| (p.step, p.value)).collect();
    let mut want: Vec<(u64, f64)> = (10..20).map(|s| (s, s as f64)).collect();
    want[5].1 = -15.0;
    want.insert(0, (3, 3.0));
    want.push((21, 22.0));
    assert_eq!(live, want, "journal merged over blocks");
    assert_eq!(closed, want, "after compaction");
}

#[test]
fn a_reader_never_sees_a_compaction_half_done() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_store(dir.path()).unwrap();
    let mut w = store.writer();
    let run = run_record("20261206-000000-reader", 64);
    let reader = {
        let (store, id) = (store.clone(), run.id.clone());
        std::thread::spawn(move || {
            let mut reads = 0u64;
            loop {
                let points = store.series(&id, "lr", Some(63)).expect("series");
                // What was written is whole steps 1..=n of rank 63, each once, in order.
                for (i, p) in points.iter().enumerate() {
                    assert_eq!((p.step, p.value), (i as u64 + 1, value(1, 63, i as u64 + 1)), "read {reads}");
                }
                // The rollups too: each step counted once, none missing below the newest.
                let buckets = store.rollups(&id, "lr", 63, 0).expect("rollups");
                let n: u64 = buckets.iter().map(|(_, b)| b.count).sum();
                let w = LEVELS[0];
                for (no, b) in &buckets {
                    let want = (no * w + w - 1).min(n) + 1 - (no * w).max(1);
                    assert_eq!(b.count, want, "read {reads}: bucket {no} of {n} steps");
                }
                reads += 1;
                if points.len() == 3000 {
                    return reads;
                }
            }
        })
    };
    // 64 ranks × 3 metrics × 3,000 steps: a compaction every 342 steps, one step a batch.
    write_steps(&mut w, &run, 64, 1..3001, 1);
    let reads = reader.join().expect("the reader saw every read whole");
    assert!(reads > 0);
    w.close_run(&run.id).unwrap();
}

#[test]
fn a_schema_1_database_is_migrated_with_every_point_and_rollup() {
    let dir = tempfile::tempdir().unwrap();
    // Written by flightdeck at schema 1 (one key per point): 3 ranks × 300 steps × 4 metrics,
    // value rank × 1000 + step + metric / 4, grad_norm at steps 7, 8, 9 NaN, +inf and -0.0.
    let status = Command::new("tar")
        .args(["xzf", concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/store/v1.tar.gz"), "-C"])
        .arg(dir.path())
        .status()
        .unwrap();
    assert!(status.success());
    let db = dir.path().join("store-v1");
    // Schema 1's log lines, one key each (`run \0 rank(u32 BE) n(u64 BE)` → the line), written
    // as schema 1's writer did (the fixture predates the logs' move), 2,000 kept of rank 0's.
    let run_key = |rank: u32, n: u64| {
        let mut k = b"20261206-100000-v1fixture\0".to_vec();
        k.extend_from_slice(&rank.to_be_bytes());
        k.extend_from_slice(&n.to_be_bytes());
        k
    };
    {
        let raw = sled::open(&db).unwrap();
        let logs = raw.open_tree("logs").unwrap();
        for n in 501..=2500u64 {
            logs.insert(run_key(0, n), format!("rank 0 line {n}").as_bytes()).unwrap();
        }
        logs.insert(run_key(2, 1), &b"rank 2's only line"[..]).unwrap();
        raw.flush().unwrap();
    }
    for _ in 0..2 {
        // Twice: the second open finds schema 2 and changes nothing.
        let store = open_store(&db).unwrap();
        let runs = store.list_runs().unwrap();
        assert_eq!(runs.len(), 1);
        let run = &runs[0].id;
        let tail = store.log_tail(run, 0).unwrap();
        assert_eq!(tail.len(), 2000);
        assert_eq!((tail[0].as_str(), tail[1999].as_str()), ("rank 0 line 501", "rank 0 line 2500"));
        assert_eq!(store.log_tail(run, 2).unwrap(), ["rank 2's only line"]);
        assert!(store.log_tail(run, 1).unwrap().is_empty());
        let names = ["grad_norm", "loss", "lr", "step_time_ms"];
        assert_eq!(store.metric_names(run).unwrap(), names);
        for name in names {
            let m = ["loss", "lr", "grad_norm", "step_time_ms"].iter().position(|n| *n == name).unwrap();
            let got = store.series(run, name, None).unwrap();
            assert_eq!(got.len(), 900, "{name}");
            for (i, p) in got.iter().enumerate() {
                let (rank, step) = ((i / 300) as u32, (i % 300) as u64 + 1);
                let mut want = f64::from(rank) * 1000.0 + step as f64 + m as f64 * 0.25;
                match (name, step) {
                    ("grad_norm", 7) => want = f64::NAN,
                    ("grad_norm", 8) => want = f64::INFINITY,
                    ("grad_norm", 9) => want = -0.0,
                    _ => {}
                }
                assert_eq!((p.rank, p.step, p.value.to_bits()), (rank, step, want.to_bits()), "{name} point {i}");
            }
            for rank in 0..3 {
                if name != "grad_norm" {
                    assert_rollups(&store, run, name, rank);
                }
            }
        }
    }
}

/// The child side of the kill test: writes batches forever, printing each acknowledged step.
#[test]
fn kill_child_writes_until_killed() {
    let Some(dir) = std::env::var_os("FD_STORE_KILL_CHILD") else { return };
    let store = open_store(Path::new(&dir)).unwrap();
    let mut w = store.writer();
    let run = run_record("20261206-000000-killed", 16);
    for step in 1.. {
        write_steps(&mut w, &run, 16, step..step + 1, 1);
        println!("acked {step}");
    }
}

#[test]
fn a_writer_killed_mid_write_loses_nothing_it_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    for round in 0..3u64 {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "kill_child_writes_until_killed", "--nocapture", "--test-threads=1"])
            .env("FD_STORE_KILL_CHILD", dir.path())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        // Past a compaction (16 ranks × 3 metrics: every 1,366 steps), then killed at once.
        let target = 1500 + round * 700;
        let mut acked = 0;
        for line in lines.by_ref() {
            if let Some(n) = line.unwrap().strip_prefix("acked ") {
                acked = n.parse().unwrap();
                if acked == target {
                    break;
                }
            }
        }
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(acked, target);
        let store = open_store(dir.path()).unwrap();
        let id = RunId("20261206-000000-killed".into());
        let loss = store.series(&id, "loss", Some(15)).unwrap();
        // Each round's child starts again at step 1 (writing steps again), so the steps held
        // are 1..=n with n at least what this round acknowledged, each once and whole.
        assert!(loss.len() as u64 >= acked, "round {round}: {} steps held, {acked} acknowledged", loss.len());
        for (i, p) in loss.iter().enumerate() {
            assert_eq!((p.step, p.value), (i as u64 + 1, value(0, 15, i as u64 + 1)));
        }
        let n = loss.len() as u64;
        assert_every_point(&store, &id, 16, 1..n + 1);
    }
}

#[test]
fn a_reader_made_before_a_compaction_reads_after_it_without_counting_twice() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_store(dir.path()).unwrap();
    let mut w = store.writer();
    let run = run_record("20261206-000000-before", 64);
    // 64 ranks × 3 metrics: the journal is compacted when it passes 65,536 points (342 steps).
    write_steps(&mut w, &run, 64, 1..301, 1);
    let mut reader = store.run_points(&run.id).unwrap();
    let before = reader.rollups("loss", 5, 0).unwrap();
    assert_eq!(before.iter().map(|(_, b)| b.count).sum::<u64>(), 300, "from the journal");
    write_steps(&mut w, &run, 64, 301..401, 1);
    let after = reader.rollups("loss", 5, 0).unwrap();
    assert_eq!(after.iter().map(|(_, b)| b.count).sum::<u64>(), 400, "each step once after the compaction");
    assert_eq!(reader.series("loss", Some(5)).unwrap().len(), 400);
    assert_rollups(&store, &run.id, "loss", 5);
}

#[test]
fn each_rank_keeps_its_last_2000_log_lines_live_after_the_end_and_reopened() {
    let dir = tempfile::tempdir().unwrap();
    let run = run_record("20261206-000000-logs", 4);
    let line = |rank: u32, n: u64| format!("rank {rank} line {n} ✓");
    let want =
        |rank: u32, last: u64| ((last.saturating_sub(1999)).max(1)..=last).map(|n| line(rank, n)).collect::<Vec<_>>();
    {
        let store = open_store(dir.path()).unwrap();
        let mut w = store.writer();
        // 4 ranks × 6,000 lines, 10 a rank a batch: compactions at 16,384 lines, chunks dropped
        // as each rank's tail moves past them.
        for first in (1..=6000u64).step_by(10) {
            let mut b = Batch::default();
            for n in first..first + 10 {
                for rank in 0..4 {
                    b.logs.push((run.id.clone(), rank, n, line(rank, n)));
                }
            }
            w.write(b).unwrap();
            if first == 2991 {
                assert_eq!(store.log_tail(&run.id, 3).unwrap(), want(3, 3000), "live, journal and chunks");
            }
        }
        assert_eq!(store.log_tail(&run.id, 1).unwrap(), want(1, 6000));
        // A snapshot's read: every rank's last n at once. 2,500 lines reach past the journal
        // (4,101..6,000 since the compaction at 4,100) into the chunk before it.
        let tails = store.log_tails(&run.id, &[0, 2, 4], 2500).unwrap();
        assert_eq!(tails.keys().copied().collect::<Vec<_>>(), [0, 2], "a rank without lines is absent");
        assert_eq!(tails[&2], (3501..=6000).map(|n| line(2, n)).collect::<Vec<_>>(), "journal and chunk");
        assert_eq!(
            store.log_tails(&run.id, &[3], 5).unwrap()[&3],
            (5996..=6000).map(|n| line(3, n)).collect::<Vec<_>>()
        );
        w.close_run(&run.id).unwrap();
        assert_eq!(store.log_tail(&run.id, 2).unwrap(), want(2, 6000), "after the end");
    }
    let store = open_store(dir.path()).unwrap();
    for rank in 0..4 {
        assert_eq!(store.log_tail(&run.id, rank).unwrap(), want(rank, 6000), "reopened");
    }
    let tails = store.log_tails(&run.id, &[0, 1, 2, 3], 20).unwrap();
    for (rank, tail) in tails {
        assert_eq!(tail, (5981..=6000).map(|n| line(rank, n)).collect::<Vec<_>>(), "rank {rank}'s newest chunk");
    }
    let counts = store.log_line_counts(&run.id).unwrap();
    assert_eq!(counts.into_iter().collect::<Vec<_>>(), [(0, 6000), (1, 6000), (2, 6000), (3, 6000)]);
    assert!(store.log_tail(&run.id, 4).unwrap().is_empty());
}
