//! `fdbench`: the Flightdeck side of `make bench`, one subcommand per role a driver starts.
//!
//! The drivers in `benches/driver/` start these as separate processes (as the Python references
//! are), time what they report, and print the tables. Run by hand with
//! `cargo bench --bench fdbench -- SUBCOMMAND ...`; every subcommand prints one JSON object per
//! line on stdout.
// As src/lib.rs, no `unwrap`; unconditional, since cargo builds bench targets with cfg(test).
#![deny(clippy::unwrap_used)]
mod allreduce;
mod charts;
mod fanout;
mod generate;
mod handshake;
mod history;
mod roles;
mod slurm_scale;
mod tables;

use anyhow::{bail, Context};

const USAGE: &str = "usage: fdbench SUBCOMMAND [ARGS]
  recipe FILE [--set k=v]...        the validated recipe as JSON (the worker's FLIGHTDECK_RECIPE)
  store-host                        a rendezvous store on 127.0.0.1; prints its port, serves until stdin closes
  arith SEED FIRST COUNT LEN        synthetic:arith sequences, for checking the Python port
  allreduce SIZES_BYTES MIN_ITERS MAX_ITERS BUDGET_BYTES
                                    one rank of the ring all-reduce benchmark (torchrun env)
  memcpy SIZES_BYTES MIN_ITERS MAX_ITERS BUDGET_BYTES
                                    one core copying buffers of each size: the all-reduce's limit
  history-write DIR RANKS STEPS     one run's metrics into a fresh store through the store writer
  history-load DIR COLUMNS          reopen, read loss for every rank, draw the chart from rollups
  fanout SSH_CONFIG HOSTS COMMAND   COMMAND on every host (comma-separated aliases) over ssh2, in parallel
  handshake ROUNDS                  ring forming and store latency without and with the run secret
  generate RECIPE_JSON THREADS REPS PROMPTS PROMPT_LEN NEW_TOKENS
                                    GRPO sampling: PROMPTS groups of group_size rows per repetition
  generate-split (the same)         the same loop's time per position: forward, logits to host, pick
  slurm-scale FD_BIN NODES RANKS_PER_NODE STEPS_PER_S SECS REPS
                                    light ranks through a fake Slurm: Flightdeck's launch, ingest,
                                    server and cockpit against srun alone (benches/fdbench/slurm_scale.rs)
  charts DOC OUT_DIR                DOC's tables (docs/benchmarks.md) as charts: OUT_DIR/ratios and
                                    OUT_DIR/allreduce_busbw, each .svg and .png";

fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| a != "--bench").collect();
    if let Err(e) = run(&args) {
        eprintln!("fdbench: {e:#}");
        std::process::exit(2);
    }
}

