//! Reading sweeps (the `sweeps` tree: one JSON `SweepRecord` per sweep id); the writer writes
//! them with the rest of a batch (`db.rs`).
use super::db::{parse, Store, StoreError};
use super::SweepRecord;

impl Store {
    /// Every sweep, oldest first (ids sort by submission time).
    pub fn list_sweeps(&self) -> Result<Vec<SweepRecord>, StoreError> {
        self.sweeps.iter().map(|kv| parse("sweeps", &kv?.1)).collect()
    }

    pub fn get_sweep(&self, id: &str) -> Result<Option<SweepRecord>, StoreError> {
        self.sweeps.get(id.as_bytes())?.map(|v| parse("sweeps", &v)).transpose()
    }

    /// A sweep by full id, unique id prefix, or name (the newest of that name).
    pub fn resolve_sweep(&self, query: &str) -> Result<SweepRecord, StoreError> {
        if let Some(s) = self.get_sweep(query)? {
            return Ok(s);
        }
        let mut by_prefix: Vec<SweepRecord> =
            self.sweeps.scan_prefix(query.as_bytes()).map(|kv| parse("sweeps", &kv?.1)).collect::<Result<_, _>>()?;
        match by_prefix.len() {
            1 => return Ok(by_prefix.remove(0)),
            n if n > 1 => {
                let candidates = by_prefix.iter().map(|s| s.id.as_str()).collect::<Vec<_>>().join(", ");
                return Err(StoreError::AmbiguousSweep { query: query.to_string(), candidates });
            }
            _ => {}
        }
        let by_name = self.list_sweeps()?.into_iter().rev().find(|s| s.name == query);
        by_name.ok_or_else(|| StoreError::NoSuchSweep { query: query.to_string() })
    }
}
