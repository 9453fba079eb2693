//! PyTorch c10d's failures: the NCCL watchdog, heartbeat monitor, desync report, teardown, store and network errors.
//!
//! `ProcessGroupNCCL`'s watchdog, heartbeat monitor, desync report and teardown
//! (`torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp`, `TraceUtils.h`), and the store and
//! network failures of `TCPStore`/`socket.cpp`.
//!
//! Every message carries the process group's log prefix, which changed over the versions:
//! `[Rank 0] ` (1.8-2.1, and `WorkNCCL`'s own prefix since), `[PG 1 Rank 0] ` (2.2-2.3),
//! `[PG 0 (default_pg) Rank 3] ` (2.4), `[PG ID 0 PG GUID 0(default_pg) Rank 1] ` and
//! `[PG ID 2 PG GUID 9 Rank 4] ` (2.5+); read into `rank` (the rank within that group),
//! `pg_id`, `pg_guid`, `pg_desc`. 1.x-2.0 printed some lines with no prefix.
//!
//! The watchdog's timeout: `Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5,
//! OpType=ALLREDUCE, NumelIn=1024, NumelOut=1024, Timeout(ms)=600000) ran for 600012
//! milliseconds before timing out.` (`SeqNum` since 1.10, `NumelIn`/`NumelOut` since 2.0; 1.8's
//! `WorkNCCL(OpType=…, TensorShape=[…], Timeout(ms)=…)`); `Timeout at NCCL work: N, last enqueued
//! NCCL work: N, last completed NCCL work: N.` (2.2+); `Exception (either an error or timeout)
//! detected by watchdog at work: N, …` (2.3-2.7) and ` failure detected by watchdog at work
//! sequence id: N PG status: last enqueued work: N, last completed work: N` (2.8+).
use super::{after, between, event, lead_int, lead_num, Bytes, Put};
use crate::adapters::value::Scan;
use crate::adapters::{Label, Record};

/// The watchdog's and heartbeat monitor's lines: phrases with `NCCL` or `watchdog` in them are
/// searched when the line has those; the others only right after a c10d prefix.
pub(super) fn parse(line: u64, t: &str, b: &Bytes, nccl: bool) -> Option<Record> {
    let message = if b.has(b'R') { message(t) } else { None };
    // A message right after its prefix starts with its phrase: no search of the whole line.
    let watchdog = match message {
        Some((_, true)) => false,
        _ => (b.has(b'w') || b.has(b'W')) && (nccl || b.has(b'R')) && t.has("atchdog"),
    };
    if let Some(r) = phrases(line, t, nccl, watchdog, message) {
        return Some(r);
    }
    if b.has(b'B') && t.has(" monitoredBarrier in ") {
        return barrier(line, t);
    }
    None
}

/// The message after the c10d prefixes (`[PG ID 0 PG GUID 0(default_pg) Rank 6] [PG ID 0 …] MSG`),
/// and whether only bracketed headers (glog's `[E …] `) come before the first prefix: when other
/// text does (`RuntimeError: NCCL communicator was aborted … [Rank 1] Watchdog …`, a bar glued
/// before the line), the phrases are searched in the whole line.
fn message(t: &str) -> Option<(&str, bool)> {
    let start = match (t.at("[Rank "), t.at("[PG ")) {
        (Some(a), Some(b)) => a.min(b),
        (Some(a), None) | (None, Some(a)) => a,
        (None, None) => return None,
    };
    let mut head = t[..start].trim_start();
    while let Some(inner) = head.strip_prefix('[') {
        let Some(end) = inner.find(']') else { break };
        head = inner[end + 1..].trim_start();
    }
    let mut m = &t[start..];
    while m.starts_with("[Rank ") || m.starts_with("[PG ") {
        let end = m.find(']')?;
        m = m[end + 1..].trim_start();
    }
    Some((m, head.is_empty()))
}

