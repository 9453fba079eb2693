//! The ranks' telemetry socket: one connection per rank, frames decoded and forwarded upstream.
use super::Input;
use crate::ids::Rank;
use crate::protocol::{AgentEvent, Decoder, Hello, RankMsg, PROTOCOL_VERSION};
use tokio::io::AsyncReadExt;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::mpsc;

/// Bad frames reported individually per connection; past this only the count is reported.
const BAD_FRAME_REPORTS: u64 = 10;

pub async fn serve(listener: UnixListener, tx: mpsc::Sender<Input>) {
    let mut refused = 0;
    loop {
        match listener.accept().await {
            Ok((stream, _)) => match crate::private_files::check_peer(&stream) {
                Ok(()) => {
                    tokio::spawn(connection(stream, tx.clone()));
                }
                Err(who) => {
                    refused += 1;
                    tracing::warn!("refused a telemetry connection: {who}");
                    let refusal = who.refusal("telemetry socket", refused);
                    let _ = tx.send(Input::Event(AgentEvent::Refused(refusal))).await;
                }
            },
            Err(e) => tracing::warn!("accept on the telemetry socket: {e}"),
        }
    }
}

async fn connection(mut stream: UnixStream, tx: mpsc::Sender<Input>) {
    let mut buf = vec![0u8; 64 * 1024];
    let first = match stream.read(&mut buf).await {
        Ok(0) | Err(_) => return,
        Ok(n) => n,
    };
    // A binary hello starts with its length (far below 123); `{` starts a JSON-lines client.
    if buf[0] == b'{' {
        return super::telemetry_json::connection(stream, buf[..first].to_vec(), tx).await;
    }
    let mut hello = Decoder::<Hello>::new();
    let mut msgs = Decoder::<RankMsg>::new();
    let mut greeted = false;
    let mut rank: Option<Rank> = None;
    let mut pending = Some(first);
    loop {
        let n = match pending.take() {
            Some(n) => n,
            None => match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            },
        };
        if !greeted {
            hello.push(&buf[..n]);
            match hello.next_frame() {
                None => continue,
                Some(Ok(h)) if h.protocol_version == PROTOCOL_VERSION => {
                    greeted = true;
                    // Whatever followed the hello in this read belongs to the message stream.
                    msgs.push(&hello.take_rest());
                }
                Some(Ok(h)) => {
                    let reason = format!(
                        "refused a rank speaking protocol {} (this agent speaks {PROTOCOL_VERSION})",
                        h.protocol_version
                    );
                    let _ = tx.send(Input::Event(AgentEvent::BadFrame { rank: None, reason })).await;
                    return;
                }
                Some(Err(e)) => {
                    let reason = format!("bad hello on the telemetry socket: {e}");
                    let _ = tx.send(Input::Event(AgentEvent::BadFrame { rank: None, reason })).await;
                    return;
                }
            }
        } else {
            msgs.push(&buf[..n]);
        }
        while let Some(frame) = msgs.next_frame() {
            match frame {
                Ok(RankMsg::Register { rank: r, pid }) => {
                    rank = Some(r);
                    let msg = RankMsg::Register { rank: r, pid };
                    let _ = tx.send(Input::Event(AgentEvent::Rank { rank: r, msg })).await;
                }
                Ok(msg) => match rank {
                    Some(r) => {
                        let _ = tx.send(Input::Event(AgentEvent::Rank { rank: r, msg })).await;
                    }
                    None => {
                        let reason = "rank message before Register".to_string();
                        let _ = tx.send(Input::Event(AgentEvent::BadFrame { rank: None, reason })).await;
                    }
                },
                Err(e) if msgs.bad.total() <= BAD_FRAME_REPORTS => {
                    let _ = tx.send(Input::Event(AgentEvent::BadFrame { rank, reason: e.to_string() })).await;
                }
                Err(_) => {}
            }
        }
    }
    if let Some(e) = msgs.finish() {
        let _ = tx.send(Input::Event(AgentEvent::BadFrame { rank, reason: e.to_string() })).await;
    }
    if msgs.bad.total() > BAD_FRAME_REPORTS {
        let reason = format!("{} bad frames in all from this rank ({:?})", msgs.bad.total(), msgs.bad);
        let _ = tx.send(Input::Event(AgentEvent::BadFrame { rank, reason })).await;
    }
    if let Some(rank) = rank {
        let _ = tx.send(Input::TelemetryClosed { rank }).await;
    }
}
