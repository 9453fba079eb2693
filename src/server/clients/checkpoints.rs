//! `Checkpoints`: a run's checkpoints as the disk has them now, merged with the store's index.
use super::resolve;
use crate::protocol::Reply;
use crate::server::Shared;

/// A run's checkpoints as the disk has them now (sizes, or every byte's sha256 when `verify`),
/// merged with what the store recorded. A full verification's verdicts are stored.
pub async fn checkpoints(shared: &Shared, query: &str, verify: bool) -> anyhow::Result<Reply> {
    use crate::store::checkpoints::{disk, inspect, root_of};
    let id = resolve(shared, query).await?;
    let store = shared.store.clone();
    let run_dir = super::super::placement::rank0_dir(&shared.db, &id);
    let id2 = id.clone();
    let (root, records) = tokio::task::spawn_blocking(move || -> anyhow::Result<_> {
        let record = store.get_run(&id2)?.ok_or_else(|| anyhow::anyhow!("run {id2} vanished"))?;
        let dir = serde_json::from_str::<crate::recipe::Recipe>(&record.recipe_json)
            .map(|r| r.checkpoint.dir)
            .unwrap_or_else(|_| "checkpoints".into());
        let root = root_of(&run_dir, &dir);
        let known = store.checkpoints(&id2)?;
        let depth = if verify { disk::Depth::Sha256 } else { disk::Depth::Sizes };
        Ok((root.clone(), inspect(&id2, &root, known, depth)))
    })
    .await??;
    if verify {
        // Only checkpoints the store already indexes: a save still being written shows as
        // torn right now, and its own record arrives when it commits.
        let known = shared.store.checkpoints(&id)?;
        let checkpoints = records.iter().filter(|r| known.iter().any(|k| k.step == r.step)).cloned().collect();
        let batch = crate::store::Batch { checkpoints, ..Default::default() };
        shared.ingest.write(batch).await.map_err(anyhow::Error::msg)?;
    }
    let latest = disk::latest(&root);
    Ok(Reply::Checkpoints { run: id, dir: root.display().to_string(), latest, checkpoints: records })
}
