//! PyTorch's flight recorder, read from its dumps: the pickle that `_dump_fr_trace()` and the
//! NCCL watchdog write, and the JSON of `_dump_fr_trace_json()`, into one `Dump`.
//!
//! The format is PyTorch 2.11's (`FlightRecorderDetail.hpp`, `TraceUtils.h`; facts in
//! `../shared/research/real-jobs.md` §1): pickle protocol 2 of plain dicts, lists and tuples;
//! `pg_config` keyed by group name with its ranks as a *string* ("[0, 1]") (gloo's holds one
//! nameless config), `pg_status` keyed by the rank's own index of the group (`pg_id`), and `entries`, one per collective the rank enqueued, with its Python `frames`.
//! The JSON has no frames, string statuses and 0 for None. A `Dump` keeps what the analysis
//! matches on (per group: the last enqueued and completed sequence; per entry: op, sizes, dtypes,
//! state, enqueue time, the call site) and is what travels from agent to server, trimmed by
//! `recent`. Pure: bytes in, a `Dump` or an error naming the input out.
mod pickle;
#[cfg(test)]
mod tests;

use crate::record::CollectiveOp;
use serde::{Deserialize, Deserializer, Serialize};
use std::collections::BTreeMap;

/// One rank's flight recorder at the moment it was dumped.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Dump {
    /// The dump format's own version ("2.10" for PyTorch 2.9–2.11).
    pub version: String,
    pub groups: Vec<Group>,
    /// Oldest first (by `record_id`).
    pub entries: Vec<Entry>,
}

/// What a rank's dumps taught about its groups: its own index of each (`pg_id`, the key of
/// `pg_status`) to the group's name and description. Only entries tell it, so a dump without
/// entries (the shim's status-only dumps) is read with what earlier dumps of the rank said.
pub type GroupIds = BTreeMap<i64, (String, String)>;

/// A process group as the rank saw it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Group {
    /// PyTorch's name for it ("0" for the default group), the same on every member.
    pub name: String,
    /// Its description ("default_pg", "undefined", or what `new_group(group_desc=)` said).
    pub desc: String,
    /// Global ranks of its members; empty where the dump does not say (gloo's in 2.11), and
    /// then the members are the ranks whose dumps know the group.
    pub ranks: Vec<u32>,
    /// The last collective sequence number this rank enqueued in the group (0: none yet).
    pub last_enqueued: u64,
    /// The last one it saw complete (0: none yet).
    pub last_completed: u64,
}

/// One collective the rank enqueued.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    pub record_id: u64,
    /// The process group's name (`Group::name`).
    pub group: String,
    pub group_desc: String,
    /// `collective_seq_id`: equal on every member for the same collective.
    pub seq: u64,
    /// PyTorch's `profiling_name`, e.g. "gloo:all_reduce", "nccl:_allgather_base".
    pub name: String,
    pub input_sizes: Vec<Vec<i64>>,
    pub output_sizes: Vec<Vec<i64>>,
    pub input_dtypes: Vec<String>,
    pub state: EntryState,
    /// Completed and dropped from the watchdog's list (on gloo the only sign of completion).
    pub retired: bool,
    /// Enqueue time, unix ns.
    pub created_ns: u64,
    /// CUDA-timed duration (NCCL with `TORCH_NCCL_ENABLE_TIMING=1`).
    pub duration_ms: Option<f64>,
    pub is_p2p: bool,
    /// The Python frames at enqueue, innermost first (empty in the JSON variant).
    pub frames: Vec<Frame>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EntryState {
    #[default]
    Scheduled,
    Started,
    Completed,
}

/// One Python frame.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Frame {
    pub name: String,
    pub file: String,
    pub line: u32,
}

impl Frame {
    /// `file:line` with the file's last component, as a person quotes it.
    pub fn site(&self) -> String {
        let file = self.file.rsplit('/').next().unwrap_or(&self.file);
        format!("{file}:{}", self.line)
    }

    /// A frame of the user's program rather than of Python, PyTorch or another installed package.
    pub fn is_user(&self) -> bool {
        let f = &self.file;
        !(f.is_empty()
            || f.starts_with('<')
            || f.contains("/site-packages/")
            || f.contains("/dist-packages/")
            || f.contains("/lib/python3")
            || f.contains("/torch/"))
    }
}

impl Entry {
    /// The op without its backend: "all_reduce" for "gloo:all_reduce".
    pub fn op(&self) -> &str {
        self.name.split_once(':').map_or(&self.name, |(_, op)| op)
    }

    /// Elements over all inputs.
    pub fn elements(&self) -> u64 {
        self.input_sizes.iter().map(|dims| dims.iter().map(|d| (*d).max(0) as u64).product::<u64>()).sum()
    }