fn run(args: &[String]) -> anyhow::Result<()> {
    let Some((cmd, rest)) = args.split_first() else {
        // `cargo bench` with no arguments: nothing to measure on its own; say how to.
        println!("{USAGE}\n(`make bench` runs every benchmark with its reference)");
        return Ok(());
    };
    match cmd.as_str() {
        "recipe" => roles::recipe(rest),
        "store-host" => roles::store_host(),
        "arith" => roles::arith(&numbers(rest, 4, "arith SEED FIRST COUNT LEN")?),
        "allreduce" => {
            let [sizes, min_iters, max_iters, budget] = rest else {
                bail!("allreduce takes SIZES_BYTES (comma-separated) MIN_ITERS MAX_ITERS BUDGET_BYTES\n{USAGE}");
            };
            let sizes = sizes.split(',').map(|s| parse_u64(s, "SIZES_BYTES")).collect::<Result<Vec<_>, _>>()?;
            let iters = (parse_u64(min_iters, "MIN_ITERS")?, parse_u64(max_iters, "MAX_ITERS")?);
            allreduce::main(&sizes, iters, parse_u64(budget, "BUDGET_BYTES")?)
        }
        "memcpy" => {
            let [sizes, min_iters, max_iters, budget] = rest else {
                bail!("memcpy takes SIZES_BYTES (comma-separated) MIN_ITERS MAX_ITERS BUDGET_BYTES\n{USAGE}");
            };
            let sizes = sizes.split(',').map(|s| parse_u64(s, "SIZES_BYTES")).collect::<Result<Vec<_>, _>>()?;
            let iters = (parse_u64(min_iters, "MIN_ITERS")?, parse_u64(max_iters, "MAX_ITERS")?);
            allreduce::memcpy(&sizes, iters, parse_u64(budget, "BUDGET_BYTES")?);
            Ok(())
        }
        "history-write" => {
            let [dir, ranks, steps] = rest else { bail!("history-write takes DIR RANKS STEPS\n{USAGE}") };
            history::write(dir.as_ref(), parse_u64(ranks, "RANKS")? as u32, parse_u64(steps, "STEPS")?)
        }
        "history-load" => {
            let [dir, columns] = rest else { bail!("history-load takes DIR COLUMNS\n{USAGE}") };
            history::load(dir.as_ref(), parse_u64(columns, "COLUMNS")? as usize)
        }
        "fanout" => {
            let [config, hosts, command] = rest else { bail!("fanout takes SSH_CONFIG HOSTS COMMAND\n{USAGE}") };
            let hosts: Vec<String> = hosts.split(',').map(str::to_string).collect();
            fanout::main(config.as_ref(), &hosts, command)
        }
        "handshake" => handshake::main(numbers(rest, 1, "handshake ROUNDS")?[0]),
        "slurm-scale" => {
            let usage = "slurm-scale FD_BIN NODES RANKS_PER_NODE STEPS_PER_S SECS REPS";
            let [bin, nodes, per_node, rate, secs, reps] = rest else { bail!("expected {usage}\n{USAGE}") };
            slurm_scale::main(&slurm_scale::Args {
                fd_bin: std::fs::canonicalize(bin).with_context(|| format!("FD_BIN {bin}"))?,
                nodes: parse_u64(nodes, "NODES")? as usize,
                ranks_per_node: parse_u64(per_node, "RANKS_PER_NODE")? as usize,
                steps_per_s: rate.parse().with_context(|| format!("STEPS_PER_S: {rate:?} is not a number"))?,
                secs: parse_u64(secs, "SECS")?,
                reps: parse_u64(reps, "REPS")? as usize,
            })
        }
        "generate" | "generate-split" => {
            let Some((recipe, n)) = rest.split_first() else {
                bail!("{cmd} takes RECIPE_JSON THREADS REPS PROMPTS PROMPT_LEN NEW_TOKENS\n{USAGE}");
            };
            let n = numbers(n, 5, "generate RECIPE_JSON THREADS REPS PROMPTS PROMPT_LEN NEW_TOKENS")?;
            let shape = generate::Shape {
                threads: i32::try_from(n[0]).context("THREADS")?,
                reps: n[1],
                prompts: n[2],
                prompt_len: n[3] as usize,
                new_tokens: u32::try_from(n[4]).context("NEW_TOKENS")?,
            };
            match cmd.as_str() {
                "generate" => generate::main(recipe.as_ref(), &shape),
                _ => generate::split(recipe.as_ref(), &shape),
            }
        }
        "charts" => {
            let [doc, out] = rest else { bail!("charts takes DOC OUT_DIR\n{USAGE}") };
            charts::main(doc.as_ref(), out.as_ref())
        }
        other => bail!("unknown subcommand {other:?}\n{USAGE}"),
    }
}

fn parse_u64(s: &str, what: &str) -> anyhow::Result<u64> {
    s.trim().parse().with_context(|| format!("{what}: {s:?} is not a whole number ≥ 0"))
}

fn numbers(args: &[String], n: usize, usage: &str) -> anyhow::Result<Vec<u64>> {
    if args.len() != n {
        bail!("expected {usage}\n{USAGE}");
    }
    args.iter().map(|a| parse_u64(a, usage)).collect()
}
