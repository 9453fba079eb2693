//! The worker's environment: torchrun's variables plus Flightdeck's own, parsed once.
use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
#[error("environment variable {var}: {problem}; expected {valid}")]
pub struct EnvError {
    pub var: &'static str,
    pub problem: String,
    pub valid: String,
}

#[derive(Clone, Debug, PartialEq)]
pub struct WorkerEnv {
    pub rank: u32,
    pub world_size: u32,
    pub local_rank: u32,
    pub local_world_size: u32,
    /// Rank 0's rendezvous store; required when world_size > 1.
    pub master: Option<(String, u16)>,
    pub recipe_path: PathBuf,
    /// The agent's telemetry socket; None when run by hand.
    pub telemetry: Option<PathBuf>,
    pub node: String,
    /// The address peers dial to reach this rank; None = the local address that routes to
    /// MASTER_ADDR (right on one machine and on a flat cluster network).
    pub advertise_host: Option<String>,
    pub rendezvous_timeout: Duration,
    /// The run's secret (`FLIGHTDECK_RUN_SECRET_FILE`, a 0600 file the agent writes); None when
    /// run by hand, and then the store and the ring take anyone, as torch's do.
    pub secret_file: Option<PathBuf>,
}

/// Long enough for every rank of a large job to be spawned over SSH and start up.
const DEFAULT_RENDEZVOUS_TIMEOUT_S: u64 = 300;

impl WorkerEnv {
    /// Parses from a lookup (the process environment in `main_from_env`, a map in tests).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<WorkerEnv, EnvError> {
        let get = |var: &str| get(var).filter(|v| !v.trim().is_empty());
        let world_size: u32 = number(&get, "WORLD_SIZE", "an integer ≥ 1 (the number of ranks)")?;
        if world_size == 0 {
            return Err(bad("WORLD_SIZE", "0", "an integer ≥ 1 (the number of ranks)"));
        }
        let range = format!("an integer in 0..{world_size} (0 ≤ RANK < WORLD_SIZE)");
        let rank: u32 = number(&get, "RANK", &range)?;
        if rank >= world_size {
            return Err(bad("RANK", &rank.to_string(), &range));
        }
        let local_world_size: u32 = number(&get, "LOCAL_WORLD_SIZE", "an integer ≥ 1 (ranks on this node)")?;
        if local_world_size == 0 {
            return Err(bad("LOCAL_WORLD_SIZE", "0", "an integer ≥ 1 (ranks on this node)"));
        }
        let local_range = format!("an integer in 0..{local_world_size} (0 ≤ LOCAL_RANK < LOCAL_WORLD_SIZE)");
        let local_rank: u32 = number(&get, "LOCAL_RANK", &local_range)?;
        if local_rank >= local_world_size {
            return Err(bad("LOCAL_RANK", &local_rank.to_string(), &local_range));
        }
        let master = if world_size > 1 {
            // Under an agent the store has variables of its own (MASTER_PORT is left free for
            // programs that bind it); run by hand (torchrun), MASTER_ADDR/MASTER_PORT name it.
            let (addr_var, port_var) = match get("FLIGHTDECK_STORE_PORT") {
                Some(_) => ("FLIGHTDECK_STORE_ADDR", "FLIGHTDECK_STORE_PORT"),
                None => ("MASTER_ADDR", "MASTER_PORT"),
            };
            let addr = required(&get, addr_var, "the host of rank 0's rendezvous store")?;
            let port: u16 = number(&get, port_var, "a TCP port, 1..=65535")?;
            if port == 0 {
                return Err(bad(port_var, "0", "a TCP port, 1..=65535"));
            }
            Some((addr, port))
        } else {
            None
        };
        let recipe_path = PathBuf::from(required(
            &get,
            "FLIGHTDECK_RECIPE",
            "the path of the validated recipe as JSON (written by the agent)",
        )?);
        let rendezvous_timeout = match get("FLIGHTDECK_RENDEZVOUS_TIMEOUT_S") {
            None => Duration::from_secs(DEFAULT_RENDEZVOUS_TIMEOUT_S),
            Some(_) => Duration::from_secs(number(&get, "FLIGHTDECK_RENDEZVOUS_TIMEOUT_S", "whole seconds ≥ 1")?),
        };
        Ok(WorkerEnv {
            rank,
            world_size,
            local_rank,
            local_world_size,
            master,
            recipe_path,
            telemetry: get("FLIGHTDECK_TELEMETRY").map(PathBuf::from),
            node: get("FLIGHTDECK_NODE").unwrap_or_else(|| "local".to_string()),
            advertise_host: get("FLIGHTDECK_ADVERTISE_HOST"),
            rendezvous_timeout,
            secret_file: get(crate::collective::auth::SECRET_FILE_ENV).map(PathBuf::from),
        })
    }

    /// Intra-op threads: this node's cores shared evenly between its ranks.
    pub fn torch_threads(&self, cores: usize) -> i32 {
        (cores / self.local_world_size as usize).max(1) as i32
    }
}

