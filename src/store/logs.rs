//! Each rank's last log lines, in the `logs` tree, written the way points are: one journal
//! entry per batch holding every rank's lines (`j run \0 id`), folded into one chunk of
//! consecutive lines per rank (`c run \0 rank first_n`) once the run's journal is large or the
//! run ends, and whole chunks dropped once a rank has `LOG_TAIL_LINES` newer lines. One key per
//! line (and a removal per line past the tail) was most of the store's work at 1,024 ranks.
//!
//! Readers read the journal first and the chunks second, and key lines by their number: a
//! compaction between the two reads shows a line twice (once kept), never not at all.
use super::block::{put_varint, Malformed, Reader};
use super::db::{Store, StoreError};
use super::keys;
use crate::ids::RunId;
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};

/// Log lines kept per rank (the tail; the full log stays in the node's log file).
pub const LOG_TAIL_LINES: u64 = 2000;
/// A run's log journal is folded into chunks once it holds this many lines…
const COMPACT_LINES: usize = 16_384;
/// …and at least this many per rank it touches.
const COMPACT_PER_RANK: usize = 64;

const FORMAT: u8 = 1;
const CHUNK: u8 = b'c';
const JOURNAL: u8 = b'j';

/// One line: (rank, number, text).
type Line = (u32, u64, String);

fn chunk_prefix(run: &RunId, rank: u32) -> Vec<u8> {
    keys::tagged(CHUNK, &keys::rank_key(run, rank))
}

fn chunk_key(run: &RunId, rank: u32, first_n: u64) -> Vec<u8> {
    let mut k = chunk_prefix(run, rank);
    k.extend_from_slice(&first_n.to_be_bytes());
    k
}

/// Whether a key is one of schema 2's (a chunk or a journal entry) rather than a run id's.
pub(super) fn is_schema_2_key(k: &[u8]) -> bool {
    matches!(k.first(), Some(&CHUNK) | Some(&JOURNAL))
}

/// Writes one rank's lines (`rank_key`: `run \0 rank`) as one chunk, for the migration.
pub(super) fn put_chunk(out: &mut sled::Batch, rank_key: &[u8], lines: &BTreeMap<u64, String>) {
    let Some(&first) = lines.keys().next() else { return };
    let mut k = keys::tagged(CHUNK, rank_key);
    k.extend_from_slice(&first.to_be_bytes());
    out.insert(k, encode_chunk(lines));
}

fn journal_prefix(run: &RunId) -> Vec<u8> {
    keys::tagged(JOURNAL, &keys::run_prefix(run))
}

/// The writer's side: each live run's log journal since its last compaction.
#[derive(Default)]
pub struct LogJournals {
    runs: HashMap<RunId, RunLogs>,
}

#[derive(Default)]
struct RunLogs {
    keys: Vec<Vec<u8>>,
    lines: Vec<Line>,
    ranks: HashSet<u32>,
    /// Each rank's stored chunks, oldest first: (first, last) line numbers; read on first use.
    chunks: HashMap<u32, VecDeque<(u64, u64)>>,
}

impl LogJournals {
    /// Adds a batch's lines to `out` as one journal entry per run; returns the runs whose
    /// journal is now full, for `compact`.
    pub fn append(
        &mut self,
        store: &Store,
        lines: Vec<(RunId, u32, u64, String)>,
        out: &mut sled::Batch,
    ) -> Result<Vec<RunId>, StoreError> {
        let mut full = Vec::new();
        for (run, lines) in keys::group_by_run(lines.into_iter().map(|(run, rank, n, line)| (run, (rank, n, line)))) {
            let mut k = journal_prefix(&run);
            k.extend_from_slice(&store.db.generate_id()?.to_be_bytes());
            out.insert(k.clone(), encode_entry(&lines));
            let j = self.runs.entry(run.clone()).or_default();
            j.keys.push(k);
            j.ranks.extend(lines.iter().map(|l| l.0));
            j.lines.extend(lines);
            if j.lines.len() >= COMPACT_LINES.max(COMPACT_PER_RANK * j.ranks.len()) {
                full.push(run);
            }
        }
        Ok(full)
    }

