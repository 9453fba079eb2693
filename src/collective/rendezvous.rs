//! The rendezvous store: a small TCP key-value server (like torch's TCPStore) and its client.
//!
//! Wire format, little-endian, one request then one reply per round trip:
//! request `[body_len u32][op u8][key_len u32][key utf-8][args]`, where args are the value's
//! bytes (set), a wait in milliseconds as u64 (get), or a delta as i64 (add);
//! reply `[body_len u32][status u8][payload]`, status 0 ok (payload: the value for get, the new
//! count as i64 for add), 1 timed out (get), 2 refused (payload: a utf-8 reason).
//!
//! Before its first request every connection passes the run's handshake (`auth`, purpose
//! `store`); one that fails it is closed, counted and reported through the run's `Gate`.
use super::auth::{Gate, Purpose, HANDSHAKE_TIMEOUT};
use super::CollectiveError;
use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Keys and values are addresses, counters and ids (NCCL's is 128 bytes); anything near this is
/// a stray or corrupt client, and refusing it keeps one bad length from allocating gigabytes.
const MAX_FRAME_BYTES: u32 = 16 << 20;
/// How long a client waits for a set or add reply before calling the store dead.
const REPLY_TIMEOUT: Duration = Duration::from_secs(60);
/// Added to a get's own wait for the client's socket timeout, so the server's reply (the value
/// or "timed out") normally arrives first and the connection stays in step.
const GET_GRACE: Duration = Duration::from_secs(5);
/// Between connection attempts while the store is not listening yet.
const CONNECT_RETRY: Duration = Duration::from_millis(50);

const OP_SET: u8 = 1;
const OP_GET: u8 = 2;
const OP_ADD: u8 = 3;
const STATUS_OK: u8 = 0;
const STATUS_TIMEOUT: u8 = 1;
const STATUS_REFUSED: u8 = 2;

/// The store's contents, shared by every connection's thread.
#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    /// Notified on every write (and when a get starts waiting, for tests).
    changed: Condvar,
}

#[derive(Default)]
struct State {
    values: HashMap<String, Vec<u8>>,
    /// Gets blocked on a missing key right now; lets tests wait for "the get has arrived".
    waiting_gets: usize,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A poisoned lock means a connection thread panicked mid-update; the map itself is
        // still a valid map, and refusing every later rank would turn one bug into a hang.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

pub struct StoreServer {
    listener: TcpListener,
    shared: Arc<Shared>,
    gate: Gate,
}

impl StoreServer {
    /// Listens on `addr` (`"127.0.0.1:0"` picks a free port; see `local_addr`), taking only
    /// clients that pass `gate`.
    pub fn bind(addr: &str, gate: Gate) -> io::Result<StoreServer> {
        Ok(StoreServer { listener: TcpListener::bind(addr)?, shared: Arc::default(), gate })
    }

    pub fn local_addr(&self) -> SocketAddr {
        // The listener is bound, so only a closed fd could fail here; fall back to "unknown".
        self.listener.local_addr().unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)))
    }

    /// Serves until the process exits: one thread accepts, one thread per connection.
    pub fn spawn(self) -> JoinHandle<()> {
        // Like every `thread::spawn`, this panics only if the OS cannot create a thread at all.
        std::thread::spawn(move || self.serve())
    }

    fn serve(self) {
        for conn in self.listener.incoming() {
            let stream = match conn {
                Ok(s) => s,
                Err(e) => {
                    // Usually out of file descriptors; back off rather than spin on the error.
                    tracing::warn!("store: accept failed: {e}");
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                }
            };
            let shared = Arc::clone(&self.shared);
            let gate = self.gate.clone();
            let spawned = std::thread::Builder::new()
                .name("store-conn".into())
                .spawn(move || serve_connection(stream, &shared, &gate));
            if let Err(e) = spawned {
                tracing::warn!("store: cannot start a connection thread: {e}");
            }
        }
    }
}

