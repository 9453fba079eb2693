//! `Checkpoints`: a run's checkpoints as the disk has them now, merged with the store's index
//! (for a run over SSH, as its nodes have them).
use super::resolve;
use crate::protocol::Reply;
use crate::server::Shared;

/// A run's checkpoints as the disk has them now (sizes, or every byte's sha256 when `verify`),
/// merged with what the store recorded. A full verification's verdicts are stored.
pub async fn checkpoints(shared: &Shared, query: &str, verify: bool) -> anyhow::Result<Reply> {
    use crate::store::checkpoints::{disk, inspect, root_of};
    let id = resolve(shared, query).await?;
    if let Some(nodes) = super::super::placement::ssh_nodes(&shared.db, &id)? {
        return on_nodes(shared, id, nodes, verify).await;
    }
    let store = shared.store.clone();
    let run_dir = super::super::placement::rank0_dir(&shared.db, &id);
    let id2 = id.clone();
    let (root, records) = tokio::task::spawn_blocking(move || -> anyhow::Result<_> {
        let dir = checkpoint_dir(&store, &id2)?;
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

/// An SSH run's checkpoints: the store's records (each listing the nodes that committed a copy);
/// with `verify`, each recorded step is checked on every node by the node's own flightdeck
/// (`agent checkpoint --step N`, every file's sha256), and the verdicts are stored.
async fn on_nodes(
    shared: &Shared,
    id: crate::ids::RunId,
    nodes: Vec<crate::ssh::launch::RemoteAgent>,
    verify: bool,
) -> anyhow::Result<Reply> {
    let store = shared.store.clone();
    let id2 = id.clone();
    let (dir, records) = tokio::task::spawn_blocking(move || -> anyhow::Result<_> {
        let dir = checkpoint_dir(&store, &id2)?;
        let mut records = store.checkpoints(&id2)?;
        if verify {
            let now = crate::ids::unix_ms();
            for rec in &mut records {
                let held = crate::ssh::carry::survey(&nodes, &dir, Some(rec.step));
                rec.nodes = held.iter().filter(|h| h.chosen.is_ok()).map(|h| h.target.spec.clone()).collect();
                let problems: Vec<String> = held.iter().filter_map(|h| h.chosen.as_ref().err().cloned()).collect();
                rec.verified = !rec.nodes.is_empty();
                rec.problem = (!problems.is_empty()).then(|| problems.join("; "));
                (rec.checked, rec.checked_ms) = ("sha256".into(), now);
            }
        }
        let where_ = nodes.first().map(|a| {
            let root = crate::store::checkpoints::root_of(std::path::Path::new(&a.run_dir), &dir);
            format!("{}:{} (and each other node's run directory)", a.target.spec, root.display())
        });
        Ok((where_.unwrap_or(dir), records))
    })
    .await??;
    if verify {
        let batch = crate::store::Batch { checkpoints: records.clone(), ..Default::default() };
        shared.ingest.write(batch).await.map_err(anyhow::Error::msg)?;
    }
    let latest = records.iter().filter(|r| r.verified).map(|r| r.step).max();
    Ok(Reply::Checkpoints { run: id, dir, latest, checkpoints: records })
}

/// The run's `checkpoint.dir` as its stored recipe says (the default when that cannot be read).
fn checkpoint_dir(store: &crate::store::Store, id: &crate::ids::RunId) -> anyhow::Result<String> {
    let record = store.get_run(id)?.ok_or_else(|| anyhow::anyhow!("run {id} vanished"))?;
    Ok(serde_json::from_str::<crate::recipe::Recipe>(&record.recipe_json)
        .map(|r| r.checkpoint.dir)
        .unwrap_or_else(|_| "checkpoints".into()))
}