/// The c10d log prefix before position `end`: the first one in `t[..end]`.
fn prefix(r: &mut Record, t: &str, end: usize) {
    let head = t.get(..end).unwrap_or(t);
    let start = match (head.at("[Rank "), head.at("[PG ")) {
        (Some(a), Some(b)) => a.min(b),
        (Some(a), None) | (None, Some(a)) => a,
        (None, None) => return,
    };
    let Some(inner) = head[start + 1..].split(']').next() else { return };
    let Some((pg, rank)) = inner.rsplit_once("Rank ") else { return };
    let Some(rank) = super::whole(rank) else { return };
    let pg = pg.trim();
    if let Some(id) = pg.strip_prefix("PG ID ") {
        // `PG ID 0 PG GUID 0(default_pg)`, `PG ID 2 PG GUID 9`
        let (id, rest) = id.split_once(' ').unwrap_or((id, ""));
        r.int_of("pg_id", id);
        if let Some(guid) = rest.strip_prefix("PG GUID ") {
            let (guid, desc) = match guid.split_once('(') {
                Some((g, d)) => (g, d.strip_suffix(')')),
                None => (guid, None),
            };
            r.text("pg_guid", guid.trim());
            if let Some(d) = desc {
                r.text("pg_desc", d);
            }
        }
    } else if let Some(id) = pg.strip_prefix("PG ") {
        // `PG 1`, `PG 0 (default_pg)`
        let (id, desc) = match id.cut(" (") {
            Some((i, d)) => (i, d.strip_suffix(')')),
            None => (id, None),
        };
        r.int_of("pg_id", id);
        if let Some(d) = desc {
            r.text("pg_desc", d);
        }
    } else if !pg.is_empty() {
        return;
    }
    // A group other than the default one numbers its ranks its own way: that rank is not the
    // job's (the launcher's `[rankN]:` or the printing rank says which that is).
    let default = match (r.label("pg_id"), r.label("pg_desc")) {
        (_, Some(Label::Text(d))) => d == "default_pg",
        (Some(Label::Int(id)), None) => *id == 0,
        _ => true,
    };
    r.int(if default { "rank" } else { "pg_rank" }, rank);
}

/// `WorkNCCL(SeqNum=5, OpType=ALLREDUCE, NumelIn=1024, NumelOut=1024, Timeout(ms)=600000)` and
/// the `ran for N milliseconds` after it.
fn work(r: &mut Record, t: &str) {
    let Some(args) = after(t, "WorkNCCL(") else { return };
    let args = args.split(") ran for").next().unwrap_or(args);
    for kv in args.split(", ") {
        let Some((k, v)) = kv.split_once('=') else { continue };
        let v = v.trim_end_matches(')');
        match k {
            "SeqNum" => r.int_of("seq", v),
            "OpType" => r.text("op", v),
            "NumelIn" => r.int_of("numel_in", v),
            "NumelOut" => r.int_of("numel_out", v),
            "Timeout(ms)" => {
                if let Some(ms) = super::whole(v) {
                    r.metric("timeout_ms", ms as f64);
                }
            }
            _ => {}
        }
    }
    if let Some((ms, _)) = after(t, " ran for ").and_then(lead_int) {
        r.metric("ran_for_ms", ms as f64);
    }
}

/// `work: 5, last enqueued NCCL work: 6, last completed NCCL work: 4` and the 2.8 form
/// `sequence id: 5 PG status: last enqueued work: 6, last completed work: 4`.
fn sequence(r: &mut Record, after_phrase: &str) {
    if let Some((seq, _)) = lead_int(after_phrase) {
        r.int("seq", seq);
    }
    if let Some((n, _)) = after(after_phrase, "enqueued NCCL work: ")
        .or_else(|| after(after_phrase, "enqueued work: "))
        .and_then(lead_int)
    {
        r.int("last_enqueued", n);
    }
    if let Some((n, _)) = after(after_phrase, "completed NCCL work: ")
        .or_else(|| after(after_phrase, "completed work: "))
        .and_then(lead_int)
    {
        r.int("last_completed", n);
    }
}

/// The message after a phrase with a nested prefix (`… with exception: [Rank 1] Watchdog …`) stripped.
fn inner_message(s: &str) -> &str {
    let s = s.trim();
    if s.starts_with("[Rank ") || s.starts_with("[PG ") {
        if let Some(i) = s.at("] ") {
            return s[i + 2..].trim_start();
        }
    }
    s
}

/// Adds what a nested failure message says: a `WorkNCCL(…)`, an NCCL error's reason and version.
fn nested(r: &mut Record, inner: &str) {
    work(r, inner);
    if let Some(e) = super::nccl::error(r.line, inner) {
        for key in ["nccl_version"] {
            if let Some(crate::adapters::Label::Text(v)) = e.label(key) {
                let v = v.clone();
                r.text(key, &v);
            }
        }
    }
}

/// Which phrases need what: `N` the line has `NCCL`, `W` it has `watchdog`, `P` the phrase
/// starts the message after the prefix (or the line, 1.x printed some unprefixed).
const GROUPS: [u8; 18] = *b"WNNNNNWWPWPNPPPPWP";

