//! NCCL's own lines and PyTorch's `NCCL error` messages.
//!
//! - `src/debug.cc` `ncclDebugLog` (NCCL 2.4 to 2.30): `HOST:PID:TID [DEV] FILE:LINE NCCL WARN MSG`
//!   (a blank line before it), `HOST:PID:TID [DEV] NCCL INFO MSG`; since 2.26 a `[%F %T] `
//!   timestamp before WARN lines by default (`NCCL_DEBUG_TIMESTAMP_FORMAT`, `…_LEVELS`). Every
//!   WARN is a `nccl_warn` event, with `host`, `pid`, `tid`, `gpu`, `file`, `src_line`, `reason` (the
//!   message) and `transport` (`NET/IB`, `NET/Socket`, `NET/Plugin`, `Proxy`, …). The IB
//!   completion error in its three forms (`with error 12, opcode 0, len 0, vendor err 129` to
//!   2.20; `with status=12 opcode=0 len=0 vendor err 129 (Recv)` 2.21+; `with
//!   status=transport retry counter exceeded(12) opcode=…(0) … vendor_err=129 …` 2.28+) also gives
//!   `peer`, `status`, `opcode`, `vendor_err`, `req_type`, `hca`.
//! - INFO lines that are facts, kind `info`: `NCCL version 2.18.1+cuda12.1` (also printed bare
//!   under `NCCL_DEBUG=VERSION|WARN`), `[FUNC] comm 0x… rank R nranks N cudaDev D [nvmlDev D] busId B
//!   [commId 0x…] - Init COMPLETE` (and `Abort COMPLETE`, `Destroy COMPLETE`), the ring
//!   `Channel 00/02 :    0   1`, the connections `Channel 00/0 : 0[0] -> 1[1] [send] via NET/IB/0`
//!   and `Using network IB`. Other INFO lines give nothing and are kept from the metric adapters.
//! - PyTorch's `NCCL error in: FILE:LINE, REASON (run with NCCL_DEBUG=INFO for details), NCCL
//!   version 2.18.1` (`ncclGetErrorWithVersion`, 1.0 to 2.11), the watchdog's `NCCL error:
//!   REASON, NCCL version V`, and 1.x's `NCCL Error N: REASON` (`torch/csrc/cuda/nccl.cpp`).
use super::{after, event, info, lead_int, Put, Read};
use crate::adapters::value::Scan;
use crate::adapters::Record;

pub(super) fn parse(line: u64, t: &str) -> Option<Read> {
    // One search: NCCL's level word follows its header.
    for (i, _) in t.match_indices(" NCCL ").take(4) {
        let after = &t[i + " NCCL ".len()..];
        let head = &t[..i];
        if let Some(msg) = after.strip_prefix("WARN ") {
            if headed(head) {
                return Some(Read::Record(warn(line, head, msg)));
            }
        } else if let Some(msg) = after.strip_prefix("INFO ") {
            if headed(head) {
                return Some(match info_line(line, msg) {
                    Some(mut r) => {
                        header(&mut r, head, false);
                        Read::Record(r)
                    }
                    None => Read::Consumed,
                });
            }
        } else if after.starts_with("TRACE ") || after.starts_with("CALL ") {
            return Some(Read::Consumed);
        }
    }
    if let Some(rest) = t.trim_start().strip_prefix("NCCL WARN ") {
        return Some(Read::Record(warn(line, "", rest)));
    }
    if let Some(v) = t.strip_prefix("NCCL version ") {
        return version(line, v).map(Read::Record);
    }
    None
}

/// Whether NCCL's own header ends `head`: the device (`[0]`, INFO) or the source place after it
/// (`[0] misc/socket.cc:46`, WARN). Prose that names `NCCL WARN` has neither.
fn headed(head: &str) -> bool {
    let mut words = head.split_whitespace().rev();
    let dev = |w: Option<&str>| {
        w.and_then(|w| w.strip_prefix('[')).and_then(|w| w.strip_suffix(']')).is_some_and(|d| super::whole(d).is_some())
    };
    let last = words.next();
    dev(last) || last.is_some_and(|w| w.rsplit_once(':').is_some_and(|(_, n)| whole(n))) && dev(words.next())
}

