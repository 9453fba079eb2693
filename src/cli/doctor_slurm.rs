//! `flightdeck doctor --slurm`: can runs launch through this Slurm? One line per check, in the
//! order a launch needs them: the client commands, the controller, the partition (the recipe's
//! or the cluster's default) and its nodes, the allocation the client sits in (if any), and a
//! 1-node test step that runs this binary's own `doctor --json` on a compute node.
//!
//! Everything runs in the client's Slurm environment (`SLURM_CONF`, `SLURM_JOB_ID`), as a
//! launch's commands do.
use super::doctor::{self, Check, Level};
use super::doctor_hosts::DOCTOR_RECIPE;
use crate::protocol::spec::ClientEnv;
use crate::slurm::{Slurm, SlurmError};
use std::process::Stdio;
use std::time::{Duration, Instant};

/// The commands a launch uses: sbatch (or the user's job), srun, squeue, scancel, scontrol, sinfo.
const COMMANDS: [&str; 6] = ["sinfo", "sbatch", "srun", "squeue", "scancel", "scontrol"];
/// How long the test step may take, waiting for a node included (`srun --immediate`).
const STEP_LIMIT: Duration = Duration::from_secs(120);
const STEP_WAIT_S: u64 = 60;
/// How long `scontrol ping` may take.
const CLIENT_LIMIT: Duration = Duration::from_secs(30);

pub fn run(args: super::doctor::DoctorArgs) -> anyhow::Result<i32> {
    let recipe = match &args.recipe {
        Some(path) => crate::recipe::load_file(path, &args.overrides)?,
        None => {
            let mut overrides = vec!["cluster.launcher=slurm".to_string()];
            overrides.extend(args.overrides.iter().cloned());
            crate::recipe::parse_str(DOCTOR_RECIPE, "doctor --slurm", &overrides)?
        }
    };
    if !recipe.is_slurm() {
        anyhow::bail!(
            "{}: the recipe launches through SSH hosts, not Slurm; give it `cluster.launcher = \"slurm\"` \
             (or --set cluster.launcher=slurm)",
            args.recipe.as_ref().map(|p| p.display().to_string()).unwrap_or_default()
        );
    }
    let slurm = Slurm::of(&ClientEnv::from_env());
    Ok(doctor::print(&checks(&slurm, &recipe), args.json))
}

/// Every check; later ones are skipped (with why) once one that they need failed.
fn checks(slurm: &Slurm, recipe: &crate::recipe::Recipe) -> Vec<Check> {
    let s = &recipe.cluster.slurm;
    let mut out = vec![commands()];
    if out[0].level == Level::Fail {
        return out;
    }
    out.push(controller(slurm));
    if out[1].level == Level::Fail {
        return out;
    }
    let job = s.slurm_job.clone().or_else(|| slurm.client_job.clone());
    let part = partition(slurm, s.partition.as_deref(), s.nodes);
    let part_failed = part.iter().any(|c| c.level == Level::Fail);
    out.extend(part);
    let mut job_failed = false;
    if let Some(job) = &job {
        let check = allocation(slurm, job);
        job_failed = check.level == Level::Fail;
        out.push(check);
    }
    // Inside a running job the step goes there, whatever the partition says.
    if job_failed || part_failed && job.is_none() {
        return out;
    }
    out.extend(step(slurm, recipe, job.as_deref()));
    out
}

fn commands() -> Check {
    let missing: Vec<&str> = COMMANDS.into_iter().filter(|c| !doctor::on_path(c)).collect();
    if !missing.is_empty() {
        let detail =
            format!("not on PATH: {}; install Slurm's client commands (Debian: slurm-client)", missing.join(", "));
        return Check { name: "commands", level: Level::Fail, detail };
    }
    Check { name: "commands", level: Level::Ok, detail: COMMANDS.join(", ") }
}

