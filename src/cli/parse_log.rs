//! `flightdeck parse-log FILE [--format auto|NAME]`: a log file through the adapters, one JSON record per line (`docs/json.md`).
use crate::adapters::{Choice, LogReader, Record, MAX_LINE_BYTES};
use anyhow::Context;
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};

#[derive(clap::Args, Debug)]
pub struct ParseLogArgs {
    /// A log file: a rank's output, a framework's log, torchrun's stdout.
    pub file: PathBuf,
    /// `auto` (each line through every adapter), `none`, or one of: megatron, nemo, deepspeed,
    /// hf, lightning, tqdm, verl, openrlhf, slime, areal, primerl, torchtitan, nanogpt, llmc,
    /// failures (docs/adapters.md).
    #[arg(long, default_value = "auto")]
    pub format: Choice,
    /// Say how line LINE_NO (1-based) was read: the wrappers taken off it, the message the
    /// adapters saw, which adapter took it and its records, or why none did.
    #[arg(long, value_name = "LINE_NO")]
    pub explain: Option<u64>,
}

pub fn parse_log(args: ParseLogArgs) -> anyhow::Result<i32> {
    let file = match std::fs::File::open(&args.file) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("flightdeck: parse-log: cannot read {}: {e}", args.file.display());
            return Ok(super::EXIT_BAD_INPUT);
        }
    };
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::with_capacity(1 << 16, stdout.lock());
    let mut write = |r: &Record| -> std::io::Result<()> {
        crate::adapters::json::write(&mut out, r)?;
        out.write_all(b"\n")
    };
    if let Some(at) = args.explain {
        return explain(file, &args.file, args.format, at);
    }
    let mut reader = LogReader::new(args.format);
    let (mut records, mut written) = (0u64, Ok(()));
    let lines = read_lines(file, &args.file, |n, line| {
        for r in reader.push(n, line) {
            records += 1;
            if written.is_ok() {
                written = write(&r);
            }
        }
    })?;
    for r in reader.finish() {
        records += 1;
        write(&r)?;
    }
    written?;
    out.flush()?;
    let s = reader.skipped;
    let too_long = s.too_long + lines.too_long;
    if too_long > 0 || s.invalid_utf8 > 0 {
        eprintln!(
            "parse-log: {}: {} lines, {records} records; {too_long} lines over {} KiB and {} of invalid UTF-8 skipped",
            args.file.display(),
            lines.lines,
            MAX_LINE_BYTES / 1024,
            s.invalid_utf8
        );
    }
    Ok(0)
}

/// `--explain LINE_NO`: every line before it read as usual (a block open at it stays open), then
/// that line read with the reader saying how.
fn explain(file: std::fs::File, path: &Path, format: Choice, at: u64) -> anyhow::Result<i32> {
    let mut reader = LogReader::new(format);
    let mut found = None;
    let lines = read_lines(file, path, |n, line| {
        if n < at {
            reader.push(n, line);
        } else if n == at {
            found = Some((String::from_utf8_lossy(line).into_owned(), reader.explain(n, line)));
        }
    })?;
    let Some((raw, explanation)) = found else {
        eprintln!(
            "flightdeck: parse-log: {} has {} lines; --explain takes 1 to {}",
            path.display(),
            lines.lines,
            lines.lines
        );
        return Ok(super::EXIT_BAD_INPUT);
    };
    print!("{}", explanation_text(path, at, &raw, format, explanation.as_ref()));
    Ok(0)
}

/// What `--explain` prints for one line.
fn explanation_text(
    path: &Path,
    at: u64,
    raw: &str,
    format: Choice,
    e: Option<&crate::adapters::Explanation>,
) -> String {
    use crate::adapters::Taker;
    let mut out = format!("{} line {at}\n  as printed: {raw:?}\n", path.display());
    let Some(e) = e else {
        let why = if format == Choice::None {
            "--format none reads nothing"
        } else {
            "the line is blank once colours and redraws are off"
        };
        out.push_str(&format!("  read by: nothing ({why})\n"));
        return out;
    };
    if let Some(why) = e.skipped {
        out.push_str(&format!("  skipped: the line is {why}\n"));
        return out;
    }
    if !e.origin.taken.is_empty() {
        let taken: Vec<&str> = e.origin.taken.iter().map(|w| w.name()).collect();
        out.push_str(&format!("  taken off: {}\n", taken.join(", ")));
    }
    let named: Vec<String> = [("rank", e.origin.rank), ("local rank", e.origin.local_rank)]
        .iter()
        .filter_map(|(k, v)| v.map(|v| format!("{k} {v}")))
        .chain(e.origin.host.iter().map(|h| format!("host {h}")))
        .collect();
    if !named.is_empty() {
        out.push_str(&format!("  the wrappers name: {}\n", named.join(", ")));
    }
    out.push_str(&format!("  message: {:?}\n", e.without_host.as_deref().unwrap_or(&e.message)));
    let taker = match e.taker {
        None => None,
        Some(Taker::Failures) => Some("the failure reader".to_string()),
        Some(Taker::CommsTable) => Some("DeepSpeed's comms summary table".to_string()),
        Some(Taker::Adapter(f)) => Some(format!("the {} adapter", f.name())),
    };
    match (taker, e.records.is_empty()) {
        (Some(t), false) => {
            out.push_str(&format!("  read by: {t}\n  records:\n"));
            for r in &e.records {
                out.push_str(&format!("    {}\n", crate::adapters::json::to_json(r)));
            }
        }
        (Some(t), true) => out.push_str(&format!(
            "  read by: {t}, as part of a block of several lines (its record comes with the block's last line)\n"
        )),
        (None, _) => {
            out.push_str("  read by: nothing: no adapter knows this message's shape. Adapters read only the lines their framework's code prints (docs/adapters.md); a number in a sentence is never a metric.\n");
            if format != Choice::Auto {
                let mut auto = LogReader::new(Choice::Auto);
                if let Some(a) = auto.explain(at, raw.as_bytes()).filter(|a| !a.records.is_empty()) {
                    if let Some(Taker::Adapter(f)) = a.taker {
                        out.push_str(&format!("  --format {} would read it (or --format auto)\n", f.name()));
                    }
                }
            }
        }
    }
    out
}