/// The messages' starts (after the prefix), each with the phrase of `PHRASES` it holds.
const STARTS: [(&str, usize); 21] = [
    ("Process group watchdog thread terminated with exception: ", 0),
    ("NCCL watchdog thread terminated with exception: ", 0),
    ("NCCL communicator was aborted on rank ", 1),
    ("Collective WorkNCCL(", 2),
    ("Watchdog caught collective operation timeout: ", 3),
    ("Caught collective operation timeout: ", 3),
    ("Work WorkNCCL(", 4),
    ("Timeout at NCCL work: ", 5),
    ("Exception (either an error or timeout) detected by watchdog at work: ", 6),
    ("failure detected by watchdog at work sequence id: ", 7),
    ("Heartbeat monitor timed out!", 8),
    ("ProcessGroupNCCL's watchdog got stuck for ", 9),
    ("First PG on this rank that detected no heartbeat", 10),
    ("Some NCCL operations have failed or timed out", 11),
    ("To avoid data inconsistency, we are taking the entire process down", 12),
    ("Terminating the process after attempting to dump debug info, due to ", 13),
    ("Received a ", 14),
    ("Observed flight recorder dump signal", 15),
    ("ProcessGroupNCCL's watchdog detected a collective timeout and notified", 16),
    ("remote error detected from rank: ", 17),
    ("ProcessGroup", 9),
];

fn phrases(line: u64, t: &str, nccl: bool, watchdog: bool, message: Option<(&str, bool)>) -> Option<Record> {
    const PHRASES: [&str; 18] = [
        "atchdog thread terminated with exception: ",
        "NCCL communicator was aborted on rank ",
        " raised the following async exception: ",
        "aught collective operation timeout: ",
        " timed out in blocking wait",
        "Timeout at NCCL work: ",
        "detected by watchdog at work: ",
        "failure detected by watchdog at work sequence id: ",
        "Heartbeat monitor timed out!",
        "'s watchdog got stuck for ",
        "First PG on this rank that detected no heartbeat",
        "Some NCCL operations have failed or timed out",
        "To avoid data inconsistency, we are taking the entire process down",
        "Terminating the process after attempting to dump debug info, due to ",
        "Received a ",
        "Observed flight recorder dump signal",
        "s watchdog detected a collective timeout and notified",
        "remote error detected from rank: ",
    ];
    let offset = |m: &str| m.as_ptr() as usize - t.as_ptr() as usize;
    let found = match message {
        Some((m, true)) => STARTS.iter().find(|(s, _)| m.starts_with(s)).and_then(|(s, k)| {
            // `ProcessGroupXCCL's watchdog …` of any backend.
            let k = if *s == "ProcessGroup" && m.has("'s watchdog detected a collective timeout") { 16 } else { *k };
            m.find(PHRASES[k]).map(|i| (k, offset(m) + i))
        }),
        _ => PHRASES.iter().enumerate().find_map(|(k, p)| match GROUPS[k] {
            b'N' if nccl => t.find(p).map(|i| (k, i)),
            b'W' if watchdog => t.find(p).map(|i| (k, i)),
            b'P' => match message {
                Some((m, _)) if m.starts_with(p) => Some((k, offset(m))),
                _ if t.starts_with(p) => Some((k, 0)),
                _ if nccl && k == 12 => t.find(p).map(|i| (k, i)),
                _ => None,
            },
            _ => None,
        }),
    };
    let (k, at) = found?;
    let rest = &t[at + PHRASES[k].len()..];
    let name = match k {
        0 => "watchdog_terminated",
        1 => "nccl_comm_aborted",
        2 => "collective_error",
        3..=5 => "nccl_timeout",
        6 | 7 => "watchdog_exception",
        8..=10 => "heartbeat_timeout",
        11 => "nccl_ops_failed",
        12 | 13 => "process_teardown",
        14 => {
            // `Received a dump signal …`, `Received a timeout signal …`, `Received a global timeout from another rank …`
            let signal = rest.starts_with("dump signal")
                || rest.starts_with("timeout signal")
                || rest.starts_with("global timeout");
            if !signal {
                return None;
            }
            "dump_signal"
        }
        15 | 16 => "dump_signal",
        _ => "remote_error",
    };
    let mut r = event(line, name);
    prefix(&mut r, t, at);
    match k {
        0 => {
            let inner = inner_message(rest);
            r.text("reason", inner);
            nested(&mut r, inner);
        }
        1 => {
            // `NCCL communicator was aborted on rank 1.  Original reason for failure was: …`
            if let Some((rank, _)) = lead_int(rest) {
                r.int("rank", rank);
            }
            if let Some(inner) = after(rest, "Original reason for failure was: ") {
                let inner = inner_message(inner);
                r.text("reason", inner);
                nested(&mut r, inner);
            }
        }
        2 => {
            // `Collective WorkNCCL(…) raised the following async exception: NCCL error: …`
            work(&mut r, &t[..at]);
            if let Some(e) = super::nccl::error(line, rest) {
                r.labels[0].1 = crate::adapters::Label::Text("nccl_error".into());
                for (k, v) in e.labels.into_iter().skip(1) {
                    if r.label(&k).is_none() {
                        r.labels.push((k, v));
                    }
                }
            } else {
                r.text("reason", rest.trim());
            }
        }
        3 | 4 => work(&mut r, t),
        5..=7 => sequence(&mut r, rest),
        8 => {
            if let Some((n, _)) = after(rest, "workMetaList_.size()=").and_then(lead_int) {
                r.int("work_list_size", n);
            }
        }
        9 => {
            if let Some((s, _)) = lead_num(rest) {
                r.metric("timeout_s", s);
            }
        }
        13 => {
            let reason = rest.trim().trim_end_matches('.');
            r.text("reason", reason);
        }
        14..=16 => {
            if let Some((n, _)) = after(t, "ast enqueued NCCL work: ").and_then(lead_int) {
                r.int("last_enqueued", n);
            }
            if let Some((n, _)) = after(t, "ast completed NCCL work: ").and_then(lead_int) {
                r.int("last_completed", n);
            }
            if let Some(from) = after(rest, "from ").map(str::trim_start).and_then(|s| s.strip_prefix("rank ")) {
                if let Some((n, _)) = lead_int(from) {
                    r.int("from_rank", n);
                }
            }
        }
        17 => {
            if let Some((n, _)) = lead_int(rest.trim_start()) {
                r.int("from_rank", n);
            }
        }
        _ => {}
    }
    Some(r)
}

