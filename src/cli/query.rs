//! Read-only client commands (`runs`, `show`, `metrics`) and run control (`stop`, `kill`).
use super::output;
use super::EXIT_BAD_INPUT;
use crate::client::Client;
use crate::paths::DbPaths;
use crate::protocol::{Reply, Request};
use crate::store::{RunDetail, RunRecord};

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Csv,
    Jsonl,
}

#[derive(clap::Args, Debug)]
pub struct MetricsArgs {
    /// The run: full id, unique prefix, or name.
    pub run: String,
    /// The metric; `flightdeck show RUN` lists them.
    #[arg(long, default_value = "loss")]
    pub key: String,
    /// Only this rank (default: every rank).
    #[arg(long)]
    pub rank: Option<u32>,
    /// `csv` (step,rank,value) or `jsonl` (one object per point).
    #[arg(long, value_enum, default_value = "csv")]
    pub format: Format,
}

async fn ask(db: &DbPaths, req: Request) -> anyhow::Result<Result<Reply, String>> {
    let mut client = Client::connect(db).await?;
    Ok(match client.request(&req).await? {
        Reply::Error { message } => Err(message),
        r => Ok(r),
    })
}

/// Prints a server-side refusal (no such run, ambiguous prefix) as bad input.
fn refused(message: &str) -> anyhow::Result<i32> {
    eprintln!("flightdeck: {message}");
    Ok(EXIT_BAD_INPUT)
}

pub async fn runs(db: &DbPaths, json: bool) -> anyhow::Result<i32> {
    let runs: Vec<RunRecord> = match ask(db, Request::ListRuns).await? {
        Ok(Reply::Runs { runs }) => runs,
        Ok(other) => anyhow::bail!("unexpected reply: {other:?}"),
        Err(m) => return refused(&m),
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&output::runs_json(&runs))?);
        return Ok(0);
    }
    println!(
        "{:<22} {:<11} {:<16} {:>5} {:>11} {:>9} {:>9}  PARENT",
        "ID", "STATUS", "NAME", "WORLD", "STEP", "LOSS", "DURATION"
    );
    for r in runs.iter().rev() {
        let v = output::run_json(r);
        let loss = r.last_loss.map(|l| format!("{l:.4}")).unwrap_or_else(|| "-".into());
        let dur = v["duration_s"].as_f64().unwrap_or(0.0);
        // A resumed run's parent and the step it took over from (`-` for a fresh run).
        // A run started from another's weights: `from RUN@STEP`.
        let parent = match (&r.parent, &r.resumed_from, &r.init_from) {
            (Some(p), Some(from), _) => format!("{p}@{}", from.step),
            (Some(p), None, Some(init)) => format!("from {p}@{}", init.step),
            (Some(p), None, None) => p.to_string(),
            (None, _, Some(init)) => format!("from {}", init.path),
            (None, _, None) => "-".into(),
        };
        println!(
            "{:<22} {:<11} {:<16} {:>5} {:>11} {:>9} {:>8.0}s  {parent}",
            r.id.as_str(),
            r.status.name(),
            truncate(&r.name, 16),
            r.world_size,
            format!("{}/{}", r.step, r.steps_planned),
            loss,
            dur
        );
    }
    Ok(0)
}

fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        s.chars().take(n - 1).chain(['…']).collect()
    }
}

/// The cockpit on one run, once the server knows it: an unknown run is refused like `show`'s,
/// before the terminal is taken over.
pub async fn attach(db: &DbPaths, run: &str, headless: bool) -> anyhow::Result<i32> {
    let id = match ask(db, Request::ShowRun { run: run.into() }).await? {
        Ok(Reply::Run { detail }) => detail.run.id,
        Ok(other) => anyhow::bail!("unexpected reply: {other:?}"),
        Err(m) => return refused(&m),
    };
    if headless {
        let client = crate::client::Client::connect(db).await?;
        return super::run::follow(db, client, &id).await;
    }
    crate::ui::run(db, crate::ui::Start::Open(id.to_string())).await
}