    /// Moves a run's journal into one chunk per rank and drops chunks past the tail, in `out`.
    pub fn compact(&mut self, store: &Store, run: &RunId, out: &mut sled::Batch) -> Result<(), StoreError> {
        let Some(j) = self.runs.get_mut(run) else { return Ok(()) };
        j.ranks.clear();
        let mut by_rank: BTreeMap<u32, BTreeMap<u64, String>> = BTreeMap::new();
        for (rank, n, line) in std::mem::take(&mut j.lines) {
            by_rank.entry(rank).or_default().insert(n, line);
        }
        for (rank, lines) in by_rank {
            let (Some(&first), Some(&last)) = (lines.keys().next(), lines.keys().next_back()) else { continue };
            let chunks = match j.chunks.entry(rank) {
                std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                std::collections::hash_map::Entry::Vacant(e) => e.insert(store.log_chunks(run, rank)?),
            };
            // Numbering that starts again (a server restarted mid-run counts from 1) replaces
            // the chunks it reaches; the rest age out as the tail moves on.
            while let Some(&(f, _)) = chunks.back().filter(|(f, _)| *f >= first) {
                out.remove(chunk_key(run, rank, f));
                chunks.pop_back();
            }
            out.insert(chunk_key(run, rank, first), encode_chunk(&lines));
            chunks.push_back((first, last));
            let newest = chunks.iter().map(|c| c.1).max().unwrap_or(last);
            while let Some(&(f, _)) = chunks.front().filter(|(_, l)| newest.saturating_sub(*l) >= LOG_TAIL_LINES) {
                out.remove(chunk_key(run, rank, f));
                chunks.pop_front();
            }
        }
        for k in j.keys.drain(..) {
            out.remove(k);
        }
        Ok(())
    }

    /// Compacts what is left of a run that has ended and forgets it.
    pub fn close(&mut self, store: &Store, run: &RunId, out: &mut sled::Batch) -> Result<(), StoreError> {
        self.compact(store, run, out)?;
        self.runs.remove(run);
        Ok(())
    }

    /// Reads every log journal entry on disk into memory; returns the runs found. An entry that
    /// cannot be read is said in the log and dropped from the journal (its lines are in the
    /// node's log file).
    pub fn load(&mut self, store: &Store, out: &mut sled::Batch) -> Result<Vec<RunId>, StoreError> {
        self.runs.clear();
        for kv in store.logs.scan_prefix([JOURNAL]) {
            let (k, v) = kv?;
            match (keys::tagged_run(&k), decode_entry(&v)) {
                (Some(run), Ok(lines)) => {
                    let j = self.runs.entry(run).or_default();
                    j.keys.push(k.to_vec());
                    j.ranks.extend(lines.iter().map(|l| l.0));
                    j.lines.extend(lines);
                }
                (_, e) => {
                    let why = e.err().map_or_else(|| "no run in its key".to_string(), |e| e.0);
                    tracing::error!("log journal entry {}: {why}; dropped", String::from_utf8_lossy(&k));
                    out.remove(k);
                }
            }
        }
        Ok(self.runs.keys().cloned().collect())
    }
}

impl Store {
    /// The last `LOG_TAIL_LINES` lines of one rank, oldest first.
    pub fn log_tail(&self, run: &RunId, rank: u32) -> Result<Vec<String>, StoreError> {
        let mut tails = self.log_tails(run, &[rank], LOG_TAIL_LINES as usize)?;
        Ok(tails.remove(&rank).unwrap_or_default())
    }

