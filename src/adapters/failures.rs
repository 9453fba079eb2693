//! Failures any framework's job prints: torchrun's ChildFailedError block, PyTorch's NCCL watchdog timeout, CUDA out of memory.
//!
//! - torchrun (`torch/distributed/elastic/multiprocessing/errors/__init__.py`,
//!   `ChildFailedError.format_msg`, PyTorch 2.11): a block of lines between `====` rules, one
//!   `[k]:` entry per failed rank with `time`, `host`, `rank : 1 (local_rank: 1)`, `exitcode : 1
//!   (pid: 4243)` (negative: the signal), `error_file`, `traceback`. One event per entry, with
//!   `end_line`. This is the one stateful adapter; its state is bounded (`MAX_BLOCK_LINES`).
//! - NCCL (`ProcessGroupNCCL.cpp`): `[Rank 1] Watchdog caught collective operation timeout:
//!   WorkNCCL(SeqNum=5, OpType=ALLREDUCE, NumelIn=1024, NumelOut=1024, Timeout(ms)=600000) ran
//!   for 600012 milliseconds before timing out.`
//! - CUDA (`c10/cuda/CUDACachingAllocator.cpp`): `CUDA out of memory. Tried to allocate 20.00
//!   MiB. GPU 0 has a total capacity of 79.15 GiB of which 6.69 MiB is free. ...`, sizes in MiB.
use super::value::{leading_count, number, size_mib};
use super::{Label, Record, RecordKind};

/// A block longer than this is not torchrun's: it is dropped.
const MAX_BLOCK_LINES: u64 = 200;

#[derive(Debug, Default)]
pub struct Failures {
    block: Option<Block>,
}

#[derive(Debug)]
struct Block {
    start: u64,
    program: Option<String>,
    entry: Option<Record>,
    /// Rules (`====`) seen; the third closes the block.
    rules: u32,
}

impl Failures {
    /// Reads one line; `None` when it is not a failure's (so the metric adapters may read it).
    pub fn push(&mut self, line: u64, text: &str) -> Option<Vec<Record>> {
        if let Some(block) = &mut self.block {
            if line.saturating_sub(block.start) > MAX_BLOCK_LINES {
                self.block = None;
            } else {
                return Some(self.in_block(line, text));
            }
        }
        if text.contains("ChildFailedError") && text.trim_end().ends_with(':') {
            self.block = Some(Block { start: line, program: None, entry: None, rules: 0 });
            return Some(Vec::new());
        }
        if text.contains("Watchdog caught collective operation timeout") {
            return nccl_timeout(line, text).map(|r| vec![r]);
        }
        if text.contains("CUDA out of memory") {
            return cuda_oom(line, text).map(|r| vec![r]);
        }
        None
    }

    /// The block's last entry, if the stream ends inside it.
    pub fn finish(&mut self) -> Vec<Record> {
        self.block.take().and_then(|b| b.entry).into_iter().collect()
    }

    fn in_block(&mut self, line: u64, text: &str) -> Vec<Record> {
        let Some(block) = &mut self.block else { return Vec::new() };
        let t = text.trim();
        let mut out = Vec::new();
        if t.starts_with("====") {
            block.rules += 1;
            if block.rules >= 2 && block.entry.is_some() {
                out.extend(block.entry.take());
                self.block = None;
            }
            return out;
        }
        if let Some(program) = t.strip_suffix(" FAILED") {
            block.program = Some(program.to_string());
        } else if t.starts_with('[') && t.ends_with("]:") {
            out.extend(block.entry.take());
            let mut r = Record::at(line, RecordKind::Event);
            r.end_line = Some(line);
            r.labels.push(("event".into(), Label::Text("child_failed".into())));
            if let Some(p) = &block.program {
                r.labels.push(("program".into(), Label::Text(p.clone())));
            }
            block.entry = Some(r);
        } else if let (Some(r), Some((key, value))) = (&mut block.entry, t.split_once(':')) {
            if field(r, key.trim(), value.trim()) {
                r.end_line = Some(line);
            }
        }
        out
    }
}