/// The eval's metric (`worker::eval`), which `show` summarises.
const EVAL_METRIC: &str = "eval/exact_match";

pub async fn show(db: &DbPaths, run: &str, json: bool) -> anyhow::Result<i32> {
    let d: RunDetail = match ask(db, Request::ShowRun { run: run.into() }).await? {
        Ok(Reply::Run { detail }) => *detail,
        Ok(other) => anyhow::bail!("unexpected reply: {other:?}"),
        Err(m) => return refused(&m),
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&output::show_json(&d))?);
        return Ok(0);
    }
    let r = &d.run;
    println!("run      {} ({})", r.id, r.name);
    println!("recipe   {} ({})", r.recipe_name, r.recipe_path);
    if let Some(p) = &r.sweep {
        println!("sweep    {} point {} (`flightdeck queue --all` lists its points)", p.sweep, p.point + 1);
    }
    println!(
        "status   {}{}",
        r.status.name(),
        if r.reason.is_empty() { String::new() } else { format!(": {}", r.reason) }
    );
    println!("world    {} on {}", r.world_size, r.hosts.join(", "));
    println!("steps    {}/{}", r.step, r.steps_planned);
    match (&r.parent, &r.resumed_from, &r.init_from) {
        (Some(p), Some(from), _) => {
            println!("lineage  resumed run {p} from its checkpoint step {} ({})", from.step, from.path)
        }
        (_, _, Some(init)) => match &init.run {
            Some(p) => println!("lineage  started from the weights of run {p} at step {} ({})", init.step, init.path),
            None => println!("lineage  started from the weights of {}", init.path),
        },
        _ => {}
    }
    if !d.attempts.is_empty() {
        println!("attempts {} ({} restarts by recovery)", d.attempts.len(), d.attempts.len() - 1);
        for (i, a) in d.attempts.iter().enumerate() {
            let why = match (&a.restart, a.resumed_from) {
                (Some(r), Some(from)) => {
                    format!(" (restart {} after a {}, from step {from})", r.attempt, r.cause.name())
                }
                _ => String::new(),
            };
            println!("  {} {} {} at step {}{why}: {}", i + 1, a.run, a.status.name(), a.step, a.reason);
        }
    }
    if let Some(g) = &d.goodput {
        let s = |ms: f64| format!("{:.1} s", ms / 1000.0);
        println!(
            "goodput  {:.1} % of {}: productive {}, failed {}, checkpoints {}, stalled {}, restart waits {}, other {}",
            100.0 * g.ratio,
            s(g.wall_ms),
            s(g.productive_ms),
            s(g.failed_ms),
            s(g.checkpoint_ms),
            s(g.stalled_ms),
            s(g.restart_wait_ms),
            s(g.other_ms)
        );
    }
    if d.metrics.iter().any(|m| m == EVAL_METRIC) {
        let points =
            match ask(db, Request::Metrics { run: r.id.to_string(), key: Some(EVAL_METRIC.into()), rank: Some(0) })
                .await?
            {
                Ok(Reply::Metrics { points }) => points,
                _ => Vec::new(),
            };
        if let (Some(first), Some(last)) = (points.first(), points.last()) {
            println!(
                "eval     exact match {:.3} at step {} → {:.3} at step {} ({} evals)",
                first.value,
                first.step,
                last.value,
                last.step,
                points.len()
            );
        }
    }
    let s = &d.summary;
    let f = |x: Option<f64>, unit: &str| x.map(|v| format!("{v:.4}{unit}")).unwrap_or_else(|| "-".into());
    println!("loss     first 10 steps {} → last 10 steps {}", f(s.loss_first10_mean, ""), f(s.loss_last10_mean, ""));
    let ms = s.step_time_ms_median.map(|v| format!("{v:.1} ms")).unwrap_or_else(|| "-".into());
    let tps = s.tokens_per_s.map(|v| format!("{v:.0}")).unwrap_or_else(|| "-".into());
    println!("speed    {ms} median step, {tps} tokens/s (all ranks)");
    println!("\nranks");
    for k in &d.ranks {
        let exit = k.exit.as_ref().map(|e| e.describe()).unwrap_or_else(|| "running".into());
        let phase = k.phase.map(|p| p.name()).unwrap_or("-");
        println!(
            "  rank {:<3} {:<10} pid {:<8} step {:<6} phase {:<5} {}",
            k.rank,
            k.host,
            k.pid.unwrap_or(0),
            k.step,
            phase,
            exit
        );
    }
    println!("\nevents");
    for e in &d.events {
        let (y, mo, day, h, mi, sec) = crate::ids::civil_from_unix((e.t_ms / 1000) as i64);
        println!("  {y:04}-{mo:02}-{day:02} {h:02}:{mi:02}:{sec:02}  {}", e.text);
    }
    println!("\nmetrics  {}", d.metrics.join(", "));
    if !d.verdicts.is_empty() {
        println!("\nverdicts");
        for v in &d.verdicts {
            println!("  {}: {}", v.verdict.kind.name(), v.verdict.summary);
            if let Some(p) = &v.report_path {
                println!("    incident report: {p}");
            }
        }
    }
    Ok(0)
}

