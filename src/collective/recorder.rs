//! The flight recorder: numbers every collective and keeps its record, so a hang can be placed.
//!
//! A record goes to the sink twice: when the collective starts and when it completes. A
//! collective that fails or never returns leaves its record `Started`, and the last `Started`
//! sequence number on each rank is what the analysis compares across ranks.
use super::{Collective, CollectiveError, DeviceBuf, DeviceDtype};
use crate::ids::{unix_us, Rank, Step};
use crate::protocol::message::{CollectiveOp, CollectiveRecord, CollectiveState};
use std::collections::VecDeque;

/// Where records go as they change (the worker streams them to the agent).
pub type RecordSink = Box<dyn FnMut(&CollectiveRecord) + Send>;

pub struct FlightRecorder<C: Collective> {
    inner: C,
    capacity: usize,
    /// The latest `capacity` records, oldest first.
    records: VecDeque<CollectiveRecord>,
    sink: RecordSink,
    next_seq: u64,
    step: Step,
}

impl<C: Collective> FlightRecorder<C> {
    /// Wraps `inner`, keeping the last `capacity` records and handing each change to `sink`
    /// (which streams it to the agent; it runs on the collective's thread, so keep it quick).
    pub fn new(inner: C, capacity: usize, sink: Box<dyn FnMut(&CollectiveRecord) + Send>) -> Self {
        FlightRecorder {
            inner,
            capacity,
            // The buffer grows to `capacity` as records arrive; a generous capacity costs nothing
            // until it is used.
            records: VecDeque::new(),
            sink,
            next_seq: 1,
            step: Step(0),
        }
    }

    /// The training step that the following collectives belong to.
    pub fn set_step(&mut self, step: Step) {
        self.step = step;
    }

    /// The kept records, oldest first.
    pub fn records(&self) -> impl Iterator<Item = &CollectiveRecord> {
        self.records.iter()
    }

    /// The sequence number the next collective will get (1 before the first).
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    pub fn inner_mut(&mut self) -> &mut C {
        &mut self.inner
    }

    fn record<T>(
        &mut self,
        op: CollectiveOp,
        elements: usize,
        dtype: DeviceDtype,
        run: impl FnOnce(&mut C) -> Result<T, CollectiveError>,
    ) -> Result<T, CollectiveError> {
        let seq = self.next_seq;
        self.next_seq += 1;
        // This layer is synchronous: a collective starts the moment it is asked for, so it is
        // never seen `Scheduled` (that state is for backends that queue work on a stream).
        let enqueue_us = unix_us();
        let mut record = CollectiveRecord {
            seq,
            op,
            dtype: dtype.name().to_string(),
            elements: elements as u64,
            bytes: (elements * dtype.size_bytes()) as u64,
            enqueue_us,
            start_us: Some(enqueue_us),
            end_us: None,
            state: CollectiveState::Started,
            step: self.step,
        };
        self.keep(record.clone());
        (self.sink)(&record);
        let result = run(&mut self.inner);
        if result.is_ok() {
            record.end_us = Some(unix_us());
            // A GPU backend knows when the work really ran on the device (CUDA events); the
            // host's times would only say when it was queued and when the host saw it finish.
            if let Some((start_us, end_us)) = self.inner.last_device_span_us() {
                record.start_us = Some(start_us.max(enqueue_us));
                record.end_us = Some(end_us.max(start_us));
            }
            record.state = CollectiveState::Completed;
            if let Some(kept) = self.records.back_mut().filter(|r| r.seq == seq) {
                *kept = record.clone();
            }
            (self.sink)(&record);
        }
        result
    }

    fn keep(&mut self, record: CollectiveRecord) {
        if self.capacity == 0 {
            return;
        }
        if self.records.len() == self.capacity {
            self.records.pop_front();
        }
        self.records.push_back(record);
    }
}

impl<C: Collective> Collective for FlightRecorder<C> {
    fn rank(&self) -> Rank {
        self.inner.rank()
    }

    fn world_size(&self) -> u32 {
        self.inner.world_size()
    }

    fn all_reduce_sum(&mut self, buf: &mut [f32]) -> Result<(), CollectiveError> {
        self.record(CollectiveOp::AllReduce, buf.len(), DeviceDtype::F32, |inner| inner.all_reduce_sum(buf))
    }

    fn barrier(&mut self) -> Result<(), CollectiveError> {
        self.record(CollectiveOp::Barrier, 0, DeviceDtype::F32, |inner| inner.barrier())
    }

    fn all_reduce_sum_device(&mut self, buf: DeviceBuf) -> Result<(), CollectiveError> {
        self.record(CollectiveOp::AllReduce, buf.elements, buf.dtype, |inner| inner.all_reduce_sum_device(buf))
    }

    fn last_device_span_us(&self) -> Option<(u64, u64)> {
        self.inner.last_device_span_us()
    }