    /// The innermost frame of the user's program: where it called the collective (or the
    /// `backward` that launched it).
    pub fn call_site(&self) -> Option<&Frame> {
        self.frames.iter().find(|f| f.is_user())
    }

    /// "all_reduce of 72 Float elements ([[72]])".
    pub fn shape(&self) -> String {
        let dtype = self.input_dtypes.first().map_or("", String::as_str);
        let sizes: Vec<String> = self.input_sizes.iter().map(|d| format!("{d:?}")).collect();
        format!("{} of {} {dtype} elements ([{}])", self.op(), self.elements(), sizes.join(", "))
    }

    /// Completed: retired from the watchdog's list (on gloo the only sign) or marked completed.
    pub fn finished(&self) -> bool {
        self.retired || self.state == EntryState::Completed
    }

    /// Bytes over all inputs, by the first input's dtype.
    pub fn bytes(&self) -> u64 {
        self.elements() * self.input_dtypes.first().map_or(4, |d| dtype_bytes(d))
    }

    /// The op as Flightdeck's records name it; None for one they do not (all_to_all, send, ...).
    pub fn collective_op(&self) -> Option<CollectiveOp> {
        Some(match self.op() {
            "all_reduce" | "allreduce" | "all_reduce_coalesced" => CollectiveOp::AllReduce,
            "reduce_scatter" | "_reduce_scatter_base" | "reduce_scatter_tensor_coalesced" => {
                CollectiveOp::ReduceScatter
            }
            "all_gather" | "allgather" | "_allgather_base" | "all_gather_into_tensor_coalesced" => {
                CollectiveOp::AllGather
            }
            "broadcast" => CollectiveOp::Broadcast,
            "barrier" => CollectiveOp::Barrier,
            _ => return None,
        })
    }

    /// What two ranks must agree on for the same sequence number.
    pub fn signature(&self) -> (&str, &[Vec<i64>], &[String]) {
        (self.op(), &self.input_sizes, &self.input_dtypes)
    }
}

impl Dump {
    pub fn group(&self, name: &str) -> Option<&Group> {
        self.groups.iter().find(|g| g.name == name)
    }

    /// The rank's entry for `seq` in `group`, newest if recorded twice.
    pub fn entry(&self, group: &str, seq: u64) -> Option<&Entry> {
        self.entries.iter().rev().find(|e| e.group == group && e.seq == seq && !e.is_p2p)
    }

    /// Entries not yet completed: the collectives the rank is inside.
    pub fn pending(&self) -> impl Iterator<Item = &Entry> {
        self.entries.iter().filter(|e| !e.finished() && !e.is_p2p)
    }

    /// What the analysis needs, small enough to send every second: every pending entry and the
    /// last `keep` entries of each group.
    pub fn recent(&self, keep: usize) -> Dump {
        let mut kept = vec![false; self.entries.len()];
        for g in &self.groups {
            let idx: Vec<usize> = (0..self.entries.len()).filter(|i| self.entries[*i].group == g.name).collect();
            for i in idx.iter().rev().take(keep) {
                kept[*i] = true;
            }
        }
        let entries =
            self.entries.iter().zip(kept).filter(|(e, k)| *k || !e.finished()).map(|(e, _)| e.clone()).collect();
        Dump { version: self.version.clone(), groups: self.groups.clone(), entries }
    }

    /// What moves while the rank makes collective progress: per group, the last enqueued and
    /// completed sequence numbers.
    pub fn progress(&self) -> Vec<(String, u64, u64)> {
        self.groups.iter().map(|g| (g.name.clone(), g.last_enqueued, g.last_completed)).collect()
    }
}

/// What the agent sends of a rank each time its shim wrote a new dump: the dump, trimmed by
/// `Dump::recent`, and where the rank's main thread was then.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    pub dump: Dump,
    /// Innermost first; empty when the shim wrote no stacks.
    pub main_stack: Vec<Frame>,
}

/// Reads the main thread's frames from the shim's stacks file
/// (`{"threads": [{"main": true, "frames": [{"name", "file", "line"}]}]}`).
pub fn parse_main_stack(bytes: &[u8], source_name: &str) -> Result<Vec<Frame>, DumpError> {
    #[derive(Deserialize)]
    struct Stacks {
        threads: Vec<Thread>,
    }
    #[derive(Deserialize)]
    struct Thread {
        #[serde(default)]
        main: bool,
        #[serde(default)]
        frames: Vec<Frame>,
    }
    let stacks: Stacks = serde_json::from_slice(bytes)
        .map_err(|e| DumpError::Stacks { source_name: source_name.to_string(), reason: e.to_string() })?;
    Ok(stacks.threads.into_iter().find(|t| t.main).map(|t| t.frames).unwrap_or_default())
}

