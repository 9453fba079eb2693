//! A printed line made plain: ANSI colours out, the last `\r` redraw kept, Ray's and PyTorch's rank prefixes off, trailing spaces trimmed.
use std::borrow::Cow;

pub fn line(text: &str) -> Cow<'_, str> {
    let text = match text.rfind('\r') {
        // A bar redrawn in place: what is on the screen is the last redraw (a trailing `\r` too).
        Some(i) if i + 1 < text.len() => &text[i + 1..],
        Some(i) => text[..i].rsplit('\r').next().unwrap_or(""),
        None => text,
    };
    let text: Cow<'_, str> = if text.contains('\x1b') { Cow::Owned(strip_ansi(text)) } else { Cow::Borrowed(text) };
    let trimmed = strip_prefixes(text.trim_end());
    if trimmed.len() == text.len() {
        text
    } else {
        Cow::Owned(trimmed.to_string())
    }
}

/// CSI sequences (`ESC [ ... letter`) and two-byte escapes.
fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '\x1b' {
            out.push(c);
            continue;
        }
        if chars.peek() == Some(&'[') {
            chars.next();
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() || c == '~' {
                    break;
                }
            }
        } else {
            chars.next();
        }
    }
    out
}

/// `(TaskRunner pid=123) `, `(WorkerDict pid=9, ip=10.0.0.1) ` (Ray's worker prefixes) and
/// `[rank1]:` (PyTorch's, on a rank's exception lines), at the start of the line.
fn strip_prefixes(mut text: &str) -> &str {
    loop {
        let before = text.len();
        if text.starts_with('(') {
            if let Some(end) = text.find(") ") {
                if text[..end].contains("pid=") {
                    text = text[end + 2..].trim_start();
                }
            }
        }
        if let Some(rest) = text.strip_prefix("[rank") {
            if let Some(end) = rest.find("]:") {
                if !rest[..end].is_empty() && rest[..end].bytes().all(|b| b.is_ascii_digit()) {
                    text = rest[end + 2..].trim_start();
                }
            }
        }
        if text.len() == before {
            return text;
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn colours_redraws_prefixes_and_trailing_spaces_go() {
        assert_eq!(super::line("\x1b[31mstep:  1\x1b[39m  \x1b[32mloss: 2.5\x1b[0m  "), "step:  1  loss: 2.5");
        assert_eq!(super::line(" 10%|#  | 1/10\r 50%|#####  | 5/10"), " 50%|#####  | 5/10");
        assert_eq!(super::line("last\r"), "last");
        assert_eq!(super::line("(TaskRunner pid=4242) step:3 - a:1"), "step:3 - a:1");
        assert_eq!(super::line("(WorkerDict pid=9, ip=10.0.0.1) [rank1]: x"), "x");
        assert_eq!(super::line("(not ray) x"), "(not ray) x");
    }
}
