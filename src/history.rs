//! Reading runs' history through the server, for `export`, `report` and the cockpit's `E`/`P`:
//! one request at a time on one connection, a refusal kept apart from a failure.
use crate::client::Client;
use crate::protocol::{Reply, Request};
use crate::record::Point;

/// What the server answered: the reply, or its refusal's message.
pub async fn ask(c: &mut Client, req: Request) -> anyhow::Result<Result<Reply, String>> {
    Ok(match c.request(&req).await? {
        Reply::Error { message } => Err(message),
        r => Ok(r),
    })
}

/// One rank's points of one metric, in step order.
pub async fn fetch(c: &mut Client, run: &str, metric: &str, rank: u32) -> anyhow::Result<Vec<Point>> {
    let req = Request::Metrics { run: run.to_string(), key: Some(metric.to_string()), rank: Some(rank) };
    match ask(c, req).await? {
        Ok(Reply::Metrics { mut points }) => {
            points.sort_by_key(|p| p.step);
            Ok(points)
        }
        Ok(other) => anyhow::bail!("unexpected reply: {other:?}"),
        Err(m) => anyhow::bail!("{metric} of rank {rank} of {run}: {m}"),
    }
}

/// A run's checkpoints as the history and the disk have them (sizes checked, not hashes).
pub async fn checkpoints(c: &mut Client, run: &str) -> anyhow::Result<Vec<crate::record::CheckpointRecord>> {
    match ask(c, Request::Checkpoints { run: run.to_string(), verify: false }).await? {
        Ok(Reply::Checkpoints { checkpoints, .. }) => Ok(checkpoints),
        Ok(other) => anyhow::bail!("unexpected reply: {other:?}"),
        Err(m) => anyhow::bail!("checkpoints of {run}: {m}"),
    }
}

/// One rank's flight-recorder records as the history has them, in sequence order.
pub async fn collectives(c: &mut Client, run: &str, rank: u32) -> anyhow::Result<Vec<crate::record::CollectiveRecord>> {
    match ask(c, Request::Collectives { run: run.to_string(), rank }).await? {
        Ok(Reply::Collectives { records }) => Ok(records),
        Ok(other) => anyhow::bail!("unexpected reply: {other:?}"),
        Err(m) => anyhow::bail!("collectives of rank {rank} of {run}: {m}"),
    }
}

/// What `show` knows of a run, or the server's refusal (no such run, an ambiguous prefix).
pub async fn detail(c: &mut Client, run: &str) -> anyhow::Result<Result<crate::record::RunDetail, String>> {
    Ok(match ask(c, Request::ShowRun { run: run.to_string() }).await? {
        Ok(Reply::Run { detail }) => Ok(*detail),
        Ok(other) => anyhow::bail!("unexpected reply: {other:?}"),
        Err(m) => Err(m),
    })
}

/// Why an export or a report gave nothing: bad input (an unknown run, metric or rank, an
/// occupied `--out`: exit 2) or a failure on the way.
#[derive(Debug, thiserror::Error)]
pub enum Failure {
    #[error("{0}")]
    BadInput(String),
    #[error(transparent)]
    Failed(#[from] anyhow::Error),
}