pub async fn metrics(db: &DbPaths, args: MetricsArgs) -> anyhow::Result<i32> {
    let key = args.key.clone();
    let req = Request::Metrics { run: args.run.clone(), key: Some(key.clone()), rank: args.rank };
    let points = match ask(db, req).await? {
        Ok(Reply::Metrics { points }) => points,
        Ok(other) => anyhow::bail!("unexpected reply: {other:?}"),
        Err(m) => return refused(&m),
    };
    if points.is_empty() {
        // A metric the run has never reported is bad input; a known one can be empty for now
        // (a live run's first step, or a rank with no points of it).
        let known = match ask(db, Request::ShowRun { run: args.run.clone() }).await? {
            Ok(Reply::Run { detail }) => detail.metrics,
            Ok(other) => anyhow::bail!("unexpected reply: {other:?}"),
            Err(m) => return refused(&m),
        };
        if !known.contains(&key) {
            return refused(&format!("run {} has no metric {key:?}; its metrics: {}", args.run, known.join(", ")));
        }
        eprintln!("flightdeck: run {} has no points of {key:?} yet", args.run);
    }
    let mut sorted = points;
    sorted.sort_by_key(|p| (p.step, p.rank));
    let mut out = String::new();
    match args.format {
        Format::Csv => {
            out.push_str("step,rank,value\n");
            for p in &sorted {
                out.push_str(&format!("{},{},{}\n", p.step, p.rank, p.value));
            }
        }
        Format::Jsonl => {
            for p in &sorted {
                let line = serde_json::json!({"step": p.step, "rank": p.rank, "key": key, "value": p.value});
                out.push_str(&line.to_string());
                out.push('\n');
            }
        }
    }
    print!("{out}");
    Ok(0)
}

/// `stop` / `kill`: the run is named as the server names it (a name: its one live run; several
/// live runs of one name are refused), and the reply says which id was taken.
pub async fn stop_or_kill(db: &DbPaths, run: &str, kill: bool) -> anyhow::Result<i32> {
    let runs = match ask(db, Request::ListRuns).await? {
        Ok(Reply::Runs { runs }) => runs,
        Ok(other) => anyhow::bail!("unexpected reply to a list of runs: {other:?}"),
        Err(m) => return refused(&m),
    };
    let id = match crate::store::db::pick(&runs, run, crate::store::db::Pick::Live) {
        Ok(id) => id,
        Err(e) => return refused(&e.to_string()),
    };
    let req = if kill { Request::Kill { run: id.0.clone() } } else { Request::Stop { run: id.0.clone() } };
    match ask(db, req).await? {
        Ok(_) => {
            let named = if id.0 == run { String::new() } else { format!(" ({run})") };
            println!("{} sent to run {id}{named}", if kill { "kill" } else { "stop" });
            Ok(0)
        }
        Err(m) => refused(&m),
    }
}