#[derive(Debug, thiserror::Error)]
pub enum DumpError {
    #[error("{source_name}: not the shim's stacks ({reason}); expected {{\"threads\": [{{\"main\": true, \"frames\": [{{\"name\", \"file\", \"line\"}}]}}]}}")]
    Stacks { source_name: String, reason: String },
    #[error("{source_name}: not a flight-recorder dump ({reason}); expected the pickle of PyTorch's _dump_fr_trace() or the JSON of _dump_fr_trace_json()")]
    Format { source_name: String, reason: String },
    #[error("{source_name}: process group {group:?} lists its ranks as {ranks:?}; expected a list like \"[0, 1]\"")]
    Ranks { source_name: String, group: String, ranks: String },
}

/// Reads a dump, pickle or JSON (told apart by the first byte); `source_name` names it in errors.
pub fn parse(bytes: &[u8], source_name: &str) -> Result<Dump, DumpError> {
    parse_with(bytes, source_name, &mut GroupIds::new())
}

/// `parse` for one rank's dumps in turn: `ids` resolves the `pg_status` of a dump without
/// entries, and learns from each dump's entries.
pub fn parse_with(bytes: &[u8], source_name: &str, ids: &mut GroupIds) -> Result<Dump, DumpError> {
    let raw: RawDump = if bytes.first() == Some(&b'{') {
        serde_json::from_slice(bytes).map_err(|e| format_error(source_name, format!("JSON: {e}")))?
    } else {
        let value = pickle::read(bytes).map_err(|e| format_error(source_name, format!("pickle: {e}")))?;
        serde_json::from_value(value).map_err(|e| format_error(source_name, format!("pickle: {e}")))?
    };
    raw.into_dump(source_name, ids)
}

fn format_error(source_name: &str, reason: String) -> DumpError {
    DumpError::Format { source_name: source_name.to_string(), reason }
}

#[derive(Deserialize)]
struct RawDump {
    #[serde(default)]
    version: String,
    #[serde(default)]
    pg_config: BTreeMap<String, RawGroup>,
    #[serde(default)]
    pg_status: BTreeMap<String, RawStatus>,
    #[serde(default)]
    entries: Vec<RawEntry>,
}

#[derive(Deserialize)]
struct RawGroup {
    #[serde(default)]
    name: String,
    #[serde(default)]
    desc: String,
    #[serde(default)]
    ranks: String,
}

#[derive(Deserialize)]
struct RawStatus {
    #[serde(default, deserialize_with = "lenient_i64")]
    last_enqueued_collective: i64,
    #[serde(default, deserialize_with = "lenient_i64")]
    last_completed_collective: i64,
}

#[derive(Deserialize)]
struct RawEntry {
    #[serde(default)]
    frames: Vec<RawFrame>,
    #[serde(default, deserialize_with = "lenient_i64")]
    record_id: i64,
    #[serde(default, deserialize_with = "lenient_i64")]
    pg_id: i64,
    process_group: (String, String),
    #[serde(default, deserialize_with = "lenient_i64")]
    collective_seq_id: i64,
    #[serde(default)]
    profiling_name: String,
    #[serde(default, deserialize_with = "lenient_i64")]
    time_created_ns: i64,
    #[serde(default)]
    duration_ms: Option<f64>,
    #[serde(default)]
    input_sizes: Vec<Vec<i64>>,
    #[serde(default)]
    output_sizes: Vec<Vec<i64>>,
    #[serde(default)]
    input_dtypes: Vec<String>,
    #[serde(default)]
    state: String,
    #[serde(default)]
    retired: bool,
    #[serde(default)]
    is_p2p: bool,
}

#[derive(Deserialize)]
struct RawFrame {
    #[serde(default)]
    name: String,
    #[serde(default)]
    filename: String,
    #[serde(default, deserialize_with = "lenient_i64")]
    line: i64,
}

