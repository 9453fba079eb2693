//! A rank's stdout and stderr: read without ever blocking the rank, kept in its log file, read by the log adapters, and sent upstream.
//!
//! Each pipe has one forwarder task. Per read it writes the complete lines to the rank's log
//! file (one write), feeds each line to the adapters (`crate::adapters`, `[command] log_format`)
//! and to the rank's `LastError`, and sends the records and the line upstream. A line over
//! `MAX_LINE_BYTES` is counted and skipped; invalid UTF-8 is read lossily and counted; a
//! `\r`-redrawn progress bar is read at each redraw and logged once, at its newline. What was
//! skipped is said once, as a notice, at the end of the stream.
use super::Input;
use crate::adapters::fatal::LastError;
use crate::adapters::{Choice, LogReader, MAX_LINE_BYTES};
use crate::ids::Rank;
use crate::protocol::{AgentEvent, Stream};
use std::io::Write;
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::mpsc;

/// A line sent upstream is cut to this many bytes (the log file keeps it whole).
const MAX_FORWARD_BYTES: usize = 16 * 1024;

/// One rank's output, shared by its stdout and stderr forwarders.
#[derive(Clone)]
pub struct Output {
    rank: Rank,
    log: Arc<std::fs::File>,
    fatal: Arc<Mutex<LastError>>,
    choice: Choice,
    tx: mpsc::Sender<Input>,
}

/// What a forwarder could not pass on.
#[derive(Default)]
struct Dropped {
    too_long: u64,
    not_utf8: u64,
    /// Lines not sent upstream because the agent's queue was full (the log file has them).
    busy: u64,
}

/// One pipe's reading state.
struct Pipe {
    reader: LogReader,
    stream: Stream,
    /// The line read so far (since its last `\r`).
    line: Vec<u8>,
    /// The last redraw of a `\r` bar, which is the line if it ends with `\r\n`.
    redrawn: Vec<u8>,
    /// The line being read is over `MAX_LINE_BYTES`: skip to its newline.
    overflow: bool,
    n: u64,
    dropped: Dropped,
    /// Complete lines for the log file, written once per read.
    file: Vec<u8>,
    /// Events for upstream, sent once per read.
    events: Vec<AgentEvent>,
}

impl Output {
    pub fn new(rank: Rank, log: std::fs::File, choice: Choice, tx: mpsc::Sender<Input>) -> Output {
        Output { rank, log: Arc::new(log), fatal: Arc::default(), choice, tx }
    }

    /// The rank's last error line so far.
    pub fn last_error(&self) -> Option<String> {
        self.fatal.lock().unwrap_or_else(|p| p.into_inner()).get().map(str::to_string)
    }

    /// Reads one pipe to its end.
    pub async fn forward<R: tokio::io::AsyncRead + Unpin>(self, pipe: R, stream: Stream) {
        let mut input = BufReader::with_capacity(64 * 1024, pipe);
        let mut p = Pipe {
            reader: LogReader::new(self.choice),
            stream,
            line: Vec::new(),
            redrawn: Vec::new(),
            overflow: false,
            n: 0,
            dropped: Dropped::default(),
            file: Vec::new(),
            events: Vec::new(),
        };
        loop {
            let used = match input.fill_buf().await {
                Ok([]) => break,
                Ok(chunk) => {
                    for piece in chunk.split_inclusive(|b| *b == b'\n' || *b == b'\r') {
                        self.piece(&mut p, piece);
                    }
                    chunk.len()
                }
                Err(e) => {
                    tracing::warn!("rank {} {stream:?}: {e}", self.rank);
                    break;
                }
            };
            input.consume(used);
            if !self.flush(&mut p).await {
                return;
            }
        }
        if !p.line.is_empty() && !p.overflow {
            // The last line had no newline.
            self.piece(&mut p, b"\n");
        }
        for record in p.reader.finish() {
            p.events.push(AgentEvent::LogRecord { rank: self.rank, record });
        }
        self.flush(&mut p).await;
        self.say_dropped(&p).await;
    }

