//! The ring's shared-memory path, for a world whose ranks all share one machine: every
//! all-reduce goes through a segment per rank in `/dev/shm` instead of loopback TCP (an empty one
//! stays on TCP, whose header exchange still catches a peer in another collective).
//!
//! Loopback TCP copies every byte twice (into the kernel and out of it) on each of the ring's
//! `2(n-1)` steps, plus the kernel's per-segment work; here each byte is copied once in, read
//! once by the rank that reduces it, and copied once out. Per round of up to `ROUND_ELEMENTS`
//! elements: every rank copies its piece of the buffer into its own segment; all meet at a
//! barrier; each rank sums its share of the round from every segment, in place into its own;
//! all meet again; each copies every rank's share out into its buffer. Rounds alternate between
//! two halves of the segments, so a round's copy-in never overwrites what a slower rank is still
//! copying out of the previous round, and two barriers a round suffice.
//!
//! Every element is summed in the TCP ring's order (from the rank whose ring chunk holds it, then
//! the ranks after it in turn), so both paths give the same bits and a run is bit-identical
//! whichever path its ranks took. The barrier is a futex word in rank 0's segment; a rank waiting
//! on it looks at its ring sockets every `WATCH`, so a neighbour that died or started another
//! collective over TCP is an error, as on the TCP path, and never a wait forever.
use super::exchange::{Failure, Header, HEADER_BYTES};
use std::fs::{File, OpenOptions};
use std::io;
use std::net::TcpStream;
use std::ops::Range;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

/// The most ranks on one machine that take this path: setting it up reads every rank's entry in
/// the store (n² reads).
pub(super) const MAX_WORLD: usize = 64;
/// Elements per rank per round: 1 MiB of f32 a half, so a segment is 2 MiB and a round's copies
/// stay within the caches of a few cores.
const ROUND_ELEMENTS: usize = 256 * 1024;
/// The segment's first page: this rank's collective header, and in rank 0's segment the barrier.
const CONTROL_BYTES: usize = 4096;
const ARRIVED_AT: usize = 64;
const GENERATION_AT: usize = 128;
const SEGMENT_BYTES: usize = CONTROL_BYTES + 2 * ROUND_ELEMENTS * 4;
/// How often a rank waiting at the barrier looks at its neighbours' sockets.
const WATCH: Duration = Duration::from_millis(200);
/// Barrier polls before sleeping: a peer on another idle core arrives within microseconds.
const SPINS: u32 = 4096;
/// Every this many polls the waiter yields its core: with more ranks than cores (4 ranks on
/// this 2-core box) the rank being waited for may need it; 10 µs instead of 240 µs a 4 KiB
/// all-reduce at 4 ranks, measured.
const YIELD_EVERY: u32 = 64;
/// Elements summed at a time: the running sum stays in L1 while every segment is added in.
const BLOCK: usize = 2048;

/// This rank's view of every rank's segment, in rank order.
pub(super) struct Shared {
    segments: Vec<Mapping>,
    /// Where this rank's segment was created (removed once every rank had mapped it).
    path: PathBuf,
    rank: usize,
    /// Rounds run so far by this ring; its parity picks the half a round uses.
    rounds: u64,
}

/// A whole segment mapped shared and writable; unmapped on drop.
struct Mapping {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is plain shared memory owned by this value; which parts may be touched
// when is governed by the barrier protocol below, not by the thread that holds it.
unsafe impl Send for Mapping {}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: ptr/len are exactly what mmap returned, and no slice derived from them
        // outlives the `&self`/`&mut self` borrows of `Shared`'s methods.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

impl Mapping {
    fn map(file: &File) -> io::Result<Mapping> {
        // SAFETY: a fresh shared mapping of a file of at least SEGMENT_BYTES (checked by the
        // caller); the kernel picks the address.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                SEGMENT_BYTES,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Mapping { ptr: ptr.cast(), len: SEGMENT_BYTES })
    }

    fn atomic(&self, at: usize) -> &AtomicU32 {
        debug_assert!(at + 4 <= CONTROL_BYTES && at.is_multiple_of(4));
        // SAFETY: inside the mapping's control page, 4-byte aligned (the mapping is page
        // aligned), and only ever accessed atomically, by every process.
        unsafe { &*self.ptr.add(at).cast::<AtomicU32>() }
    }

