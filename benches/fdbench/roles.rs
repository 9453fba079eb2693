//! Small roles for the drivers: the recipe as JSON, a rendezvous store host, arith sequences.
use anyhow::Context;
use flightdeck::collective::auth::{Gate, RunSecret, SECRET_FILE_ENV};
use flightdeck::collective::rendezvous::StoreServer;
use std::io::{Read, Write};

/// `recipe FILE [--set k=v]...`: what the agent would write to FLIGHTDECK_RECIPE, so the worker
/// and the Python reference read one validated recipe.
pub fn recipe(args: &[String]) -> anyhow::Result<()> {
    let Some((file, rest)) = args.split_first() else {
        anyhow::bail!("recipe takes FILE [--set k=v]...");
    };
    let mut overrides = Vec::new();
    let mut it = rest.iter();
    while let Some(flag) = it.next() {
        match (flag.as_str(), it.next()) {
            ("--set", Some(kv)) => overrides.push(kv.clone()),
            _ => anyhow::bail!("recipe: expected --set k=v, got {flag:?}"),
        }
    }
    let recipe = flightdeck::recipe::load_file(file.as_ref(), &overrides)?;
    println!("{}", serde_json::to_string(&recipe)?);
    Ok(())
}

/// `store-host`: the rendezvous store the agent would host for a worker run, on a free port.
/// Serves until its stdin closes, so the driver ends it by dropping the pipe.
pub fn store_host() -> anyhow::Result<()> {
    let server = StoreServer::bind("127.0.0.1:0", gate_from_env()?).context("binding the rendezvous store")?;
    let port = server.local_addr().port();
    let _serving = server.spawn();
    println!("{{\"port\": {port}}}");
    std::io::stdout().flush()?;
    let mut sink = Vec::new();
    std::io::stdin().read_to_end(&mut sink)?;
    Ok(())
}

/// The run's gate as a rank would build it: the secret in `FLIGHTDECK_RUN_SECRET_FILE`, or
/// none (as a rank run by hand) when that is unset.
pub fn gate_from_env() -> anyhow::Result<Gate> {
    match std::env::var_os(SECRET_FILE_ENV) {
        None => Ok(Gate::open()),
        Some(path) => {
            let secret = RunSecret::read_file(path.as_ref()).map_err(anyhow::Error::msg)?;
            Ok(Gate::new(secret, std::sync::Arc::new(|r| eprintln!("refused: {r:?}"))))
        }
    }
}

/// `arith SEED FIRST COUNT LEN`: sequences FIRST..FIRST+COUNT, one JSON array per line.
pub fn arith(n: &[u64]) -> anyhow::Result<()> {
    let (seed, first, count, len) = (n[0], n[1], n[2], n[3] as usize);
    for index in first..first + count {
        println!("{}", serde_json::to_string(&flightdeck::worker::arith::sequence(seed, index, len))?);
    }
    Ok(())
}