fn serve_connection(mut stream: TcpStream, shared: &Shared, gate: &Gate) {
    let peer = stream.peer_addr().map_or_else(|_| "unknown peer".to_string(), |a| a.to_string());
    // Replies are one small frame each; Nagle would add a delay to every rendezvous round trip.
    let _ = stream.set_nodelay(true);
    let admitted = stream
        .set_read_timeout(Some(HANDSHAKE_TIMEOUT))
        .map_err(super::auth::AuthError::from)
        .and_then(|()| gate.accept(&mut stream, Purpose::Store))
        .and_then(|()| stream.set_read_timeout(None).map_err(Into::into));
    if let Err(e) = admitted {
        gate.refuse("store", &peer, &e.to_string());
        return;
    }
    loop {
        let body = match read_frame(&mut stream) {
            Ok(Some(body)) => body,
            Ok(None) => return, // the client hung up between requests: the normal end
            Err(e) => {
                tracing::warn!("store: closing connection from {peer}: {e}");
                return;
            }
        };
        let reply = match Request::parse(&body) {
            Ok(request) => request.apply(shared),
            Err(reason) => {
                tracing::warn!("store: closing connection from {peer}: malformed request: {reason}");
                return;
            }
        };
        if let Err(e) = write_frame(&mut stream, &reply) {
            tracing::warn!("store: closing connection from {peer}: cannot reply: {e}");
            return;
        }
    }
}

enum Request<'a> {
    Set { key: &'a str, value: &'a [u8] },
    Get { key: &'a str, wait_ms: u64 },
    Add { key: &'a str, delta: i64 },
}

impl<'a> Request<'a> {
    fn parse(body: &'a [u8]) -> Result<Request<'a>, String> {
        let (&op, rest) = body.split_first().ok_or("empty request")?;
        let (key_len, rest) = take_u32(rest).ok_or("truncated key length")?;
        let key_len = key_len as usize;
        if rest.len() < key_len {
            return Err(format!("key length {key_len} exceeds the {} bytes left", rest.len()));
        }
        let (key, args) = rest.split_at(key_len);
        let key = std::str::from_utf8(key).map_err(|e| format!("key is not utf-8: {e}"))?;
        let eight = |what: &str| -> Result<[u8; 8], String> {
            args.try_into().map_err(|_| format!("{what} must be 8 bytes, got {}", args.len()))
        };
        match op {
            OP_SET => Ok(Request::Set { key, value: args }),
            OP_GET => Ok(Request::Get { key, wait_ms: u64::from_le_bytes(eight("get's wait")?) }),
            OP_ADD => Ok(Request::Add { key, delta: i64::from_le_bytes(eight("add's delta")?) }),
            other => Err(format!("unknown op {other} (valid: 1 set, 2 get, 3 add)")),
        }
    }

    /// Runs the request against the store and returns the reply body.
    fn apply(self, shared: &Shared) -> Vec<u8> {
        match self {
            Request::Set { key, value } => {
                shared.lock().values.insert(key.to_string(), value.to_vec());
                shared.changed.notify_all();
                vec![STATUS_OK]
            }
            Request::Get { key, wait_ms } => {
                let mut state = shared.lock();
                if !state.values.contains_key(key) {
                    state.waiting_gets += 1;
                    shared.changed.notify_all();
                    let wait = Duration::from_millis(wait_ms);
                    state = shared
                        .changed
                        .wait_timeout_while(state, wait, |s| !s.values.contains_key(key))
                        .map_or_else(|poisoned| poisoned.into_inner().0, |(s, _)| s);
                    state.waiting_gets -= 1;
                }
                match state.values.get(key) {
                    Some(value) => [&[STATUS_OK][..], value].concat(),
                    None => vec![STATUS_TIMEOUT],
                }
            }
            Request::Add { key, delta } => {
                let mut state = shared.lock();
                // Counters are stored as ASCII decimal, as torch's TCPStore does, so a get of a
                // counter reads the same in both stores.
                let current = match state.values.get(key) {
                    None => Some(0),
                    Some(v) => std::str::from_utf8(v).ok().and_then(|s| s.parse::<i64>().ok()),
                };
                let Some(current) = current else {
                    return refused(&format!("key {key:?} holds a value that is not a counter"));
                };
                let Some(next) = current.checked_add(delta) else {
                    return refused(&format!("counter {key:?} = {current} overflows adding {delta}"));
                };
                state.values.insert(key.to_string(), next.to_string().into_bytes());
                drop(state);
                shared.changed.notify_all();
                [&[STATUS_OK][..], &next.to_le_bytes()].concat()
            }
        }
    }
}

fn refused(reason: &str) -> Vec<u8> {
    [&[STATUS_REFUSED][..], reason.as_bytes()].concat()
}

fn take_u32(bytes: &[u8]) -> Option<(u32, &[u8])> {
    let (head, rest) = bytes.split_first_chunk::<4>()?;
    Some((u32::from_le_bytes(*head), rest))
}

/// One frame's body, or `None` on a clean end of stream before its first byte.
fn read_frame(stream: &mut TcpStream) -> io::Result<Option<Vec<u8>>> {
    let mut len = [0u8; 4];
    // A signal (the graceful stop's SIGUSR1) interrupts a read with a timeout even under
    // SA_RESTART; read_exact retries by itself, this first read must too.
    let first = loop {
        match stream.read(&mut len[..1]) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            other => break other?,
        }
    };
    match first {
        0 => return Ok(None),
        _ => stream.read_exact(&mut len[1..])?,
    }
    let len = u32::from_le_bytes(len);
    if len > MAX_FRAME_BYTES {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("frame of {len} bytes exceeds the {MAX_FRAME_BYTES}-byte limit"),
        ));
    }
    let mut body = vec![0u8; len as usize];
    stream.read_exact(&mut body)?;
    Ok(Some(body))
}

