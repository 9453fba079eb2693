//! `flightdeck stacks RUN [--rank R] [--native] [--json]`: the live ranks' stacks, identical ones grouped.
use super::EXIT_BAD_INPUT;
use crate::client::Client;
use crate::paths::DbPaths;
use crate::protocol::{Reply, Request, StackReport};

#[derive(clap::Args, Debug)]
pub struct StacksArgs {
    /// The run: full id, unique prefix, or name.
    pub run: String,
    /// Only this rank.
    #[arg(long)]
    pub rank: Option<u32>,
    /// Python ranks' C/C++ frames too (py-spy --native), interleaved with the Python ones:
    /// where a rank waits inside libtorch or a C extension. Native ranks always have them.
    #[arg(long)]
    pub native: bool,
    /// The report as JSON (groups, failures, per-rank timings).
    #[arg(long)]
    pub json: bool,
}

pub async fn stacks(db: &DbPaths, args: StacksArgs) -> anyhow::Result<i32> {
    let mut client = Client::connect(db).await?;
    let report: StackReport =
        match client.request(&Request::Stacks { run: args.run.clone(), rank: args.rank, native: args.native }).await? {
            Reply::Stacks(r) => *r,
            Reply::Error { message } => {
                eprintln!("flightdeck: {message}");
                return Ok(EXIT_BAD_INPUT);
            }
            other => anyhow::bail!("unexpected reply: {other:?}"),
        };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", text(&report));
    }
    // Stacks of some ranks but not all still answer the question; none at all does not.
    Ok(if report.groups.is_empty() { super::EXIT_FAILURE } else { 0 })
}

/// Groups largest first, so the odd rank out comes last and stands apart.
pub fn text(r: &StackReport) -> String {
    let mut out = String::new();
    let timings: Vec<String> = r
        .timings
        .iter()
        .map(|(rank, pid, tool, ms)| format!("rank {rank} (pid {pid}) {} {ms} ms", tool.map_or("-", |t| t.name())))
        .collect();
    out.push_str(&format!("run {}: {} group(s); {}\n", r.run, r.groups.len(), timings.join(", ")));
    for g in &r.groups {
        let ranks: Vec<String> = g.ranks.iter().map(u32::to_string).collect();
        out.push_str(&format!("\n== {} {} ==\n", if g.ranks.len() == 1 { "rank" } else { "ranks" }, ranks.join(",")));
        for t in &g.threads {
            out.push_str(&format!(
                "thread {}{}\n",
                t.tid,
                t.name.as_ref().map(|n| format!(" \"{n}\"")).unwrap_or_default()
            ));
            for (i, f) in t.frames.iter().enumerate() {
                let at = f.location.as_ref().map(|l| format!("  at {l}")).unwrap_or_default();
                out.push_str(&format!("  #{i:<2} {}{at}\n", f.function));
            }
        }
    }
    for (rank, why) in &r.failures {
        out.push_str(&format!("\nrank {rank}: no stacks: {why}\n"));
    }
    out
}
