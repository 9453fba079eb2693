//! The run's secret, and the challenge–response every TCP connection of a run starts with.
//!
//! The launcher draws one secret per run from the OS (`RunSecret::generate`) and it travels
//! only inside private files: the node's `spec.json` (over the SSH channel's stdin for remote
//! nodes), then `run.secret` (0600) in the node's run directory, which ranks find through
//! `FLIGHTDECK_RUN_SECRET_FILE`. Whoever accepts a connection (the store, a ring listener)
//! speaks first:
//!
//! ```text
//! acceptor → dialer   "FDAUTH01" nonce_a[16]                                  (24 bytes)
//! dialer → acceptor   nonce_d[16] HMAC(secret, "dialer" purpose nonce_a nonce_d)  (48 bytes)
//! acceptor → dialer   HMAC(secret, "acceptor" purpose nonce_d nonce_a)            (32 bytes)
//! ```
//!
//! HMAC-SHA256; `purpose` keeps a store handshake from being replayed at a ring port and back;
//! the fresh nonce on each side makes recorded bytes worthless on a new connection, and the
//! two roles' different labels stop a reflection. The bytes after the handshake are plain:
//! traffic is authenticated at its start, not encrypted (docs/security.md says why).
use crate::protocol::message::Refusal;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::io::{self, Read, Write};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// 256 bits: HMAC-SHA256's block of strength, twice the 128 the threat model asks for.
pub const SECRET_BYTES: usize = 32;
const NONCE_BYTES: usize = 16;
const MAC_BYTES: usize = 32;
const MAGIC: [u8; 8] = *b"FDAUTH01";
/// What the acceptor sends first.
pub const CHALLENGE_BYTES: usize = MAGIC.len() + NONCE_BYTES;
/// What the dialer answers.
pub const RESPONSE_BYTES: usize = NONCE_BYTES + MAC_BYTES;
/// What the acceptor proves back.
pub const PROOF_BYTES: usize = MAC_BYTES;
/// How long either side waits for the other's next handshake message: a peer that connects
/// and says nothing holds one store thread or one ring slot this long, never the run.
pub const HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
/// Refusals reported one by one; after these, every `REPORT_EVERY`-th, so a flood of bad
/// connections stays a handful of events and still shows its count.
const REPORT_FIRST: u64 = 16;
const REPORT_EVERY: u64 = 1000;

/// The environment variable naming a rank's secret file.
pub const SECRET_FILE_ENV: &str = "FLIGHTDECK_RUN_SECRET_FILE";

type HmacSha256 = Hmac<Sha256>;

/// A run's shared secret. Never printed: `Debug` shows only that there is one.
#[derive(Clone, PartialEq, Eq)]
pub struct RunSecret([u8; SECRET_BYTES]);

impl std::fmt::Debug for RunSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RunSecret(…)")
    }
}

impl RunSecret {
    /// A fresh secret from the kernel's random source.
    pub fn generate() -> io::Result<RunSecret> {
        let mut bytes = [0u8; SECRET_BYTES];
        fill_random(&mut bytes)?;
        Ok(RunSecret(bytes))
    }

    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    pub fn from_hex(text: &str) -> Result<RunSecret, String> {
        let text = text.trim();
        let valid = format!("{} hexadecimal digits", 2 * SECRET_BYTES);
        if text.len() != 2 * SECRET_BYTES || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(format!("a run secret must be {valid}, got {} characters", text.len()));
        }
        let mut bytes = [0u8; SECRET_BYTES];
        for (i, byte) in bytes.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).map_err(|e| format!("{valid}: {e}"))?;
        }
        Ok(RunSecret(bytes))
    }

    /// Writes the secret to `path` as hex, owner-only (0600) whatever the umask.
    pub fn write_file(&self, path: &Path) -> io::Result<()> {
        use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
        let mut file = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(path)?;
        // An existing file keeps its old mode through `open`; make sure it is private too.
        file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
        file.write_all(self.to_hex().as_bytes())
    }

    /// Reads a secret file; refuses one that other users could read.
    pub fn read_file(path: &Path) -> Result<RunSecret, String> {
        use std::os::unix::fs::PermissionsExt;
        let at = path.display();
        let meta = std::fs::metadata(path).map_err(|e| format!("run secret {at}: {e}"))?;
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(format!("run secret {at} is open to other users (mode {mode:o}); it must be 0600"));
        }
        let text = std::fs::read_to_string(path).map_err(|e| format!("run secret {at}: {e}"))?;
        RunSecret::from_hex(&text).map_err(|e| format!("run secret {at}: {e}"))
    }

    fn mac(&self, label: &[u8], purpose: Purpose, first: &[u8], second: &[u8]) -> HmacSha256 {
        // Any key length is valid for HMAC, so this cannot fail.
        let mut mac = <HmacSha256 as Mac>::new_from_slice(&self.0).unwrap_or_else(|_| unreachable!());
        for part in [label, b"/", purpose.label(), b"/", first, second] {
            mac.update(part);
        }
        mac
    }
}