    fn header(&self) -> [u8; HEADER_BYTES] {
        let mut out = [0u8; HEADER_BYTES];
        // SAFETY: the first HEADER_BYTES of the control page; written only by the segment's
        // owner before the round-0 barrier of a collective, read only between its two barriers.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr, out.as_mut_ptr(), HEADER_BYTES) };
        out
    }

    fn set_header(&mut self, header: &[u8; HEADER_BYTES]) {
        // SAFETY: as in `header`; the owner writes it while no peer reads it.
        unsafe { std::ptr::copy_nonoverlapping(header.as_ptr(), self.ptr, HEADER_BYTES) };
    }

    /// Elements `range` of data half `half`. The caller must hold the barrier protocol's
    /// guarantee that no process writes them while the slice lives.
    unsafe fn floats(&self, half: usize, range: Range<usize>) -> &[f32] {
        debug_assert!(half < 2 && range.end <= ROUND_ELEMENTS);
        let start = self.ptr.add(CONTROL_BYTES + half * ROUND_ELEMENTS * 4).cast::<f32>().add(range.start);
        std::slice::from_raw_parts(start, range.len())
    }

    /// As `floats`, for the segment's owner, with the guarantee that no process reads them.
    #[allow(clippy::mut_from_ref)]
    unsafe fn floats_mut(&self, half: usize, range: Range<usize>) -> &mut [f32] {
        debug_assert!(half < 2 && range.end <= ROUND_ELEMENTS);
        let start = self.ptr.add(CONTROL_BYTES + half * ROUND_ELEMENTS * 4).cast::<f32>().add(range.start);
        std::slice::from_raw_parts_mut(start, range.len())
    }
}

/// This rank's segment before the others have mapped it: the file is unlinked once they have.
pub(super) struct Own {
    path: PathBuf,
    mapping: Mapping,
}

impl Own {
    /// Creates and maps a new segment (mode 0600, its space reserved now, so a full /dev/shm is
    /// an error here rather than a SIGBUS mid-collective).
    pub(super) fn create(rank: u32) -> io::Result<Own> {
        let mut suffix = [0u8; 8];
        crate::collective::auth::fill_random(&mut suffix)?;
        let suffix: String = suffix.iter().map(|b| format!("{b:02x}")).collect();
        let path = PathBuf::from(format!("/dev/shm/flightdeck-ring-{}-rank{rank}-{suffix}", std::process::id()));
        let file = OpenOptions::new().read(true).write(true).create_new(true).mode(0o600).open(&path)?;
        let made = (|| {
            // SAFETY: a valid open descriptor and a byte range from 0.
            let rc = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, SEGMENT_BYTES as libc::off_t) };
            if rc != 0 {
                return Err(io::Error::from_raw_os_error(rc));
            }
            Mapping::map(&file)
        })();
        match made {
            Ok(mapping) => Ok(Own { path, mapping }),
            Err(e) => {
                let _ = std::fs::remove_file(&path);
                Err(e)
            }
        }
    }

    pub(super) fn path(&self) -> &Path {
        &self.path
    }

    /// Removes the file (peers keep their mappings) and joins the segments into the path.
    pub(super) fn into_shared(self, rank: usize, peers: Vec<(usize, PeerSegment)>) -> Shared {
        self.unlink();
        let mut by_rank: Vec<Option<Mapping>> = (0..peers.len() + 1).map(|_| None).collect();
        by_rank[rank] = Some(self.mapping);
        for (r, peer) in peers {
            by_rank[r] = Some(peer.0);
        }
        Shared { segments: by_rank.into_iter().flatten().collect(), path: self.path, rank, rounds: 0 }
    }

    /// Removes the file; every peer that mapped it keeps its mapping.
    pub(super) fn unlink(&self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Another rank's segment, mapped.
pub(super) struct PeerSegment(Mapping);

impl PeerSegment {
    pub(super) fn open(path: &str) -> io::Result<PeerSegment> {
        let file = OpenOptions::new().read(true).write(true).open(path)?;
        let len = file.metadata()?.len();
        if len < SEGMENT_BYTES as u64 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{path} holds {len} bytes, a ring segment {SEGMENT_BYTES}"),
            ));
        }
        Mapping::map(&file).map(PeerSegment)
    }
}