    /// A piece of a read: some bytes, ending with `\n`, `\r`, or (at the read's end) neither.
    fn piece(&self, p: &mut Pipe, piece: &[u8]) {
        let end = piece.last().copied().filter(|b| *b == b'\n' || *b == b'\r');
        let body = if end.is_some() { &piece[..piece.len() - 1] } else { piece };
        if p.line.len() + body.len() > MAX_LINE_BYTES {
            (p.overflow, p.line) = (true, Vec::new());
        }
        if !p.overflow {
            p.line.extend_from_slice(body);
        }
        match end {
            None => {}
            Some(b'\r') if p.overflow || p.line.is_empty() => p.line.clear(),
            Some(b'\r') => {
                // A redraw: the adapters see each state of the bar; the log keeps the last.
                p.n += 1;
                let records = p.reader.push(p.n, &p.line);
                p.events.extend(records.into_iter().map(|record| AgentEvent::LogRecord { rank: self.rank, record }));
                std::mem::swap(&mut p.line, &mut p.redrawn);
                p.line.clear();
            }
            Some(_) if p.overflow => {
                p.dropped.too_long += 1;
                (p.overflow, p.redrawn) = (false, Vec::new());
                p.line.clear();
            }
            Some(_) => {
                if p.line.is_empty() && !p.redrawn.is_empty() {
                    std::mem::swap(&mut p.line, &mut p.redrawn);
                }
                p.redrawn.clear();
                p.n += 1;
                self.whole_line(p);
                p.line.clear();
            }
        }
    }

    fn whole_line(&self, p: &mut Pipe) {
        p.file.extend_from_slice(&p.line);
        p.file.push(b'\n');
        let text = String::from_utf8_lossy(&p.line);
        if matches!(text, std::borrow::Cow::Owned(_)) {
            p.dropped.not_utf8 += 1;
        }
        self.fatal.lock().unwrap_or_else(|e| e.into_inner()).line(&text);
        let records = p.reader.push(p.n, &p.line);
        p.events.extend(records.into_iter().map(|record| AgentEvent::LogRecord { rank: self.rank, record }));
        let mut line = text.into_owned();
        if line.len() > MAX_FORWARD_BYTES {
            let cut = (0..=MAX_FORWARD_BYTES).rev().find(|i| line.is_char_boundary(*i)).unwrap_or(0);
            line.truncate(cut);
            line.push_str(" …(cut)");
        }
        // Log lines never wait for the agent: the file has them whatever happens upstream.
        match self.tx.try_send(Input::Event(AgentEvent::Log { rank: self.rank, stream: p.stream, line })) {
            Ok(()) | Err(mpsc::error::TrySendError::Closed(_)) => {}
            Err(mpsc::error::TrySendError::Full(_)) => p.dropped.busy += 1,
        }
    }

    /// Writes the read's lines to the log file and sends its records; false once the agent is gone.
    async fn flush(&self, p: &mut Pipe) -> bool {
        if !p.file.is_empty() {
            if let Err(e) = (&*self.log).write_all(&p.file) {
                tracing::warn!("rank {}: writing its log: {e}", self.rank);
            }
            p.file.clear();
        }
        for event in p.events.drain(..) {
            if self.tx.send(Input::Event(event)).await.is_err() {
                return false;
            }
        }
        true
    }

