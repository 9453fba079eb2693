//! What a launcher hands each node's agent (`spec.json` in its run directory), and the timing
//! rules both sides share. Every placement (local, SSH, and any later one) writes this one spec.
use crate::ids::{Rank, RunId};
use crate::recipe::Recipe;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// SIGTERM-to-SIGKILL grace when stopping ranks.
pub const STOP_GRACE_MS: u64 = 5000;
/// How long a graceful stop may take (reach a step boundary, snapshot, write the checkpoint)
/// before the agent falls back to SIGTERM: a step and a save of a large model.
pub const SAVE_GRACE_MS: u64 = 120_000;
/// `agent connect`'s exit status when no agent listens: the run's agent has exited, so a
/// launcher must stop reconnecting.
pub const NO_AGENT_EXIT: i32 = 3;

/// What the launcher tells an agent to run, written to `spec.json` in its run directory.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct AgentSpec {
    pub run: RunId,
    /// This node's name as the run's records show it (`local` for the embedded runtime).
    pub node: String,
    /// The global ranks this node runs, with their local ranks.
    pub ranks: Vec<(Rank, u32)>,
    pub world_size: u32,
    /// The rendezvous address every rank uses; this agent hosts the store when `host_store`.
    pub master_addr: String,
    /// The port of the rendezvous store (this agent's when `host_store`): ranks find it as
    /// `FLIGHTDECK_STORE_ADDR`/`FLIGHTDECK_STORE_PORT`.
    pub master_port: u16,
    /// MASTER_PORT for the ranks' own program: a port on MASTER_ADDR that nothing of ours
    /// holds, so `init_process_group`'s env:// rendezvous binds it unchanged. 0: the agent
    /// hosting the store picks a free one.
    #[serde(default)]
    pub program_port: u16,
    pub host_store: bool,
    pub recipe: Recipe,
    /// The executable the ranks run (`flightdeck worker`), normally this very binary.
    pub exe: PathBuf,
    /// SIGTERM, then SIGKILL after this long.
    pub stop_grace_ms: u64,
    /// A graceful stop (SIGUSR1: stop at the next step boundary and save) may take this long
    /// before the ranks get SIGTERM.
    #[serde(default = "default_save_grace_ms")]
    pub save_grace_ms: u64,
    /// A resumed run: the checkpoint directory every rank restores (FLIGHTDECK_RESUME_FROM).
    #[serde(default)]
    pub resume_from: Option<PathBuf>,
    /// `[init] from`, resolved: the checkpoint directory whose weights every rank starts from
    /// (FLIGHTDECK_INIT_FROM).
    #[serde(default)]
    pub init_from: Option<PathBuf>,
    /// The run's secret: every TCP connection of the run proves it (`collective::auth`). This
    /// file is owner-only, and travels over the SSH channel, never on a command line.
    pub secret: crate::collective::auth::RunSecret,
    /// Listen on TCP at this address too (port chosen by the kernel, told in the ready line):
    /// the Slurm placement, whose server reaches agents over the cluster network.
    #[serde(default)]
    pub listen_tcp: Option<String>,
}

impl AgentSpec {
    /// The ranks of node `index` (with their local ranks): nodes hold `per_node` consecutive
    /// ranks each, the last node's block cut at the world size.
    pub fn node_ranks(index: u32, per_node: u32, world: u32) -> Vec<(Rank, u32)> {
        let first = index * per_node;
        (first..(first + per_node).min(world)).map(|r| (Rank(r), r - first)).collect()
    }

    /// This node's place among the run's nodes (torchrun's `GROUP_RANK`): nodes hold
    /// `ranks_per_node` consecutive ranks each, so it is the first rank's block.
    pub fn node_rank(&self) -> u32 {
        let per_node = self.recipe.cluster.ranks_per_node.max(1);
        self.ranks.first().map_or(0, |(rank, _)| rank.0 / per_node)
    }

    /// How many nodes the run has (torchrun's `GROUP_WORLD_SIZE`).
    pub fn nodes(&self) -> u32 {
        self.world_size.div_ceil(self.recipe.cluster.ranks_per_node.max(1))
    }
}

fn default_save_grace_ms() -> u64 {
    SAVE_GRACE_MS
}

/// The environment of the client that asks for a launch: the server acts in it, not in its own
/// (a server started from an earlier login would otherwise use a dead ssh-agent socket, ignore
/// the asking client's `HOME` and `FLIGHTDECK_SSH_CONFIG`, or another cluster's `slurm.conf`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ClientEnv {
    /// The client's home: `~` in the config, the default config, keys and known_hosts.
    pub home: Option<PathBuf>,
    /// The config file the client names (`$FLIGHTDECK_SSH_CONFIG`); None: `~/.ssh/config`.
    pub config: Option<PathBuf>,
    /// The client's ssh-agent (`$SSH_AUTH_SOCK`).
    pub agent_socket: Option<PathBuf>,
    /// `$SLURM_CONF`: the Slurm the client uses; None: Slurm's own default.
    #[serde(default)]
    pub slurm_conf: Option<PathBuf>,
    /// `$SLURM_JOB_ID`: the allocation the client runs inside (`salloc`), if any.
    #[serde(default)]
    pub slurm_job: Option<String>,
}

impl ClientEnv {
    /// The environment variable naming the config file to use instead of `~/.ssh/config`.
    pub const CONFIG_ENV: &'static str = "FLIGHTDECK_SSH_CONFIG";

    /// This process's environment.
    pub fn from_env() -> ClientEnv {
        let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty()).map(PathBuf::from);
        ClientEnv {
            home: var("HOME"),
            config: var(Self::CONFIG_ENV),
            agent_socket: var("SSH_AUTH_SOCK"),
            slurm_conf: var("SLURM_CONF"),
            slurm_job: std::env::var("SLURM_JOB_ID").ok().filter(|v| !v.is_empty()),
        }
    }

    /// The home directory to resolve `~` against (`/` when none is known, as OpenSSH does).
    pub fn home_dir(&self) -> PathBuf {
        self.home.clone().unwrap_or_else(|| PathBuf::from("/"))
    }
}
