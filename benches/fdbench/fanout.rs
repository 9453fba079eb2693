//! `fdbench fanout CONFIG HOSTS COMMAND`: the launcher's fan-out (one ssh2 session per host,
//! each on its own thread, `src/ssh/fanout.rs`) running one command on every host, as a launch
//! contacts its nodes. Prints `{"hosts", "ok", "fanout_ms", "failures"}`.
use anyhow::Context;
use flightdeck::ssh::{config, fanout, session, Limits};
use std::path::Path;
use std::time::{Duration, Instant};

pub fn main(config_path: &Path, hosts: &[String], command: &str) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(config_path).with_context(|| format!("reading {}", config_path.display()))?;
    let limits = Limits {
        connect: Duration::from_secs(30),
        command: Duration::from_secs(30),
        link: Duration::from_secs(30),
        accept_new: false,
    };
    let t0 = Instant::now();
    let results = fanout::each(hosts.len(), |i| -> Result<String, String> {
        let target = config::resolve_with(&hosts[i], Some((&text, config_path)), &config::ClientEnv::from_env())
            .map_err(|e| e.to_string())?;
        let node = session::connect(&target, &limits).map_err(|e| e.to_string())?;
        node.check("bench command", command, None).map_err(|e| e.to_string())
    });
    let fanout_ms = t0.elapsed().as_secs_f64() * 1e3;
    let failures: Vec<String> =
        results.iter().zip(hosts).filter_map(|(r, h)| r.as_ref().err().map(|e| format!("{h}: {e}"))).collect();
    let ok = results.len() - failures.len();
    println!("{}", serde_json::json!({"hosts": hosts.len(), "ok": ok, "fanout_ms": fanout_ms, "failures": failures}));
    Ok(())
}
