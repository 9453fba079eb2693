//! gloo's errors as PyTorch raises them: enforce failures, closed connections, timeouts.
//!
//! From pytorch/gloo, `gloo/common/logging.cc`, `gloo/common/error.h`,
//! `gloo/transport/tcp/pair.cc`, `unbound_buffer.cc`) as PyTorch raises them.
//!
//! - `GLOO_ENFORCE`: `[enforce fail at ../third_party/gloo/gloo/transport/tcp/pair.cc:446]
//!   op.preamble.length <= op.nbytes. 8773308 vs 4`
//! - `GLOO_ERROR_MSG`: `[../third_party/gloo/gloo/transport/tcp/pair.cc:598] Connection closed by
//!   peer [10.0.0.1]:5643`, `… Read error [10.0.0.1]:41530: Connection reset by peer`, `… Timed out
//!   waiting 1800000ms for recv operation to complete`, `… Socket closed [ip]:port`, `… connect
//!   [ip]:port: Connection refused`
//! - `ProcessGroupGloo.cpp` (2.1+): `Gloo connectFullMesh failed with [FILE:LINE] no error`
//!
//! One `gloo_error` each: `file`, `src_line`, `reason` (the message; `connectFullMesh failed` with
//! gloo's own words in `detail`), `peer`, `timeout_ms`.
use super::{after, event, lead_int, Put};
use crate::adapters::value::Scan;
use crate::adapters::Record;

pub(super) fn parse(line: u64, t: &str) -> Option<Record> {
    if let Some(rest) = after(t, "Gloo connectFullMesh failed with ") {
        let mut r = event(line, "gloo_error");
        r.text("reason", "connectFullMesh failed");
        if let Some((file, src, msg)) = bracket(rest) {
            r.text("file", file);
            r.int("src_line", src);
            r.text("detail", msg.trim());
        }
        return Some(r);
    }
    let i = t.at("gloo/")?;
    let open = t[..i].rfind('[')?;
    let (file, src, msg) = bracket(&t[open..])?;
    let mut r = event(line, "gloo_error");
    r.text("file", file);
    r.int("src_line", src);
    let msg = msg.trim();
    r.text("reason", msg);
    for head in [
        "Connection closed by peer ",
        "Read error ",
        "Write error ",
        "Socket closed ",
        "connect ",
        "Read timeout ",
        "Write timeout ",
    ] {
        if let Some(peer) = msg.strip_prefix(head) {
            let peer = peer.split_whitespace().next().unwrap_or("");
            r.text("peer", peer.trim_end_matches(':'));
        }
    }
    if let Some((ms, _)) = after(msg, "Timed out waiting ").and_then(lead_int) {
        r.metric("timeout_ms", ms as f64);
    }
    Some(r)
}

/// `[enforce fail at FILE:LINE] MSG` or `[FILE:LINE] MSG` at the start of `s`.
fn bracket(s: &str) -> Option<(&str, i64, &str)> {
    let inner = s.strip_prefix('[')?;
    let (place, msg) = inner.cut("] ")?;
    let place = place.strip_prefix("enforce fail at ").unwrap_or(place);
    let (file, num) = place.rsplit_once(':')?;
    if !file.has("gloo") {
        return None;
    }
    Some((file, super::whole(num)?, msg))
}