fn write_frame(stream: &mut TcpStream, body: &[u8]) -> io::Result<()> {
    let len = u32::try_from(body.len()).ok().filter(|&n| n <= MAX_FRAME_BYTES).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("frame of {} bytes exceeds the {MAX_FRAME_BYTES}-byte limit", body.len()),
        )
    })?;
    // One write per frame: with TCP_NODELAY, two writes would be two packets.
    stream.write_all(&[&len.to_le_bytes()[..], body].concat())
}

/// A rank's connection to the store. Requests are strictly one at a time.
pub struct StoreClient {
    addr: String,
    /// `None` once a reply went missing: the stream may hold half a frame, so reusing it would
    /// pair later requests with the wrong replies.
    stream: Option<TcpStream>,
}

impl StoreClient {
    /// Connects to the store at `addr` and passes its handshake with `gate`'s secret, retrying
    /// the connection until `timeout` passes, since ranks may start before the agent's store
    /// listens.
    pub fn connect(addr: &str, gate: &Gate, timeout: Duration) -> Result<StoreClient, CollectiveError> {
        let deadline = Instant::now() + timeout;
        loop {
            let attempt = addr.to_socket_addrs().and_then(|mut addrs| {
                let target = addrs
                    .next()
                    .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "the name resolved to no address"))?;
                let left = deadline.saturating_duration_since(Instant::now());
                TcpStream::connect_timeout(&target, left.max(Duration::from_millis(1)))
            });
            match attempt {
                Ok(mut stream) => {
                    let _ = stream.set_nodelay(true);
                    let admitted = stream
                        .set_read_timeout(Some(HANDSHAKE_TIMEOUT))
                        .map_err(super::auth::AuthError::from)
                        .and_then(|()| gate.dial(&mut stream, Purpose::Store));
                    if let Err(e) = admitted {
                        return Err(CollectiveError::Rendezvous {
                            addr: addr.to_string(),
                            reason: format!("the store's handshake failed: {e}"),
                        });
                    }
                    return Ok(StoreClient { addr: addr.to_string(), stream: Some(stream) });
                }
                Err(e) if Instant::now() + CONNECT_RETRY >= deadline => {
                    return Err(CollectiveError::Rendezvous {
                        addr: addr.to_string(),
                        reason: format!("store unreachable after {timeout:?}: {e}"),
                    });
                }
                Err(_) => std::thread::sleep(CONNECT_RETRY),
            }
        }
    }

    /// The store's address, as given to `connect`.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    pub fn set(&mut self, key: &str, value: &[u8]) -> Result<(), CollectiveError> {
        let reply = self.call(OP_SET, key, value, REPLY_TIMEOUT)?;
        self.expect_ok(key, reply).map(|_| ())
    }

    /// The value under `key`, waiting up to `timeout` for another rank to set it.
    pub fn get(&mut self, key: &str, timeout: Duration) -> Result<Vec<u8>, CollectiveError> {
        let wait_ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
        let reply = self.call(OP_GET, key, &wait_ms.to_le_bytes(), timeout + GET_GRACE)?;
        if reply.first() == Some(&STATUS_TIMEOUT) {
            return Err(self.error(format!("key {key:?} was not set within {timeout:?}")));
        }
        self.expect_ok(key, reply)
    }

    /// Adds `delta` to the counter under `key` (absent counts as 0) and returns the new count.
    pub fn add(&mut self, key: &str, delta: i64) -> Result<i64, CollectiveError> {
        let reply = self.call(OP_ADD, key, &delta.to_le_bytes(), REPLY_TIMEOUT)?;
        let payload = self.expect_ok(key, reply)?;
        let count: [u8; 8] = payload
            .as_slice()
            .try_into()
            .map_err(|_| self.error(format!("add reply for {key:?} has {} bytes, not 8", payload.len())))?;
        Ok(i64::from_le_bytes(count))
    }

    /// Sends one request and returns the reply body (status byte first).
    fn call(&mut self, op: u8, key: &str, args: &[u8], reply_timeout: Duration) -> Result<Vec<u8>, CollectiveError> {
        let key_len =
            u32::try_from(key.len()).map_err(|_| self.error(format!("key of {} bytes is too long", key.len())))?;
        let body = [&[op][..], &key_len.to_le_bytes(), key.as_bytes(), args].concat();
        let Some(stream) = self.stream.as_mut() else {
            return Err(self.error("connection lost in an earlier request".into()));
        };
        let result = stream
            .set_read_timeout(Some(reply_timeout))
            .and_then(|()| write_frame(stream, &body))
            .and_then(|()| read_frame(stream))
            .and_then(|reply| {
                reply.ok_or_else(|| io::Error::new(io::ErrorKind::UnexpectedEof, "the store closed the connection"))
            });
        result.map_err(|e| {
            self.stream = None;
            self.error(format!("request for key {key:?} failed: {e}"))
        })
    }

    /// The payload of an ok reply, or the store's refusal as an error.
    fn expect_ok(&self, key: &str, reply: Vec<u8>) -> Result<Vec<u8>, CollectiveError> {
        match reply.split_first() {
            Some((&STATUS_OK, payload)) => Ok(payload.to_vec()),
            Some((&STATUS_REFUSED, reason)) => {
                Err(self.error(format!("refused for key {key:?}: {}", String::from_utf8_lossy(reason))))
            }
            Some((status, _)) => Err(self.error(format!("unknown reply status {status}"))),
            None => Err(self.error("empty reply".into())),
        }
    }

    fn error(&self, reason: String) -> CollectiveError {
        CollectiveError::Rendezvous { addr: self.addr.clone(), reason }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collective::auth::RunSecret;
    use crate::protocol::message::Refusal;

    /// One secret for every test's store and clients; refusals collected.
    fn gate() -> (Gate, Arc<Mutex<Vec<Refusal>>>) {
        static SECRET: std::sync::OnceLock<RunSecret> = std::sync::OnceLock::new();
        let secret = SECRET.get_or_init(|| RunSecret::generate().unwrap()).clone();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&seen);
        (Gate::new(secret, Arc::new(move |r| sink.lock().unwrap().push(r))), seen)
    }

    fn connect(addr: &str, timeout: Duration) -> Result<StoreClient, CollectiveError> {
        StoreClient::connect(addr, &gate().0, timeout)
    }

    fn start() -> (String, Arc<Shared>) {
        let (addr, shared, _) = start_gated();
        (addr, shared)
    }

    fn start_gated() -> (String, Arc<Shared>, Arc<Mutex<Vec<Refusal>>>) {
        let (gate, seen) = gate();
        let server = StoreServer::bind("127.0.0.1:0", gate).unwrap();
        let addr = server.local_addr().to_string();
        let shared = Arc::clone(&server.shared);
        server.spawn();
        (addr, shared, seen)
    }

    /// Blocks until `n` gets are parked on missing keys inside the server.
    fn wait_for_parked_gets(shared: &Shared, n: usize) {
        let state = shared.lock();
        let _state = shared.changed.wait_while(state, |s| s.waiting_gets < n).unwrap();
    }

    #[test]
    fn set_then_get_round_trips_bytes() {
        let (addr, _) = start();
        let mut c = connect(&addr, Duration::from_secs(5)).unwrap();
        c.set("a", b"\x00\xffbytes").unwrap();
        assert_eq!(c.get("a", Duration::ZERO).unwrap(), b"\x00\xffbytes");
        c.set("a", b"").unwrap();
        assert_eq!(c.get("a", Duration::ZERO).unwrap(), b"");
    }

    #[test]
    fn get_before_set_blocks_until_the_set() {
        let (addr, shared) = start();
        let waiter = {
            let addr = addr.clone();
            std::thread::spawn(move || {
                let mut c = connect(&addr, Duration::from_secs(5)).unwrap();
                c.get("late", Duration::from_secs(60)).unwrap()
            })
        };
        // The get is parked in the server on a missing key, so only the set below can free it.
        wait_for_parked_gets(&shared, 1);
        assert!(!waiter.is_finished());
        let mut setter = connect(&addr, Duration::from_secs(5)).unwrap();
        setter.set("late", b"here").unwrap();
        assert_eq!(waiter.join().unwrap(), b"here");
    }

    #[test]
    fn get_of_a_missing_key_times_out_and_the_client_stays_usable() {
        let (addr, _) = start();
        let mut c = connect(&addr, Duration::from_secs(5)).unwrap();
        let err = c.get("never", Duration::from_millis(20)).unwrap_err();
        assert!(err.to_string().contains("\"never\" was not set"), "{err}");
        c.set("k", b"v").unwrap();
        assert_eq!(c.get("k", Duration::ZERO).unwrap(), b"v");
    }

    #[test]
    fn add_counts_across_clients_and_refuses_non_counters() {
        let (addr, _) = start();
        let mut a = connect(&addr, Duration::from_secs(5)).unwrap();
        let mut b = connect(&addr, Duration::from_secs(5)).unwrap();
        assert_eq!(a.add("n", 1).unwrap(), 1);
        assert_eq!(b.add("n", 5).unwrap(), 6);
        assert_eq!(a.add("n", -2).unwrap(), 4);
        assert_eq!(b.get("n", Duration::ZERO).unwrap(), b"4");
        a.set("text", b"hello").unwrap();
        let err = a.add("text", 1).unwrap_err();
        assert!(err.to_string().contains("not a counter"), "{err}");
        assert_eq!(a.add("n", 0).unwrap(), 4);
    }

    #[test]
    fn malformed_requests_close_only_that_connection() {
        let (addr, _) = start();
        let garbage: [&[u8]; 4] = [
            &u32::MAX.to_le_bytes(),                              // absurd length
            &[1, 0, 0, 0, 9],                                     // unknown op
            &[5, 0, 0, 0, OP_SET, 200, 0, 0, 0],                  // key longer than the body
            &[10, 0, 0, 0, OP_GET, 1, 0, 0, 0, b'k', 1, 2, 3, 4], // short wait field
        ];
        for bytes in garbage {
            let mut raw = TcpStream::connect(&addr).unwrap();
            gate().0.dial(&mut raw, Purpose::Store).unwrap();
            raw.write_all(bytes).unwrap();
            let mut rest = Vec::new();
            // The server hangs up without a reply: end of stream (or a reset) rather than data.
            let n = raw.read_to_end(&mut rest).unwrap_or(0);
            assert_eq!(n, 0, "server replied to garbage {bytes:?}");
        }
        let mut c = connect(&addr, Duration::from_secs(5)).unwrap();
        c.set("still", b"serving").unwrap();
        assert_eq!(c.get("still", Duration::ZERO).unwrap(), b"serving");
    }

    #[test]
    fn connect_retries_until_the_store_listens() {
        // Reserve a free port, release it, then start the store there after the client began.
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let addr = format!("127.0.0.1:{port}");
        let client = {
            let addr = addr.clone();
            std::thread::spawn(move || connect(&addr, Duration::from_secs(30)))
        };
        let server = StoreServer::bind(&addr, gate().0).unwrap();
        server.spawn();
        let mut c = client.join().unwrap().unwrap();
        assert_eq!(c.add("up", 1).unwrap(), 1);
    }

    #[test]
    fn connect_to_nothing_fails_with_the_address() {
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let addr = format!("127.0.0.1:{port}");
        let err = connect(&addr, Duration::from_millis(100)).err().unwrap();
        assert!(matches!(&err, CollectiveError::Rendezvous { addr: a, .. } if *a == addr), "{err}");
    }

    #[test]
    fn clients_without_the_secret_are_refused_and_named_and_the_store_serves_on() {
        let (addr, _, seen) = start_gated();
        let mut owner = connect(&addr, Duration::from_secs(5)).unwrap();
        owner.set("ring/rank0/addr", b"10.0.0.1:1234").unwrap();
        // No secret: a plain request, as an old or foreign client would send.
        let mut plain = TcpStream::connect(&addr).unwrap();
        let request = [&[OP_GET][..], &15u32.to_le_bytes(), b"ring/rank0/addr", &0u64.to_le_bytes()].concat();
        write_frame(&mut plain, &request).unwrap();
        // A wrong secret.
        let wrong = Gate::new(RunSecret::generate().unwrap(), Arc::new(|_| {}));
        let err = StoreClient::connect(&addr, &wrong, Duration::from_secs(5)).err().unwrap();
        assert!(err.to_string().contains("handshake failed"), "{err}");
        let mut refused_peers = vec![];
        // Replayed bytes: a genuine answer recorded from one connection, sent on the next.
        let mut first = TcpStream::connect(&addr).unwrap();
        let mut challenge = [0u8; crate::collective::auth::CHALLENGE_BYTES];
        first.read_exact(&mut challenge).unwrap();
        let secret = gate().0.secret().unwrap().clone();
        let answer = crate::collective::auth::Answer::new(&secret, Purpose::Store, &challenge).unwrap().bytes;
        first.write_all(&answer).unwrap(); // the genuine answer passes
        let mut proof = [0u8; crate::collective::auth::PROOF_BYTES];
        first.read_exact(&mut proof).unwrap();
        let mut replay = TcpStream::connect(&addr).unwrap();
        refused_peers.push(replay.local_addr().unwrap().to_string());
        replay.read_exact(&mut challenge).unwrap();
        replay.write_all(&answer).unwrap();
        let mut rest = Vec::new();
        assert_eq!(replay.read_to_end(&mut rest).unwrap_or(0), 0, "the replay got an answer");
        // The plain client's request is too short for an answer; once it has said all it will
        // say, the store closes on it. All it ever got is the challenge, never the value.
        plain.shutdown(std::net::Shutdown::Write).unwrap();
        let mut got = Vec::new();
        let _ = plain.read_to_end(&mut got);
        assert!(got.len() <= crate::collective::auth::CHALLENGE_BYTES, "plain client got {got:?}");
        // Each refused connection ended after its refusal was counted.
        assert_eq!(owner.get("ring/rank0/addr", Duration::ZERO).unwrap(), b"10.0.0.1:1234");
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 3, "{seen:?}");
        assert!(seen.iter().all(|r| r.listener == "store"));
        assert!(seen.iter().any(|r| refused_peers.contains(&r.peer) && r.reason.contains("secret")), "{seen:?}");
    }
}
