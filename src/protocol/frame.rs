//! Length-prefixed frames: a u32 little-endian payload length, then a bincode payload.
//!
//! The decoder is fed bytes as they arrive and yields whole messages. A bad frame (oversized,
//! undecodable, or cut short at end of stream) is counted and reported, never a panic, and the
//! stream goes on at the next frame boundary.
use serde::{de::DeserializeOwned, Serialize};
use std::io::{Read, Write};
use std::marker::PhantomData;

/// Frames above this are refused: the largest real frame (a stack dump) is far smaller.
pub const MAX_FRAME_BYTES: usize = 16 * 1024 * 1024;
const HEADER_BYTES: usize = 4;

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum FrameError {
    #[error("frame of {len} bytes exceeds the {max} byte limit")]
    Oversized { len: usize, max: usize },
    #[error("undecodable frame of {len} bytes: {reason}")]
    Undecodable { len: usize, reason: String },
    #[error("stream ended inside a frame ({have} of {want} bytes)")]
    Truncated { have: usize, want: usize },
}

/// Serialises one message into a frame.
pub fn encode<T: Serialize>(msg: &T) -> Vec<u8> {
    // bincode cannot fail on our message types (no maps with non-string keys, no unsized data).
    let payload = bincode::serialize(msg).unwrap_or_default();
    let mut out = Vec::with_capacity(HEADER_BYTES + payload.len());
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&payload);
    out
}

/// Counts of frames dropped, by reason, for telemetry and logs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BadFrameCounts {
    pub oversized: u64,
    pub undecodable: u64,
    pub truncated: u64,
}

impl BadFrameCounts {
    pub fn total(&self) -> u64 {
        self.oversized + self.undecodable + self.truncated
    }
}

/// An incremental decoder: `push` bytes, then drain `next_frame` until it returns None.
pub struct Decoder<T> {
    buf: Vec<u8>,
    /// Bytes still to discard from an oversized frame.
    skipping: usize,
    pub bad: BadFrameCounts,
    _msg: PhantomData<T>,
}

impl<T: DeserializeOwned> Default for Decoder<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: DeserializeOwned> Decoder<T> {
    pub fn new() -> Self {
        Decoder { buf: Vec::new(), skipping: 0, bad: BadFrameCounts::default(), _msg: PhantomData }
    }

    pub fn push(&mut self, bytes: &[u8]) {
        let mut bytes = bytes;
        if self.skipping > 0 {
            let n = self.skipping.min(bytes.len());
            self.skipping -= n;
            bytes = &bytes[n..];
        }
        self.buf.extend_from_slice(bytes);
    }

    /// The next whole message, a bad frame's error, or None when more bytes are needed.
    pub fn next_frame(&mut self) -> Option<Result<T, FrameError>> {
        if self.skipping > 0 || self.buf.len() < HEADER_BYTES {
            return None;
        }
        let len = u32::from_le_bytes([self.buf[0], self.buf[1], self.buf[2], self.buf[3]]) as usize;
        if len > MAX_FRAME_BYTES {
            let have = self.buf.len() - HEADER_BYTES;
            let discard_now = have.min(len);
            self.buf.drain(..HEADER_BYTES + discard_now);
            self.skipping = len - discard_now;
            self.bad.oversized += 1;
            return Some(Err(FrameError::Oversized { len, max: MAX_FRAME_BYTES }));
        }
        if self.buf.len() < HEADER_BYTES + len {
            return None;
        }
        let decoded = bincode::deserialize::<T>(&self.buf[HEADER_BYTES..HEADER_BYTES + len]);
        self.buf.drain(..HEADER_BYTES + len);
        match decoded {
            Ok(msg) => Some(Ok(msg)),
            Err(e) => {
                self.bad.undecodable += 1;
                Some(Err(FrameError::Undecodable { len, reason: e.to_string() }))
            }
        }
    }