/// What says two ranks share memory: the same boot of the same kernel, the same mount
/// namespace (so the same /dev/shm) and the same user. None where any part cannot be read.
pub(super) fn machine_identity() -> Option<String> {
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    let mounts = std::fs::read_link("/proc/self/ns/mnt").ok()?;
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    Some(format!("{}/{}/{uid}", boot.trim(), mounts.display()))
}

impl Shared {
    pub(super) fn path(&self) -> &Path {
        &self.path
    }

    /// Sums `buf` across the world in place, as `exchange::all_reduce` does. `stall` (fault
    /// injection) stops this rank for good once the first round's pieces are all in.
    pub(super) fn all_reduce(
        &mut self,
        next: &TcpStream,
        prev: &TcpStream,
        header: Header,
        buf: &mut [f32],
        stall: bool,
    ) -> Result<(), Failure> {
        let n = self.segments.len();
        let own_header = header.encode();
        self.segments[self.rank].set_header(&own_header);
        let len = buf.len();
        let mut base = 0;
        while base < len {
            let round = base..(base + ROUND_ELEMENTS).min(len);
            let half = (self.rounds % 2) as usize;
            self.rounds += 1;
            let count = round.len();
            // SAFETY: this half of the own segment was last read by peers in the gather two
            // rounds ago, which every rank finished before the previous round's first barrier.
            unsafe { self.segments[self.rank].floats_mut(half, 0..count) }.copy_from_slice(&buf[round.clone()]);
            self.barrier(next, prev)?;
            if base == 0 {
                self.check_headers(&own_header)?;
                if stall {
                    // Inside the collective, segments mapped and sockets open: the peers wait
                    // at the next barrier for a rank that never comes.
                    loop {
                        std::thread::park();
                    }
                }
            }
            self.reduce_share(len, round.start, count, half);
            self.barrier(next, prev)?;
            for (q, segment) in self.segments.iter().enumerate() {
                let share = share(count, n, q);
                // SAFETY: rank q's share of this half was written before the barrier just
                // passed and is not written again before this rank's next first barrier.
                let summed = unsafe { segment.floats(half, share.clone()) };
                buf[round.start + share.start..round.start + share.end].copy_from_slice(summed);
            }
            base = round.end;
        }
        Ok(())
    }

    /// Sums this rank's share of the round from every segment into its own segment, each
    /// element in the TCP ring's order for a buffer of `len` elements.
    fn reduce_share(&self, len: usize, round_start: usize, count: usize, half: usize) {
        let n = self.segments.len();
        let mut at = share(count, n, self.rank);
        let mut sum = [0f32; BLOCK];
        while !at.is_empty() {
            // The ring chunk of the first element left: its owner's rank starts the sum.
            let first = ring_chunk_of(len, n, round_start + at.start);
            let chunk_end = super::exchange::chunk(len, n, first).end - round_start;
            let end = at.end.min(chunk_end).min(at.start + BLOCK);
            let piece = at.start..end;
            let sum = &mut sum[..piece.len()];
            // SAFETY: during the reduce every rank reads only its own share of every segment,
            // written before the barrier just passed; only this rank writes its share of its own.
            unsafe {
                sum.copy_from_slice(self.segments[first].floats(half, piece.clone()));
                for k in 1..n {
                    add_into(sum, self.segments[(first + k) % n].floats(half, piece.clone()));
                }
                self.segments[self.rank].floats_mut(half, piece.clone()).copy_from_slice(sum);
            }
            at.start = end;
        }
    }

    /// Every rank's header against this rank's, read between the first round's barriers.
    fn check_headers(&self, own: &[u8; HEADER_BYTES]) -> Result<(), Failure> {
        for (q, segment) in self.segments.iter().enumerate() {
            let theirs = segment.header();
            if &theirs != own {
                return Err(Failure::Mismatch(format!(
                    "rank {q} is in collective {}, this rank in {}",
                    Header::describe(&theirs),
                    Header::describe(own)
                )));
            }
        }
        Ok(())
    }