/// `HOST:PID:TID [DEV] FILE:LINE` (WARN) or `HOST:PID:TID [DEV]` (INFO), after any timestamp or
/// launcher prefix.
fn header(r: &mut Record, head: &str, warn: bool) {
    let mut words = head.split_whitespace().rev();
    let mut next = words.next();
    if warn {
        if let Some((file, num)) = next.and_then(|w| w.rsplit_once(':')) {
            if num.bytes().all(|b| b.is_ascii_digit()) && !num.is_empty() {
                r.text("file", file);
                r.int_of("src_line", num);
                next = words.next();
            }
        }
    }
    if let Some(dev) = next.and_then(|w| w.strip_prefix('[')).and_then(|w| w.strip_suffix(']')) {
        r.int_of("gpu", dev);
        next = words.next();
    }
    let Some(who) = next else { return };
    let mut parts = who.rsplitn(3, ':');
    let (tid, pid, host) = (parts.next(), parts.next(), parts.next());
    match (tid, pid, host) {
        (Some(tid), Some(pid), Some(host)) if whole(pid) && whole(tid) => {
            // A launcher prefix glued before the host (`…]<stdout>:host`) is not the host.
            let host = host.rsplit([':', '>', ']', ')']).next().unwrap_or(host);
            r.text("host", host);
            r.int_of("pid", pid);
            r.int_of("tid", tid);
        }
        _ => {}
    }
}

fn whole(s: &str) -> bool {
    !s.is_empty() && s.len() < 19 && s.bytes().all(|b| b.is_ascii_digit())
}

fn warn(line: u64, head: &str, msg: &str) -> Record {
    let mut r = event(line, "nccl_warn");
    header(&mut r, head, true);
    let msg = msg.trim();
    r.text("reason", msg);
    if let Some(t) = transport(msg) {
        r.text("transport", t);
    }
    if msg.has("Got completion from peer ") {
        ib_completion(&mut r, msg);
    }
    r
}

/// The transport a WARN names first: `NET/IB : …`, `NET/IB: …`, `NET/Socket : …`, `Net : …`,
/// `NET/Plugin: …`, `UDS: …`, `[Proxy Service 0] …`, `[Service thread] …`.
fn transport(msg: &str) -> Option<&str> {
    if msg.starts_with("[Proxy") || msg.starts_with("[Service thread]") {
        return Some("Proxy");
    }
    let end = msg.find(':')?;
    let name = msg[..end].trim_end();
    let known = name.starts_with("NET") || name == "Net" || name == "UDS" || name == "TOPO/NET" || name == "GIN";
    let plain = name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'/');
    (known && plain && !name.is_empty()).then_some(name)
}

/// The IB completion error's fields, in any version's form.
fn ib_completion(r: &mut Record, msg: &str) {
    if let Some(peer) = super::between(msg, "from peer ", " with ") {
        r.text("peer", peer);
    }
    // `with error 12,` (to 2.20), `with status=12 ` (2.21+), `with status=transport retry counter exceeded(12) ` (2.28+)
    if let Some(rest) = after(msg, " with error ").or_else(|| after(msg, " with status=")) {
        if let Some((v, _)) = lead_int(rest) {
            r.int("status", v);
        } else if let Some((name, rest)) = rest.split_once('(') {
            r.text("status_name", name);
            r.int_of("status", rest.split(')').next().unwrap_or(""));
        }
    }
    if let Some(rest) = after(msg, "opcode ").or_else(|| after(msg, "opcode=")) {
        if let Some((v, _)) = lead_int(rest) {
            r.int("opcode", v);
        } else if let Some((_, rest)) = rest.split_once('(') {
            r.int_of("opcode", rest.split(')').next().unwrap_or(""));
        }
    }
    if let Some(rest) = after(msg, "vendor err ").or_else(|| after(msg, "vendor_err=")) {
        if let Some((v, rest)) = lead_int(rest) {
            r.int("vendor_err", v);
            // `vendor err 129 (Recv)`
            if let Some(kind) = rest.strip_prefix(" (").and_then(|k| k.split(')').next()) {
                r.text("req_type", kind);
            }
        }
    }
    if let Some(kind) = after(msg, "req_type=") {
        r.text("req_type", kind.split(|c: char| c.is_whitespace()).next().unwrap_or(""));
    }
    if let Some(hca) = after(msg, " hca ") {
        r.text("hca", hca.split_whitespace().next().unwrap_or(""));
    }
}

