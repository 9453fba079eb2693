//! `flightdeck agent slurm`: the agent's start on a compute node, as srun's task. It takes the
//! run's spec from the step's environment, makes it this node's (its name, index, ranks, and
//! whether it hosts the rendezvous store), writes it into a private run directory on the node,
//! and runs the agent in the foreground: the agent is the step's task, so Slurm tracks it and
//! its ranks, and cancelling the step takes all of them down.
use super::agents::{OFFSET_ENV, SPEC_ENV};
use crate::paths::RunDirPaths;
use crate::protocol::spec::AgentSpec;
use anyhow::Context;
use std::path::PathBuf;

/// This node's spec from the run's: the node's index is the step's offset plus Slurm's node id.
pub fn node_spec(template: &AgentSpec, node: &str, index: u32) -> AgentSpec {
    let mut spec = template.clone();
    spec.node = node.to_string();
    spec.ranks = AgentSpec::node_ranks(index, template.recipe.cluster.ranks_per_node.max(1), template.world_size);
    spec.host_store = index == 0;
    spec.listen_tcp = Some("0.0.0.0".into());
    spec
}

/// The node's run directory: `cluster.remote_dir` (relative: under the home directory) /runs/
/// RUN/NODE (the node's name keeps nodes apart on a shared home).
pub fn run_dir(remote_dir: &str, run: &crate::ids::RunId, node: &str) -> PathBuf {
    base_dir(remote_dir).join("runs").join(run.as_str()).join(node)
}

/// `cluster.remote_dir` on a node: as given when absolute, else under the home directory.
pub fn base_dir(remote_dir: &str) -> PathBuf {
    let base = PathBuf::from(remote_dir);
    if base.is_absolute() {
        base
    } else {
        std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/tmp")).join(base)
    }
}

pub fn main() -> anyhow::Result<()> {
    let text = std::env::var(SPEC_ENV).with_context(|| {
        format!("{SPEC_ENV} is not set: `flightdeck agent slurm` is started by the Slurm launcher, through srun")
    })?;
    // The spec holds the run's secret: the ranks must not inherit it.
    std::env::remove_var(SPEC_ENV);
    let template: AgentSpec = serde_json::from_str(&text).with_context(|| format!("parsing {SPEC_ENV}"))?;
    let number = |name: &str| -> anyhow::Result<u32> {
        let v = std::env::var(name).with_context(|| format!("{name} is not set (not started by srun?)"))?;
        v.trim().parse().with_context(|| format!("{name}={v:?} is not a number"))
    };
    let index = number(OFFSET_ENV)? + number("SLURM_NODEID")?;
    let node = std::env::var("SLURMD_NODENAME").context("SLURMD_NODENAME is not set (not started by srun?)")?;
    let spec = node_spec(&template, &node, index);
    let dir = run_dir(&template.recipe.cluster.ssh.remote_dir, &template.run, &node);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let paths = RunDirPaths::new(dir.clone());
    std::fs::write(dir.join("recipe.json"), serde_json::to_vec_pretty(&spec.recipe)?)?;
    // Private by the process's umask (077, `private_files::restrict`).
    std::fs::write(paths.spec(), serde_json::to_vec_pretty(&spec)?)
        .with_context(|| format!("writing {}", paths.spec().display()))?;
    crate::agent::main(dir)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::Rank;

    #[test]
    fn each_node_gets_its_block_of_ranks_and_only_node_0_hosts_the_store() {
        let recipe = crate::recipe::parse_str(
            "name = \"t\"\nkind = \"command\"\n[command]\nargv = [\"true\"]\n[cluster]\nlauncher = \"slurm\"\nnodes = 3\nranks_per_node = 2\n[parallel]\ndata = 5\n",
            "t.toml",
            &[],
        )
        .expect("recipe");
        let template = AgentSpec {
            run: crate::ids::RunId("r".into()),
            node: String::new(),
            ranks: Vec::new(),
            world_size: 5,
            master_addr: "10.0.0.1".into(),
            master_port: 0,
            program_port: 0,
            host_store: false,
            recipe,
            exe: "/bin/flightdeck".into(),
            stop_grace_ms: 1,
            save_grace_ms: 1,
            resume_from: None,
            init_from: None,
            secret: crate::collective::auth::RunSecret::generate().expect("secret"),
            listen_tcp: None,
        };
        let n0 = node_spec(&template, "gpu-a", 0);
        assert!(n0.host_store && n0.listen_tcp.is_some());
        assert_eq!(n0.ranks, vec![(Rank(0), 0), (Rank(1), 1)]);
        let n2 = node_spec(&template, "gpu-c", 2);
        assert!(!n2.host_store);
        assert_eq!(
            (n2.node.as_str(), n2.ranks.clone()),
            ("gpu-c", vec![(Rank(4), 0)]),
            "the last node's block is cut at the world size"
        );
        assert!(run_dir(".flightdeck", &template.run, "gpu-c").ends_with(".flightdeck/runs/r/gpu-c"));
        assert_eq!(run_dir("/scratch/fd", &template.run, "gpu-c"), PathBuf::from("/scratch/fd/runs/r/gpu-c"));
    }
}
