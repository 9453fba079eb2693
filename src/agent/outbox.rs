//! The agent's outbox: every frame it has sent or will send, until the server acknowledges it.
use crate::ids::unix_ms;
use crate::protocol::{AgentEvent, AgentFrame};
use crate::sync::lock;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use tokio::sync::watch;

#[derive(Default)]
pub struct Outbox {
    frames: VecDeque<AgentFrame>,
    last_seq: u64,
}

impl Outbox {
    /// The outbox, shared with the link, and a watch of its newest sequence number.
    pub fn shared() -> (Arc<Mutex<Outbox>>, watch::Sender<u64>) {
        (Arc::new(Mutex::new(Outbox::default())), watch::channel(0).0)
    }

    /// Stamps the next sequence number on an event and keeps it until acknowledged.
    pub fn push(&mut self, event: AgentEvent) -> u64 {
        self.last_seq += 1;
        self.frames.push_back(AgentFrame { seq: self.last_seq, t_ms: unix_ms(), event });
        self.last_seq
    }

    /// Frames after `seq`, in order (what a (re)attached server has not seen).
    pub fn after(&self, seq: u64) -> impl Iterator<Item = &AgentFrame> {
        // Sequence numbers are consecutive from the front, so the first one wanted is found by
        // arithmetic: a backlog of thousands of unacknowledged frames is not scanned per write.
        let first = self.frames.front().map_or(0, |f| f.seq);
        let skip = (seq + 1).saturating_sub(first) as usize;
        self.frames.iter().skip(skip.min(self.frames.len()))
    }

    /// The frames after `seq`, encoded back to back, up to about `max_bytes` (at least one
    /// frame), and the sequence number of the last one; None when there is nothing after `seq`.
    /// One write carries them all, rather than a write (and a segment) per frame.
    pub fn encode_after(&self, seq: u64, max_bytes: usize) -> Option<(Vec<u8>, u64)> {
        let mut bytes = Vec::new();
        let mut last = None;
        for frame in self.after(seq) {
            if bytes.len() >= max_bytes {
                break;
            }
            bytes.extend_from_slice(&crate::protocol::frame::encode(frame));
            last = Some(frame.seq);
        }
        last.map(|last| (bytes, last))
    }

    /// Forgets everything up to and including `seq`: it is durable in the server's store.
    pub fn ack(&mut self, seq: u64) {
        while self.frames.front().is_some_and(|f| f.seq <= seq) {
            self.frames.pop_front();
        }
    }

    pub fn is_empty(&self) -> bool {
        self.frames.is_empty()
    }
}

/// The frames after `seq` from a shared outbox, encoded (see `Outbox::encode_after`).
pub fn encode_after(outbox: &Mutex<Outbox>, seq: u64, max_bytes: usize) -> Option<(Vec<u8>, u64)> {
    lock(outbox).encode_after(seq, max_bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::Decoder;

    #[test]
    fn encoded_batches_decode_to_the_frames_in_order_and_respect_the_size_bound() {
        let mut o = Outbox::default();
        for i in 0..10 {
            o.push(AgentEvent::Notice { text: format!("frame {i}") });
        }
        o.ack(3);
        let (all, last) = o.encode_after(3, 1 << 20).expect("frames after 3");
        assert_eq!(last, 10);
        let mut d = Decoder::<AgentFrame>::new();
        d.push(&all);
        let seqs: Vec<u64> = std::iter::from_fn(|| d.next_frame().map(|f| f.expect("decodes").seq)).collect();
        assert_eq!(seqs, (4..=10).collect::<Vec<_>>());
        // A bound smaller than one frame still sends one: the writer always makes progress.
        let (one, last) = o.encode_after(3, 1).expect("one frame");
        assert_eq!(last, 4);
        assert_eq!(one, crate::protocol::frame::encode(o.after(3).next().expect("frame 4")));
    }

    #[test]
    fn ack_forgets_and_replay_starts_after_the_ack() {
        let mut o = Outbox::default();
        for _ in 0..5 {
            o.push(AgentEvent::Heartbeat);
        }
        o.ack(2);
        let seqs: Vec<u64> = o.after(0).map(|f| f.seq).collect();
        assert_eq!(seqs, vec![3, 4, 5]);
        assert_eq!(o.after(4).map(|f| f.seq).collect::<Vec<_>>(), vec![5]);
        assert_eq!(o.after(5).count(), 0);
        assert_eq!(o.after(99).count(), 0, "an ack from the future finds nothing, never panics");
        o.ack(5);
        assert!(o.is_empty());
        assert!(o.encode_after(0, 1 << 20).is_none());
        assert_eq!(o.push(AgentEvent::Heartbeat), 6, "sequence numbers never restart");
    }
}