    async fn say_dropped(&self, p: &Pipe) {
        let d = &p.dropped;
        let mut said = Vec::new();
        if d.too_long > 0 {
            said.push(format!("{} lines over {} KiB skipped", d.too_long, MAX_LINE_BYTES / 1024));
        }
        if d.not_utf8 > 0 {
            said.push(format!("{} lines of invalid UTF-8 read lossily", d.not_utf8));
        }
        if d.busy > 0 {
            said.push(format!("{} lines not sent upstream while the agent was busy (its log file has them)", d.busy));
        }
        if !said.is_empty() {
            let stream = match p.stream {
                Stream::Stdout => "stdout",
                Stream::Stderr => "stderr",
            };
            let text = format!("rank {} {stream}: {}", self.rank, said.join("; "));
            let _ = self.tx.send(Input::Event(AgentEvent::Notice { text })).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::strategy::Strategy;

    /// Runs one forwarder over `bytes`; returns the log file and what went upstream.
    async fn forward(bytes: Vec<u8>) -> (Vec<u8>, Vec<AgentEvent>) {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("rank-0.log");
        let file = std::fs::File::create(&path).expect("log file");
        let (tx, mut rx) = mpsc::channel(1024);
        Output::new(Rank(0), file, Choice::Auto, tx).forward(&bytes[..], Stream::Stdout).await;
        let mut events = Vec::new();
        while let Ok(Input::Event(e)) = rx.try_recv() {
            events.push(e);
        }
        (std::fs::read(&path).expect("read log"), events)
    }

    fn lines(events: &[AgentEvent]) -> Vec<String> {
        let lines = events.iter().filter_map(|e| match e {
            AgentEvent::Log { line, .. } => Some(line.clone()),
            _ => None,
        });
        lines.collect()
    }

    #[tokio::test]
    async fn long_lines_are_skipped_bars_logged_once_and_bad_bytes_read_lossily() {
        let mut bytes = b"first\n".to_vec();
        bytes.extend(std::iter::repeat_n(b'x', 3 * MAX_LINE_BYTES));
        bytes.extend(b"\rstill the long line\n");
        bytes.extend(b" 10%|#  | 1/10\r 50%|#####  | 5/10\r100%|##########| 10/10\r\n");
        bytes.extend(b"bad \xff\xfe bytes\n");
        bytes.extend(b"crlf\r\n");
        bytes.extend(b"no newline at the end");
        let (log, events) = forward(bytes).await;
        let want = ["first", "100%|##########| 10/10", "bad \u{fffd}\u{fffd} bytes", "crlf", "no newline at the end"];
        assert_eq!(lines(&events), want);
        let raw = b"first\n100%|##########| 10/10\nbad \xff\xfe bytes\ncrlf\nno newline at the end\n";
        assert_eq!(log, raw, "the log file keeps the bytes the rank printed, one line per line");
        let notice = events.iter().find_map(|e| match e {
            AgentEvent::Notice { text } => Some(text.clone()),
            _ => None,
        });
        assert_eq!(
            notice.as_deref(),
            Some("rank 0 stdout: 1 lines over 64 KiB skipped; 1 lines of invalid UTF-8 read lossily")
        );
    }

    #[tokio::test]
    async fn the_last_error_line_is_kept_across_the_stream() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = std::fs::File::create(dir.path().join("log")).expect("log file");
        let (tx, _rx) = mpsc::channel(1024);
        let out = Output::new(Rank(1), file, Choice::None, tx);
        let text = b"step 1\nTraceback (most recent call last):\n  File \"t.py\", line 1\nValueError: bad shape\n";
        out.clone().forward(&text[..], Stream::Stderr).await;
        assert_eq!(out.last_error().as_deref(), Some("ValueError: bad shape"));
    }

    proptest::proptest! {
        #![proptest_config(proptest::test_runner::Config::with_cases(64))]
        /// Random bytes, with newlines, carriage returns and runs longer than a line may be: the
        /// forwarder ends, forwards bounded lines, and keeps the log within what came in.
        #[test]
        fn random_output_never_stalls_or_panics(
            chunks in proptest::collection::vec(
                proptest::prop_oneof![
                    proptest::collection::vec(proptest::num::u8::ANY, 0..512),
                    (0usize..3).prop_map(|k| vec![b'x'; MAX_LINE_BYTES * k + 7]),
                    proptest::strategy::Just(b"\r".to_vec()),
                    proptest::strategy::Just(b"{'loss': 1.5, 'epoch': 0.1}\n".to_vec()),
                ],
                0..12,
            )
        ) {
            let bytes: Vec<u8> = chunks.concat();
            let rt = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
            let (log, events) = rt.block_on(forward(bytes.clone()));
            proptest::prop_assert!(log.len() <= bytes.len() + bytes.iter().filter(|b| **b == b'\r').count() + 1);
            for e in &events {
                if let AgentEvent::Log { line, .. } = e {
                    proptest::prop_assert!(line.len() <= MAX_FORWARD_BYTES + 16);
                }
            }
        }
    }
}
