//! Checkpoint benchmark (not a test): save and load GB/s against a plain sequential write of the
//! same bytes on the same disk, and how long training blocks per save.
//!
//! `cargo bench --bench ckpt -- [DIR] [REPS]` (DIR: where to write, default a temporary
//! directory under the working directory, so the disk is the repository's; REPS default 5).
//! Prints a markdown table for docs/benchmarks.md.
use flightdeck::collective::solo::Solo;
use flightdeck::recipe::Recipe;
use flightdeck::store::checkpoints::disk;
use flightdeck::worker::checkpoint::{restore, Checkpointer, Plan};
use flightdeck::worker::model::Gpt;
use flightdeck::worker::optim::AdamW;
use flightdeck::worker::telemetry::Telemetry;
use std::io::Write;
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    let base = args.first().map(std::path::PathBuf::from).unwrap_or_else(|| std::path::PathBuf::from("."));
    let reps: usize = args.get(1).map(|r| r.parse()).transpose()?.unwrap_or(5);
    // As a rank of the default two-rank run on this machine: one intra-op thread each.
    tch::set_num_interop_threads(1);
    tch::set_num_threads(1);
    let tmp = tempfile::Builder::new().prefix("ckpt-bench").tempdir_in(&base)?;
    let tiny = flightdeck::recipe::load_file(Path::new("recipes/tiny-gpt.toml"), &[])?;
    let step_ms = default_step_ms(&tiny)?;
    println!("default recipe (tiny-gpt), one rank's step: {step_ms:.1} ms median over steps 6-30");
    println!();
    println!("| model | checkpoint MB | plain write GB/s | save GB/s (write thread) | save ÷ plain | load GB/s | blocking ms per save | blocking ÷ step |");
    println!("| --- | --- | --- | --- | --- | --- | --- | --- |");
    let sizes = [
        ("tiny-gpt (d 128, 2 layers)", vec![]),
        ("d 512, 8 layers", vec!["model.d_model=512".into(), "model.n_layer=8".into(), "model.n_head=8".into()]),
    ];
    for (label, overrides) in sizes {
        let recipe = flightdeck::recipe::load_file(Path::new("recipes/tiny-gpt.toml"), &overrides)?;
        let r = measure(&recipe, tmp.path(), reps)?;
        println!(
            "| {label} | {:.1} | {:.2} | {:.2} | **{:.2}** | {:.2} | {:.2} (max {:.2}) | {:.3} |",
            r.bytes as f64 / 1e6,
            median(&r.plain_gbps),
            median(&r.save_gbps),
            median(&r.save_gbps) / median(&r.plain_gbps),
            median(&r.load_gbps),
            median(&r.blocking_ms),
            r.blocking_ms.iter().cloned().fold(0.0, f64::max),
            median(&r.blocking_ms) / step_ms,
        );
    }
    Ok(())
}

struct Result {
    bytes: u64,
    plain_gbps: Vec<f64>,
    save_gbps: Vec<f64>,
    load_gbps: Vec<f64>,
    blocking_ms: Vec<f64>,
}

fn median(xs: &[f64]) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn measure(recipe: &Recipe, base: &Path, reps: usize) -> anyhow::Result<Result> {
    let mut model = Gpt::new(&recipe.model, recipe.train.seed)?;
    let opt = AdamW::from_recipe(model.params_mut(), &recipe.train)?;
    let tele = Telemetry::disabled();
    let never = AtomicBool::new(false);
    let mut out = Result { bytes: 0, plain_gbps: vec![], save_gbps: vec![], load_gbps: vec![], blocking_ms: vec![] };
    // One checkpointer for every repetition, as in a run: from the second save on, the
    // snapshot reuses the buffers the writer hands back.
    let root = base.join("save");
    let plan = Plan {
        root: root.clone(),
        every: 1,
        keep: 1,
        run: "bench".into(),
        recipe_json: serde_json::to_vec(recipe)?,
        writes: true,
        node: "local".into(),
    };
    let mut ckpt = Checkpointer::new(Some(plan), &never, recipe, tele.tx())?;
    for rep in 0..reps {
        let step = rep as u64 + 1;
        let t0 = Instant::now();
        ckpt.after_step(step, 2.0, &model, &opt, 0, &mut Solo)?;
        let blocking = t0.elapsed();
        ckpt.flush();
        let save = t0.elapsed() - blocking;
        let dir = root.join(disk::step_dir_name(step));
        let bytes = disk::read_manifest(&dir).map_err(|e| anyhow::anyhow!("{e}"))?.bytes();
        out.bytes = bytes;
        out.blocking_ms.push(blocking.as_secs_f64() * 1e3);
        out.save_gbps.push(bytes as f64 / save.as_secs_f64() / 1e9);

        // The reference: the same number of bytes, one file, written and fsynced.
        let buf = vec![7u8; bytes as usize];
        let plain = base.join(format!("plain-{rep}"));
        let t0 = Instant::now();
        let mut f = std::fs::File::create(&plain)?;
        f.write_all(&buf)?;
        f.sync_all()?;
        out.plain_gbps.push(bytes as f64 / t0.elapsed().as_secs_f64() / 1e9);
        std::fs::remove_file(&plain)?;

        let mut m2 = Gpt::new(&recipe.model, recipe.train.seed + 1)?;
        let mut o2 = AdamW::from_recipe(m2.params_mut(), &recipe.train)?;
        let t0 = Instant::now();
        restore(&dir, 0, 1, &mut m2, &mut o2)?;
        out.load_gbps.push(bytes as f64 / t0.elapsed().as_secs_f64() / 1e9);
    }
    ckpt.finish()?;
    std::fs::remove_dir_all(&root)?;
    Ok(out)
}

/// One rank's step time on the default recipe (its batch per rank, world 1), from the loop.
fn default_step_ms(recipe: &Recipe) -> anyhow::Result<f64> {
    let mut r = recipe.clone();
    (r.parallel.data, r.cluster.ranks_per_node, r.train.steps) = (1, 1, 30);
    let tele = Telemetry::disabled();
    let mut ms = Vec::new();
    flightdeck::worker::train::train(&r, &mut Solo, tele.tx(), &mut |m| {
        if m.step.0 > 5 {
            ms.push(m.step_time_ms)
        }
    })?;
    Ok(median(&ms))
}