/// How many lines a file had, and how many were too long to hand over.
pub struct Lines {
    pub lines: u64,
    pub too_long: u64,
}

/// Calls `each(n, line)` for every line of `file` (1-based, without its newline), in bounded
/// memory: a line over `MAX_LINE_BYTES` is counted, not read into memory, and not handed over.
pub fn read_lines(file: std::fs::File, path: &Path, mut each: impl FnMut(u64, &[u8])) -> anyhow::Result<Lines> {
    let mut input = std::io::BufReader::with_capacity(1 << 16, file);
    let (mut line, mut overflow) = (Vec::new(), false);
    let mut counts = Lines { lines: 0, too_long: 0 };
    loop {
        let chunk = input.fill_buf().with_context(|| format!("reading {}", path.display()))?;
        if chunk.is_empty() {
            break;
        }
        let used = chunk.len();
        for piece in chunk.split_inclusive(|b| *b == b'\n') {
            let ends = piece.last() == Some(&b'\n');
            let body = if ends { &piece[..piece.len() - 1] } else { piece };
            if overflow || line.len() + body.len() > MAX_LINE_BYTES {
                // A bar redrawn in place for a whole epoch is one long line of `\r` redraws:
                // what is on the screen is its last redraw, which is kept when it fits.
                match body.iter().rposition(|b| *b == b'\r') {
                    Some(cr) if body.len() - cr - 1 <= MAX_LINE_BYTES && cr + 1 < body.len() => {
                        (overflow, line) = (false, body[cr + 1..].to_vec());
                        if ends {
                            counts.lines += 1;
                            each(counts.lines, &line);
                            line.clear();
                        }
                        continue;
                    }
                    _ => {
                        overflow = true;
                        line.clear();
                    }
                }
            }
            if !overflow {
                line.extend_from_slice(body);
            }
            if ends {
                counts.lines += 1;
                if overflow {
                    counts.too_long += 1;
                } else {
                    each(counts.lines, &line);
                }
                overflow = false;
                line.clear();
            }
        }
        input.consume(used);
    }
    if !line.is_empty() || overflow {
        counts.lines += 1;
        if overflow {
            counts.too_long += 1;
        } else {
            each(counts.lines, &line);
        }
    }
    Ok(counts)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines_of(bytes: &[u8]) -> (Vec<Vec<u8>>, u64) {
        let mut f = tempfile::tempfile().expect("a temporary file");
        f.write_all(bytes).expect("writing it");
        use std::io::Seek;
        f.rewind().expect("rewinding it");
        let mut got = Vec::new();
        let counts = read_lines(f, Path::new("t.log"), |_, l| got.push(l.to_vec())).expect("reading it");
        (got, counts.too_long)
    }

    #[test]
    fn a_bar_redrawn_past_the_line_limit_gives_its_last_redraw_and_a_plain_long_line_is_skipped() {
        let mut bytes = Vec::new();
        for i in 0..20_000 {
            bytes.extend_from_slice(format!("{:3}%|#   | {i}/20000\r", i / 200).as_bytes());
        }
        bytes.extend_from_slice(b"100%|####| 20000/20000 [00:10<00:00, 1999.00it/s, loss=2.5]\n");
        bytes.extend_from_slice(&vec![b'x'; MAX_LINE_BYTES + 10]);
        bytes.extend_from_slice(b"\nlast\n");
        let (lines, too_long) = lines_of(&bytes);
        assert_eq!(lines.len(), 2, "{:?}", lines.iter().map(|l| l.len()).collect::<Vec<_>>());
        // Within the limit, what is handed over may still hold earlier redraws: the reader keeps
        // the last (adapters/clean.rs).
        assert!(lines[0].len() <= MAX_LINE_BYTES);
        let last = lines[0].rsplit(|b| *b == b'\r').next().unwrap_or_default();
        assert_eq!(last, b"100%|####| 20000/20000 [00:10<00:00, 1999.00it/s, loss=2.5]");
        assert_eq!((lines[1].as_slice(), too_long), (&b"last"[..], 1));
    }
}