/// `TORCH_NCCL_DESYNC_DEBUG`'s report (`TraceUtils.h` `retrieveDesyncReport`), one line each:
/// `\t - [0] Timeout at collective: ALLREDUCE, #5`, `\t - To our best knowledge, ranks [1, 3] are
/// the lagging ranks that caused this timeout. They never joined any collectives`, `\t   - [1]
/// joined but didn't finish collective #5 (count from 1)`, `\t     [0, 2] finished collective #5,
/// but didn't join collective #6 (count from 1)`. Also `ProcessGroupGloo`'s `Ranks 1, 2 failed to
/// pass monitoredBarrier in 30000 ms` and `ProcessGroupWrapper`'s `Detected mismatch between
/// collectives on ranks.`
pub(super) fn desync(line: u64, t: &str) -> Option<Record> {
    let ranks_in = |s: &str| -> Option<(String, i64)> {
        let list = s.split(']').next()?.trim_start_matches('[');
        let ranks: Vec<i64> = list.split(',').map(super::whole).collect::<Option<_>>()?;
        Some((ranks.iter().map(|r| r.to_string()).collect::<Vec<_>>().join(", "), *ranks.first()?))
    };
    let body = t.trim_start().trim_start_matches("- ").trim_start();
    if let Some(i) = t.at("] Timeout at collective: ") {
        let open = t[..i].rfind('[')?;
        let rank = super::whole(&t[open + 1..i])?;
        let rest = &t[i + "] Timeout at collective: ".len()..];
        let (op, seq) = rest.rsplit_once(", #")?;
        let mut r = event(line, "desync_timeout");
        r.int("rank", rank);
        r.text("op", op.trim());
        r.int_of("seq", seq);
        return Some(r);
    }
    if let Some(list) = between(t, "To our best knowledge, ranks ", " are the lagging ranks") {
        let (ranks, first) = ranks_in(list)?;
        let mut r = event(line, "desync_lagging");
        r.int("rank", first);
        r.text("ranks", &ranks);
        return Some(r);
    }
    if body.starts_with('[') {
        if let Some(seq) = after(body, "] joined but didn't finish collective #") {
            let (ranks, first) = ranks_in(body)?;
            let mut r = event(line, "desync_lagging");
            r.int("rank", first);
            r.text("ranks", &ranks);
            r.int("seq", lead_int(seq)?.0);
            return Some(r);
        }
        if let Some(seq) = after(body, ", but didn't join collective #") {
            if body.has("] finished collective #") {
                let (ranks, first) = ranks_in(body)?;
                let mut r = event(line, "desync_lagging");
                r.int("rank", first);
                r.text("ranks", &ranks);
                r.int("seq", lead_int(seq)?.0);
                return Some(r);
            }
        }
    }
    if let Some(rest) = after(t, "Detected mismatch between collectives on ranks. ") {
        let mut r = event(line, "collective_mismatch");
        r.text("reason", rest.trim());
        return Some(r);
    }
    None
}