/// `scontrol ping`, bounded: Slurm's clients retry a missing config or a silent controller for a
/// minute before they give up.
fn controller(slurm: &Slurm) -> Check {
    let fail = |detail: String| Check { name: "controller", level: Level::Fail, detail };
    if let Some(conf) = slurm.conf.as_ref().filter(|c| !c.exists()) {
        return fail(format!("SLURM_CONF={}: no such file; point it at the cluster's slurm.conf", conf.display()));
    }
    let conf = slurm.conf.as_ref().map(|c| format!(", SLURM_CONF={}", c.display())).unwrap_or_default();
    let mut cmd = slurm.command("scontrol");
    cmd.arg("ping").stdout(Stdio::piped()).stderr(Stdio::piped());
    let out = match run_bounded(cmd, CLIENT_LIMIT, "scontrol ping") {
        Ok(out) => out,
        Err(why) => return fail(format!("{why}{conf}")),
    };
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    if !out.status.success() || !stdout.contains("is UP") {
        let said = if stdout.trim().is_empty() { first_line(&stderr) } else { first_line(&stdout) };
        return fail(format!("{said}{conf}: launches cannot allocate nodes"));
    }
    let version = slurm.run("sinfo", &["--version"]).map(|v| v.trim().to_string()).unwrap_or_default();
    Check { name: "controller", level: Level::Ok, detail: format!("{} ({version}{conf})", first_line(&stdout)) }
}

/// The partition launches go to, and whether it has `nodes` usable nodes.
fn partition(slurm: &Slurm, wanted: Option<&str>, nodes: u32) -> Vec<Check> {
    let text = match slurm.run("sinfo", &["-h", "-o", SINFO_FORMAT]) {
        Ok(t) => t,
        Err(e) => return vec![Check { name: "partition", level: Level::Fail, detail: one_line(&e) }],
    };
    judge_partition(&partitions(&text), wanted, nodes)
}

/// The partition and nodes lines from sinfo's partitions.
fn judge_partition(parts: &[Partition], wanted: Option<&str>, nodes: u32) -> Vec<Check> {
    let chosen = match wanted {
        Some(name) => parts.iter().find(|p| p.name == name),
        None => parts.iter().find(|p| p.default),
    };
    let Some(p) = chosen else {
        let names: Vec<&str> = parts.iter().map(|p| p.name.as_str()).collect();
        let detail = match wanted {
            Some(name) => format!("no partition {name:?}; the cluster has: {}", names.join(", ")),
            None => format!("no default partition; set cluster.partition to one of: {}", names.join(", ")),
        };
        return vec![Check { name: "partition", level: Level::Fail, detail }];
    };
    let states: Vec<String> = p.states.iter().map(|(state, n)| format!("{n} {state}")).collect();
    let which = if p.default && wanted.is_none() { " (the default)" } else { "" };
    let part = if p.available == "up" {
        let detail = format!("{}{which}: up, {} nodes ({})", p.name, p.total(), states.join(", "));
        Check { name: "partition", level: Level::Ok, detail }
    } else {
        let detail = format!("{}{which} is {}: jobs there do not start", p.name, p.available);
        Check { name: "partition", level: Level::Fail, detail }
    };
    let usable = p.usable();
    let need = format!("the recipe asks for {nodes} (cluster.nodes)");
    let node_check = if nodes > p.total() {
        let detail = format!("{} has {} nodes; {need}", p.name, p.total());
        Check { name: "nodes", level: Level::Fail, detail }
    } else if nodes > usable {
        let detail = format!("{} of {}'s nodes are up (not down or drained); {need}: it would wait", usable, p.name);
        Check { name: "nodes", level: Level::Warn, detail }
    } else {
        Check { name: "nodes", level: Level::Ok, detail: format!("{usable} usable; {need}") }
    };
    vec![part, node_check]
}

/// `partition|availability|nodes|state`, one row per partition and node state.
const SINFO_FORMAT: &str = "%P|%a|%D|%T";

/// One partition as sinfo lists it: its rows' node counts per state.
#[derive(Debug, PartialEq)]
struct Partition {
    name: String,
    default: bool,
    /// `up`, `down`, `drain` or `inact`.
    available: String,
    states: Vec<(String, u32)>,
}

impl Partition {
    fn total(&self) -> u32 {
        self.states.iter().map(|(_, n)| n).sum()
    }

