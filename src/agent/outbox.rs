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
    pub fn after(&self, seq: u64) -> Vec<AgentFrame> {
        self.frames.iter().filter(|f| f.seq > seq).cloned().collect()
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

/// Frames after `seq` from a shared outbox.
pub fn after(outbox: &Mutex<Outbox>, seq: u64) -> Vec<AgentFrame> {
    lock(outbox).after(seq)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ack_forgets_and_replay_starts_after_the_ack() {
        let mut o = Outbox::default();
        for _ in 0..5 {
            o.push(AgentEvent::Heartbeat);
        }
        o.ack(2);
        let seqs: Vec<u64> = o.after(0).iter().map(|f| f.seq).collect();
        assert_eq!(seqs, vec![3, 4, 5]);
        assert_eq!(o.after(4).len(), 1);
        o.ack(5);
        assert!(o.is_empty());
        assert_eq!(o.push(AgentEvent::Heartbeat), 6, "sequence numbers never restart");
    }
}
