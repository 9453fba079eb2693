//! A printed line made plain before any adapter reads it: colours out, whatever wrapped it (launchers, containers, loggers) off and the rank it named kept, the last `\r` redraw kept.
//!
//! A rank's line reaches us wrapped by whatever started it and whatever printed it, nested in
//! any order: a container or journald timestamp, `srun -l`'s `3: `, pdsh's `node7: `, mpirun's
//! `[1,3]<stdout>:`, torchrun's `[rank3]:` / `[default3]:`, Ray's `(WorkerDict pid=9, ip=10.0.0.1)`,
//! then the framework's own logging header (`[titan] 2025-03-01 12:00:00,123 - root - INFO - `,
//! `[2024-05-01 12:00:00,000] [INFO] [logging.py:96:log_dist] `, `INFO:root:`, loguru's
//! `2024-05-01 12:00:00.123 | INFO     | mod:fn:12 - `, glog's `I0501 12:00:00.123456  42 x.cc:7] `).
//! One place takes them all off, so every adapter reads the message alone, and the rank, local
//! rank and host they named go on the records as labels.
//!
//! pdsh's `host: ` cannot be told from a framework's `step: ` by its shape, so it is not taken
//! off here: `host_cut` says where the message would start without it, and the reader tries
//! that only when nothing reads the whole line.
use super::value::{with_message_bytes, ByteSet};
use crate::adapters::value::Scan;
use std::borrow::Cow;

/// What a line's wrappers said about where it came from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Origin {
    /// The global rank a launcher's prefix named (`[rank3]:`, `srun -l`'s `3: `, mpirun's `[1,3]`).
    pub rank: Option<u32>,
    /// The local rank torchrun's older `[default3]:` prefix named.
    pub local_rank: Option<u32>,
    /// The host a prefix named (Ray's `ip=`, a syslog line's host, pdsh's `host: `).
    pub host: Option<String>,
    /// Which wrappers were taken off, outermost first (for `parse-log --explain`).
    pub taken: Taken,
}

/// The wrappers taken off one line, in order: a fixed array, so the hot path allocates nothing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Taken {
    items: [Option<Wrapper>; MAX_WRAPPERS + 3],
    len: usize,
}

impl Taken {
    /// Keeps `w`; past the array's room (more wrappers than anyone nests) it is dropped.
    pub fn push(&mut self, w: Wrapper) {
        if let Some(slot) = self.items.get_mut(self.len) {
            *slot = Some(w);
            self.len += 1;
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = Wrapper> + '_ {
        self.items[..self.len].iter().flatten().copied()
    }

    pub fn contains(&self, w: &Wrapper) -> bool {
        self.iter().any(|x| x == *w)
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// `self`, then `then`'s.
    pub fn followed_by(mut self, then: &Taken) -> Taken {
        then.iter().for_each(|w| self.push(w));
        self
    }
}

/// The kinds of wrapper taken off a line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wrapper {
    Colours,
    Redraw,
    Timestamp,
    Syslog,
    Srun,
    Mpirun,
    Torchrun,
    Ray,
    Logger,
    Pdsh,
    Stream,
}

impl Wrapper {
    pub fn name(self) -> &'static str {
        match self {
            Wrapper::Colours => "ANSI colours",
            Wrapper::Redraw => "\\r redraws (the last kept)",
            Wrapper::Timestamp => "a timestamp",
            Wrapper::Syslog => "a syslog/journald header",
            Wrapper::Srun => "srun -l's task prefix",
            Wrapper::Mpirun => "mpirun's rank tag",
            Wrapper::Torchrun => "torchrun's rank prefix",
            Wrapper::Ray => "Ray's (or Monarch's) actor prefix",
            Wrapper::Logger => "a logging header",
            Wrapper::Pdsh => "pdsh's host prefix",
            Wrapper::Stream => "a stream's name",
        }
    }
}

/// A line ready for the adapters.
#[derive(Debug)]
pub struct Cleaned<'a> {
    pub text: Cow<'a, str>,
    /// The bytes of the line as printed: a superset of `text`'s (taking wrappers and colours
    /// off only removes bytes), for the readers' phrase searches (`value::Scan`).
    pub bytes: ByteSet,
    pub origin: Origin,
    /// Where the message starts if its first `word: ` is pdsh's host (tried only when nothing
    /// reads `text` whole).
    pub host_cut: Option<usize>,
}

/// Wrappers nest at most this deep; a line of more is read as it is past them.
const MAX_WRAPPERS: usize = 12;

pub fn line(text: &str) -> Cleaned<'_> {
    // One pass for the bytes every check below asks about.
    let bytes = ByteSet::of(text);
    // rsyslog writes control characters as `#NNN` octal: `#015` a `\r`, `#033` an escape.
    if let Some(plain) = if bytes.has(b'#') { syslog_controls(text) } else { None } {
        let bytes = ByteSet::of(&plain);
        let c = with_message_bytes(&plain, bytes, || plain_line(&plain, &bytes));
        return Cleaned { text: Cow::Owned(c.text.into_owned()), bytes, origin: c.origin, host_cut: c.host_cut };
    }
    with_message_bytes(text, bytes, || plain_line(text, &bytes))
}

