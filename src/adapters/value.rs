//! The one name/value rule every adapter uses: printed labels into metric names, printed numbers into values.
//!
//! Names: a label that is already an identifier (ASCII letters, digits and `_ / . - @`, nothing else)
//! is kept verbatim (`rewards/chosen`, `actor/pg_loss`, `grad_norm`); any other label is lowercased
//! and each run of other characters becomes one `_`, trimmed at both ends (`elapsed time per
//! iteration (ms)` → `elapsed_time_per_iteration_ms`, `lm loss` → `lm_loss`).
//! Values: what is printed, read as f64 (`2.133e+05`, `193,831`, `nan`, `inf`, `'0.5'`,
//! `np.float64(0.5)`); anything else is not a value.

/// The metric name for a printed label.
pub fn name(label: &str) -> String {
    let label = label.trim();
    if is_identifier(label) {
        return label.to_string();
    }
    let mut out = String::with_capacity(label.len());
    let mut gap = false;
    for c in label.chars() {
        if c.is_ascii_alphanumeric() {
            if gap && !out.is_empty() {
                out.push('_');
            }
            gap = false;
            out.push(c.to_ascii_lowercase());
        } else {
            gap = true;
        }
    }
    out
}

/// Whether a label is printed as an identifier, so kept verbatim.
pub fn is_identifier(label: &str) -> bool {
    !label.is_empty()
        && label.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'/' | b'.' | b'-' | b'@'))
}

/// A printed number: plain, quoted (HF's newer string form), wrapped by numpy's repr, or with
/// thousands separators. `None` for anything else (words, booleans, empty).
pub fn number(printed: &str) -> Option<f64> {
    let mut s = printed.trim();
    if s.len() >= 2 && (s.starts_with('\'') && s.ends_with('\'') || s.starts_with('"') && s.ends_with('"')) {
        s = s[1..s.len() - 1].trim();
    }
    if let Some(inner) = unwrap_call(s) {
        s = inner;
    }
    let first = *s.as_bytes().first()?;
    if !(first.is_ascii_digit() || matches!(first, b'-' | b'+' | b'.' | b'n' | b'N' | b'i' | b'I')) {
        return None;
    }
    if s.contains(',') {
        return thousands(s);
    }
    match s {
        // Python's `{:E}` prints `NAN`/`INF`; Lightning's bar pads them (`nan.0`, `-inf.`).
        "nan" | "NaN" | "-nan" | "NAN" | "-NAN" | "nan.0" | "nan." => Some(f64::NAN),
        "inf" | "Inf" | "+inf" | "infinity" | "INF" | "+INF" | "inf.0" | "inf." => Some(f64::INFINITY),
        "-inf" | "-Inf" | "-infinity" | "-INF" | "-inf.0" | "-inf." => Some(f64::NEG_INFINITY),
        _ if s.bytes().all(|b| b.is_ascii_digit() || matches!(b, b'-' | b'+' | b'.' | b'e' | b'E')) => s.parse().ok(),
        _ => None,
    }
}

/// `np.float64(0.5)`, `np.int64(3)`, `tensor(0.5)`: numpy 2's and torch's reprs of a scalar.
fn unwrap_call(s: &str) -> Option<&str> {
    let open = s.find('(')?;
    let head = &s[..open];
    let known = head.starts_with("np.") || head.starts_with("numpy.") || head == "tensor";
    if known && s.ends_with(')') {
        let inner = &s[open + 1..s.len() - 1];
        // `tensor(0.5, device='cuda:0')`: the value is the first argument.
        Some(inner.split(',').next().unwrap_or(inner).trim())
    } else {
        None
    }
}

/// `193,831` and `1,234.56`: groups of three digits after the first comma.
fn thousands(s: &str) -> Option<f64> {
    let (int, frac) = s.split_once('.').map_or((s, None), |(i, f)| (i, Some(f)));
    let mut groups = int.split(',');
    let lead = groups.next()?.trim_start_matches(['-', '+']);
    if lead.is_empty() || lead.len() > 3 || !lead.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    if !groups.all(|g| g.len() == 3 && g.bytes().all(|b| b.is_ascii_digit())) {
        return None;
    }
    let mut plain: String = int.chars().filter(|&c| c != ',').collect();
    if let Some(frac) = frac {
        plain.push('.');
        plain.push_str(frac);
    }
    plain.parse().ok()
}

/// The number at the start of `s` and what follows it (`9.46GiB(64.99%)` → 9.46, `GiB(64.99%)`).
pub fn leading_number(s: &str) -> Option<(f64, &str)> {
    let s = s.trim_start();
    for word in ["-inf", "inf", "nan"] {
        if let Some(rest) = s.strip_prefix(word) {
            if !rest.starts_with(|c: char| c.is_ascii_alphanumeric()) {
                return Some((number(word)?, rest));
            }
        }
    }
    let mut end = s
        .bytes()
        .position(|b| !(b.is_ascii_digit() || matches!(b, b'.' | b',' | b'+' | b'-' | b'e' | b'E')))
        .unwrap_or(s.len());
    // `1.5e-3ms` stops at `m`; `12e` or `3,` need the tail trimmed back to a number.
    while end > 0 {
        if let Some(value) = number(&s[..end]) {
            return Some((value, &s[end..]));
        }
        end -= 1;
    }
    None
}

