//! The TCP ring backend: ranks found through the rendezvous store, all-reduce as a ring.
//!
//! Each rank listens on its own port, publishes the address in the store, dials the next rank
//! and accepts the previous one; the data path is in `exchange`. A failed collective closes
//! both sockets, so the failure travels around the ring and every rank returns an error
//! instead of waiting on a neighbour that gave up. Every ring connection starts with the run's
//! handshake (`auth`), then the hello; the listener's side is `admit`. When every rank is on
//! one machine, large all-reduces take the shared-memory path (`shm`) over the same sockets'
//! watch; the sums are the same bits either way.
mod admit;
mod exchange;
mod shm;

use super::auth::{Gate, Purpose, HANDSHAKE_TIMEOUT};
use super::rendezvous::StoreClient;
use super::{Collective, CollectiveError, InjectedFault};
use crate::ids::Rank;
use crate::protocol::message::CollectiveOp;
use exchange::{Failure, Header};
use std::io::{self, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Opens every ring hello, so a stray client on the port is not taken for a rank.
const HELLO_MAGIC: [u8; 8] = *b"FDRING01";
/// The magic, the dialling rank and the world size.
const HELLO_BYTES: usize = 16;

/// The store key under which `rank` publishes its ring address.
pub fn addr_key(rank: u32) -> String {
    format!("ring/rank{rank}/addr")
}

/// The store key under which `rank` publishes its machine and shared-memory segment.
fn shm_key(rank: u32) -> String {
    format!("ring/rank{rank}/shm")
}

/// Whether large all-reduces may use shared memory when every rank is on one machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SharedMemory {
    WhenLocal,
    Never,
}

impl SharedMemory {
    /// `FLIGHTDECK_RING_SHM=0` turns the shared-memory path off (as NCCL_SHM_DISABLE does).
    pub fn from_env() -> SharedMemory {
        match std::env::var("FLIGHTDECK_RING_SHM").as_deref() {
            Ok("0") => SharedMemory::Never,
            _ => SharedMemory::WhenLocal,
        }
    }
}

pub struct Ring {
    rank: Rank,
    world_size: u32,
    /// Collectives started so far; the header of the next one carries `seq + 1`.
    seq: u64,
    links: Links,
    /// Reused by every collective, so the data path allocates once per ring, not per call.
    staging: Vec<f32>,
    /// A fault the next collective plays (tests only).
    fault: Option<InjectedFault>,
}

enum Links {
    /// World size 1: every collective is the identity.
    Alone,
    Connected {
        next: Peer,
        prev: Peer,
        /// Every rank's segment, when the whole world shares this machine.
        shared: Option<shm::Shared>,
    },
    /// A collective failed and the sockets are closed; the text is that first error.
    Broken(String),
}

struct Peer {
    rank: u32,
    addr: String,
    stream: TcpStream,
}

impl Ring {
    /// Joins the ring of `world_size` ranks through `store`, listening on `advertise_host`
    /// (an address the other ranks can reach) and taking only peers that pass `gate`. Gives
    /// up after `timeout`. Shared memory as `FLIGHTDECK_RING_SHM` says.
    pub fn connect(
        store: &mut StoreClient,
        rank: Rank,
        world_size: u32,
        advertise_host: &str,
        timeout: Duration,
        gate: &Gate,
    ) -> Result<Ring, CollectiveError> {
        Ring::connect_with(store, rank, world_size, advertise_host, timeout, gate, SharedMemory::from_env())
    }

    /// `connect`, with the shared-memory path allowed or not.
    pub fn connect_with(
        store: &mut StoreClient,
        rank: Rank,
        world_size: u32,
        advertise_host: &str,
        timeout: Duration,
        gate: &Gate,
        shared: SharedMemory,
    ) -> Result<Ring, CollectiveError> {
        if rank.0 >= world_size {
            return Err(rendezvous_error(
                store,
                format!("rank {rank} is outside a world of {world_size} (valid ranks: 0..{world_size})"),
            ));
        }
        let deadline = Instant::now() + timeout;
        let mut links = match world_size {
            1 => Links::Alone,
            _ => link_up(store, rank.0, world_size, advertise_host, deadline, gate)?,
        };
        if let (Links::Connected { next, prev, shared: segments }, SharedMemory::WhenLocal) = (&mut links, shared) {
            if world_size as usize <= shm::MAX_WORLD {
                *segments = share_memory(store, rank.0, world_size, next, prev, deadline)?;
            }
        }
        Ok(Ring { rank, world_size, seq: 0, links, staging: Vec::new(), fault: None })
    }