fn plain_line<'a>(text: &'a str, bytes: &ByteSet) -> Cleaned<'a> {
    let mut origin = Origin::default();
    let escaped = bytes.has(0x1b) || bytes.has(b'[') && bare_sgr_at(text).is_some();
    let text: Cow<'_, str> = if escaped {
        origin.taken.push(Wrapper::Colours);
        Cow::Owned(strip_ansi(text))
    } else {
        Cow::Borrowed(text)
    };
    let (start, host_at_start) = strip_wrappers(&text, &mut origin);
    let (from, to) = if bytes.has(b'\r') { last_redraw(&text, start) } else { (start, text.len()) };
    if from > start {
        origin.taken.push(Wrapper::Redraw);
    }
    let body = ray_repeats(text[from..to].trim_end());
    // A redraw may itself begin with a wrapper (each redraw of a bar printed through a logger).
    let inner = if from > start { strip_wrappers(body, &mut origin).0 } else { 0 };
    let (message_start, end) = (from + inner, from + body.len());
    // `strip_wrappers` looked for the host where the message starts: its answer holds for the
    // message (a shorter slice of the same bytes) when the cut lies within it; no host at the
    // longer text is none at the shorter.
    let host_cut = match host_at_start {
        Some(known) if message_start == start => known.filter(|cut| start + cut <= end),
        _ => pdsh_host(&text[message_start..end]).map(|(cut, _)| cut),
    };
    let start = message_start;
    let text = match text {
        Cow::Borrowed(t) => Cow::Borrowed(&t[start..end]),
        Cow::Owned(t) if start == 0 && end == t.len() => Cow::Owned(t),
        Cow::Owned(t) => Cow::Owned(t[start..end].to_string()),
    };
    Cleaned { text, bytes: *bytes, origin, host_cut }
}

/// `#015` and `#033` (rsyslog's escapes of `\r` and ESC) as the characters; `None` if none.
fn syslog_controls(text: &str) -> Option<String> {
    if !text.has("#015") && !text.has("#033[") {
        return None;
    }
    Some(text.replace("#015", "\r").replace("#033[", "\x1b["))
}

/// Ray's log deduplication ends a line with ` [repeated 7x across cluster]`.
fn ray_repeats(text: &str) -> &str {
    match text.strip_suffix(" across cluster]").and_then(|t| t.rfind(" [repeated ").map(|at| (t, at))) {
        Some((t, at)) if t[at + 11..].strip_suffix('x').is_some_and(all_digits) => text[..at].trim_end(),
        _ => text,
    }
}