/// A value with a percentage in parentheses: `9.46GiB(64.99%)` → (9.46, Some(64.99)).
/// A bare percentage (`35.2%`) is its number; a glued unit (`GiB`, `ms`) is dropped.
pub fn with_percent(printed: &str) -> Option<(f64, Option<f64>)> {
    let (value, rest) = leading_number(printed)?;
    let rest = rest.trim_start_matches(|c: char| c.is_ascii_alphabetic() || c == '%');
    if rest.is_empty() {
        return Some((value, None));
    }
    let pct = rest.strip_prefix('(')?.strip_suffix("%)")?;
    Some((value, Some(number(pct)?)))
}

/// A size PyTorch's allocator printed (`20.00 MiB`, `512 bytes`, `1.5 GiB`) in MiB.
pub fn size_mib(printed: &str) -> Option<f64> {
    let (value, rest) = leading_number(printed)?;
    let unit = rest.trim_start();
    let factor = if unit.starts_with("bytes") || unit.starts_with("B") {
        1.0 / (1024.0 * 1024.0)
    } else if unit.starts_with("KiB") {
        1.0 / 1024.0
    } else if unit.starts_with("MiB") {
        1.0
    } else if unit.starts_with("GiB") {
        1024.0
    } else if unit.starts_with("TiB") {
        1024.0 * 1024.0
    } else {
        return None;
    };
    Some(value * factor)
}

/// A whole unsigned integer, as printed (a step, a rank).
pub fn count(printed: &str) -> Option<u64> {
    let s = printed.trim();
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// The unsigned integer at the start of `s`, and the rest.
pub fn leading_count(s: &str) -> Option<(u64, &str)> {
    let end = s.bytes().position(|b| !b.is_ascii_digit()).unwrap_or(s.len());
    if end == 0 {
        return None;
    }
    Some((s[..end].parse().ok()?, &s[end..]))
}

/// Phrase search for the adapters' hot path. Every line passes some fifteen readers, each
/// looking for its phrases, and most lines hold none of them: std's `str::find(&str)` sets up a
/// two-way searcher and scans the line each time. While a line is being read (`with_message`),
/// its set of bytes is known, so a phrase with a byte the line lacks is rejected in a few
/// instructions, for the line and any slice of it; only the rest are searched.
pub trait Scan {
    /// `str::contains` of a phrase.
    fn has(&self, needle: &str) -> bool;
    /// `str::find` of a phrase.
    fn at(&self, needle: &str) -> Option<usize>;
    /// `str::split_once` at a phrase.
    fn cut<'a>(&'a self, needle: &str) -> Option<(&'a str, &'a str)>;
}

impl Scan for str {
    fn has(&self, needle: &str) -> bool {
        self.at(needle).is_some()
    }

    fn at(&self, needle: &str) -> Option<usize> {
        if !may_hold(self, needle) {
            return None;
        }
        memchr::memmem::find(self.as_bytes(), needle.as_bytes())
    }

    fn cut<'a>(&'a self, needle: &str) -> Option<(&'a str, &'a str)> {
        // A match of a whole `str` starts and ends on char boundaries.
        let at = self.at(needle)?;
        Some((&self[..at], &self[at + needle.len()..]))
    }
}

/// A 256-bit set of the bytes a text holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ByteSet([u64; 4]);

impl ByteSet {
    pub fn of(text: &str) -> ByteSet {
        let mut s = [0u64; 4];
        for &b in text.as_bytes() {
            s[usize::from(b >> 6)] |= 1 << (b & 63);
        }
        ByteSet(s)
    }

    pub fn has(&self, b: u8) -> bool {
        self.0[usize::from(b >> 6)] & (1 << (b & 63)) != 0
    }
}

std::thread_local! {
    /// The line being read: where its message lies and its bytes.
    static MESSAGE: std::cell::Cell<Option<(usize, usize, ByteSet)>> = const { std::cell::Cell::new(None) };
}

/// Runs `read` with `message`'s bytes known to `Scan` (for `message` and every slice of it).
pub fn with_message<R>(message: &str, read: impl FnOnce() -> R) -> R {
    with_message_bytes(message, ByteSet::of(message), read)
}

/// `with_message`, with the message's bytes already known (or a superset of them: a line's
/// bytes before its wrappers were taken off).
pub fn with_message_bytes<R>(message: &str, bytes: ByteSet, read: impl FnOnce() -> R) -> R {
    let known = (message.as_ptr() as usize, message.len(), bytes);
    let before = MESSAGE.with(|m| m.replace(Some(known)));
    let out = read();
    MESSAGE.with(|m| m.set(before));
    out
}

/// Whether `text` holds byte `b`: from the message's bytes when `text` is (a slice of) the
/// message being read and `b` is not there, else by a scan.
pub fn holds(text: &str, b: u8) -> bool {
    let known = MESSAGE.with(|m| match m.get() {
        Some((start, len, bytes)) => {
            let at = text.as_ptr() as usize;
            (at >= start && at + text.len() <= start + len && !bytes.has(b)).then_some(false)
        }
        None => None,
    });
    known.unwrap_or_else(|| text.as_bytes().contains(&b))
}

/// False only when `text` is (a slice of) the message being read and `needle` has a byte the
/// message lacks.
fn may_hold(text: &str, needle: &str) -> bool {
    MESSAGE.with(|m| match m.get() {
        Some((start, len, bytes)) => {
            let at = text.as_ptr() as usize;
            let within = at >= start && at + text.len() <= start + len;
            !within || needle.bytes().all(|b| bytes.has(b))
        }
        None => true,
    })
}
