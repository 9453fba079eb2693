//! `flightdeck doctor --hosts ...`: every node checked in parallel over SSH, one table.
//!
//! Per node: reachable (TCP + SSH handshake + host key), auth, the binary (deployed if missing,
//! as a launch would), then the node's own `flightdeck doctor --json` for libtorch, NVML, GPUs,
//! free ports and free disk under the remote directory.
use super::doctor::DoctorArgs;
use super::EXIT_FAILURE;
use crate::recipe::ClusterSsh;
use crate::ssh::deploy::{self, Deployed};
use crate::ssh::{config, fanout, session, Limits, SshError};

/// The table's columns after HOST, in order.
const COLUMNS: [&str; 8] = ["reach", "auth", "binary", "libtorch", "nvml", "gpus", "ports", "disk"];

/// Without --recipe: a stand-in recipe that only carries `--hosts` (or `--slurm`) and `--set`
/// cluster keys.
pub(super) const DOCTOR_RECIPE: &str = "name = \"doctor\"\nkind = \"command\"\n[command]\nargv = [\"true\"]\n";

/// One cell: state (`ok`, `warn`, `FAIL`, `-` = not reached) and its detail.
type Cell = (String, String);

pub fn run(args: DoctorArgs) -> anyhow::Result<i32> {
    let (hosts, cluster) = settings(&args)?;
    let mut limits = Limits {
        connect: std::time::Duration::from_secs(cluster.connect_timeout_s),
        command: std::time::Duration::from_secs(cluster.command_timeout_s),
        link: std::time::Duration::from_secs(cluster.link_timeout_s),
        accept_new: cluster.accept_new_host_keys,
    };
    limits.accept_new |= args.accept_new_host_keys;
    let rows = fanout::each(hosts.len(), |i| check_host(&hosts[i], &cluster, &limits));
    let width = hosts.iter().map(String::len).max().unwrap_or(4).max(4);
    print!("{:<width$}", "HOST");
    for c in COLUMNS {
        print!("  {c:<8}");
    }
    println!();
    for (host, row) in hosts.iter().zip(&rows) {
        print!("{host:<width$}");
        for (state, _) in row {
            print!("  {state:<8}");
        }
        println!();
    }
    let mut failed = false;
    for (host, row) in hosts.iter().zip(&rows) {
        for (name, (state, detail)) in COLUMNS.iter().zip(row) {
            failed |= state == "FAIL";
            if state != "ok" && !detail.is_empty() {
                println!("{host} {name}: {detail}");
            }
        }
    }
    Ok(if failed { EXIT_FAILURE } else { 0 })
}

/// The hosts and the `[cluster]` settings: from the recipe (when given) and the flags.
fn settings(args: &DoctorArgs) -> anyhow::Result<(Vec<String>, ClusterSsh)> {
    let mut overrides = args.overrides.clone();
    if !args.hosts.is_empty() {
        let quoted: Vec<String> = args.hosts.iter().map(|h| format!("{h:?}")).collect();
        overrides.push(format!("cluster.hosts=[{}]", quoted.join(",")));
    }
    let recipe = match &args.recipe {
        Some(path) => crate::recipe::load_file(path, &overrides)?,
        None => crate::recipe::parse_str(DOCTOR_RECIPE, "doctor --hosts", &overrides)?,
    };
    let hosts: Vec<String> = recipe.cluster.hosts.iter().filter(|h| *h != "local").cloned().collect();
    if hosts.is_empty() {
        anyhow::bail!("doctor --hosts needs SSH hosts (e.g. --hosts node-a,user@node-b:2222); for this machine run `flightdeck doctor`");
    }
    Ok((hosts, recipe.cluster.ssh))
}

fn cell(state: &str, detail: impl Into<String>) -> Cell {
    (state.to_string(), detail.into())
}

fn check_host(spec: &str, cluster: &ClusterSsh, limits: &Limits) -> Vec<Cell> {
    let mut row: Vec<Cell> = COLUMNS.iter().map(|_| cell("-", "")).collect();
    let target = match config::resolve(
        spec,
        cluster.ssh_config.as_deref().map(std::path::Path::new),
        &config::ClientEnv::from_env(),
    ) {
        Ok(t) => t,
        Err(e) => {
            row[0] = cell("FAIL", e.to_string());
            return row;
        }
    };
    let node = match session::connect(&target, limits) {
        Ok(n) => n,
        Err(e @ SshError::Auth { .. }) => {
            row[0] = cell("ok", "");
            row[1] = cell("FAIL", e.to_string());
            return row;
        }
        Err(e) => {
            row[0] = cell("FAIL", e.to_string());
            return row;
        }
    };
    row[0] = cell("ok", "");
    row[1] = cell("ok", node.auth.clone());
    let layout = match deploy::probe(&node, &cluster.remote_dir, cluster.libtorch.as_deref()) {
        Ok(l) => l,
        Err(e) => {
            row[2] = cell("FAIL", e.to_string());
            return row;
        }
    };
    let tag = format!("doctor-{}", std::process::id());
    match deploy::deploy(&node, &layout, &tag) {
        Ok(Deployed::Present) => row[2] = cell("ok", format!("present at {}", layout.exe)),
        Ok(Deployed::Uploaded { .. }) => row[2] = cell("ok", format!("installed at {}", layout.exe)),
        Err(e) => {
            row[2] = cell("FAIL", e.to_string());
            return row;
        }
    }
    let cmd = layout.command(&[("", "--db"), ("cluster.remote_dir", &layout.root), ("", "doctor"), ("", "--json")]);
    let out = cmd.and_then(|c| node.run("running doctor on the node", &c, None));
    let out = match out {
        Ok(o) => o,
        Err(e) => {
            row[3] = cell("FAIL", e.to_string());
            return row;
        }
    };
    let parsed: Option<serde_json::Value> = serde_json::from_str(out.stdout.trim()).ok();
    let Some(checks) = parsed.as_ref().and_then(|v| v["checks"].as_array()) else {
        // The binary could not even start: most often libtorch is not where the binary looks.
        let why = out.stderr.trim().lines().last().unwrap_or("no output").to_string();
        row[3] = cell("FAIL", format!("the binary does not run on the node ({why}); set cluster.libtorch"));
        return row;
    };
    for (i, name) in COLUMNS.iter().enumerate().skip(3) {
        let found = checks.iter().find(|c| c["name"] == *name);
        row[i] = match found {
            Some(c) => cell(c["state"].as_str().unwrap_or("?"), c["detail"].as_str().unwrap_or("")),
            None => cell("?", "the node's doctor has no such check"),
        };
    }
    row
}