    /// Nodes a job can get: not down, drained, failing or unknown to the controller.
    fn usable(&self) -> u32 {
        const OUT: [&str; 9] =
            ["down", "drained", "draining", "drain", "fail", "failing", "inval", "unknown", "future"];
        let state = |s: &str| s.trim_end_matches(|c: char| !c.is_ascii_alphanumeric()).to_ascii_lowercase();
        self.states.iter().filter(|(s, _)| !OUT.contains(&state(s).as_str())).map(|(_, n)| n).sum()
    }
}

/// sinfo's rows folded into partitions, in its order; rows it cannot read are left out.
fn partitions(text: &str) -> Vec<Partition> {
    let mut out: Vec<Partition> = Vec::new();
    for line in text.lines() {
        let f: Vec<&str> = line.trim().split('|').collect();
        let [name, available, count, state] = f[..] else { continue };
        let Ok(count) = count.parse::<u32>() else { continue };
        let default = name.ends_with('*');
        let name = name.trim_end_matches('*');
        match out.iter_mut().find(|p| p.name == name) {
            Some(p) => p.states.push((state.to_string(), count)),
            None => out.push(Partition {
                name: name.into(),
                default,
                available: available.into(),
                states: vec![(state.to_string(), count)],
            }),
        }
    }
    out
}

/// The allocation runs would use instead of submitting their own.
fn allocation(slurm: &Slurm, job: &str) -> Check {
    match slurm.job(job) {
        Ok(Some(info)) if info.running() => Check {
            name: "job",
            level: Level::Ok,
            detail: format!("runs go into job {job}, running on {}", info.nodes),
        },
        Ok(Some(info)) => Check {
            name: "job",
            level: Level::Fail,
            detail: format!("job {job} (cluster.slurm_job or $SLURM_JOB_ID) is {}, not running", info.state),
        },
        Ok(None) => Check {
            name: "job",
            level: Level::Fail,
            detail: format!("Slurm does not know job {job} (cluster.slurm_job or $SLURM_JOB_ID): it ended?"),
        },
        Err(e) => Check { name: "job", level: Level::Fail, detail: one_line(&e) },
    }
}

/// A 1-node step runs this binary's `doctor --json` on a node, as a launch runs its agents:
/// the step line, then the node's own libtorch, database and disk lines.
fn step(slurm: &Slurm, recipe: &crate::recipe::Recipe, job: Option<&str>) -> Vec<Check> {
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => return vec![Check { name: "step", level: Level::Fail, detail: format!("locating flightdeck: {e}") }],
    };
    let s = &recipe.cluster.slurm;
    let mut cmd = slurm.command("srun");
    cmd.args(["--nodes=1", "--ntasks=1", "--job-name=flightdeck-doctor", "--quiet"]);
    match job {
        Some(job) => {
            cmd.args(["--jobid", job, "--overlap"]);
        }
        None => {
            cmd.arg(format!("--immediate={STEP_WAIT_S}")).arg("--time=5");
            if let Some(p) = &s.partition {
                cmd.arg(format!("--partition={p}"));
            }
            if let Some(a) = &s.account {
                cmd.arg(format!("--account={a}"));
            }
        }
    }
    let db = crate::slurm::node::base_dir(&recipe.cluster.ssh.remote_dir);
    // The node's name first, from the step's own environment, then the binary's checks there.
    cmd.args(["sh", "-c", "printf 'node %s\\n' \"$SLURMD_NODENAME\"; exec \"$0\" \"$@\""])
        .arg(&exe)
        .arg("--db")
        .arg(&db)
        .args(["doctor", "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let started = Instant::now();
    let out = match run_bounded(cmd, STEP_LIMIT, "the 1-node test step") {
        Ok(out) => out,
        Err(why) => {
            let why = format!("{why} (no node free within {STEP_WAIT_S} s, or a node that does not start steps)");
            return vec![Check { name: "step", level: Level::Fail, detail: why }];
        }
    };
    let secs = started.elapsed().as_secs_f64();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let node = stdout.lines().find_map(|l| l.strip_prefix("node ")).unwrap_or("?").trim().to_string();
    let json = stdout.lines().find(|l| l.trim_start().starts_with('{'));
    let parsed: Option<serde_json::Value> = json.and_then(|j| serde_json::from_str(j).ok());
    let Some(report) = parsed else {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let detail = format!(
            "the 1-node test step failed ({}): {}",
            out.status,
            first_line(if stderr.trim().is_empty() { &stdout } else { &stderr })
        );
        return vec![Check { name: "step", level: Level::Fail, detail }];
    };
    let mut checks = vec![Check {
        name: "step",
        level: Level::Ok,
        detail: format!("a 1-node step ran {} on {node} in {secs:.1} s", exe.display()),
    }];
    for name in ["libtorch", "database", "disk"] {
        let found = report["checks"].as_array().and_then(|cs| cs.iter().find(|c| c["name"] == name));
        let Some(c) = found else { continue };
        let level = match c["state"].as_str() {
            Some("ok") => Level::Ok,
            Some("FAIL") => Level::Fail,
            _ => Level::Warn,
        };
        let detail = format!("on {node}: {}", c["detail"].as_str().unwrap_or_default());
        checks.push(Check { name: node_check_name(name), level, detail });
    }
    checks
}

/// The node's lines, told apart from this machine's.
fn node_check_name(name: &str) -> &'static str {
    match name {
        "libtorch" => "node-torch",
        "database" => "node-dir",
        _ => "node-disk",
    }
}

