//! `flightdeck parse-log FILE [--format auto|NAME]`: a log file through the adapters, one JSON record per line (`docs/json.md`).
use crate::adapters::{Choice, LogReader, Record, MAX_LINE_BYTES};
use anyhow::Context;
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};

#[derive(clap::Args, Debug)]
pub struct ParseLogArgs {
    /// A log file: a rank's output, a framework's log, torchrun's stdout.
    pub file: PathBuf,
    /// `auto` (each line through every adapter), `none`, or one of: megatron, deepspeed, hf,
    /// tqdm, verl, openrlhf, torchtitan, nanogpt, failures.
    #[arg(long, default_value = "auto")]
    pub format: Choice,
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
        serde_json::to_writer(&mut out, &crate::adapters::json::to_json(r))?;
        out.write_all(b"\n")
    };
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
            if line.len() + body.len() > MAX_LINE_BYTES {
                overflow = true;
                line.clear();
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