    fn inject(&mut self, fault: super::InjectedFault) {
        self.inner.inject(fault)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collective::solo::Solo;
    use std::sync::{Arc, Mutex};

    /// A collective that doubles buffers and fails the calls it is told to.
    struct Scripted {
        calls: u64,
        fail_on_call: u64,
    }

    impl Collective for Scripted {
        fn rank(&self) -> Rank {
            Rank(3)
        }
        fn world_size(&self) -> u32 {
            4
        }
        fn all_reduce_sum(&mut self, buf: &mut [f32]) -> Result<(), CollectiveError> {
            self.calls += 1;
            if self.calls == self.fail_on_call {
                return Err(CollectiveError::Protocol {
                    seq: self.calls,
                    op: "all_reduce",
                    reason: "scripted failure".into(),
                });
            }
            buf.iter_mut().for_each(|x| *x *= 2.0);
            Ok(())
        }
        fn barrier(&mut self) -> Result<(), CollectiveError> {
            self.all_reduce_sum(&mut [])
        }
    }

    fn sink() -> (Arc<Mutex<Vec<CollectiveRecord>>>, RecordSink) {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let writer = Arc::clone(&seen);
        (seen, Box::new(move |r: &CollectiveRecord| writer.lock().unwrap().push(r.clone())))
    }

    #[test]
    fn each_collective_is_numbered_recorded_and_sent_twice() {
        let (seen, sink) = sink();
        let mut rec = FlightRecorder::new(Solo, 16, sink);
        assert_eq!(rec.next_seq(), 1);
        rec.set_step(Step(7));
        rec.all_reduce_sum(&mut [1.0; 10]).unwrap();
        rec.barrier().unwrap();
        assert_eq!(rec.next_seq(), 3);

        let seen = seen.lock().unwrap();
        let calls: Vec<_> = seen.iter().map(|r| (r.seq, r.state)).collect();
        use CollectiveState::{Completed, Started};
        assert_eq!(calls, [(1, Started), (1, Completed), (2, Started), (2, Completed)]);
        assert!(seen[0].end_us.is_none() && seen[0].start_us.is_some());
        let done = &seen[1];
        assert_eq!((done.op, done.dtype.as_str(), done.elements, done.bytes), (CollectiveOp::AllReduce, "f32", 10, 40));
        assert_eq!(done.step, Step(7));
        assert!(done.enqueue_us <= done.start_us.unwrap() && done.start_us <= done.end_us);
        assert_eq!(seen[3].op, CollectiveOp::Barrier);

        let kept: Vec<_> = rec.records().cloned().collect();
        assert_eq!(kept, [seen[1].clone(), seen[3].clone()]);
    }

    #[test]
    fn a_failed_collective_stays_started_with_one_sink_call() {
        let (seen, sink) = sink();
        let mut rec = FlightRecorder::new(Scripted { calls: 0, fail_on_call: 2 }, 16, sink);
        let mut buf = [1.0f32; 3];
        rec.all_reduce_sum(&mut buf).unwrap();
        rec.all_reduce_sum(&mut buf).unwrap_err();
        rec.barrier().unwrap();
        assert_eq!(buf, [2.0; 3]);
        assert_eq!((rec.rank(), rec.world_size()), (Rank(3), 4));
        assert_eq!(rec.inner_mut().calls, 3);

        let states: Vec<_> = rec.records().map(|r| (r.seq, r.state, r.end_us.is_some())).collect();
        use CollectiveState::{Completed, Started};
        assert_eq!(states, [(1, Completed, true), (2, Started, false), (3, Completed, true)]);
        let sink_calls: Vec<_> = seen.lock().unwrap().iter().map(|r| r.seq).collect();
        assert_eq!(sink_calls, [1, 1, 2, 3, 3]);
    }

    #[test]
    fn the_buffer_keeps_the_newest_records_oldest_first() {
        let (seen, sink) = sink();
        let mut rec = FlightRecorder::new(Solo, 3, sink);
        for _ in 0..5 {
            rec.barrier().unwrap();
        }
        let kept: Vec<_> = rec.records().map(|r| r.seq).collect();
        assert_eq!(kept, [3, 4, 5]);
        assert_eq!(seen.lock().unwrap().len(), 10);

        let (seen, sink) = self::sink();
        let mut none_kept = FlightRecorder::new(Solo, 0, sink);
        none_kept.barrier().unwrap();
        assert_eq!(none_kept.records().count(), 0);
        assert_eq!(seen.lock().unwrap().len(), 2);
    }

    /// A GPU backend: work queued on a stream, with the device's own start and end times.
    struct DeviceTimed;

    impl Collective for DeviceTimed {
        fn rank(&self) -> Rank {
            Rank(0)
        }
        fn world_size(&self) -> u32 {
            2
        }
        fn all_reduce_sum(&mut self, _buf: &mut [f32]) -> Result<(), CollectiveError> {
            Ok(())
        }
        fn barrier(&mut self) -> Result<(), CollectiveError> {
            Ok(())
        }
        fn all_reduce_sum_device(&mut self, _buf: DeviceBuf) -> Result<(), CollectiveError> {
            Ok(())
        }
        fn last_device_span_us(&self) -> Option<(u64, u64)> {
            // Far in the future, so the recorder's clamping to the enqueue time cannot hide it.
            Some((u64::MAX - 500, u64::MAX - 100))
        }
    }

    #[test]
    fn device_collectives_record_dtype_bytes_and_the_device_span() {
        let (seen, sink) = sink();
        let mut rec = FlightRecorder::new(DeviceTimed, 4, sink);
        rec.all_reduce_sum_device(DeviceBuf { ptr: 0x1000, elements: 10, dtype: DeviceDtype::Bf16 }).unwrap();
        let done = seen.lock().unwrap()[1].clone();
        assert_eq!((done.dtype.as_str(), done.elements, done.bytes), ("bf16", 10, 20));
        assert_eq!((done.start_us, done.end_us), (Some(u64::MAX - 500), Some(u64::MAX - 100)));
        assert_eq!(done.state, CollectiveState::Completed);
        let buf = DeviceBuf { ptr: 0, elements: 1, dtype: DeviceDtype::F32 };
        assert!(Solo.all_reduce_sum_device(buf).is_ok(), "one rank: the identity");
        // A host-only backend refuses GPU memory with a clear error.
        let err = Scripted { calls: 0, fail_on_call: 0 }.all_reduce_sum_device(buf).unwrap_err().to_string();
        assert_eq!(err, "all_reduce of GPU memory is not supported by the ring backend");
    }
}