fn required(get: &impl Fn(&str) -> Option<String>, var: &'static str, valid: &str) -> Result<String, EnvError> {
    get(var).ok_or_else(|| EnvError { var, problem: "not set".into(), valid: valid.into() })
}

fn number<T: std::str::FromStr>(
    get: &impl Fn(&str) -> Option<String>,
    var: &'static str,
    valid: &str,
) -> Result<T, EnvError> {
    let raw = required(get, var, valid)?;
    raw.trim().parse().map_err(|_| bad(var, &raw, valid))
}

fn bad(var: &'static str, value: &str, valid: &str) -> EnvError {
    EnvError { var, problem: format!("{value:?} is not valid"), valid: valid.into() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn parse(pairs: &[(&str, &str)]) -> Result<WorkerEnv, EnvError> {
        let map: HashMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        WorkerEnv::from_lookup(|k| map.get(k).cloned())
    }

    const BASE: [(&str, &str); 5] = [
        ("RANK", "1"),
        ("WORLD_SIZE", "2"),
        ("LOCAL_RANK", "1"),
        ("LOCAL_WORLD_SIZE", "2"),
        ("FLIGHTDECK_RECIPE", "/tmp/r.json"),
    ];

    #[test]
    fn torchrun_environment_parses() {
        let mut v = BASE.to_vec();
        v.extend([("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29500"), ("FLIGHTDECK_NODE", "node-b")]);
        let env = parse(&v).unwrap();
        assert_eq!((env.rank, env.world_size, env.local_world_size), (1, 2, 2));
        assert_eq!(env.master, Some(("127.0.0.1".into(), 29500)));
        assert_eq!((env.node.as_str(), env.telemetry.clone()), ("node-b", None));
        assert_eq!(env.torch_threads(16), 8);
        assert_eq!(env.torch_threads(1), 1);
    }

    #[test]
    fn under_an_agent_the_store_has_its_own_variables_and_master_port_is_the_programs() {
        let mut v = BASE.to_vec();
        v.extend([("MASTER_ADDR", "10.0.0.2"), ("MASTER_PORT", "29500")]);
        v.extend([("FLIGHTDECK_STORE_ADDR", "10.0.0.2"), ("FLIGHTDECK_STORE_PORT", "41000")]);
        assert_eq!(parse(&v).unwrap().master, Some(("10.0.0.2".into(), 41000)));
        let mut bad = BASE.to_vec();
        bad.extend([("FLIGHTDECK_STORE_ADDR", "h"), ("FLIGHTDECK_STORE_PORT", "0")]);
        assert!(parse(&bad).unwrap_err().to_string().contains("FLIGHTDECK_STORE_PORT"));
    }

    #[test]
    fn errors_name_the_variable_and_what_is_valid() {
        let err = parse(&BASE[1..]).unwrap_err().to_string();
        assert!(err.contains("RANK: not set") && err.contains("0..2"), "{err}");
        let mut v = BASE.to_vec();
        v[0] = ("RANK", "2");
        let err = parse(&v).unwrap_err().to_string();
        assert!(err.contains("RANK: \"2\" is not valid") && err.contains("0..2"), "{err}");
        let mut v = BASE.to_vec();
        v[1] = ("WORLD_SIZE", "two");
        assert!(parse(&v).unwrap_err().to_string().contains("WORLD_SIZE: \"two\""));
        // World 2 needs the rendezvous address.
        let err = parse(&BASE).unwrap_err().to_string();
        assert!(err.contains("MASTER_ADDR: not set"), "{err}");
        let mut v = BASE.to_vec();
        v.extend([("MASTER_ADDR", "h"), ("MASTER_PORT", "99999")]);
        assert!(parse(&v).unwrap_err().to_string().contains("MASTER_PORT"));
    }

    #[test]
    fn a_lone_rank_needs_no_master() {
        let env = parse(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "1"),
            ("LOCAL_RANK", "0"),
            ("LOCAL_WORLD_SIZE", "1"),
            ("FLIGHTDECK_RECIPE", "r.json"),
            ("FLIGHTDECK_TELEMETRY", "/run/a.sock"),
        ])
        .unwrap();
        assert_eq!(env.master, None);
        assert_eq!(env.telemetry, Some(PathBuf::from("/run/a.sock")));
        assert_eq!(env.node, "local");
    }
}