fn barrier(line: u64, t: &str) -> Option<Record> {
    if let Some(i) = t.at(" failed to pass monitoredBarrier in ") {
        // `Ranks 1, 2 failed to pass monitoredBarrier in 30000 ms`
        let head = &t[..i];
        let list = head.rsplit_once("Ranks ").or_else(|| head.rsplit_once("Rank "))?.1;
        let ranks: Vec<i64> = list.split(',').map(super::whole).collect::<Option<_>>()?;
        let mut r = event(line, "barrier_timeout");
        r.int("rank", *ranks.first()?);
        r.text("ranks", &ranks.iter().map(|r| r.to_string()).collect::<Vec<_>>().join(", "));
        if let Some((ms, _)) = lead_int(&t[i + " failed to pass monitoredBarrier in ".len()..]) {
            r.metric("timeout_ms", ms as f64);
        }
        return Some(r);
    }
    None
}

/// The store's and the sockets' failures, as exceptions or log lines: `Timed out after 901
/// seconds waiting for clients. 1/2 clients joined.` (2.2+; `workers` in 2.2's first form),
/// `wait timeout after 900000ms, keys: …` (`DistStoreError`, 2.1+), `Socket Timeout` (1.x),
/// `Timed out initializing process group in store based barrier on rank: 4, for key: …
/// (world_size=8, worker_count=4, timeout=0:30:00)` (1.9-2.1), `The client socket has timed out
/// after 900s while trying to connect to (host, 29500).` (`socket.cpp`, 1.13+).
pub(super) fn store_or_network(line: u64, t: &str) -> Option<Record> {
    if !(t.has("imeout") || t.has("imed out")) {
        return None;
    }
    if let Some(rest) = after(t, "Timed out after ") {
        let (secs, rest) = lead_int(rest)?;
        let rest = rest.strip_prefix(" seconds waiting for ")?;
        let (_, counts) = rest.cut(". ")?;
        let (joined, rest) = lead_int(counts)?;
        let (expected, _) = lead_int(rest.strip_prefix('/')?)?;
        let mut r = event(line, "store_timeout");
        r.metric("waited_s", secs as f64);
        r.int("clients_joined", joined);
        r.int("clients_expected", expected);
        return Some(r);
    }
    if let Some(rest) = after(t, "ait timeout after ") {
        let (ms, rest) = lead_int(rest)?;
        let mut r = event(line, "store_timeout");
        r.metric("timeout_ms", ms as f64);
        if let Some(keys) = rest.strip_prefix("ms, keys: ") {
            r.text("keys", keys.trim());
        }
        return Some(r);
    }
    if let Some(rest) = after(t, "Timed out initializing process group in store based barrier on rank") {
        let mut r = event(line, "store_timeout");
        if let Some((rank, _)) = lead_int(rest.trim_start_matches([':', ' '])) {
            r.int("rank", rank);
        }
        for (key, name) in [("world_size=", "world_size"), ("worker_count=", "worker_count")] {
            if let Some((n, _)) = after(rest, key).and_then(lead_int) {
                r.int(name, n);
            }
        }
        return Some(r);
    }
    if let Some(rest) = after(t, "The client socket has timed out after ") {
        let (secs, rest) = lead_num(rest)?;
        let mut r = event(line, "dist_network_error");
        r.metric("timeout_s", secs);
        if let Some(peer) = between(rest, "connect to (", ")") {
            r.text("peer", &peer.replace(", ", ":"));
        }
        r.text("reason", "client socket timed out");
        return Some(r);
    }
    if t.ends_with("Socket Timeout") {
        let mut r = event(line, "store_timeout");
        r.text("reason", "Socket Timeout");
        return Some(r);
    }
    None
}