/// pdsh's `host: ` at the start of a message: the cut after it and the host.
pub fn pdsh_host(text: &str) -> Option<(usize, &str)> {
    // Only as far as a host's characters go: most lines stop at their first space.
    let colon =
        text.bytes().take(65).take_while(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_')).count();
    if !text[colon..].starts_with(": ") {
        return None;
    }
    let host = &text[..colon];
    let plausible = !host.is_empty()
        && host.len() <= 64
        && host.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
        && !host.bytes().all(|b| b.is_ascii_digit())
        && !matches!(host, "stdout" | "stderr")
        && !is_exception_name(host);
    plausible.then_some((colon + 2, host))
}

/// `RuntimeError`, `torch.distributed.DistBackendError`, `UserWarning`: a Python exception's
/// or warning's type before its message, never a host.
fn is_exception_name(word: &str) -> bool {
    let last = word.rsplit('.').next().unwrap_or(word);
    ["Error", "Exception", "Interrupt", "Exit", "Warning"].iter().any(|s| last.ends_with(s))
}

/// Whether a `word: ` is worth reading as pdsh's host before the stream has shown it to be one:
/// a host names a machine (`node7`, `worker-0`, `ip-10-0-0-1.ec2`), with a digit, a dash or a
/// dot; `wandb: ` and `Epoch: ` are a program's words. Hosts without any are learned from the
/// stream (the same word on two lines) instead.
pub fn host_like(host: &str) -> bool {
    host.bytes().any(|b| b.is_ascii_digit() || b == b'-' || b == b'.')
}

/// A tqdm bar after the `word: ` (`Iteration:  50%|`): the word is as likely the bar's desc as a
/// pdsh host, so it is a host only once the stream knows it as one.
pub fn bar_start(rest: &str) -> bool {
    let t = rest.trim_start();
    let digits = t.bytes().take_while(u8::is_ascii_digit).count();
    digits > 0 && digits <= 3 && t[digits..].starts_with("%|")
}

/// The `[from, to)` of the last redraw at or after `start`: a bar redrawn in place shows its
/// last redraw (a trailing `\r` too).
fn last_redraw(text: &str, start: usize) -> (usize, usize) {
    let rest = &text[start..];
    match rest.rfind('\r') {
        Some(i) if i + 1 < rest.trim_end().len() => (start + i + 1, text.len()),
        Some(i) => match rest[..i].rfind('\r') {
            Some(j) => (start + j + 1, start + i),
            None => (start, start + i),
        },
        None => (start, text.len()),
    }
}

/// Takes wrappers off the start of `text`, outermost first, noting what they said; returns the
/// offset where the message starts and, when it was looked for there, the cut after a pdsh
/// `host: ` candidate at that start (`Some(None)`: none).
fn strip_wrappers(text: &str, origin: &mut Origin) -> (usize, Option<Option<usize>>) {
    let mut at = 0;
    for _ in 0..MAX_WRAPPERS {
        let rest = &text[at..];
        if let Some((len, wrapper)) = wrapper(rest, origin) {
            origin.taken.push(wrapper);
            at += len;
            continue;
        }
        // pdsh's `host: ` is certain when another wrapper follows it (`worker-0: [rank3]:`).
        let Some((cut, host)) = pdsh_host(rest) else { return (at, Some(None)) };
        let mut inner = Origin::default();
        if wrapper(&rest[cut..], &mut inner).is_none() {
            return (at, Some(Some(cut)));
        }
        origin.host.get_or_insert_with(|| host.to_string());
        origin.taken.push(Wrapper::Pdsh);
        at += cut;
    }
    (at, None)
}

/// The wrapper at the start of `s`, if any: its length (with the one space after it) and kind.
fn wrapper(s: &str, origin: &mut Origin) -> Option<(usize, Wrapper)> {
    let lead = s.len() - s.trim_start_matches(' ').len();
    let t = &s[lead..];
    let first = *t.as_bytes().first()?;
    let found = match first {
        b'[' => torchrun(t, origin)
            .or_else(|| monarch(t))
            .or_else(|| mpirun(t, origin))
            .or_else(|| logger_bracketed(t))
            .or_else(|| dmesg(t)),
        b'(' => ray(t, origin),
        b'0'..=b'9' => kmsg(t).or_else(|| timestamp_led(t, origin)).or_else(|| srun(t, origin)).or_else(|| glog(t)),
        b'A'..=b'Z' => {
            // A level word first (`INFO:root:`, `INFO 05-01 ...`), glog's `I0501 `, a month, `P0 `:
            // each is told by its first few bytes, so a sentence costs no scan.
            let word = t.as_bytes().iter().take(9).take_while(|b| b.is_ascii_alphanumeric()).count();
            if is_level(&t[..word]) {
                level_colon(t).or_else(|| level_led(t))
            } else {
                glog(t).or_else(|| syslog(t, origin)).or_else(|| srun_het(t, origin))
            }
        }
        // A pipe's name before its lines (`stdout: `, as some schedulers and notebooks print).
        b's' => ["stdout:", "stderr:"].iter().find(|p| t.starts_with(**p)).map(|p| (p.len(), Wrapper::Stream)),
        _ => None,
    }?;
    let (len, kind) = found;
    // The one space after a wrapper is its own; more is the message's indentation (a timer row
    // behind `[rank3]:`, which prints none of its own), kept whole.
    let after = &t[len..];
    let space = after.starts_with(' ') && !after.starts_with("  ");
    Some((lead + len + usize::from(space), kind))
}

/// torchrun's `[rank3]:` (PyTorch 2.x, `--local-ranks-filter`, exception lines) and
/// `[default3]:` (`--tee`: role name and local rank).
fn torchrun(t: &str, origin: &mut Origin) -> Option<(usize, Wrapper)> {
    // `[` + a role name and up to 7 digits + `]:`: within the first 40 bytes.
    let end = t.as_bytes().iter().take(40).position(|b| *b == b']')?;
    if !t[end..].starts_with("]:") {
        return None;
    }
    let inner = &t[1..end];
    let digits = inner.len() - inner.trim_end_matches(|c: char| c.is_ascii_digit()).len();
    let (role, n) = inner.split_at(inner.len() - digits);
    if n.is_empty() || n.len() > 7 || role.is_empty() || !role.bytes().all(|b| b.is_ascii_alphabetic() || b == b'_') {
        return None;
    }
    let n: u32 = n.parse().ok()?;
    if role == "rank" {
        origin.rank.get_or_insert(n);
    } else {
        origin.local_rank.get_or_insert(n);
    }
    Some((end + 2, Wrapper::Torchrun))
}

/// Monarch's actor prefix (torchtitan's RL experiments): `[actor=<root>.<...Trainer trainer{'gpus': 0/2}>] `.
fn monarch(t: &str) -> Option<(usize, Wrapper)> {
    if !t.starts_with("[actor=") {
        return None;
    }
    let end = t.at("] ")?;
    Some((end + 1, Wrapper::Ray))
}

/// OpenMPI's `--tag-output` `[1,3]<stdout>:` (job, rank) and MPICH/Intel MPI's `-l` `[3] `.
fn mpirun(t: &str, origin: &mut Origin) -> Option<(usize, Wrapper)> {
    let end = t.find(']')?;
    let inner = &t[1..end];
    // SageMaker's `[1,mpirank:0,algo-1]<stdout>:`: the rank and the host it names.
    if let Some(r) = inner.strip_prefix("1,mpirank:").or_else(|| inner.cut(",mpirank:").map(|(_, r)| r)) {
        let (rank, host) = r.split_once(',').unwrap_or((r, ""));
        let rank: u32 = rank.parse().ok()?;
        let tag = ["<stdout>:", "<stderr>:"].iter().find(|tag| t[end + 1..].starts_with(**tag))?;
        origin.rank.get_or_insert(rank);
        if !host.is_empty() {
            origin.host.get_or_insert_with(|| host.to_string());
        }
        return Some((end + 1 + tag.len(), Wrapper::Mpirun));
    }
    let rank = match inner.split_once(',') {
        Some((job, rank)) if all_digits(job) && all_digits(rank) => rank,
        None if all_digits(inner) && t[end + 1..].starts_with(' ') => inner,
        _ => return None,
    };
    let rank: u32 = rank.parse().ok()?;
    let mut len = end + 1;
    for tag in ["<stdout>:", "<stderr>:"] {
        if t[len..].starts_with(tag) {
            len += tag.len();
        }
    }
    if inner.contains(',') && len == end + 1 && !t[len..].starts_with(':') {
        return None;
    }
    if t[len..].starts_with(':') {
        len += 1;
    }
    origin.rank.get_or_insert(rank);
    Some((len, Wrapper::Mpirun))
}

/// Ray's worker prefixes: `(TaskRunner pid=4242)`, `(WorkerDict pid=9, ip=10.0.0.1)`,
/// `(pid=9)`, `(RayTrainWorker pid=9, ip=10.0.0.1)`, `(raylet)`, `(autoscaler +1m2s)`.
fn ray(t: &str, origin: &mut Origin) -> Option<(usize, Wrapper)> {
    // Within the first 256 bytes (a byte search: that bound may fall inside a character).
    let head = &t.as_bytes()[..t.len().min(256)];
    let end = head.windows(2).position(|w| w == b") ").or_else(|| t.ends_with(')').then(|| t.len() - 1))?;
    let inner = &t[1..end];
    let known = inner.starts_with("pid=")
        || inner.has(" pid=")
        || inner == "raylet"
        || inner.starts_with("raylet,")
        || inner.starts_with("autoscaler")
        || inner.starts_with("gcs_server");
    if !known || inner.len() > 200 {
        return None;
    }
    if let Some((_, ip)) = inner.cut("ip=") {
        let ip = ip.split([',', ' ']).next().unwrap_or(ip);
        if !ip.is_empty() {
            origin.host.get_or_insert_with(|| ip.to_string());
        }
    }
    Some((end + 1, Wrapper::Ray))
}

/// `srun -l`'s `3: ` (right-aligned: the caller allows the padding).
fn srun(t: &str, origin: &mut Origin) -> Option<(usize, Wrapper)> {
    let digits = t.bytes().take_while(u8::is_ascii_digit).count();
    if digits == 0 || digits > 7 || !t[digits..].starts_with(": ") {
        return None;
    }
    origin.rank.get_or_insert(t[..digits].parse().ok()?);
    Some((digits + 1, Wrapper::Srun))
}

/// `srun -l` of a heterogeneous job: `P0 3: `.
fn srun_het(t: &str, origin: &mut Origin) -> Option<(usize, Wrapper)> {
    let rest = t.strip_prefix('P')?;
    let comp = rest.bytes().take_while(u8::is_ascii_digit).count();
    if comp == 0 || !rest[comp..].starts_with(' ') {
        return None;
    }
    let (len, w) = srun(&rest[comp + 1..], origin)?;
    Some((1 + comp + 1 + len, w))
}

/// A line that starts with a timestamp: a container's or kubectl's RFC 3339 stamp (with the
/// CRI log's `stdout F`), a logger's `2024-05-01 12:00:00,123 - INFO - ` or loguru's
/// `2024-05-01 12:00:00.123 | INFO     | mod:fn:12 - `, HF examples' `05/01/2024 12:00:00 -
/// INFO - __main__ - `, journald's `2024-05-01T12:00:00+0000 host unit[pid]: `.
fn timestamp_led(t: &str, origin: &mut Origin) -> Option<(usize, Wrapper)> {
    let stamp = datetime(t)?;
    let rest = &t[stamp..];
    // A logger's fields after the stamp: ` - LEVEL - ` / ` - name - LEVEL - ` / ` | LEVEL | where - `.
    if let Some(fields) = logger_fields(rest) {
        return Some((stamp + fields, Wrapper::Logger));
    }
    let rest_trim = rest.strip_prefix(' ')?;
    // The CRI container log: `STAMP stdout F msg` (P: a partial line).
    for stream in ["stdout F ", "stderr F ", "stdout P ", "stderr P "] {
        if rest_trim.starts_with(stream) {
            return Some((stamp + 1 + stream.len() - 1, Wrapper::Timestamp));
        }
    }
    // Only the ISO form with a `T` stands alone (docker logs -t, kubectl logs --timestamps,
    // journald's short-iso): `2024-05-01 12:00:00 ...` without a logger's fields is a message's.
    if t.as_bytes().get(10) != Some(&b'T') {
        return None;
    }
    if let Some(len) = syslog_tail(rest_trim, origin) {
        return Some((stamp + 1 + len, Wrapper::Syslog));
    }
    Some((stamp, Wrapper::Timestamp))
}

/// A logger's fields between its timestamp and the message, separated by ` - ` or ` | `, one
/// of them a level: returns the length up to the message.
fn logger_fields(rest: &str) -> Option<usize> {
    let (sep, body) = if let Some(b) = rest.strip_prefix(" - ") {
        (" - ", b)
    } else if let Some(b) = rest.strip_prefix(" | ") {
        (" | ", b)
    } else {
        return None;
    };
    let mut at = rest.len() - body.len();
    let mut level = false;
    // Up to four fields (name, level, place), each a short token; the message follows the last
    // separator after the level, or, for loguru, the ` - ` after its place.
    for _ in 0..4 {
        let field_end = rest[at..].find(sep)?;
        let field = rest[at..at + field_end].trim();
        if field.is_empty() || field.len() > 80 || field.has("  ") && !is_level(field.trim()) {
            return None;
        }
        level |= is_level(field);
        at += field_end + sep.len();
        if level {
            // loguru: `| INFO     | module:function:line - message`.
            if sep == " | " {
                let place_end = rest[at..].at(" - ")?;
                let place = &rest[at..at + place_end];
                if place.contains(' ') || !place.contains(':') {
                    return None;
                }
                at += place_end + 3;
            } else if let Some(name_end) = rest[at..].at(" - ") {
                // `- LEVEL - name - message` (HF examples: `%(levelname)s - %(name)s - %(message)s`).
                let name = &rest[at..at + name_end];
                if is_logger_name(name) {
                    at += name_end + 3;
                }
            }
            return Some(at);
        }
        if !is_logger_name(field) {
            return None;
        }
    }
    None
}

fn is_level(s: &str) -> bool {
    matches!(s, "DEBUG" | "INFO" | "WARNING" | "WARN" | "ERROR" | "CRITICAL" | "FATAL" | "SUCCESS" | "TRACE" | "NOTSET")
}

/// A logger's name or a module path: `root`, `__main__`, `torchtitan.train`, `slime.ray`.
fn is_logger_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 80
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-' | b':' | b'<' | b'>'))
}