    /// The undecoded bytes left in the buffer, handed over to a decoder of another message type
    /// (after a handshake, the stream switches types).
    pub fn take_rest(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.buf)
    }

    /// Call at end of stream: reports a partial frame left in the buffer, if any.
    pub fn finish(&mut self) -> Option<FrameError> {
        if self.skipping > 0 {
            // Already counted as oversized when its header arrived.
            return None;
        }
        if self.buf.is_empty() {
            return None;
        }
        let have = self.buf.len();
        let want = if have >= HEADER_BYTES {
            HEADER_BYTES + u32::from_le_bytes([self.buf[0], self.buf[1], self.buf[2], self.buf[3]]) as usize
        } else {
            HEADER_BYTES
        };
        self.buf.clear();
        self.bad.truncated += 1;
        Some(FrameError::Truncated { have, want })
    }
}

/// Blocking write of one frame (for threads that own a std socket).
pub fn write_frame<T: Serialize, W: Write>(w: &mut W, msg: &T) -> std::io::Result<()> {
    w.write_all(&encode(msg))
}

/// Blocking read of one frame. Ok(None) at a clean end of stream.
pub fn read_frame<T: DeserializeOwned, R: Read>(r: &mut R) -> std::io::Result<Option<T>> {
    let mut header = [0u8; HEADER_BYTES];
    match r.read_exact(&mut header) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let len = u32::from_le_bytes(header) as usize;
    if len > MAX_FRAME_BYTES {
        return Err(invalid(FrameError::Oversized { len, max: MAX_FRAME_BYTES }));
    }
    let mut payload = vec![0u8; len];
    r.read_exact(&mut payload).map_err(|e| {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            invalid(FrameError::Truncated { have: 0, want: len })
        } else {
            e
        }
    })?;
    bincode::deserialize(&payload)
        .map(Some)
        .map_err(|e| invalid(FrameError::Undecodable { len, reason: e.to_string() }))
}

fn invalid(e: FrameError) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, e)
}

/// Async read of one frame. Ok(None) at a clean end of stream.
pub async fn read_frame_async<T, R>(r: &mut R) -> std::io::Result<Option<T>>
where
    T: DeserializeOwned,
    R: tokio::io::AsyncRead + Unpin,
{
    use tokio::io::AsyncReadExt;
    let mut header = [0u8; HEADER_BYTES];
    match r.read_exact(&mut header).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let len = u32::from_le_bytes(header) as usize;
    if len > MAX_FRAME_BYTES {
        return Err(invalid(FrameError::Oversized { len, max: MAX_FRAME_BYTES }));
    }
    let mut payload = vec![0u8; len];
    r.read_exact(&mut payload).await?;
    bincode::deserialize(&payload)
        .map(Some)
        .map_err(|e| invalid(FrameError::Undecodable { len, reason: e.to_string() }))
}

/// Whether `buf` starts with a whole frame (header and payload), so reading it from a buffered
/// reader holding `buf` needs no more bytes from the peer.
pub fn whole_frame_at_front(buf: &[u8]) -> bool {
    match buf.first_chunk::<HEADER_BYTES>() {
        Some(header) => buf.len() - HEADER_BYTES >= u32::from_le_bytes(*header) as usize,
        None => false,
    }
}