    /// Waits until every rank has arrived. Generation counting: the last to arrive resets the
    /// count and moves the generation on, which is what the others wait for.
    fn barrier(&self, next: &TcpStream, prev: &TcpStream) -> Result<(), Failure> {
        let control = &self.segments[0];
        let (arrived, generation) = (control.atomic(ARRIVED_AT), control.atomic(GENERATION_AT));
        // Read before arriving: once this rank has arrived the last one may move it on.
        let seen = generation.load(Ordering::Acquire);
        if arrived.fetch_add(1, Ordering::AcqRel) + 1 == self.segments.len() as u32 {
            arrived.store(0, Ordering::Relaxed);
            generation.store(seen.wrapping_add(1), Ordering::Release);
            futex_wake(generation);
            return Ok(());
        }
        for i in 0..SPINS {
            if generation.load(Ordering::Acquire) != seen {
                return Ok(());
            }
            if i % YIELD_EVERY == YIELD_EVERY - 1 {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
        loop {
            let woken = futex_wait(generation, seen, WATCH);
            if generation.load(Ordering::Acquire) != seen {
                return Ok(());
            }
            if !woken {
                neighbours_alive(next, prev)?;
            }
        }
    }
}

/// The part of a round's `count` elements that rank `q` of `n` reduces.
fn share(count: usize, n: usize, q: usize) -> Range<usize> {
    super::exchange::chunk(count, n, q)
}

/// Which of the ring's `n` chunks of a `len`-element buffer holds element `e`.
fn ring_chunk_of(len: usize, n: usize, e: usize) -> usize {
    let (base, extra) = (len / n, len % n);
    let long = extra * (base + 1);
    if e < long {
        e / (base + 1)
    } else {
        extra + (e - long) / base
    }
}

fn add_into(dst: &mut [f32], src: &[f32]) {
    for (d, s) in dst.iter_mut().zip(src) {
        *d += *s;
    }
}

/// Sleeps while `word` holds `expected`, at most `timeout`; false when the time ran out.
fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) -> bool {
    let ts = libc::timespec { tv_sec: timeout.as_secs() as libc::time_t, tv_nsec: timeout.subsec_nanos() as _ };
    // SAFETY: `word` is a live, aligned u32 in a shared mapping; FUTEX_WAIT (not the private
    // variant) because the waker is another process; the timespec outlives the call.
    let rc = unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAIT, expected, &ts as *const libc::timespec, 0, 0)
    };
    !(rc == -1 && io::Error::last_os_error().raw_os_error() == Some(libc::ETIMEDOUT))
}

fn futex_wake(word: &AtomicU32) {
    // SAFETY: as in `futex_wait`; waking has no other effect.
    unsafe { libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, i32::MAX, 0, 0, 0) };
}

/// Between collectives a ring socket carries nothing, so a readable one means its peer hung up
/// (or failed), or the previous rank began a collective over TCP while this one is here.
fn neighbours_alive(next: &TcpStream, prev: &TcpStream) -> Result<(), Failure> {
    let mut fds = [
        libc::pollfd { fd: next.as_raw_fd(), events: libc::POLLIN, revents: 0 },
        libc::pollfd { fd: prev.as_raw_fd(), events: libc::POLLIN, revents: 0 },
    ];
    if super::exchange::poll(&mut fds, 0).map_err(Failure::Poll)? == 0 {
        return Ok(());
    }
    let hung_up = || io::Error::new(io::ErrorKind::UnexpectedEof, "connection closed mid-collective");
    if fds[0].revents != 0 {
        // The next rank never sends: readable means it hung up (or failed); a spurious
        // readiness that peeks nothing is no failure.
        let mut byte = [0u8; 1];
        match next.peek(&mut byte) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(Failure::Send(e)),
            Ok(_) => return Err(Failure::Send(hung_up())),
        }
    }
    let mut peeked = [0u8; HEADER_BYTES];
    match prev.peek(&mut peeked) {
        Ok(0) => Err(Failure::Recv(hung_up())),
        Ok(HEADER_BYTES) => Err(Failure::Mismatch(format!(
            "the previous rank is in collective {} over TCP, this rank in one over shared memory",
            Header::describe(&peeked)
        ))),
        Ok(_) => Err(Failure::Mismatch(
            "the previous rank began a collective over TCP, this rank one over shared memory".into(),
        )),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(()),
        Err(e) => Err(Failure::Recv(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_chunk_of_inverts_the_ring_chunks() {
        for n in 1..=5 {
            for len in [1, 3, 7, 1000, 1001] {
                for c in 0..n {
                    for e in super::super::exchange::chunk(len, n, c) {
                        assert_eq!(ring_chunk_of(len, n, e), c, "len {len} n {n} e {e}");
                    }
                }
            }
        }
    }
}