impl serde::Serialize for RunSecret {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_hex())
    }
}

impl<'de> serde::Deserialize<'de> for RunSecret {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<RunSecret, D::Error> {
        let text = String::deserialize(d)?;
        RunSecret::from_hex(&text).map_err(serde::de::Error::custom)
    }
}

pub(crate) fn fill_random(bytes: &mut [u8]) -> io::Result<()> {
    let mut filled = 0;
    while filled < bytes.len() {
        let rest = &mut bytes[filled..];
        // SAFETY: the pointer and length describe `rest`, a live, writable slice.
        let n = unsafe { libc::getrandom(rest.as_mut_ptr().cast(), rest.len(), 0) };
        match n {
            n if n > 0 => filled += n as usize,
            _ => {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
    }
    Ok(())
}

/// Which kind of port a handshake opens, bound into its MACs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Purpose {
    Store,
    Ring,
    /// A server's link to an agent that listens on TCP (the Slurm placement).
    Agent,
}

impl Purpose {
    fn label(self) -> &'static [u8] {
        match self {
            Purpose::Store => b"store",
            Purpose::Ring => b"ring",
            Purpose::Agent => b"agent",
        }
    }
}

/// Why a handshake failed.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("{0}")]
    Io(#[from] io::Error),
    #[error("the peer did not open with a Flightdeck challenge (its first bytes are not {MAGIC:?})")]
    NotAChallenge,
    #[error("the peer's proof does not match: it does not hold this run's secret")]
    BadProof,
    #[error("the peer closed the connection during the handshake")]
    Closed,
}

/// An acceptor's half-done handshake: the challenge it sent, waiting for the answer.
pub struct Challenge {
    nonce: [u8; NONCE_BYTES],
    purpose: Purpose,
}

impl Challenge {
    /// A fresh challenge and the bytes to send.
    pub fn new(purpose: Purpose) -> io::Result<(Challenge, [u8; CHALLENGE_BYTES])> {
        let mut nonce = [0u8; NONCE_BYTES];
        fill_random(&mut nonce)?;
        let mut bytes = [0u8; CHALLENGE_BYTES];
        bytes[..MAGIC.len()].copy_from_slice(&MAGIC);
        bytes[MAGIC.len()..].copy_from_slice(&nonce);
        Ok((Challenge { nonce, purpose }, bytes))
    }

    /// Checks the dialer's answer; Ok is the proof to send back.
    pub fn check(&self, secret: &RunSecret, response: &[u8; RESPONSE_BYTES]) -> Result<[u8; PROOF_BYTES], AuthError> {
        let (nonce_d, mac_d) = response.split_at(NONCE_BYTES);
        secret
            .mac(b"dialer", self.purpose, &self.nonce, nonce_d)
            .verify_slice(mac_d)
            .map_err(|_| AuthError::BadProof)?;
        Ok(secret.mac(b"acceptor", self.purpose, nonce_d, &self.nonce).finalize().into_bytes().into())
    }
}

/// The acceptor's side on a blocking stream (the store): challenge, check, prove.
pub fn accept(stream: &mut (impl Read + Write), secret: &RunSecret, purpose: Purpose) -> Result<(), AuthError> {
    let (challenge, bytes) = Challenge::new(purpose)?;
    stream.write_all(&bytes)?;
    let mut response = [0u8; RESPONSE_BYTES];
    read_all(stream, &mut response)?;
    let proof = challenge.check(secret, &response)?;
    stream.write_all(&proof)?;
    Ok(())
}

/// The dialer's answer to one challenge, and what it needs to check the acceptor's proof.
pub struct Answer {
    pub bytes: [u8; RESPONSE_BYTES],
    nonce_a: [u8; NONCE_BYTES],
    nonce_d: [u8; NONCE_BYTES],
    purpose: Purpose,
}

