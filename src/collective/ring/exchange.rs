//! The ring all-reduce's data path: reduce-scatter then all-gather, run as two byte streams.
//!
//! With `n` ranks the buffer is cut into `n` chunks and the collective takes `2(n-1)` steps: in
//! step `t` this rank sends chunk `(rank - t) mod n` to the next rank and receives chunk
//! `(rank - t - 1) mod n` from the previous one, adding it in during the first `n-1` steps
//! (reduce-scatter) and copying it over during the rest (all-gather). The chunk sent in step
//! `t+1` is always the one received in step `t`, so the outgoing stream may run up to exactly
//! where the incoming one has been reduced. Both streams are driven from one thread over
//! non-blocking sockets and `poll`: sending never waits for receiving to drain (no deadlock on
//! large buffers), steps pipeline into one another, and no thread is spawned per call.
//! Every rank ends with the owner's bits for every chunk, so results are bit-identical.
use crate::protocol::message::CollectiveOp;
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::ops::Range;
use std::os::fd::AsRawFd;

// Payloads travel as the f32s' in-memory bytes, which is the little-endian wire format only on
// little-endian machines; every target this project builds for (x86_64, aarch64) is one.
#[cfg(not(target_endian = "little"))]
compile_error!("the ring backend sends f32 in native byte order and needs a little-endian target");

/// Each collective opens with `[seq u64][op u64][elements u64]` so that two neighbours in
/// different collectives fail loudly instead of summing unrelated buffers.
pub(super) const HEADER_BYTES: usize = 24;
/// Received partial sums land here before being added in: 256 KiB stays in L2 while it is
/// summed, and is large enough that each read syscall moves several loopback segments.
pub(super) const STAGING_ELEMENTS: usize = 64 * 1024;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Header {
    pub seq: u64,
    pub op: CollectiveOp,
    pub elements: u64,
}

impl Header {
    pub(super) fn encode(self) -> [u8; HEADER_BYTES] {
        let op = match self.op {
            CollectiveOp::AllReduce => 1u64,
            CollectiveOp::ReduceScatter => 2,
            CollectiveOp::AllGather => 3,
            CollectiveOp::Broadcast => 4,
            CollectiveOp::Barrier => 5,
        };
        let mut out = [0u8; HEADER_BYTES];
        out[..8].copy_from_slice(&self.seq.to_le_bytes());
        out[8..16].copy_from_slice(&op.to_le_bytes());
        out[16..].copy_from_slice(&self.elements.to_le_bytes());
        out
    }

    pub(super) fn describe(bytes: &[u8; HEADER_BYTES]) -> String {
        let word = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&bytes[i * 8..i * 8 + 8]);
            u64::from_le_bytes(w)
        };
        let op = match word(1) {
            1 => CollectiveOp::AllReduce.name().to_string(),
            2 => CollectiveOp::ReduceScatter.name().to_string(),
            3 => CollectiveOp::AllGather.name().to_string(),
            4 => CollectiveOp::Broadcast.name().to_string(),
            5 => CollectiveOp::Barrier.name().to_string(),
            other => format!("unknown op {other}"),
        };
        format!("#{} {op} of {} elements", word(0), word(2))
    }
}

/// Why a collective stopped; the caller names the peer behind each socket.
#[derive(Debug)]
pub(super) enum Failure {
    /// Writing to the next rank failed (reset, broken pipe).
    Send(io::Error),
    /// Reading from the previous rank failed, or it hung up mid-collective.
    Recv(io::Error),
    /// The previous rank is in a different collective; the text says how.
    Mismatch(String),
    /// Waiting on the sockets themselves failed.
    Poll(io::Error),
}

/// The `i`th of `n` near-equal chunks of `len` elements; the first `len % n` get one extra.
pub(super) fn chunk(len: usize, n: usize, i: usize) -> Range<usize> {
    let (base, extra) = (len / n, len % n);
    let start = i * base + i.min(extra);
    start..start + base + usize::from(i < extra)
}