    /// The last `n` lines of each of `ranks`, oldest first (a rank with none is absent). The
    /// run's journal holds every rank's recent lines together, so it is decoded once for all
    /// ranks (once per rank made a 1,024-rank snapshot decode it 1,024 times); each rank's
    /// chunks are read newest first, only as far as its `n` lines reach.
    pub fn log_tails(&self, run: &RunId, ranks: &[u32], n: usize) -> Result<BTreeMap<u32, Vec<String>>, StoreError> {
        let corrupt = |what: &str, rank: Option<u32>, e: Malformed| StoreError::Corrupt {
            tree: "logs",
            reason: match rank {
                Some(rank) => format!("{what} of run {run} rank {rank}: {}", e.0),
                None => format!("{what} of run {run}: {}", e.0),
            },
        };
        let keep = |lines: &mut BTreeMap<u64, String>| {
            while lines.len() > n {
                lines.pop_first();
            }
        };
        let wanted: HashSet<u32> = ranks.iter().copied().collect();
        // The journal first: a compaction after this read leaves its lines in the chunks.
        let mut recent: HashMap<u32, BTreeMap<u64, String>> = HashMap::new();
        for kv in self.logs.scan_prefix(journal_prefix(run)) {
            let lines = decode_entry(&kv?.1).map_err(|e| corrupt("a log journal entry", None, e))?;
            for (rank, number, line) in lines.into_iter().filter(|l| wanted.contains(&l.0)) {
                let mine = recent.entry(rank).or_default();
                mine.insert(number, line);
                keep(mine);
            }
        }
        let mut out = BTreeMap::new();
        for &rank in &wanted {
            let mut by_n: BTreeMap<u64, String> = BTreeMap::new();
            // Chunks hold consecutive, disjoint spans keyed by their first number: once `n`
            // lines are read, every older chunk's lines are older than all of them.
            for kv in self.logs.scan_prefix(chunk_prefix(run, rank)).rev() {
                by_n.extend(decode_chunk(&kv?.1).map_err(|e| corrupt("a log chunk", Some(rank), e))?);
                if by_n.len() >= n {
                    break;
                }
            }
            by_n.extend(recent.remove(&rank).unwrap_or_default());
            keep(&mut by_n);
            if !by_n.is_empty() {
                out.insert(rank, by_n.into_values().collect());
            }
        }
        Ok(out)
    }

    /// The newest line number stored for each rank of a run, so a tracker made again after a
    /// server restart numbers on from there instead of from 1.
    pub fn log_line_counts(&self, run: &RunId) -> Result<BTreeMap<u32, u64>, StoreError> {
        let mut out: BTreeMap<u32, u64> = BTreeMap::new();
        let mut note = |rank: u32, n: u64| {
            let e = out.entry(rank).or_insert(n);
            *e = (*e).max(n);
        };
        for kv in self.logs.scan_prefix(journal_prefix(run)) {
            if let Ok(lines) = decode_entry(&kv?.1) {
                lines.iter().for_each(|l| note(l.0, l.1));
            }
        }
        let prefix = keys::tagged(CHUNK, &keys::run_prefix(run));
        for kv in self.logs.scan_prefix(&prefix) {
            let (k, v) = kv?;
            let rank = k.get(prefix.len()..prefix.len() + 4).and_then(|b| b.try_into().ok()).map(u32::from_be_bytes);
            if let (Some(rank), Ok((_, last))) = (rank, chunk_span(&v)) {
                note(rank, last);
            }
        }
        Ok(out)
    }

    /// One rank's stored chunks as (first, last) line numbers, oldest first.
    fn log_chunks(&self, run: &RunId, rank: u32) -> Result<VecDeque<(u64, u64)>, StoreError> {
        let mut out = VecDeque::new();
        for kv in self.logs.scan_prefix(chunk_prefix(run, rank)) {
            let (k, v) = kv?;
            let (first, last) = chunk_span(&v).map_err(|e| StoreError::Corrupt {
                tree: "logs",
                reason: format!("log chunk {}: {}", String::from_utf8_lossy(&k), e.0),
            })?;
            out.push_back((first, last));
        }
        Ok(out)
    }
}

/// A journal entry: format, count, then per line rank, number, length and UTF-8 bytes.
fn encode_entry(lines: &[Line]) -> Vec<u8> {
    let mut out = Vec::with_capacity(8 + lines.iter().map(|l| l.2.len() + 6).sum::<usize>());
    out.push(FORMAT);
    put_varint(&mut out, lines.len() as u64);
    for (rank, n, line) in lines {
        put_varint(&mut out, u64::from(*rank));
        put_varint(&mut out, *n);
        put_varint(&mut out, line.len() as u64);
        out.extend_from_slice(line.as_bytes());
    }
    out
}