impl Answer {
    /// Answers the acceptor's `challenge` bytes with a fresh nonce of the dialer's.
    pub fn new(secret: &RunSecret, purpose: Purpose, challenge: &[u8; CHALLENGE_BYTES]) -> Result<Answer, AuthError> {
        let (magic, nonce) = challenge.split_at(MAGIC.len());
        if magic != MAGIC {
            return Err(AuthError::NotAChallenge);
        }
        let mut nonce_a = [0u8; NONCE_BYTES];
        nonce_a.copy_from_slice(nonce);
        let mut nonce_d = [0u8; NONCE_BYTES];
        fill_random(&mut nonce_d)?;
        let mac = secret.mac(b"dialer", purpose, &nonce_a, &nonce_d).finalize().into_bytes();
        let mut bytes = [0u8; RESPONSE_BYTES];
        bytes[..NONCE_BYTES].copy_from_slice(&nonce_d);
        bytes[NONCE_BYTES..].copy_from_slice(&mac);
        Ok(Answer { bytes, nonce_a, nonce_d, purpose })
    }

    /// Whether the acceptor's proof shows it holds the secret.
    pub fn check_proof(&self, secret: &RunSecret, proof: &[u8; PROOF_BYTES]) -> Result<(), AuthError> {
        secret
            .mac(b"acceptor", self.purpose, &self.nonce_d, &self.nonce_a)
            .verify_slice(proof)
            .map_err(|_| AuthError::BadProof)
    }
}

/// The dialer's side on a blocking stream: answer the challenge, check the acceptor's proof.
pub fn dial(stream: &mut (impl Read + Write), secret: &RunSecret, purpose: Purpose) -> Result<(), AuthError> {
    let mut challenge = [0u8; CHALLENGE_BYTES];
    read_all(stream, &mut challenge)?;
    let answer = Answer::new(secret, purpose, &challenge)?;
    stream.write_all(&answer.bytes)?;
    let mut proof = [0u8; PROOF_BYTES];
    read_all(stream, &mut proof)?;
    answer.check_proof(secret, &proof)
}

/// `read_exact`, with a clean end of stream told apart from other failures.
fn read_all(stream: &mut impl Read, buf: &mut [u8]) -> Result<(), AuthError> {
    stream.read_exact(buf).map_err(|e| match e.kind() {
        io::ErrorKind::UnexpectedEof => AuthError::Closed,
        _ => AuthError::Io(e),
    })
}

/// What a run's listeners know: the secret (None: a rank run by hand, as torchrun would, with
/// no agent and so no secret; its store is open too), and where refused peers are reported.
#[derive(Clone)]
pub struct Gate {
    secret: Option<RunSecret>,
    report: Arc<dyn Fn(Refusal) + Send + Sync>,
    refused: Arc<AtomicU64>,
}

impl Gate {
    pub fn new(secret: RunSecret, report: Arc<dyn Fn(Refusal) + Send + Sync>) -> Gate {
        Gate { secret: Some(secret), report, refused: Arc::default() }
    }

    /// No secret: every connection is taken, as before per-run secrets (ranks run by hand,
    /// benchmarks of the handshake's cost).
    pub fn open() -> Gate {
        Gate { secret: None, report: Arc::new(|_| {}), refused: Arc::default() }
    }

    pub fn secret(&self) -> Option<&RunSecret> {
        self.secret.as_ref()
    }

    /// Connections refused so far.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// Counts a refused peer and reports it (each of the first few, then every thousandth).
    pub fn refuse(&self, listener: &str, peer: &str, reason: &str) {
        let count = self.refused.fetch_add(1, Ordering::Relaxed) + 1;
        tracing::warn!("{listener}: refused a connection from {peer}: {reason} ({count} refused so far)");
        if count <= REPORT_FIRST || count.is_multiple_of(REPORT_EVERY) {
            (self.report)(Refusal { listener: listener.into(), peer: peer.into(), reason: reason.into(), count });
        }
    }

    /// The acceptor's handshake on a blocking stream; Ok when the gate is open.
    pub fn accept(&self, stream: &mut (impl Read + Write), purpose: Purpose) -> Result<(), AuthError> {
        match &self.secret {
            Some(secret) => accept(stream, secret, purpose),
            None => Ok(()),
        }
    }