/// Sums `buf` across the ring in place. `next` and `prev` must be non-blocking. `stall` (fault
/// injection) stops this rank for good once its first chunk is sent.
#[allow(clippy::too_many_arguments)]
pub(super) fn all_reduce(
    next: &mut TcpStream,
    prev: &mut TcpStream,
    rank: usize,
    n: usize,
    header: Header,
    buf: &mut [f32],
    staging: &mut Vec<f32>,
    stall: bool,
) -> Result<(), Failure> {
    let steps = 2 * (n - 1);
    let len = buf.len();
    // t < 2n, so adding 2n keeps these unsigned.
    let send_chunk = |t: usize| chunk(len, n, (rank + 2 * n - t) % n);
    let recv_chunk = |t: usize| chunk(len, n, (rank + 2 * n - t - 1) % n);
    if staging.len() < STAGING_ELEMENTS {
        staging.resize(STAGING_ELEMENTS, 0.0);
    }
    let own_header = header.encode();
    let mut peer_header = [0u8; HEADER_BYTES];
    let (mut header_sent, mut header_got) = (0usize, 0usize);
    // Per stream: the step it is in and the bytes of that step's chunk already moved.
    let (mut send_t, mut send_off) = (0usize, 0usize);
    let (mut recv_t, mut recv_off) = (0usize, 0usize);

    loop {
        // Leave finished steps (zero-length chunks finish at once when len < n).
        while send_t < steps && send_off == 4 * send_chunk(send_t).len() {
            (send_t, send_off) = (send_t + 1, 0);
        }
        while header_got == HEADER_BYTES && recv_t < steps && recv_off == 4 * recv_chunk(recv_t).len() {
            (recv_t, recv_off) = (recv_t + 1, 0);
        }
        if stall && send_t >= 1 {
            // Mid-ring, sockets open: the peers wait for bytes that never come.
            loop {
                std::thread::park();
            }
        }
        let send_done = header_sent == HEADER_BYTES && send_t == steps;
        let recv_done = header_got == HEADER_BYTES && recv_t == steps;
        if send_done && recv_done {
            return Ok(());
        }
        let (mut progressed, mut wait_out, mut wait_in) = (false, false, false);

        if !send_done {
            let pending: &[u8] = if header_sent < HEADER_BYTES {
                &own_header[header_sent..]
            } else {
                let range = send_chunk(send_t);
                let ready_bytes = if send_t == 0 || recv_t >= send_t {
                    4 * range.len()
                } else {
                    // Only whole, fully reduced elements of the chunk being received.
                    recv_off / 4 * 4
                };
                &as_bytes(&buf[range])[send_off..ready_bytes]
            };
            if !pending.is_empty() {
                match next.write(pending) {
                    Ok(0) => return Err(Failure::Send(io::ErrorKind::WriteZero.into())),
                    Ok(k) if header_sent < HEADER_BYTES => (header_sent, progressed) = (header_sent + k, true),
                    Ok(k) => (send_off, progressed) = (send_off + k, true),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => wait_out = true,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => progressed = true,
                    Err(e) => return Err(Failure::Send(e)),
                }
            }
        }

        if !recv_done {
            let header_was_partial = header_got < HEADER_BYTES;
            let range = recv_chunk(recv_t);
            let reducing = recv_t < n - 1;
            // Bytes of a partial element that the last read left at the front of staging.
            let carry = recv_off % 4;
            let read = if header_was_partial {
                prev.read(&mut peer_header[header_got..])
            } else if reducing {
                let want = (4 * range.len() - recv_off).min(4 * staging.len() - carry);
                prev.read(&mut as_bytes_mut(staging)[carry..carry + want])
            } else {
                // Gather: the owner's final values go straight into place.
                prev.read(&mut as_bytes_mut(&mut buf[range.clone()])[recv_off..])
            };
            match read {
                Ok(0) => {
                    return Err(Failure::Recv(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "connection closed mid-collective",
                    )))
                }
                Ok(k) if header_was_partial => (header_got, progressed) = (header_got + k, true),
                Ok(k) => {
                    if reducing {
                        // Add every element that is now whole; keep a trailing partial one.
                        let first = range.start + recv_off / 4;
                        let (filled, whole) = (carry + k, (carry + k) / 4);
                        add_into(&mut buf[first..first + whole], &staging[..whole]);
                        as_bytes_mut(staging).copy_within(4 * whole..filled, 0);
                    }
                    (recv_off, progressed) = (recv_off + k, true);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => wait_in = true,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => progressed = true,
                Err(e) => return Err(Failure::Recv(e)),
            }
            // Checked the moment the header is whole, before any of its payload is read.
            if header_was_partial && header_got == HEADER_BYTES && peer_header != own_header {
                return Err(Failure::Mismatch(format!(
                    "the previous rank is in collective {}, this rank in {}",
                    Header::describe(&peer_header),
                    Header::describe(&own_header)
                )));
            }
        }

        // Every path without progress hit WouldBlock on a wanted direction; the check keeps a
        // future slip from turning into a poll on no sockets, which would never return.
        if !progressed && (wait_out || wait_in) {
            wait(next, wait_out, prev, wait_in).map_err(Failure::Poll)?;
        }
    }
}