    /// Whether this ring's all-reduces go through shared memory.
    pub fn shares_memory(&self) -> bool {
        self.segment_path().is_some()
    }

    /// Where this rank's shared-memory segment was made (the file is removed once every rank
    /// has mapped it), if the ring shares memory.
    pub fn segment_path(&self) -> Option<&std::path::Path> {
        match &self.links {
            Links::Connected { shared: Some(shared), .. } => Some(shared.path()),
            _ => None,
        }
    }

    fn run(&mut self, op: CollectiveOp, buf: &mut [f32]) -> Result<(), CollectiveError> {
        self.seq += 1;
        let seq = self.seq;
        let links = match &mut self.links {
            Links::Alone => return Ok(()),
            Links::Broken(first) => {
                return Err(CollectiveError::Protocol {
                    seq,
                    op: op.name(),
                    reason: format!("the ring broke in an earlier collective ({first})"),
                })
            }
            Links::Connected { next, prev, shared } => (next, prev, shared),
        };
        let (next, prev, shared) = links;
        let header = Header { seq, op, elements: buf.len() as u64 };
        let rank = self.rank.0 as usize;
        let n = self.world_size as usize;
        let stall = self.fault.take() == Some(InjectedFault::StallAfterFirstChunk);
        let result = match shared {
            Some(shared) if !buf.is_empty() => shared.all_reduce(&next.stream, &prev.stream, header, buf, stall),
            _ => {
                exchange::all_reduce(&mut next.stream, &mut prev.stream, rank, n, header, buf, &mut self.staging, stall)
            }
        };
        let Err(failure) = result else {
            return Ok(());
        };
        let peer_error =
            |peer: &Peer, source| CollectiveError::Peer { peer: peer.rank, addr: peer.addr.clone(), source };
        let protocol_error = |reason| CollectiveError::Protocol { seq, op: op.name(), reason };
        let err = match failure {
            Failure::Send(e) => peer_error(next, e),
            Failure::Recv(e) => peer_error(prev, e),
            Failure::Mismatch(reason) => protocol_error(reason),
            Failure::Poll(e) => protocol_error(format!("waiting on the ring sockets failed: {e}")),
        };
        // Dropping the streams closes them, which is what tells both neighbours to stop.
        self.links = Links::Broken(err.to_string());
        Err(err)
    }
}

impl Collective for Ring {
    fn rank(&self) -> Rank {
        self.rank
    }

    fn world_size(&self) -> u32 {
        self.world_size
    }

    fn all_reduce_sum(&mut self, buf: &mut [f32]) -> Result<(), CollectiveError> {
        self.run(CollectiveOp::AllReduce, buf)
    }

    fn barrier(&mut self) -> Result<(), CollectiveError> {
        // A rank cannot finish an all-reduce before every rank has contributed to it.
        self.run(CollectiveOp::Barrier, &mut [0.0])
    }

    fn inject(&mut self, fault: InjectedFault) {
        self.fault = Some(fault);
    }
}

fn rendezvous_error(store: &StoreClient, reason: String) -> CollectiveError {
    CollectiveError::Rendezvous { addr: store.addr().to_string(), reason }
}