/// vLLM's and OpenRLHF's `INFO 05-01 12:00:00 llm_engine.py:123] ` (`%(levelname)s %(asctime)s
/// %(filename)s:%(lineno)d] `, dates `%m-%d %H:%M:%S`).
fn level_led(t: &str) -> Option<(usize, Wrapper)> {
    let (level, rest) = t.split_once(' ')?;
    if !is_level(level) {
        return None;
    }
    let b = rest.as_bytes();
    let date = b.len() > 15
        && b[..2].iter().all(u8::is_ascii_digit)
        && b[2] == b'-'
        && b[3..5].iter().all(u8::is_ascii_digit)
        && b[5] == b' ';
    if !date {
        return None;
    }
    let time = time_at(&rest[6..])?;
    let place = rest[6 + time..].strip_prefix(' ')?;
    let close = place.at("] ")?;
    let file = &place[..close];
    let plausible = file.contains(':') && !file.contains(' ') && close < 80;
    plausible.then(|| (t.len() - place.len() + close + 1, Wrapper::Logger))
}

/// `LEVEL:name:` (the `logging` module's default format, `%(levelname)s:%(name)s:%(message)s`).
fn level_colon(t: &str) -> Option<(usize, Wrapper)> {
    let (level, rest) = t.split_once(':')?;
    if !is_level(level) {
        return None;
    }
    let name_end = rest.find(':')?;
    let name = &rest[..name_end];
    (is_logger_name(name) && !name.contains(' ')).then_some((level.len() + 1 + name_end + 1, Wrapper::Logger))
}

