//! JSON-lines telemetry for ranks that are not Rust (DESIGN §7): the same messages as the
//! binary protocol, one JSON object per line, a `Hello` first. `assets/flightdeck_telemetry.py`
//! is a stdlib-only client.
use super::Input;
use crate::adapters::writers;
use crate::ids::Rank;
use crate::protocol::{AgentEvent, Hello, RankMsg, PROTOCOL_VERSION};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, BufReader};
use tokio::net::UnixStream;
use tokio::sync::mpsc;

/// Longest accepted line; a longer one is dropped as a bad frame (and the stream goes on).
const MAX_LINE_BYTES: usize = 1 << 20;
const BAD_LINE_REPORTS: u64 = 10;

/// Messages only a JSON client sends: the Python shim's reports of the program's own metric
/// writers (`crate::adapters::writers`), which become log records as a printed line would.
#[derive(serde::Deserialize)]
enum JsonOnly {
    Logged(writers::Logged),
}

pub async fn connection(stream: UnixStream, first: Vec<u8>, tx: mpsc::Sender<Input>) {
    let reader = BufReader::new(std::io::Cursor::new(first).chain(stream));
    serve_lines(reader, tx).await
}

async fn bad(tx: &mpsc::Sender<Input>, rank: Option<Rank>, reason: String) {
    let _ = tx.send(Input::Event(AgentEvent::BadFrame { rank, reason })).await;
}

async fn serve_lines<R: AsyncRead + Unpin>(mut reader: BufReader<R>, tx: mpsc::Sender<Input>) {
    let mut rank: Option<Rank> = None;
    let mut greeted = false;
    let mut bad_lines = 0u64;
    let mut line_no = 0u64;
    let mut line = Vec::new();
    loop {
        line.clear();
        match reader.read_until(b'\n', &mut line).await {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        line_no += 1;
        let text = String::from_utf8_lossy(&line);
        let text = text.trim();
        if text.is_empty() {
            continue;
        }
        let parsed: Result<(), String> = if line.len() > MAX_LINE_BYTES {
            Err(format!("line {line_no} is {} bytes (limit {MAX_LINE_BYTES})", line.len()))
        } else if !greeted {
            match serde_json::from_str::<Hello>(text) {
                Ok(h) if h.protocol_version == PROTOCOL_VERSION => {
                    greeted = true;
                    Ok(())
                }
                Ok(h) => {
                    let reason = format!(
                        "refused a JSON rank speaking protocol {} (this agent speaks {PROTOCOL_VERSION})",
                        h.protocol_version
                    );
                    bad(&tx, None, reason).await;
                    return;
                }
                Err(e) => Err(format!("line {line_no}: expected a Hello object first: {e}")),
            }
        } else if text.strip_prefix('{').is_some_and(|t| t.trim_start().starts_with("\"Logged\"")) {
            match (serde_json::from_str::<JsonOnly>(text), rank) {
                (Ok(JsonOnly::Logged(logged)), Some(r)) => {
                    let record = writers::record(line_no, logged);
                    let _ = tx.send(Input::Event(AgentEvent::LogRecord { rank: r, record })).await;
                    Ok(())
                }
                (Ok(_), None) => Err(format!("line {line_no}: a rank message before Register")),
                (Err(e), _) => Err(format!("line {line_no}: {e}")),
            }
        } else {
            match serde_json::from_str::<RankMsg>(text) {
                Ok(RankMsg::Register { rank: r, pid }) => {
                    rank = Some(r);
                    let msg = RankMsg::Register { rank: r, pid };
                    let _ = tx.send(Input::Event(AgentEvent::Rank { rank: r, msg })).await;
                    Ok(())
                }
                Ok(msg) => match rank {
                    Some(r) => {
                        let _ = tx.send(Input::Event(AgentEvent::Rank { rank: r, msg })).await;
                        Ok(())
                    }
                    None => Err(format!("line {line_no}: a rank message before Register")),
                },
                Err(e) => Err(format!("line {line_no}: {e}")),
            }
        };
        if let Err(reason) = parsed {
            bad_lines += 1;
            if bad_lines <= BAD_LINE_REPORTS {
                bad(&tx, rank, format!("JSON telemetry {reason}")).await;
            }
        }
    }
    if bad_lines > BAD_LINE_REPORTS {
        bad(&tx, rank, format!("{bad_lines} bad JSON lines in all from this rank")).await;
    }
    if let Some(rank) = rank {
        let _ = tx.send(Input::TelemetryClosed { rank }).await;
    }
}

#[cfg(test)]
mod tests {
    /// The Python client speaks the same protocol version as the agent (it is refused otherwise,
    /// and its rank then reports nothing).
    #[test]
    fn the_python_client_speaks_this_protocol_version() {
        for (file, assignment) in
            [("assets/flightdeck_telemetry.py", "PROTOCOL_VERSION = "), ("assets/shim/sitecustomize.py", "protocol = ")]
        {
            let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(file);
            let text = std::fs::read_to_string(&path).unwrap();
            let line = text.lines().map(str::trim_start).find(|l| l.starts_with(assignment)).expect(assignment);
            let version: u32 = line[assignment.len()..].split_whitespace().next().unwrap().parse().unwrap();
            assert_eq!(version, crate::protocol::PROTOCOL_VERSION, "{file}");
        }
    }
}