/// Publishes this rank's listener, then dials the next rank while accepting the previous one.
/// Both sides of a link speak in its handshake (the acceptor's challenge first), so the accept
/// runs on its own thread from the moment the address is published: no rank's dial waits on a
/// rank that is itself still dialling or looking up its neighbour, and the ring cannot deadlock
/// while forming.
fn link_up(
    store: &mut StoreClient,
    rank: u32,
    world_size: u32,
    advertise_host: &str,
    deadline: Instant,
    gate: &Gate,
) -> Result<Links, CollectiveError> {
    let listener = TcpListener::bind((advertise_host, 0))
        .map_err(|e| rendezvous_error(store, format!("cannot listen on advertise host {advertise_host:?}: {e}")))?;
    let own_addr = listener
        .local_addr()
        .map_err(|e| rendezvous_error(store, format!("cannot read the ring listener's address: {e}")))?;
    if own_addr.ip().is_unspecified() {
        return Err(rendezvous_error(
            store,
            format!(
                "advertise host {advertise_host:?} is not an address other ranks can dial; \
                 give this node's IP or host name"
            ),
        ));
    }
    store.set(&addr_key(rank), own_addr.to_string().as_bytes())?;
    let next_rank = (rank + 1) % world_size;
    let prev_rank = (rank + world_size - 1) % world_size;
    let store_addr = store.addr().to_string();
    let dial_failed = AtomicBool::new(false);
    std::thread::scope(|s| {
        let accepting = std::thread::Builder::new()
            .name("ring-accept".into())
            .spawn_scoped(s, || accept(&listener, rank, world_size, prev_rank, deadline, gate, &dial_failed))
            .map_err(|e| rendezvous_error(store, format!("cannot start the ring's accepting thread: {e}")))?;
        let next = (|| {
            let next_addr = store.get(&addr_key(next_rank), left(deadline))?;
            let next_addr = String::from_utf8(next_addr).map_err(|e| {
                rendezvous_error(store, format!("rank {next_rank}'s published address is not utf-8: {e}"))
            })?;
            dial(rank, world_size, next_rank, next_addr, deadline, gate)
        })();
        dial_failed.store(next.is_err(), Ordering::Relaxed);
        // The accept ends by itself: at the previous rank's hello, or at the deadline.
        let prev = accepting
            .join()
            .unwrap_or_else(|_| Err("the ring's accepting thread panicked".into()))
            .map_err(|reason| CollectiveError::Rendezvous { addr: store_addr.clone(), reason });
        Ok(Links::Connected { next: next?, prev: prev?, shared: None })
    })
}

/// Sets up the shared-memory path when every rank is on this machine: each rank creates its
/// segment and publishes it with its machine's identity; where all identities agree each maps
/// every segment; one all-reduce over the ring then says whether every rank managed, after which
/// the files are removed (the mappings stay). None (the TCP path) where anything disagrees or
/// fails, on every rank alike.
fn share_memory(
    store: &mut StoreClient,
    rank: u32,
    world_size: u32,
    next: &mut Peer,
    prev: &mut Peer,
    deadline: Instant,
) -> Result<Option<shm::Shared>, CollectiveError> {
    let own = shm::machine_identity().and_then(|machine| match shm::Own::create(rank) {
        Ok(own) => Some((machine, own)),
        Err(e) => {
            tracing::info!("ring: no shared-memory segment for rank {rank} ({e}); all-reduces go over TCP");
            None
        }
    });
    let entry = own.as_ref().map_or("-".to_string(), |(machine, own)| format!("{machine}\n{}", own.path().display()));
    store.set(&shm_key(rank), entry.as_bytes())?;
    let mut entries = Vec::with_capacity(world_size as usize);
    for r in 0..world_size {
        entries.push(String::from_utf8_lossy(&store.get(&shm_key(r), left(deadline))?).into_owned());
    }
    let mapped = own.as_ref().and_then(|(machine, _)| {
        let mut peers = Vec::with_capacity(entries.len());
        for (r, entry) in entries.iter().enumerate().filter(|(r, _)| *r != rank as usize) {
            let (their_machine, path) = entry.split_once('\n')?;
            if their_machine != machine {
                return None;
            }
            match shm::PeerSegment::open(path) {
                Ok(segment) => peers.push((r, segment)),
                Err(e) => {
                    tracing::info!("ring: cannot map rank {r}'s segment {path} ({e}); all-reduces go over TCP");
                    return None;
                }
            }
        }
        Some(peers)
    });
    // Every rank takes the path only if every rank mapped every segment.
    let mut missing = [if mapped.is_some() { 0.0f32 } else { 1.0 }];
    let header = Header { seq: 0, op: CollectiveOp::AllReduce, elements: 1 };
    let mut staging = Vec::new();
    let (r, n) = (rank as usize, world_size as usize);
    let agreed =
        exchange::all_reduce(&mut next.stream, &mut prev.stream, r, n, header, &mut missing, &mut staging, false);
    if let Some((_, own)) = &own {
        own.unlink();
    }
    agreed.map_err(|failure| match failure {
        Failure::Send(e) => CollectiveError::Peer { peer: next.rank, addr: next.addr.clone(), source: e },
        Failure::Recv(e) => CollectiveError::Peer { peer: prev.rank, addr: prev.addr.clone(), source: e },
        Failure::Mismatch(reason) => rendezvous_error(store, format!("agreeing on shared memory: {reason}")),
        Failure::Poll(e) => rendezvous_error(store, format!("agreeing on shared memory: {e}")),
    })?;
    Ok(match (own, mapped) {
        (Some((_, own)), Some(peers)) if missing[0] == 0.0 => Some(own.into_shared(r, peers)),
        _ => None,
    })
}