/// One `key : value` line of an entry; false for a line that is not one of its fields.
fn field(r: &mut Record, key: &str, value: &str) -> bool {
    let int = |s: &str| s.trim().parse::<i64>().ok();
    match key {
        "host" => r.labels.push(("host".into(), Label::Text(value.to_string()))),
        "rank" => {
            // `1 (local_rank: 1)`
            let (rank, rest) = value.split_once(' ').unwrap_or((value, ""));
            r.labels.extend(int(rank).map(|v| ("rank".to_string(), Label::Int(v))));
            let local = rest.split_once("local_rank:").and_then(|(_, l)| int(l.trim_end_matches(')')));
            r.labels.extend(local.map(|v| ("local_rank".to_string(), Label::Int(v))));
        }
        "exitcode" => {
            // `1 (pid: 4243)`, or `-9 (pid: 4243)` for a signal.
            let (code, rest) = value.split_once(' ').unwrap_or((value, ""));
            match int(code) {
                Some(c) if c < 0 => r.labels.push(("signal".into(), Label::Int(-c))),
                Some(c) => r.labels.push(("exit_code".into(), Label::Int(c))),
                None => {}
            }
            let pid = rest.split_once("pid:").and_then(|(_, p)| int(p.trim_end_matches(')')));
            r.labels.extend(pid.map(|v| ("pid".to_string(), Label::Int(v))));
        }
        "traceback" if value.starts_with("Signal ") => {
            // `Signal 9 (SIGKILL) received by PID 4243`
            let name = value.split_once('(').and_then(|(_, n)| n.split_once(')')).map(|(n, _)| n.to_string());
            r.labels.extend(name.map(|n| ("signal_name".to_string(), Label::Text(n))));
        }
        "time" | "error_file" | "traceback" => {}
        _ => return false,
    }
    true
}

fn nccl_timeout(line: u64, text: &str) -> Option<Record> {
    let mut r = Record::at(line, RecordKind::Event);
    r.labels.push(("event".into(), Label::Text("nccl_timeout".into())));
    if let Some((_, rest)) = text.split_once("[Rank ") {
        r.labels.extend(leading_count(rest).map(|(n, _)| ("rank".to_string(), Label::Int(n as i64))));
    }
    let (_, work) = text.split_once("WorkNCCL(")?;
    let args = work.split_once(") ran for").map_or(work.trim_end_matches(')'), |(a, _)| a);
    for kv in args.split(", ") {
        let Some((k, v)) = kv.split_once('=') else { continue };
        let int = v.parse::<i64>().ok();
        match k {
            "SeqNum" => r.labels.extend(int.map(|s| ("seq".to_string(), Label::Int(s)))),
            "OpType" => r.labels.push(("op".into(), Label::Text(v.to_string()))),
            "NumelIn" => r.labels.extend(int.map(|n| ("numel_in".to_string(), Label::Int(n)))),
            "NumelOut" => r.labels.extend(int.map(|n| ("numel_out".to_string(), Label::Int(n)))),
            "Timeout(ms)" => r.metrics.extend(number(v).map(|t| ("timeout_ms".to_string(), t))),
            _ => {}
        }
    }
    if let Some((_, ran)) = text.split_once(" ran for ") {
        r.metrics.extend(leading_count(ran).map(|(ms, _)| ("ran_for_ms".to_string(), ms as f64)));
    }
    Some(r)
}

fn cuda_oom(line: u64, text: &str) -> Option<Record> {
    let mut r = Record::at(line, RecordKind::Event);
    r.labels.push(("event".into(), Label::Text("cuda_oom".into())));
    let between = |start: &str, end: &str| -> Option<f64> {
        let (_, rest) = text.split_once(start)?;
        size_mib(rest.split_once(end)?.0)
    };
    if let Some((_, gpu)) = text.split_once(". GPU ") {
        r.labels.extend(leading_count(gpu).map(|(g, _)| ("gpu".to_string(), Label::Int(g as i64))));
    }
    let sizes = [
        ("tried_mib", between("Tried to allocate ", ". ")),
        ("total_mib", between("has a total capacity of ", " of which")),
        ("free_mib", between(" of which ", " is free")),
        ("in_use_mib", between("this process has ", " memory in use")),
        ("allocated_mib", between("Of the allocated memory ", " is allocated by PyTorch")),
        ("reserved_unallocated_mib", between("PyTorch, and ", " is reserved by PyTorch but unallocated")),
    ];
    r.metrics.extend(sizes.into_iter().filter_map(|(k, v)| v.map(|v| (k.to_string(), v))));
    Some(r)
}
