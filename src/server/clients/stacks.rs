//! `Stacks`: a live run's stacks, asked of its agents and grouped.
use super::resolve;
use crate::protocol::Reply;
use crate::server::Shared;
use crate::sync::lock;
use std::time::Duration;

/// How long a client waits for a live run's stacks: gdb on a large rank can take tens of
/// seconds, and the agent gives each tool at most 30 s.
const STACKS_WAIT: Duration = Duration::from_secs(45);

/// Asks the run's agent for stacks (all ranks or one) and groups identical ones.
pub async fn stacks(shared: &Shared, run: &str, rank: Option<u32>, native: bool) -> anyhow::Result<Reply> {
    let id = resolve(shared, run).await?;
    let tx = lock(&shared.registry).get(&id).map(|l| l.stacks.clone());
    let Some(tx) = tx else {
        anyhow::bail!("run {id} is not live: stacks are read from running ranks (`flightdeck show {id}` has its incident reports)")
    };
    let (reply, answer) = tokio::sync::oneshot::channel();
    tx.send(crate::server::StackAsk { rank, native, reply })
        .await
        .map_err(|_| anyhow::anyhow!("run {id} ended meanwhile"))?;
    let stacks = match tokio::time::timeout(STACKS_WAIT, answer).await {
        Ok(Ok(s)) => s,
        Ok(Err(_)) => anyhow::bail!("run {id} ended (or its agent went away) before the stacks came back"),
        Err(_) => anyhow::bail!("the agent of run {id} did not answer within {STACKS_WAIT:?}"),
    };
    if let (Some(r), true) = (rank, stacks.is_empty()) {
        anyhow::bail!("rank {r} is not a live rank of run {id}; `flightdeck show {id}` lists its ranks");
    }
    Ok(Reply::Stacks(Box::new(crate::protocol::StackReport::from_dumps(id, &stacks))))
}