/// Runs `cmd` (`what`, for messages) to its end, or kills it after `limit`.
fn run_bounded(mut cmd: std::process::Command, limit: Duration, what: &str) -> Result<std::process::Output, String> {
    let program = cmd.get_program().to_string_lossy().into_owned();
    let child = cmd.spawn().map_err(|e| one_line(&SlurmError::Spawn { program, source: e }))?;
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(limit) {
        Ok(Ok(out)) => Ok(out),
        Ok(Err(e)) => Err(format!("waiting for {what}: {e}")),
        Err(_) => {
            // SAFETY: kill(2) on the child we started; it has not been reaped (its thread waits).
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            Err(format!("{what} did not finish in {} s", limit.as_secs()))
        }
    }
}

fn first_line(text: &str) -> &str {
    text.lines().map(str::trim).find(|l| !l.is_empty()).unwrap_or("")
}

fn one_line(e: &SlurmError) -> String {
    e.to_string().lines().map(str::trim).collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sinfo_rows_fold_into_partitions_with_usable_nodes() {
        let text = "debug*|up|3|idle\ndebug*|up|1|down*\nbig|down|8|drained\nbig|down|2|mixed\nbad line\n";
        let parts = partitions(text);
        assert_eq!(parts.len(), 2);
        let debug = &parts[0];
        assert!(debug.default && debug.name == "debug" && debug.available == "up");
        assert_eq!((debug.total(), debug.usable()), (4, 3));
        let big = &parts[1];
        assert!(!big.default);
        assert_eq!((big.total(), big.usable()), (10, 2));
    }

    #[test]
    fn a_missing_or_down_partition_and_too_few_nodes_fail_with_what_would_do() {
        let parts = partitions("debug*|up|3|idle\ndebug*|up|1|down\nbig|down|8|idle\n");
        let levels = |c: &[Check]| c.iter().map(|c| (c.name, c.level == Level::Ok)).collect::<Vec<_>>();
        let ok = judge_partition(&parts, None, 3);
        assert_eq!(levels(&ok), [("partition", true), ("nodes", true)]);
        assert!(ok[0].detail.starts_with("debug (the default): up, 4 nodes (3 idle, 1 down)"), "{}", ok[0].detail);
        let missing = judge_partition(&parts, Some("gpu"), 1);
        assert!(missing.len() == 1 && missing[0].level == Level::Fail);
        assert_eq!(missing[0].detail, "no partition \"gpu\"; the cluster has: debug, big");
        let down = judge_partition(&parts, Some("big"), 1);
        assert!(down[0].level == Level::Fail && down[0].detail == "big is down: jobs there do not start");
        let waits = judge_partition(&parts, None, 4);
        assert!(waits[1].level == Level::Warn, "{}", waits[1].detail);
        let too_many = judge_partition(&parts, None, 5);
        assert!(too_many[1].level == Level::Fail, "{}", too_many[1].detail);
        assert_eq!(too_many[1].detail, "debug has 4 nodes; the recipe asks for 5 (cluster.nodes)");
    }
}