/// The INFO lines that are facts; `None` for the rest.
fn info_line(line: u64, msg: &str) -> Option<Record> {
    let msg = msg.trim();
    if let Some(v) = msg.strip_prefix("NCCL version ") {
        return version(line, v);
    }
    if let Some(rest) = msg.strip_prefix("Channel ") {
        return channel(line, rest);
    }
    if let Some(net) = msg.strip_prefix("Using network ") {
        let mut r = info(line, "nccl_net");
        r.text("transport", net.trim());
        return Some(r);
    }
    let done = if msg.ends_with(" - Init COMPLETE") {
        "nccl_init"
    } else if msg.ends_with(" - Abort COMPLETE") {
        "nccl_abort"
    } else if msg.ends_with(" - Destroy COMPLETE") {
        "nccl_destroy"
    } else {
        return None;
    };
    // `[ncclCommInitRank ]comm 0x… rank 0 nranks 8 cudaDev 0 [nvmlDev 0 ]busId 1000 [commId 0x…] - Init COMPLETE`
    let (func, rest) = msg.cut("comm 0x")?;
    let mut r = info(line, done);
    let func = func.trim();
    if !func.is_empty() {
        r.text("func", func);
    }
    let mut words = rest.split_whitespace();
    if let Some(ptr) = words.next() {
        r.text("comm", &format!("0x{ptr}"));
    }
    while let Some(key) = words.next() {
        if key == "-" {
            break;
        }
        let Some(value) = words.next() else { break };
        match key {
            "rank" => r.int_of("rank", value),
            "nranks" | "nRanks" => r.int_of("nranks", value),
            "cudaDev" => r.int_of("gpu", value),
            "nvmlDev" => r.int_of("nvml_dev", value),
            "busId" => r.text("bus_id", value),
            "commId" => r.text("comm_id", value),
            "parent" => r.text("parent", value),
            "color" => r.int_of("color", value),
            "key" => r.int_of("key", value),
            _ => {}
        }
    }
    Some(r)
}

/// `2.18.1+cuda12.1`
fn version(line: u64, v: &str) -> Option<Record> {
    let v = v.trim();
    let (nccl, cuda) = match v.cut("+cuda") {
        Some((n, c)) => (n, Some(c)),
        None => (v, None),
    };
    let numeric = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit() || b == b'.');
    if !numeric(nccl) || cuda.is_some_and(|c| !numeric(c)) {
        return None;
    }
    let mut r = info(line, "nccl_version");
    r.text("nccl_version", nccl);
    if let Some(c) = cuda {
        r.text("cuda_version", c);
    }
    Some(r)
}

/// The ring (`00/02 :    0   1   2   3`) or a connection (`00/0 : 0[0] -> 1[1] [send] via NET/IB/0`).
fn channel(line: u64, rest: &str) -> Option<Record> {
    let (head, body) = rest.cut(" : ")?;
    let (num, of) = match head.split_once('/') {
        Some((n, o)) => (n, Some(o)),
        None => (head, None),
    };
    let channel = super::whole(num)?;
    if let Some((path, via)) = body.cut(" via ") {
        let mut r = info(line, "nccl_connection");
        r.int("channel", channel);
        let mut words = path.split_whitespace();
        let from = words.next()?;
        if words.next() != Some("->") {
            return None;
        }
        let to = words.next()?;
        let rank = |w: &str| super::whole(w.split('[').next().unwrap_or(w));
        r.int("src_rank", rank(from)?);
        r.int("dst_rank", rank(to)?);
        if let Some(dir) = words.next().and_then(|w| w.strip_prefix('[')).and_then(|w| w.strip_suffix(']')) {
            r.text("direction", dir);
        }
        r.text("transport", via.split_whitespace().next().unwrap_or(""));
        return Some(r);
    }
    let ranks: Vec<&str> = body.split_whitespace().collect();
    if ranks.is_empty() || !ranks.iter().all(|w| super::whole(w).is_some()) {
        return None;
    }
    let mut r = info(line, "nccl_channel");
    r.int("channel", channel);
    if let Some(n) = of.and_then(super::whole) {
        r.int("channels", n);
    }
    r.text("ring", &ranks.join(" "));
    Some(r)
}

/// PyTorch's NCCL error text, anywhere in the line (after `RuntimeError: `, `what():  `, a
/// watchdog's prefix): `NCCL error in: FILE:LINE, REASON, NCCL version V`, `NCCL error: REASON,
/// NCCL version V`, `NCCL Error N: REASON`.
pub(super) fn error(line: u64, t: &str) -> Option<Record> {
    let mut r = event(line, "nccl_error");
    let rest = if let Some(rest) = after(t, "NCCL error in: ") {
        // `../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1333, unhandled system error …`
        let (place, rest) = rest.cut(", ")?;
        let (file, num) = place.rsplit_once(':')?;
        r.text("file", file);
        r.int_of("src_line", num);
        rest
    } else if let Some(rest) = after(t, "NCCL error: ") {
        rest
    } else if let Some(rest) = after(t, "NCCL Error ") {
        let (code, rest) = lead_int(rest)?;
        r.int("code", code);
        rest.strip_prefix(": ")?
    } else {
        return None;
    };
    let (reason, version) = match rest.rsplit_once(", NCCL version ") {
        Some((reason, v)) => (reason, Some(v)),
        None => (rest, None),
    };
    let reason = reason.split(" (run with NCCL_DEBUG").next().unwrap_or(reason).trim();
    if reason.is_empty() {
        return None;
    }
    r.text("reason", reason);
    if let Some(v) = version {
        r.text("nccl_version", v.split_whitespace().next().unwrap_or(v));
    }
    Some(r)
}