/// Bracketed logging headers: DeepSpeed's `[2024-05-01 12:00:00,000] [INFO] [logging.py:96:log_dist] `,
/// Megatron's `[2024-05-01 12:00:00] `, torchtitan's `[titan] 2025-03-01 12:00:00,123 - root -
/// INFO - `, NeMo's `[NeMo I 2024-05-01 12:00:00 nemo_logging:349] `, transformers'
/// `[INFO|trainer.py:2000] 2024-05-01 12:00:00,000 >> `, PyTorch's C++ `[W501 12:00:00.123456
/// ProcessGroupNCCL.cpp:1234] ` and the older `[W socket.cpp:663] `.
fn logger_bracketed(t: &str) -> Option<(usize, Wrapper)> {
    let end = t.find(']')?;
    let inner = &t[1..end];
    let after = &t[end + 1..];
    // `[2024-05-01 12:00:00,000]`, then DeepSpeed's `[INFO] [file.py:N:func]`.
    if datetime(inner) == Some(inner.len()) {
        let mut len = end + 1;
        let mut rest = after;
        for _ in 0..2 {
            let Some(r) = rest.strip_prefix(" [") else { break };
            let Some(close) = r.find(']') else { break };
            let field = &r[..close];
            if !(is_level(field) || field.has(".py:")) {
                break;
            }
            len += 2 + close + 1;
            rest = &r[close + 1..];
        }
        // torch elastic 2.1-2.3: `[2024-05-28 14:04:27,954] torch.distributed.elastic.multiprocessing.api: [WARNING] `.
        if let Some(r) = rest.strip_prefix(' ') {
            if let Some((name, after)) = r.cut(": [") {
                if let Some(close) = after.at("] ") {
                    if is_logger_name(name) && name.contains('.') && is_level(&after[..close]) {
                        return Some((len + 1 + name.len() + 3 + close + 1, Wrapper::Logger));
                    }
                }
            }
        }
        // slime's `[2024-05-01 12:00:00] model.py:654 - ` (`%(filename)s:%(lineno)d - `).
        if let Some(r) = rest.strip_prefix(' ') {
            if let Some(dash) = r.at(" - ") {
                let place = &r[..dash];
                if place.has(".py:") && !place.contains(' ') {
                    len += 1 + dash + 2;
                }
            }
        }
        return Some((len, Wrapper::Logger));
    }
    // torch elastic 1.9: `[INFO] 2021-12-08 12:28:26,050 run: `.
    if is_level(inner) {
        if let Some(stamp) = after.strip_prefix(' ').and_then(datetime) {
            let rest = &after[1 + stamp..];
            if let Some(r) = rest.strip_prefix(' ') {
                if let Some(colon) = r.at(": ") {
                    if is_logger_name(&r[..colon]) {
                        return Some((end + 2 + stamp + 1 + colon + 1, Wrapper::Logger));
                    }
                }
            }
        }
        return None;
    }
    // `[NeMo I 2024-05-01 12:00:00 nemo_logging:349]`.
    if let Some(r) = inner.strip_prefix("NeMo ") {
        let level = r.bytes().next()?;
        if matches!(level, b'D' | b'I' | b'W' | b'E' | b'C') && r[1..].starts_with(' ') && datetime(&r[2..]).is_some() {
            return Some((end + 1, Wrapper::Logger));
        }
        return None;
    }
    // `[INFO|trainer.py:2000] 2024-05-01 12:00:00,000 >> `.
    if let Some((level, place)) = inner.split_once('|') {
        if is_level(level) && place.contains(':') {
            let stamp = after.strip_prefix(' ').and_then(datetime)?;
            let rest = &after[1 + stamp..];
            let arrows = rest.strip_prefix(" >>")?;
            return Some((t.len() - arrows.len(), Wrapper::Logger));
        }
        return None;
    }
    // PyTorch's C++ log: `[W501 12:00:00.123456 file.cpp:12]`, `[W socket.cpp:663]`,
    // `[E1204 02:46:27.862779498 ProcessGroupNCCL.cpp:1250]`.
    if inner.bytes().next().is_some_and(|b| matches!(b, b'I' | b'W' | b'E' | b'F')) {
        let body = &inner[1..];
        let place = body.rsplit(' ').next().unwrap_or("");
        let code_place = place.contains(':') && (place.has(".cpp") || place.has(".cc") || place.has(".h"));
        if code_place && (body.starts_with(' ') || body.bytes().next().is_some_and(|b| b.is_ascii_digit())) {
            return Some((end + 1, Wrapper::Logger));
        }
    }
    // `[titan] 2025-...` / `[name] 2025-...`: a logger's tag before a timestamp-led header.
    if !inner.is_empty() && inner.len() <= 32 && is_logger_name(inner) {
        let rest = after.strip_prefix(' ')?;
        let stamp = datetime(rest)?;
        let fields = logger_fields(&rest[stamp..])?;
        return Some((end + 2 + stamp + fields, Wrapper::Logger));
    }
    None
}