/// Async write of one frame.
pub async fn write_frame_async<T, W>(w: &mut W, msg: &T) -> std::io::Result<()>
where
    T: Serialize,
    W: tokio::io::AsyncWrite + Unpin,
{
    use tokio::io::AsyncWriteExt;
    w.write_all(&encode(msg)).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::message::{AgentEvent, AgentFrame, Hello, Role};
    use proptest::prelude::*;

    fn sample() -> AgentFrame {
        AgentFrame { seq: 7, t_ms: 1, event: AgentEvent::Notice { text: "hi".into() } }
    }

    #[test]
    fn a_whole_frame_at_the_front_is_told_from_a_partial_one() {
        let bytes = encode(&sample());
        assert!(whole_frame_at_front(&bytes));
        assert!(whole_frame_at_front(&[bytes.clone(), bytes[..3].to_vec()].concat()));
        for cut in 0..bytes.len() {
            assert!(!whole_frame_at_front(&bytes[..cut]), "{cut} of {} bytes", bytes.len());
        }
    }

    #[test]
    fn round_trips_split_at_every_byte() {
        let bytes = [encode(&sample()), encode(&sample())].concat();
        for cut in 0..bytes.len() {
            let mut d = Decoder::<AgentFrame>::new();
            d.push(&bytes[..cut]);
            let mut got = Vec::new();
            while let Some(m) = d.next_frame() {
                got.push(m.unwrap());
            }
            d.push(&bytes[cut..]);
            while let Some(m) = d.next_frame() {
                got.push(m.unwrap());
            }
            assert_eq!(got, vec![sample(), sample()], "cut at {cut}");
            assert_eq!(d.finish(), None);
        }
    }

    #[test]
    fn oversized_frame_is_skipped_and_the_next_one_decodes() {
        let mut bytes = ((MAX_FRAME_BYTES + 1) as u32).to_le_bytes().to_vec();
        let mut d = Decoder::<AgentFrame>::new();
        d.push(&bytes);
        assert!(matches!(d.next_frame(), Some(Err(FrameError::Oversized { .. }))));
        bytes = vec![0u8; MAX_FRAME_BYTES + 1];
        bytes.extend(encode(&sample()));
        d.push(&bytes);
        assert_eq!(d.next_frame(), Some(Ok(sample())));
        assert_eq!(d.bad.oversized, 1);
    }

    #[test]
    fn undecodable_frame_is_counted_and_skipped() {
        let mut bytes = 3u32.to_le_bytes().to_vec();
        bytes.extend([0xff, 0xff, 0xff]);
        bytes.extend(encode(&sample()));
        let mut d = Decoder::<AgentFrame>::new();
        d.push(&bytes);
        assert!(matches!(d.next_frame(), Some(Err(FrameError::Undecodable { .. }))));
        assert_eq!(d.next_frame(), Some(Ok(sample())));
        assert_eq!(d.bad.undecodable, 1);
    }

    #[test]
    fn truncated_stream_is_reported_at_finish() {
        let bytes = encode(&Hello::new(Role::Agent, "local"));
        let mut d = Decoder::<Hello>::new();
        d.push(&bytes[..bytes.len() - 1]);
        assert_eq!(d.next_frame(), None);
        assert!(matches!(d.finish(), Some(FrameError::Truncated { .. })));
        assert_eq!(d.bad.truncated, 1);
    }

    #[test]
    fn blocking_reader_refuses_oversized_and_truncated() {
        let mut r = &((MAX_FRAME_BYTES as u32) + 1).to_le_bytes()[..];
        assert!(read_frame::<Hello, _>(&mut r).is_err());
        let bytes = encode(&Hello::new(Role::Agent, "local"));
        let mut r = &bytes[..bytes.len() - 2];
        assert!(read_frame::<Hello, _>(&mut r).is_err());
        let mut r = &bytes[..];
        assert_eq!(read_frame::<Hello, _>(&mut r).unwrap(), Some(Hello::new(Role::Agent, "local")));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        /// Random bytes, pushed in random chunks, never panic and never loop forever.
        #[test]
        fn random_input_never_panics(data in proptest::collection::vec(any::<u8>(), 0..4096),
                                     chunk in 1usize..512) {
            let mut d = Decoder::<AgentFrame>::new();
            for piece in data.chunks(chunk) {
                d.push(piece);
                let mut guard = 0;
                while d.next_frame().is_some() {
                    guard += 1;
                    prop_assert!(guard <= data.len() + 1);
                }
            }
            let _ = d.finish();
        }

        /// Valid frames with random garbage frames between them still all arrive.
        #[test]
        fn valid_frames_survive_garbage_between(garbage in proptest::collection::vec(any::<u8>(), 0..64)) {
            let mut bytes = encode(&sample());
            bytes.extend((garbage.len() as u32).to_le_bytes());
            bytes.extend(&garbage);
            bytes.extend(encode(&sample()));
            let mut d = Decoder::<AgentFrame>::new();
            d.push(&bytes);
            let mut good = 0;
            while let Some(m) = d.next_frame() {
                if m.is_ok() { good += 1; }
            }
            prop_assert!(good >= 2);
        }
    }
}
