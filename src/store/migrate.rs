//! Schema migrations, run by `Store::open` before anything reads.
//!
//! 1 to 2: schema 1 kept one key per point in `series` (`run \0 metric \0 rank step` → the
//! value's 8 little-endian bytes) and the rollups in `rollups`. Schema 2 keeps blocks, rollups
//! and the journal in `history`. Every point is copied into blocks and the rollups are made
//! again from the points (schema 2's levels are wider); the old trees are dropped only after the new version is on disk, so a migration cut
//! short runs again from the start at the next open and loses nothing.
use super::block;
use super::db::StoreError;
use super::keys;
use super::points::BLOCK_MAX;
use super::rollup::{Bucket, LEVELS};
use std::collections::btree_map::{BTreeMap, Entry};

/// One series' (step, value) points.
type Steps = Vec<(u64, f64)>;

/// Blocks per sled batch while migrating, so memory stays bounded on a large history.
const BLOCKS_PER_BATCH: usize = 1024;

pub fn v1_to_v2(db: &sled::Db, history: &sled::Tree) -> Result<(), StoreError> {
    let series = db.open_tree("series")?;
    let mut out = sled::Batch::default();
    let mut blocks = 0usize;
    // The series of the key before: its prefix (without the step) and its points so far.
    let mut open: Option<(Vec<u8>, Steps)> = None;
    for kv in series.iter() {
        let (k, v) = kv?;
        let bad = |what: &str| StoreError::Corrupt {
            tree: "series",
            reason: format!("{what} under key {} (schema 1 migration)", String::from_utf8_lossy(&k)),
        };
        let split = k.len().checked_sub(8).filter(|&n| n > 0).ok_or_else(|| bad("a key too short for a step"))?;
        let (prefix, step) = k.split_at(split);
        let step = u64::from_be_bytes(step.try_into().map_err(|_| bad("a step that is not 8 bytes"))?);
        let value = f64::from_le_bytes(v.as_ref().try_into().map_err(|_| bad("a value that is not 8 bytes"))?);
        match &mut open {
            Some((p, points)) if p.as_slice() == prefix => points.push((step, value)),
            _ => {
                if let Some((p, points)) = open.replace((prefix.to_vec(), vec![(step, value)])) {
                    blocks += put(&mut out, &p, &points);
                }
            }
        }
        if blocks >= BLOCKS_PER_BATCH {
            history.apply_batch(std::mem::take(&mut out))?;
            blocks = 0;
        }
    }
    if let Some((p, points)) = open {
        put(&mut out, &p, &points);
    }
    history.apply_batch(out)?;
    logs_v1_to_v2(&db.open_tree("logs")?)?;
    db.flush()?;
    Ok(())
}

/// Schema 1's log lines, one key each (`run \0 rank n` → the line), into one chunk per rank.
/// An open cut short may have left chunks already; they start with their tag and are skipped.
fn logs_v1_to_v2(logs: &sled::Tree) -> Result<(), StoreError> {
    let mut out = sled::Batch::default();
    let mut open: Option<(Vec<u8>, BTreeMap<u64, String>)> = None;
    for kv in logs.iter() {
        let (k, v) = kv?;
        if super::logs::is_schema_2_key(&k) {
            continue;
        }
        let split = k.len().checked_sub(8).filter(|&n| n > 4).ok_or_else(|| StoreError::Corrupt {
            tree: "logs",
            reason: format!("a key of {} bytes (schema 1 migration)", k.len()),
        })?;
        let (rank_key, n) = k.split_at(split);
        let n = n.try_into().map(u64::from_be_bytes).unwrap_or(0);
        let line = String::from_utf8_lossy(&v).into_owned();
        match &mut open {
            Some((p, lines)) if p.as_slice() == rank_key => {
                lines.insert(n, line);
            }
            _ => {
                if let Some((p, lines)) = open.replace((rank_key.to_vec(), BTreeMap::from([(n, line)]))) {
                    super::logs::put_chunk(&mut out, &p, &lines);
                }
            }
        }
        out.remove(k);
    }
    if let Some((p, lines)) = open {
        super::logs::put_chunk(&mut out, &p, &lines);
    }
    logs.apply_batch(out)?;
    Ok(())
}

/// Drops schema 1's trees once schema 2 is recorded (they may outlive a cut-short open).
pub fn drop_v1_trees(db: &sled::Db) -> Result<(), StoreError> {
    for name in ["series", "rollups"] {
        if db.tree_names().iter().any(|t| t.as_ref() == name.as_bytes()) {
            db.drop_tree(name)?;
        }
    }
    Ok(())
}

/// One series' points (in step order, as schema 1's keys sort) as blocks and rollups; returns
/// how many blocks.
fn put(out: &mut sled::Batch, series_prefix: &[u8], points: &[(u64, f64)]) -> usize {
    for (level, width) in LEVELS.iter().enumerate() {
        let mut buckets: BTreeMap<u64, Bucket> = BTreeMap::new();
        for &(step, v) in points {
            match buckets.entry(step / width) {
                Entry::Occupied(mut b) => b.get_mut().add(step, v),
                Entry::Vacant(e) => {
                    e.insert(Bucket::new(step, v));
                }
            }
        }
        for (no, b) in buckets {
            let mut k = keys::tagged(keys::ROLLUP, series_prefix);
            k.push(level as u8);
            k.extend_from_slice(&no.to_be_bytes());
            out.insert(k, b.to_bytes());
        }
    }
    let mut n = 0;
    for chunk in points.chunks(BLOCK_MAX) {
        let mut k = keys::tagged(keys::BLOCK, series_prefix);
        k.extend_from_slice(&chunk[0].0.to_be_bytes());
        out.insert(k, block::encode(chunk));
        n += 1;
    }
    n
}