fn decode_entry(bytes: &[u8]) -> Result<Vec<Line>, Malformed> {
    let mut r = Reader { bytes, at: 0 };
    format(&mut r)?;
    let count = bounded(&mut r, bytes.len())?;
    let mut out = Vec::with_capacity(count);
    for _ in 0..count {
        let rank = u32::try_from(r.varint()?).map_err(|_| Malformed("a rank beyond u32".into()))?;
        let n = r.varint()?;
        out.push((rank, n, text(&mut r)?));
    }
    finished(&r)?;
    Ok(out)
}

/// A chunk: format, count, first and last numbers, then per line its number's distance from
/// the previous one, its length and its bytes.
fn encode_chunk(lines: &BTreeMap<u64, String>) -> Vec<u8> {
    let mut out = Vec::with_capacity(16 + lines.values().map(|l| l.len() + 3).sum::<usize>());
    out.push(FORMAT);
    put_varint(&mut out, lines.len() as u64);
    let first = lines.keys().next().copied().unwrap_or(0);
    put_varint(&mut out, first);
    put_varint(&mut out, lines.keys().next_back().copied().unwrap_or(0));
    let mut prev = first;
    for (n, line) in lines {
        put_varint(&mut out, n - prev);
        put_varint(&mut out, line.len() as u64);
        out.extend_from_slice(line.as_bytes());
        prev = *n;
    }
    out
}

/// A chunk's header: (first, last) line numbers.
fn chunk_span(bytes: &[u8]) -> Result<(u64, u64), Malformed> {
    let mut r = Reader { bytes, at: 0 };
    format(&mut r)?;
    r.varint()?;
    Ok((r.varint()?, r.varint()?))
}

fn decode_chunk(bytes: &[u8]) -> Result<Vec<(u64, String)>, Malformed> {
    let mut r = Reader { bytes, at: 0 };
    format(&mut r)?;
    let count = bounded(&mut r, bytes.len())?;
    let (mut n, _last) = (r.varint()?, r.varint()?);
    let mut out = Vec::with_capacity(count);
    for _ in 0..count {
        n = n.wrapping_add(r.varint()?);
        out.push((n, text(&mut r)?));
    }
    finished(&r)?;
    Ok(out)
}

fn format(r: &mut Reader) -> Result<(), Malformed> {
    match r.byte()? {
        FORMAT => Ok(()),
        f => Err(Malformed(format!("format {f}, this flightdeck reads format {FORMAT}"))),
    }
}

/// A count that the remaining bytes could hold (each line takes at least two).
fn bounded(r: &mut Reader, len: usize) -> Result<usize, Malformed> {
    let count = r.varint()?;
    if count > len as u64 {
        return Err(Malformed(format!("says {count} lines in {len} bytes")));
    }
    Ok(count as usize)
}

fn text(r: &mut Reader) -> Result<String, Malformed> {
    let len = usize::try_from(r.varint()?).map_err(|_| Malformed("a line longer than memory".into()))?;
    Ok(String::from_utf8_lossy(r.take(len)?).into_owned())
}

fn finished(r: &Reader) -> Result<(), Malformed> {
    match r.bytes.len() - r.at {
        0 => Ok(()),
        n => Err(Malformed(format!("{n} bytes after the last line"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_and_chunks_round_trip_and_damage_is_an_error() {
        let lines: Vec<Line> =
            vec![(0, 1, "step 1 loss 2.5".into()), (1023, 7, "ünïcode ✓".into()), (3, 9, String::new())];
        assert_eq!(decode_entry(&encode_entry(&lines)).unwrap(), lines);
        let chunk: BTreeMap<u64, String> = [(5, "a".to_string()), (6, "b".into()), (90, "c".into())].into();
        let bytes = encode_chunk(&chunk);
        assert_eq!(decode_chunk(&bytes).unwrap(), chunk.clone().into_iter().collect::<Vec<_>>());
        assert_eq!(chunk_span(&bytes).unwrap(), (5, 90));
        for cut in 0..bytes.len() {
            assert!(decode_chunk(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        let entry = encode_entry(&lines);
        for cut in 0..entry.len() {
            assert!(decode_entry(&entry[..cut]).is_err(), "cut at {cut}");
        }
        let mut wrong = entry.clone();
        wrong[0] = 7;
        assert!(decode_entry(&wrong).unwrap_err().0.contains("format 7"));
    }
}