    /// The dialer's handshake on a blocking stream; Ok when the gate is open.
    pub fn dial(&self, stream: &mut (impl Read + Write), purpose: Purpose) -> Result<(), AuthError> {
        match &self.secret {
            Some(secret) => dial(stream, secret, purpose),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{TcpListener, TcpStream};

    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let d = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        (l.accept().unwrap().0, d)
    }

    fn handshake(
        a: &RunSecret,
        d: &RunSecret,
        pa: Purpose,
        pd: Purpose,
    ) -> (Result<(), AuthError>, Result<(), AuthError>) {
        let (mut acc, mut dia) = pair();
        let d = d.clone();
        let dialer = std::thread::spawn(move || dial(&mut dia, &d, pd));
        let acceptor = accept(&mut acc, a, pa);
        drop(acc); // a refused dialer must see the end, not wait for a proof
        (acceptor, dialer.join().unwrap())
    }

    #[test]
    fn the_same_secret_passes_both_ways_and_a_different_one_fails_both() {
        let s = RunSecret::generate().unwrap();
        let (a, d) = handshake(&s, &s, Purpose::Ring, Purpose::Ring);
        assert!(a.is_ok() && d.is_ok(), "{a:?} {d:?}");
        let other = RunSecret::generate().unwrap();
        assert_ne!(s, other);
        let (a, d) = handshake(&s, &other, Purpose::Ring, Purpose::Ring);
        assert!(matches!(a, Err(AuthError::BadProof)), "{a:?}");
        assert!(matches!(d, Err(AuthError::Closed | AuthError::Io(_))), "{d:?}");
    }

    #[test]
    fn a_store_handshake_does_not_open_a_ring_port() {
        let s = RunSecret::generate().unwrap();
        let (a, _) = handshake(&s, &s, Purpose::Ring, Purpose::Store);
        assert!(matches!(a, Err(AuthError::BadProof)), "{a:?}");
    }

    #[test]
    fn replayed_bytes_of_a_real_handshake_fail_on_a_new_connection() {
        let s = RunSecret::generate().unwrap();
        // A genuine handshake, recorded: the acceptor's challenge, the dialer's answer, the proof.
        let (challenge, sent) = Challenge::new(Purpose::Store).unwrap();
        let answer = Answer::new(&s, Purpose::Store, &sent).unwrap();
        let proof = challenge.check(&s, &answer.bytes).unwrap();
        assert!(answer.check_proof(&s, &proof).is_ok());
        // The same answer to the next connection's challenge is refused.
        let (next, _) = Challenge::new(Purpose::Store).unwrap();
        assert!(matches!(next.check(&s, &answer.bytes), Err(AuthError::BadProof)));
        // And a proof recorded from one acceptor does not pass for another dialer's answer.
        let (_, other_sent) = Challenge::new(Purpose::Store).unwrap();
        let other = Answer::new(&s, Purpose::Store, &other_sent).unwrap();
        assert!(matches!(other.check_proof(&s, &proof), Err(AuthError::BadProof)));
        assert!(matches!(Answer::new(&s, Purpose::Store, &[0u8; CHALLENGE_BYTES]), Err(AuthError::NotAChallenge)));
    }

    #[test]
    fn secrets_round_trip_through_hex_and_files_are_private() {
        let s = RunSecret::generate().unwrap();
        assert_eq!(RunSecret::from_hex(&s.to_hex()).unwrap(), s);
        assert_eq!(format!("{s:?}"), "RunSecret(…)");
        assert!(RunSecret::from_hex("abc").unwrap_err().contains("64 hexadecimal digits"));
        assert!(RunSecret::from_hex(&"zz".repeat(32)).is_err());
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run.secret");
        s.write_file(&path).unwrap();
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(RunSecret::read_file(&path).unwrap(), s);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let err = RunSecret::read_file(&path).unwrap_err();
        assert!(err.contains("open to other users (mode 644)"), "{err}");
    }

    #[test]
    fn refusals_are_counted_and_the_first_reported() {
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let sink = Arc::clone(&seen);
        let gate = Gate::new(RunSecret::generate().unwrap(), Arc::new(move |r| sink.lock().unwrap().push(r)));
        for _ in 0..1000 {
            gate.refuse("store", "10.0.0.9:4242", "no secret");
        }
        assert_eq!(gate.refused(), 1000);
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len() as u64, REPORT_FIRST + 1);
        assert_eq!(seen[0].peer, "10.0.0.9:4242");
        assert_eq!(seen.last().unwrap().count, 1000);
    }
}