impl RawDump {
    fn into_dump(self, source_name: &str, ids: &mut GroupIds) -> Result<Dump, DumpError> {
        // `pg_status` is keyed by the rank's own index of the group (an entry's `pg_id`), the
        // entries name it (`process_group.0`), which is what every member shares.
        let mut seen = BTreeMap::new();
        for e in &self.entries {
            seen.entry(e.pg_id).or_insert_with(|| e.process_group.clone());
        }
        ids.extend(seen);
        let names: BTreeMap<i64, String> = ids.iter().map(|(id, (name, _))| (*id, name.clone())).collect();
        let mut groups: Vec<Group> = Vec::new();
        // Gloo's 2.11 dumps carry one config with an empty name: nothing to go by.
        for (key, g) in self.pg_config {
            let name = if g.name.is_empty() { key } else { g.name };
            if name.is_empty() {
                continue;
            }
            let ranks = parse_ranks(&g.ranks).ok_or_else(|| DumpError::Ranks {
                source_name: source_name.to_string(),
                group: name.clone(),
                ranks: g.ranks.clone(),
            })?;
            groups.push(Group { name, desc: g.desc, ranks, ..Group::default() });
        }
        let mut entries: Vec<Entry> = self.entries.into_iter().map(RawEntry::into_entry).collect();
        entries.sort_by_key(|e| e.record_id);
        for e in &entries {
            match groups.iter_mut().find(|g| g.name == e.group) {
                Some(g) if g.desc.is_empty() => g.desc.clone_from(&e.group_desc),
                Some(_) => {}
                None => groups.push(Group { name: e.group.clone(), desc: e.group_desc.clone(), ..Group::default() }),
            }
        }
        let seq = |v: i64| v.max(0) as u64;
        for (key, status) in &self.pg_status {
            let Some(id) = key.parse::<i64>().ok() else { continue };
            let Some(name) = names.get(&id) else { continue };
            if !groups.iter().any(|g| &g.name == name) {
                // A group no entry of this dump names: known from earlier dumps.
                let desc = ids.get(&id).map(|(_, d)| d.clone()).unwrap_or_default();
                groups.push(Group { name: name.clone(), desc, ..Group::default() });
            }
            if let Some(g) = groups.iter_mut().find(|g| &g.name == name) {
                g.last_enqueued = seq(status.last_enqueued_collective);
                g.last_completed = seq(status.last_completed_collective);
            }
        }
        // The entries themselves, where the status is missing or behind (older dumps).
        for g in &mut groups {
            let mine = entries.iter().filter(|e| e.group == g.name && !e.is_p2p);
            let (enq, done) =
                mine.fold((0, 0), |(enq, done), e| (enq.max(e.seq), if e.finished() { done.max(e.seq) } else { done }));
            (g.last_enqueued, g.last_completed) = (g.last_enqueued.max(enq), g.last_completed.max(done));
        }
        Ok(Dump { version: self.version, groups, entries })
    }
}

impl RawEntry {
    fn into_entry(self) -> Entry {
        let state = match self.state.as_str() {
            "started" => EntryState::Started,
            "completed" => EntryState::Completed,
            _ => EntryState::Scheduled,
        };
        let frames = self
            .frames
            .into_iter()
            .map(|f| Frame { name: f.name, file: f.filename, line: f.line.clamp(0, u32::MAX as i64) as u32 })
            .collect();
        Entry {
            record_id: self.record_id.max(0) as u64,
            group: self.process_group.0,
            group_desc: self.process_group.1,
            seq: self.collective_seq_id.max(0) as u64,
            name: self.profiling_name,
            input_sizes: self.input_sizes,
            output_sizes: self.output_sizes,
            input_dtypes: self.input_dtypes,
            state,
            retired: self.retired,
            created_ns: self.time_created_ns.max(0) as u64,
            // The JSON writes 0 where the pickle has None.
            duration_ms: self.duration_ms.filter(|d| *d > 0.0),
            is_p2p: self.is_p2p,
            frames,
        }
    }
}

/// Bytes per element of PyTorch's dtype names as the recorder writes them ("Float", "BFloat16").
pub fn dtype_bytes(dtype: &str) -> u64 {
    match dtype {
        "Double" | "Long" | "ComplexFloat" => 8,
        "Float" | "Int" => 4,
        "Half" | "BFloat16" | "Short" => 2,
        "Byte" | "Char" | "Bool" | "Float8_e4m3fn" | "Float8_e5m2" => 1,
        "ComplexDouble" => 16,
        _ => 4,
    }
}

/// "[0, 1]" into [0, 1].
fn parse_ranks(s: &str) -> Option<Vec<u32>> {
    let inner = s.trim().strip_prefix('[')?.strip_suffix(']')?.trim();
    if inner.is_empty() {
        return Some(Vec::new());
    }
    inner.split(',').map(|r| r.trim().parse().ok()).collect()
}

/// An integer where the JSON variant may write it as a string and either may write None.
fn lenient_i64<'de, D: Deserializer<'de>>(d: D) -> Result<i64, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    #[allow(dead_code)] // `Nothing` only matches; what it holds is None.
    enum Lenient {
        Int(i64),
        Float(f64),
        Text(String),
        Nothing(Option<()>),
    }
    Ok(match Lenient::deserialize(d)? {
        Lenient::Int(i) => i,
        Lenient::Float(f) => f as i64,
        Lenient::Text(s) => s.trim().parse().unwrap_or(0),
        Lenient::Nothing(_) => 0,
    })
}