/// Blocks until one of the wanted directions is ready (or the socket has an error or hung up,
/// which the next read or write then reports). Waits without limit: a live peer that is slow
/// to arrive is a hang for the flight recorder to place, not an error to invent here.
fn wait(next: &TcpStream, want_out: bool, prev: &TcpStream, want_in: bool) -> io::Result<()> {
    let mut fds = [libc::pollfd { fd: -1, events: 0, revents: 0 }; 2];
    if want_out {
        fds[0] = libc::pollfd { fd: next.as_raw_fd(), events: libc::POLLOUT, revents: 0 };
    }
    if want_in {
        fds[1] = libc::pollfd { fd: prev.as_raw_fd(), events: libc::POLLIN, revents: 0 };
    }
    poll(&mut fds, -1).map(|_| ())
}

/// `poll(2)` over `fds` (negative fds are skipped); `timeout_ms < 0` waits forever. Returns the
/// number of ready descriptors; an interrupted wait counts as zero ready.
pub(super) fn poll(fds: &mut [libc::pollfd], timeout_ms: i32) -> io::Result<usize> {
    let count = fds.len() as libc::nfds_t;
    // SAFETY: `fds` is a live, exclusively borrowed array of `count` initialised pollfd structs
    // for the whole call, and poll only writes their `revents` fields.
    let rc = unsafe { libc::poll(fds.as_mut_ptr(), count, timeout_ms) };
    match rc {
        rc if rc >= 0 => Ok(rc as usize),
        _ => match io::Error::last_os_error() {
            e if e.kind() == io::ErrorKind::Interrupted => Ok(0),
            e => Err(e),
        },
    }
}

/// A plain zip that the compiler vectorises; the summation order per element is fixed by the
/// ring, which is what keeps every rank's result bit-identical.
fn add_into(dst: &mut [f32], src: &[f32]) {
    for (d, s) in dst.iter_mut().zip(src) {
        *d += *s;
    }
}

fn as_bytes(floats: &[f32]) -> &[u8] {
    // SAFETY: f32 is four bytes with no padding and u8 needs no alignment, so the same memory
    // is a valid byte slice of four times the length, borrowed for the same lifetime.
    unsafe { std::slice::from_raw_parts(floats.as_ptr().cast::<u8>(), std::mem::size_of_val(floats)) }
}

fn as_bytes_mut(floats: &mut [f32]) -> &mut [u8] {
    // SAFETY: as in `as_bytes`, and every bit pattern is a valid f32, so writes through the
    // byte view cannot leave an invalid value behind; the exclusive borrow moves to the result.
    unsafe { std::slice::from_raw_parts_mut(floats.as_mut_ptr().cast::<u8>(), std::mem::size_of_val(floats)) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_tile_the_buffer_for_every_length_and_world() {
        for n in 1..=5 {
            for len in [0, 1, 3, 7, 1000, 1001] {
                let ranges: Vec<_> = (0..n).map(|i| chunk(len, n, i)).collect();
                assert_eq!(ranges[0].start, 0);
                assert_eq!(ranges[n - 1].end, len);
                for w in ranges.windows(2) {
                    assert_eq!(w[0].end, w[1].start);
                    assert!(w[0].len() >= w[1].len() && w[0].len() - w[1].len() <= 1);
                }
            }
        }
    }

    #[test]
    fn header_description_names_the_collective() {
        let h = Header { seq: 7, op: CollectiveOp::Barrier, elements: 1 };
        assert_eq!(Header::describe(&h.encode()), "#7 barrier of 1 elements");
    }
}