fn left(deadline: Instant) -> Duration {
    deadline.saturating_duration_since(Instant::now())
}

/// The first bytes on a ring connection: who is dialling, and in which world.
fn hello(rank: u32, world_size: u32) -> [u8; HELLO_BYTES] {
    let mut out = [0u8; HELLO_BYTES];
    out[..8].copy_from_slice(&HELLO_MAGIC);
    out[8..12].copy_from_slice(&rank.to_le_bytes());
    out[12..].copy_from_slice(&world_size.to_le_bytes());
    out
}

/// `hello`'s rank and world size, or None for bytes that are not a ring hello.
fn parse_hello(bytes: &[u8; HELLO_BYTES]) -> Option<(u32, u32)> {
    let word = |i: usize| u32::from_le_bytes([bytes[i], bytes[i + 1], bytes[i + 2], bytes[i + 3]]);
    (bytes[..HELLO_MAGIC.len()] == HELLO_MAGIC).then(|| (word(8), word(12)))
}

/// Connects to the next rank, which is listening already: it published after binding.
fn dial(
    rank: u32,
    world_size: u32,
    next_rank: u32,
    next_addr: String,
    deadline: Instant,
    gate: &Gate,
) -> Result<Peer, CollectiveError> {
    let connected = (|| -> io::Result<TcpStream> {
        let target = next_addr
            .to_socket_addrs()?
            .next()
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "the address resolved to nothing"))?;
        let mut stream = TcpStream::connect_timeout(&target, left(deadline).max(Duration::from_millis(1)))?;
        let handshake_deadline = Some(left(deadline).clamp(Duration::from_millis(1), HANDSHAKE_TIMEOUT));
        stream.set_write_timeout(handshake_deadline)?;
        stream.set_read_timeout(handshake_deadline)?;
        gate.dial(&mut stream, Purpose::Ring).map_err(|e| match e {
            super::auth::AuthError::Io(e) => e,
            other => io::Error::new(io::ErrorKind::PermissionDenied, format!("the ring handshake failed: {other}")),
        })?;
        (&stream).write_all(&hello(rank, world_size))?;
        ready_for_collectives(&stream)?;
        Ok(stream)
    })();
    match connected {
        Ok(stream) => Ok(Peer { rank: next_rank, addr: next_addr, stream }),
        Err(source) => Err(CollectiveError::Peer { peer: next_rank, addr: next_addr, source }),
    }
}

/// Accepts the previous rank's connection; connections that fail the handshake are refused
/// (counted and reported through `gate`), hellos from other ranks dropped.
fn accept(
    listener: &TcpListener,
    rank: u32,
    world_size: u32,
    prev_rank: u32,
    deadline: Instant,
    gate: &Gate,
    stop: &AtomicBool,
) -> Result<Peer, String> {
    let name = format!("ring listener of rank {rank}");
    let admitted = admit::admit(listener, gate, &name, deadline, stop, |a| match (a.rank, a.world) {
        (r, w) if r == prev_rank && w == world_size => Ok(true),
        (r, w) if w != world_size => Err(format!(
            "rank {r} at {} believes the world has {w} ranks, this rank {world_size}; every rank must be \
             launched with the same world size",
            a.from
        )),
        (r, _) => {
            tracing::warn!("ring: dropping a connection from rank {r} at {}; expected rank {prev_rank}", a.from);
            Ok(false)
        }
    })
    .map_err(|reason| format!("waiting for rank {prev_rank}: {reason}"))?;
    ready_for_collectives(&admitted.stream).map_err(|e| format!("rank {prev_rank}'s connection: {e}"))?;
    Ok(Peer { rank: prev_rank, addr: admitted.from.to_string(), stream: admitted.stream })
}

/// Collectives are latency-bound at small sizes (Nagle would hold back a barrier's last bytes)
/// and driven by `poll`, so the sockets become no-delay and non-blocking.
fn ready_for_collectives(stream: &TcpStream) -> io::Result<()> {
    stream.set_read_timeout(None)?;
    stream.set_write_timeout(None)?;
    stream.set_nodelay(true)?;
    stream.set_nonblocking(true)
}

#[cfg(test)]
mod tests;
