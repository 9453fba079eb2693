//! Where the owner's inputs come from: the agent's channel, the heartbeat, the acks and the armed timers, as one stream.
use super::outbox::Outbox;
use super::owner::{Input, Timer};
use crate::sync::lock;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, Notify};
use tokio::time::{Instant, Interval, MissedTickBehavior};

/// A heartbeat frame this often while the run lives, so the server can tell a silent node from
/// a quiet one (the analysis calls a node lost after ten missed beats).
const HEARTBEAT: Duration = Duration::from_secs(1);

/// The owner's armed timers: each fires once, at its deadline, as `Input::Timer`.
#[derive(Default)]
pub(crate) struct Timers {
    armed: BTreeMap<Timer, Instant>,
}

impl Timers {
    /// Arms `timer` for `at` (re-arming one moves its deadline).
    pub fn arm(&mut self, timer: Timer, at: Instant) {
        self.armed.insert(timer, at);
    }

    /// Waits for the earliest armed timer and disarms it; never returns while none is armed.
    /// Cancel-safe: a timer is disarmed only after its sleep completes, with no await after.
    pub async fn next(&mut self) -> Timer {
        let Some((&timer, &at)) = self.armed.iter().min_by_key(|(_, at)| **at) else {
            return std::future::pending().await;
        };
        tokio::time::sleep_until(at).await;
        self.armed.remove(&timer);
        timer
    }
}

pub(crate) struct Inputs {
    rx: mpsc::Receiver<Input>,
    heartbeat: Interval,
    /// Notified after each ack; the outbox then tells whether every frame is acknowledged.
    acked: Arc<Notify>,
    outbox: Arc<Mutex<Outbox>>,
    timers: Timers,
}

impl Inputs {
    pub fn new(rx: mpsc::Receiver<Input>, acked: Arc<Notify>, outbox: Arc<Mutex<Outbox>>) -> Inputs {
        let mut heartbeat = tokio::time::interval(HEARTBEAT);
        heartbeat.set_missed_tick_behavior(MissedTickBehavior::Delay);
        Inputs { rx, heartbeat, acked, outbox, timers: Timers::default() }
    }

    pub fn arm(&mut self, timer: Timer, at: Instant) {
        self.timers.arm(timer, at);
    }

    /// The next input. `ended`: the run has ended, so heartbeats stop and acks are watched.
    pub async fn next(&mut self, ended: bool) -> Input {
        loop {
            tokio::select! {
                // The agent's loop holds a sender (stack dumps answer through it): this never closes.
                Some(input) = self.rx.recv() => return input,
                _ = self.heartbeat.tick(), if !ended => return Input::Heartbeat,
                _ = self.acked.notified(), if ended => {
                    if lock(&self.outbox).is_empty() {
                        return Input::AllAcked;
                    }
                }
                timer = self.timers.next() => return Input::Timer(timer),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::AgentEvent;

    #[tokio::test(start_paused = true)]
    async fn timers_fire_earliest_first_and_survive_a_lost_race() {
        let mut timers = Timers::default();
        let start = Instant::now();
        timers.arm(Timer::Escalate, start + Duration::from_secs(5));
        timers.arm(Timer::SaveOverdue, start + Duration::from_secs(2));
        // Another select! branch wins first: the dropped wait must not disarm anything.
        tokio::select! {
            _ = timers.next() => panic!("no timer is due at 1 s"),
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
        assert_eq!(timers.next().await, Timer::SaveOverdue);
        assert_eq!((Instant::now() - start).as_secs(), 2);
        assert_eq!(timers.next().await, Timer::Escalate);
        assert_eq!((Instant::now() - start).as_secs(), 5);
        let none = tokio::time::timeout(Duration::from_secs(3600), timers.next()).await;
        assert!(none.is_err(), "a fired timer is disarmed");
    }

    #[tokio::test(start_paused = true)]
    async fn heartbeats_while_running_and_the_last_ack_once_ended() {
        let (tx, rx) = mpsc::channel(4);
        let (outbox, _) = Outbox::shared();
        let acked = Arc::new(Notify::new());
        let mut inputs = Inputs::new(rx, acked.clone(), outbox.clone());
        assert!(matches!(inputs.next(false).await, Input::Heartbeat), "the first beat is at once");
        let start = Instant::now();
        assert!(matches!(inputs.next(false).await, Input::Heartbeat));
        assert_eq!(Instant::now() - start, HEARTBEAT);

        let seq = lock(&outbox).push(AgentEvent::Heartbeat);
        acked.notify_one();
        let quiet = tokio::time::timeout(Duration::from_secs(10), inputs.next(true)).await;
        assert!(quiet.is_err(), "ended: no heartbeat, and an ack that leaves a frame unacknowledged is no input");
        tx.send(Input::Stop).await.expect("the channel is open");
        assert!(matches!(inputs.next(true).await, Input::Stop), "the channel still feeds the owner");
        lock(&outbox).ack(seq);
        acked.notify_one();
        assert!(matches!(inputs.next(true).await, Input::AllAcked));
    }
}