/// /dev/kmsg's `6,1234,5678901,-;` (priority, sequence, microseconds, flags).
fn kmsg(t: &str) -> Option<(usize, Wrapper)> {
    let semi = t.find(';')?;
    let fields: Vec<&str> = t[..semi].split(',').collect();
    let ok = fields.len() >= 4 && fields[..3].iter().all(|f| all_digits(f)) && fields[3] == "-";
    ok.then_some((semi + 1, Wrapper::Timestamp))
}

/// glog's (and absl's) `I0501 12:00:00.123456  1234 file.cc:12] `.
fn glog(t: &str) -> Option<(usize, Wrapper)> {
    let b = t.as_bytes();
    if !matches!(b.first()?, b'I' | b'W' | b'E' | b'F') || b.len() < 22 {
        return None;
    }
    if !(b[1..5].iter().all(u8::is_ascii_digit) && b[5] == b' ' && time_at(&t[6..]).is_some()) {
        return None;
    }
    let close = t.at("] ")?;
    let head = &t[..close];
    (head.contains(':') && close < 120).then_some((close + 1, Wrapper::Logger))
}

/// The kernel ring buffer's `[ 1234.567890] ` and `dmesg -T`'s `[Wed May  1 12:00:00 2024] `.
fn dmesg(t: &str) -> Option<(usize, Wrapper)> {
    let end = t.at("] ")?;
    let inner = t[1..end].trim();
    let uptime = inner.split_once('.').is_some_and(|(s, f)| all_digits(s) && all_digits(f));
    let human = inner.len() == 24 && inner.as_bytes()[3] == b' ' && inner.get(11..).and_then(time_at).is_some();
    (uptime || human).then_some((end + 1, Wrapper::Timestamp))
}

/// syslog's `May  1 12:00:00 host proc[123]: ` (and `host kernel: `).
fn syslog(t: &str, origin: &mut Origin) -> Option<(usize, Wrapper)> {
    const MONTHS: [&str; 12] = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];
    let month = t.get(..3)?;
    if t.len() < 16 || !MONTHS.contains(&month) || t.as_bytes()[3] != b' ' {
        return None;
    }
    let day = t.get(4..6)?.trim_start();
    if !all_digits(day) || t.as_bytes()[6] != b' ' {
        return None;
    }
    let time = time_at(&t[7..])?;
    let rest = t[7 + time..].strip_prefix(' ')?;
    let len = syslog_tail(rest, origin)?;
    Some((t.len() - rest.len() + len, Wrapper::Syslog))
}

/// After a syslog timestamp: `host proc[123]: ` or `host kernel: `; the host is kept.
fn syslog_tail(rest: &str, origin: &mut Origin) -> Option<usize> {
    let (host, after) = rest.split_once(' ')?;
    let colon = after.at(": ")?;
    let proc = &after[..colon];
    // An identifier with its pid (`python[4242]`), or the kernel: a message's `iter 10: ` is neither.
    let ident = match proc.split_once('[') {
        Some((name, pid)) => pid.strip_suffix(']').is_some_and(all_digits).then_some(name),
        None => (proc == "kernel").then_some(proc),
    };
    let plausible = is_logger_name(host)
        && ident.is_some_and(|n| {
            !n.is_empty() && n.len() <= 64 && n.bytes().next().is_some_and(|b| b.is_ascii_alphabetic())
        });
    if !plausible {
        return None;
    }
    origin.host.get_or_insert_with(|| host.to_string());
    Some(host.len() + 1 + colon + 1)
}

/// A date and time at the start: `2024-05-01 12:00:00`, `2024-05-01T12:00:00.123456789Z`,
/// `2024-05-01 12:00:00,123`, `+00:00` / `+0000` zones, `05/01/2024 12:00:00`. Its length.
fn datetime(s: &str) -> Option<usize> {
    let b = s.as_bytes();
    if b.len() < 19 {
        return None;
    }
    let iso = b[..4].iter().all(u8::is_ascii_digit)
        && b[4] == b'-'
        && b[5..7].iter().all(u8::is_ascii_digit)
        && b[7] == b'-'
        && b[8..10].iter().all(u8::is_ascii_digit);
    let us = b[..2].iter().all(u8::is_ascii_digit)
        && b[2] == b'/'
        && b[3..5].iter().all(u8::is_ascii_digit)
        && b[5] == b'/'
        && b[6..10].iter().all(u8::is_ascii_digit);
    if !(iso || us) || !matches!(b[10], b' ' | b'T') {
        return None;
    }
    let mut at = 11 + time_at(&s[11..])?;
    // A zone: `Z`, `+00:00`, `+0000`, `-07:00`.
    if b.get(at) == Some(&b'Z') {
        at += 1;
    } else if matches!(b.get(at), Some(b'+' | b'-')) {
        let zone = b[at + 1..].iter().take_while(|c| c.is_ascii_digit() || **c == b':').count();
        if (4..=5).contains(&zone) {
            at += 1 + zone;
        }
    }
    Some(at)
}

/// `HH:MM:SS` with an optional `.fraction` or `,millis`: its length.
fn time_at(s: &str) -> Option<usize> {
    let b = s.as_bytes();
    if b.len() < 8 {
        return None;
    }
    let ok = b[..2].iter().all(u8::is_ascii_digit)
        && b[2] == b':'
        && b[3..5].iter().all(u8::is_ascii_digit)
        && b[5] == b':'
        && b[6..8].iter().all(u8::is_ascii_digit);
    if !ok {
        return None;
    }
    let mut at = 8;
    if matches!(b.get(8), Some(b'.' | b',')) {
        let frac = b[9..].iter().take_while(|c| c.is_ascii_digit()).count();
        if frac > 0 {
            at += 1 + frac;
        }
    }
    Some(at)
}

fn all_digits(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())
}

/// An escape character, or a colour code whose escape was lost (a log pasted from a terminal
/// keeps `[32m`).
/// The first `[31m` / `[38;2;180;60;0m` / `[0m` in `text` (an SGR code without its escape).
fn bare_sgr_at(text: &str) -> Option<usize> {
    let b = text.as_bytes();
    let mut from = 0;
    while let Some(i) = text[from..].find('[') {
        let at = from + i;
        if sgr_len(&b[at..]).is_some() {
            return Some(at);
        }
        from = at + 1;
    }
    None
}

/// The length of `[digits(;digits)*m` at the start of `b`.
fn sgr_len(b: &[u8]) -> Option<usize> {
    if b.first() != Some(&b'[') {
        return None;
    }
    let body = b[1..].iter().take_while(|c| c.is_ascii_digit() || **c == b';').count();
    (body > 0 && body <= 20 && b.get(1 + body) == Some(&b'm')).then_some(body + 2)
}

/// CSI sequences (`ESC [ ... final`, 24-bit colours included), OSC sequences (`ESC ] ... BEL`
/// or `ESC \`), two-byte escapes, and colour codes that lost their escape.
fn strip_ansi(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let mut kept = 0;
    while i < b.len() {
        let skip = match b[i] {
            0x1b => match b.get(i + 1) {
                Some(b'[') => {
                    2 + b[i + 2..].iter().position(|c| (0x40..=0x7e).contains(c)).map_or(b.len() - i - 2, |p| p + 1)
                }
                Some(b']') => {
                    let body = &b[i + 2..];
                    match body.iter().position(|c| *c == 0x07 || *c == 0x1b) {
                        Some(p) if body[p] == 0x1b => 2 + p + 2,
                        Some(p) => 2 + p + 1,
                        None => b.len() - i,
                    }
                }
                Some(_) => 2,
                None => 1,
            },
            b'[' => sgr_len(&b[i..]).unwrap_or(0),
            _ => 0,
        };
        if skip == 0 {
            i += 1;
            continue;
        }
        out.push_str(&text[kept..i]);
        i = (i + skip).min(b.len());
        // Never cut inside a character: an escape's body is ASCII, so this only moves past a
        // truncated sequence's tail.
        while i < b.len() && !text.is_char_boundary(i) {
            i += 1;
        }
        kept = i;
    }
    out.push_str(&text[kept..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(text: &str) -> String {
        line(text).text.into_owned()
    }

    #[test]
    fn colours_redraws_and_trailing_spaces_go() {
        assert_eq!(msg("\x1b[31mstep:  1\x1b[39m  \x1b[32mloss: 2.5\x1b[0m  "), "step:  1  loss: 2.5");
        assert_eq!(msg("\x1b[38;2;180;60;0mgrad_norm: 1\x1b[39m"), "grad_norm: 1");
        assert_eq!(msg("[31mstep:  1[39m  [32mloss: 2.5[0m"), "step:  1  loss: 2.5", "escape lost in a paste");
        assert_eq!(msg("\x1b]0;title\x07step: 1"), "step: 1");
        assert_eq!(msg(" 10%|#  | 1/10\r 50%|#####  | 5/10"), " 50%|#####  | 5/10");
        assert_eq!(msg("last\r"), "last");
        assert_eq!(msg(" 10%|#  | 1/10#015 50%|#####  | 5/10"), " 50%|#####  | 5/10", "rsyslog's escapes");
        assert_eq!(msg("[1, 2, 3]"), "[1, 2, 3]");
    }

    #[test]
    fn launcher_prefixes_go_and_keep_the_rank_they_name() {
        let c = line("[rank3]:[titan] 2025-03-01 12:00:00,123 - root - INFO - step:  4  loss:  7.6");
        assert_eq!((c.text.as_ref(), c.origin.rank), ("step:  4  loss:  7.6", Some(3)));
        let c = line("[default1]:{'loss': 2.0}");
        assert_eq!((c.text.as_ref(), c.origin.local_rank), ("{'loss': 2.0}", Some(1)));
        let c = line(" 3: iter 10: loss 2.0");
        assert_eq!((c.text.as_ref(), c.origin.rank), ("iter 10: loss 2.0", Some(3)));
        let c = line("P1 12: x");
        assert_eq!((c.text.as_ref(), c.origin.rank), ("x", Some(12)));
        let c = line("[1,5]<stdout>:step: 1 loss: 2");
        assert_eq!((c.text.as_ref(), c.origin.rank), ("step: 1 loss: 2", Some(5)));
        let c = line("[1,mpirank:3,algo-2]<stdout>:step: 1 loss: 2");
        assert_eq!(
            (c.text.as_ref(), c.origin.rank, c.origin.host.as_deref()),
            ("step: 1 loss: 2", Some(3), Some("algo-2"))
        );
        let c = line("[7] step: 1 loss: 2");
        assert_eq!((c.text.as_ref(), c.origin.rank), ("step: 1 loss: 2", Some(7)));
        let c = line("\x1b[36m(WorkerDict pid=9, ip=10.0.0.1)\x1b[0m [rank1]: x");
        assert_eq!((c.text.as_ref(), c.origin.rank, c.origin.host.as_deref()), ("x", Some(1), Some("10.0.0.1")));
        assert_eq!(msg("(TaskRunner pid=4242) step:3 - a:1"), "step:3 - a:1");
        assert_eq!(msg("(not ray) x"), "(not ray) x");
        assert_eq!(
            msg("[actor=<root>.<Trainer trainer{'gpus': 0/2}>] Train | Step: 3  loss: 1.0"),
            "Train | Step: 3  loss: 1.0"
        );
        assert_eq!(msg("(pid=9) {'loss': 1.0} [repeated 3x across cluster]"), "{'loss': 1.0}");
    }

    #[test]
    fn timestamps_and_logging_headers_go() {
        assert_eq!(msg("2024-05-01T12:00:00.123456789Z iteration 1/ 2 | a: 1 |"), "iteration 1/ 2 | a: 1 |");
        assert_eq!(msg("2024-05-01T12:00:00.1Z stdout F {'loss': 1.0}"), "{'loss': 1.0}");
        assert_eq!(msg("2025-01-01 12:00:00,123 - root - INFO - step: 1"), "step: 1");
        assert_eq!(msg("2025-01-01 12:00:00,123 - INFO - step: 1"), "step: 1");
        assert_eq!(msg("05/01/2024 12:00:00 - INFO - __main__ - epoch 0: {'f1': 0.5}"), "epoch 0: {'f1': 0.5}");
        assert_eq!(
            msg("2024-05-01 12:00:00.123 | INFO     | slime.train:step:12 - Step 3 | Loss: 1"),
            "Step 3 | Loss: 1"
        );
        assert_eq!(msg("INFO:root:step 1"), "step 1");
        assert_eq!(
            msg("[2024-05-28 14:04:27,954] torch.distributed.elastic.multiprocessing.api: [WARNING] Sending process 1 closing signal SIGTERM"),
            "Sending process 1 closing signal SIGTERM"
        );
        assert_eq!(msg("[INFO] 2021-12-08 12:28:26,050 run: Using nproc_per_node=2."), "Using nproc_per_node=2.");
        assert_eq!(msg("6,1234,5678901,-;NVRM: Xid (PCI:0000:3b:00): 79"), "NVRM: Xid (PCI:0000:3b:00): 79");
        assert_eq!(msg("INFO 05-01 12:00:00 ppo_trainer.py:123] Global step 3: {}"), "Global step 3: {}");
        assert_eq!(msg("[2024-05-01 12:00:00] model.py:654 - step 3: {'a/b': 1}"), "step 3: {'a/b': 1}");
        let c = line("stdout: [2022-12-20 08:26:26,101] [INFO] [timer.py:197:stop] 0/17, SamplesPerSec=1.5");
        assert_eq!((c.text.as_ref(), c.origin.host), ("0/17, SamplesPerSec=1.5", None));
        assert_eq!(
            msg("[2024-05-01 12:00:00,000] [INFO] [logging.py:96:log_dist] [Rank 0] step=10, skipped=0"),
            "[Rank 0] step=10, skipped=0"
        );
        assert_eq!(msg(" [2024-05-01 12:00:00] iteration  10/ 100 |"), "iteration  10/ 100 |");
        assert_eq!(msg("[NeMo I 2024-05-01 12:00:00 nemo_logging:349] Training epoch 0"), "Training epoch 0");
        assert_eq!(
            msg("[INFO|trainer.py:2000] 2024-05-01 12:00:00,000 >> ***** Running training *****"),
            "***** Running training *****"
        );
        assert_eq!(
            msg("[E1204 02:46:27.862779498 ProcessGroupNCCL.cpp:1250] [PG ID 0 PG GUID 0(default_pg) Rank 1] x"),
            "[PG ID 0 PG GUID 0(default_pg) Rank 1] x"
        );
        assert_eq!(msg("[W socket.cpp:663] [c10d] x"), "[c10d] x");
        assert_eq!(msg("I0501 12:00:00.123456  1234 train.cc:12] hello"), "hello");
        let c = line("May  1 12:00:00 node7 kernel: [ 1234.567890] NVRM: Xid (PCI:0000:3b:00): 79");
        assert_eq!((c.text.as_ref(), c.origin.host.as_deref()), ("NVRM: Xid (PCI:0000:3b:00): 79", Some("node7")));
    }

    #[test]
    fn a_pdsh_host_is_only_a_candidate() {
        let c = line("machine1: {'loss': 2.0}");
        assert_eq!(c.text, "machine1: {'loss': 2.0}");
        assert_eq!(c.host_cut.map(|at| &c.text[at..]), Some("{'loss': 2.0}"));
        assert_eq!(line("step:  4  loss: 2").host_cut, Some(6), "a candidate only: tried when nothing reads the whole");
        assert_eq!(line("1234: x").host_cut, None, "digits are srun's, not a host");
        assert_eq!(line("torch.distributed.DistBackendError: [3] x").host_cut, None, "an exception's type");
        assert!(bar_start(" 50%|#####     | 5/10"), "`Iteration:  50%|` may be a bar's desc");
    }

    #[test]
    fn messages_that_only_look_like_wrappers_stay() {
        for t in [
            "step: 10 of 1000 warmup steps done",
            "[Rank 0] step=10, skipped=0",
            "(min, max) time across ranks (ms):",
            "Epoch 0:  50%|#####     | 50/100",
            "  lr .............................................. 0.0003",
            "[titan] hello",
            "WARNING: lm loss went up",
            "10 iterations done",
        ] {
            assert_eq!(msg(t), t.trim_end(), "{t}");
        }
    }
}
