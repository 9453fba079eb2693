//! docs/benchmarks.md's tables read back: each `bench:NAME` section's speed-ups and the
//! all-reduce bus bandwidths, for `fdbench charts` to draw exactly what the tables say.
//!
//! The doc's conventions (benches/driver/*.py write them): a section sits between
//! `<!-- bench:NAME:begin -->` and `<!-- bench:NAME:end -->` under a `## ` heading; the ratio a
//! target is judged on is bold (`**1.23**`, `**1.7×**`), in a column headed "speed-up…" or
//! "ratio…", or along a row headed "speed-up…"; speed-up = reference ÷ Flightdeck.
use std::path::Path;

/// Sections whose bold ratio is not Flightdeck against a reference, so not charted as a
/// speed-up: the handshake's is Flightdeck with its run secret ÷ without (a cost, > 1 worse);
/// parse-log's is Flightdeck ÷ `grep -c` (a floor no parser reaches; its target is absolute).
const NOT_SPEEDUPS: [&str; 2] = ["handshake", "parselog"];
/// Longest bar label; longer row names are cut at their first ": " or shortened with "…".
const LABEL_CHARS: usize = 40;

/// Where the doc broke its conventions, and what was expected there.
#[derive(Debug, PartialEq, thiserror::Error)]
#[error("{file}:{line}: {section}: {what}")]
pub struct DocError {
    pub file: String,
    /// 1-based; 0 when the fault is the file as a whole.
    pub line: usize,
    /// `section bench:NAME`, or `outside any bench section`.
    pub section: String,
    pub what: String,
}

/// One markdown table of a section: its header cells and rows, each with its line number.
#[derive(Clone, Debug, PartialEq)]
pub struct Table {
    /// The NAME of `bench:NAME`.
    pub section: String,
    /// The `## ` heading in effect at the table.
    pub heading: String,
    pub header: Vec<String>,
    pub rows: Vec<(usize, Vec<String>)>,
}

/// One bold speed-up: a bar of the ratios chart.
#[derive(Clone, Debug, PartialEq)]
pub struct Speedup {
    /// The section's heading, shortened: the bar's group.
    pub group: String,
    /// What tells this row from the others of its section ("processes 2, 4 KiB").
    pub label: String,
    pub ratio: f64,
}

/// One line of the bandwidth chart: a column's GB/s against message size for one world size.
#[derive(Clone, Debug, PartialEq)]
pub struct Bandwidth {
    /// The column's name without its unit: "ring", "gloo", "memcpy".
    pub side: String,
    pub processes: u32,
    /// (bytes, GB/s), in table order.
    pub points: Vec<(u64, f64)>,
}

/// Every table of every `bench:NAME` section of `text` (read from `file`, named in errors).
pub fn parse(file: &Path, text: &str) -> Result<Vec<Table>, DocError> {
    let fail = |line: usize, section: Option<&str>, what: String| DocError {
        file: file.display().to_string(),
        line,
        section: section.map_or("outside any bench section".into(), |s| format!("section bench:{s}")),
        what,
    };
    let mut tables: Vec<Table> = Vec::new();
    let mut heading = String::new();
    let mut open: Option<(String, usize)> = None;
    let lines: Vec<&str> = text.lines().collect();
    let mut i = 0;
    while i < lines.len() {
        let (n, line) = (i + 1, lines[i].trim());
        i += 1;
        if let Some(h) = line.strip_prefix("## ") {
            heading = h.trim().to_string();
        } else if let Some((name, end)) = marker(line) {
            match (&open, end) {
                (None, false) => open = Some((name.to_string(), n)),
                (Some((cur, _)), true) if cur == name => open = None,
                (Some((cur, at)), _) => {
                    return Err(fail(
                        n,
                        Some(cur),
                        format!("expected `<!-- bench:{cur}:end -->` (its begin is on line {at}), found {line:?}"),
                    ))
                }
                (None, true) => return Err(fail(n, None, format!("{line:?} closes a section that was never begun"))),
            }
        } else if let (Some((section, _)), true) = (&open, line.starts_with('|')) {
            let header = cells(line);
            let rule = lines.get(i).map_or("", |l| l.trim());
            if !cells(rule).iter().all(|c| !c.is_empty() && c.chars().all(|ch| matches!(ch, '-' | ':'))) {
                return Err(fail(
                    i + 1,
                    Some(section),
                    format!("expected the table's `| --- |` rule under its header, found {rule:?}"),
                ));
            }
            i += 1;
            let mut rows = Vec::new();
            while let Some(row) = lines.get(i).map(|l| l.trim()).filter(|l| l.starts_with('|')) {
                let row = cells(row);
                if row.len() != header.len() {
                    let what =
                        format!("expected {} cells as in the header on line {n}, found {}", header.len(), row.len());
                    return Err(fail(i + 1, Some(section), what));
                }
                rows.push((i + 1, row));
                i += 1;
            }
            tables.push(Table { section: section.clone(), heading: heading.clone(), header, rows });
        }
    }
    match open {
        Some((name, at)) => {
            Err(fail(at, Some(&name), format!("expected `<!-- bench:{name}:end -->` before the end of the file")))
        }
        None => Ok(tables),
    }
}

/// `<!-- bench:NAME:begin -->` → (NAME, false), `…:end -->` → (NAME, true).
fn marker(line: &str) -> Option<(&str, bool)> {
    let inner = line.strip_prefix("<!-- bench:")?.strip_suffix("-->")?.trim_end();
    let (name, which) = inner.rsplit_once(':')?;
    match which {
        "begin" => Some((name, false)),
        "end" => Some((name, true)),
        _ => None,
    }
}

fn cells(line: &str) -> Vec<String> {
    let inner = line.trim().trim_start_matches('|');
    let inner = inner.strip_suffix('|').unwrap_or(inner);
    inner.split('|').map(|c| c.trim().to_string()).collect()
}

/// Every bold speed-up of `tables`, in the doc's order.
pub fn speedups(file: &Path, tables: &[Table]) -> Result<Vec<Speedup>, DocError> {
    let mut out = Vec::new();
    for t in tables.iter().filter(|t| !NOT_SPEEDUPS.contains(&t.section.as_str())) {
        let is_ratio = |s: &str| {
            let s = s.to_lowercase();
            s.starts_with("speed-up") || s.starts_with("ratio")
        };
        let columns: Vec<usize> = (0..t.header.len()).filter(|&j| is_ratio(&t.header[j])).collect();
        for (line, row) in &t.rows {
            // A "speed-up" row holds one ratio per measured column; otherwise the ratio columns do.
            let along_row = row.first().is_some_and(|c| is_ratio(c));
            let wanted: Vec<usize> = if along_row { (1..row.len()).collect() } else { columns.clone() };
            for j in wanted {
                let Some(bold) = bold(&row[j]) else { continue };
                let Some(ratio) = number(bold) else {
                    if along_row {
                        continue; // a bold verdict ("**missed**") beside the ratios
                    }
                    let what =
                        format!("expected a bold number like **1.23** in column {:?}, found {:?}", t.header[j], row[j]);
                    return Err(DocError {
                        file: file.display().to_string(),
                        line: *line,
                        section: format!("section bench:{}", t.section),
                        what,
                    });
                };
                let label = if along_row { measure_name(&t.header[j]) } else { row_name(&t.header, row) };
                out.push(Speedup { group: short_heading(&t.heading, &t.section), label, ratio });
            }
        }
    }
    Ok(out)
}

/// The bold run at the start of a cell: `**1.7×** (target…)` → `1.7×`.
fn bold(cell: &str) -> Option<&str> {
    let rest = cell.strip_prefix("**")?;
    rest.split_once("**").map(|(b, _)| b.trim())
}

/// A table number: `1,234.5`, `1.7×`, `2.83`; the first number of `189 (88–291)`. Percentages
/// are not ratios.
fn number(s: &str) -> Option<f64> {
    let head = s.split_whitespace().next()?.trim_end_matches('×');
    if head.ends_with('%') {
        return None;
    }
    head.replace(',', "").parse::<f64>().ok().filter(|v| v.is_finite())
}

/// A measured column's name for a speed-up row: `load s (open + …)` → `load`.
fn measure_name(header: &str) -> String {
    let name = header.split(" (").next().unwrap_or(header).trim();
    match name.rsplit_once(' ') {
        Some((what, unit)) if ["s", "ms", "µs", "MB", "GB/s"].contains(&unit) => what.to_string(),
        _ => name.to_string(),
    }
}

/// The leading cells that name a row (before its first measurement, "median (min–max)"); a bare
/// number is shown with its column's name ("processes 2").
fn row_name(header: &[String], row: &[String]) -> String {
    let keys: Vec<String> = row
        .iter()
        .zip(header)
        .take_while(|(c, _)| !is_measurement(c) && !c.starts_with("**"))
        .map(|(c, h)| if number(c).is_some() && !c.contains(' ') { format!("{h} {c}") } else { c.clone() })
        .collect();
    let name = if keys.is_empty() { row.first().cloned().unwrap_or_default() } else { keys.join(", ") };
    shorten(&name)
}

/// `189 (88–291)`: a median with its range.
fn is_measurement(cell: &str) -> bool {
    cell.contains(" (") && number(cell).is_some()
}

fn short_heading(heading: &str, section: &str) -> String {
    if heading.is_empty() {
        return section.to_string();
    }
    // A group heading has the whole row to itself: only the part before a subtitle is kept.
    heading.split(": ").next().unwrap_or(heading).to_string()
}

fn shorten(s: &str) -> String {
    let s = if s.chars().count() > LABEL_CHARS { s.split(": ").next().unwrap_or(s) } else { s };
    if s.chars().count() <= LABEL_CHARS {
        return s.to_string();
    }
    let cut: String = s.chars().take(LABEL_CHARS - 1).collect();
    format!("{}…", cut.trim_end())
}

/// The all-reduce table's GB/s columns, one line per (column, processes).
pub fn bandwidths(file: &Path, tables: &[Table]) -> Result<Vec<Bandwidth>, DocError> {
    let fail = |line: usize, what: String| DocError {
        file: file.display().to_string(),
        line,
        section: "section bench:allreduce".into(),
        what,
    };
    let find = |t: &Table, prefix: &str| t.header.iter().position(|h| h.to_lowercase().starts_with(prefix));
    let table = tables.iter().filter(|t| t.section == "allreduce").find_map(|t| {
        let gbps: Vec<usize> = (0..t.header.len()).filter(|&j| t.header[j].ends_with("GB/s")).collect();
        Some((t, find(t, "processes")?, find(t, "size")?, gbps)).filter(|f| !f.3.is_empty())
    });
    let Some((table, procs, size, gbps)) = table else {
        let what = "expected a table with columns \"processes\", \"size …\" and at least one \"… GB/s\"".into();
        return Err(fail(0, what));
    };
    let mut out: Vec<Bandwidth> = Vec::new();
    for (line, row) in &table.rows {
        let processes = row[procs]
            .parse::<u32>()
            .map_err(|_| fail(*line, format!("expected a whole number of processes, found {:?}", row[procs])))?;
        let bytes = bytes(&row[size]).ok_or_else(|| {
            fail(*line, format!("expected a size like \"4 KiB\" or \"64 MiB\", found {:?}", row[size]))
        })?;
        for &j in &gbps {
            let value = number(&row[j]).ok_or_else(|| {
                fail(*line, format!("expected a number of GB/s in column {:?}, found {:?}", table.header[j], row[j]))
            })?;
            let side = table.header[j].trim_end_matches("GB/s").trim().trim_end_matches("busbw").trim().to_string();
            match out.iter_mut().find(|b| b.side == side && b.processes == processes) {
                Some(b) => b.points.push((bytes, value)),
                None => out.push(Bandwidth { side, processes, points: vec![(bytes, value)] }),
            }
        }
    }
    Ok(out)
}

/// `4 KiB` → 4096; `512 B`, `64 MiB`, `1 GiB`.
pub fn bytes(cell: &str) -> Option<u64> {
    let (n, unit) = cell.trim().split_once(' ')?;
    let scale = match unit.trim() {
        "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        _ => return None,
    };
    n.parse::<u64>().ok()?.checked_mul(scale)
}

/// The section's "Measured YYYY-MM-DD HH:MM" stamp, for a chart's caption.
pub fn measured(text: &str, section: &str) -> Option<String> {
    let begin = format!("<!-- bench:{section}:begin -->");
    let after = text.split_once(&begin)?.1;
    let stamp = after.trim_start().strip_prefix("Measured ")?;
    Some(stamp.split(" on ").next()?.to_string())
}

/// Only `#[test]` items here: fdbench itself is built with cfg(test) but without libtest, which
/// strips them, so anything else in this module would be dead code there.
#[cfg(test)]
mod tests {

    #[test]
    fn a_sample_doc_reads_into_its_speedups_in_order() {
        use super::*;
        let doc = || Path::new("docs/benchmarks.md");
        let tables = parse(doc(), include_str!("sample_benchmarks.md")).expect("parsed");
        assert_eq!(tables.len(), 6);
        assert_eq!(tables[1].heading, "All-reduce");
        assert_eq!(tables[1].rows[0].0, 21, "rows keep their line numbers");
        let got: Vec<(String, String, f64)> =
            speedups(doc(), &tables).expect("speed-ups").into_iter().map(|s| (s.group, s.label, s.ratio)).collect();
        let want = [
            ("Training throughput", "1 process × 2 threads", 0.80),
            ("Training throughput", "2 processes × 1 thread", 0.95),
            ("All-reduce", "processes 2, 4 KiB", 12.76),
            ("All-reduce", "processes 2, 1 MiB", 2.83),
            ("All-reduce", "processes 4, 4 KiB", 31.21),
            ("All-reduce", "processes 4, 1 MiB", 1234.5),
            ("History", "write", 1.7),
            ("History", "load", 43.1),
            // overhead's bold percentage is not a ratio; the handshake's is a cost.
            ("SSH fan-out", "hosts 32", 1.23),
        ];
        let want: Vec<(String, String, f64)> = want.iter().map(|w| (w.0.into(), w.1.into(), w.2)).collect();
        assert_eq!(got, want);
    }

    #[test]
    fn the_allreduce_table_reads_into_one_line_per_side_and_world_size() {
        use super::*;
        let doc = || Path::new("docs/benchmarks.md");
        let tables = parse(doc(), include_str!("sample_benchmarks.md")).expect("parsed");
        let got = bandwidths(doc(), &tables).expect("bandwidths");
        let line = |side: &str, processes, points: [(u64, f64); 2]| Bandwidth {
            side: side.into(),
            processes,
            points: points.to_vec(),
        };
        assert_eq!(
            got,
            [
                line("ring", 2, [(4096, 0.02), (1 << 20, 1.02)]),
                line("gloo", 2, [(4096, 0.0), (1 << 20, 0.36)]),
                line("ring", 4, [(4096, 0.02), (1 << 20, 0.21)]),
                line("gloo", 4, [(4096, 0.0), (1 << 20, 0.12)]),
            ]
        );
        assert_eq!(measured(include_str!("sample_benchmarks.md"), "allreduce").as_deref(), Some("2026-12-02 12:32"));
    }

    #[test]
    fn each_broken_convention_names_the_file_section_line_and_what_was_expected() {
        use super::*;
        let doc = || Path::new("docs/benchmarks.md");
        let sample = include_str!("sample_benchmarks.md");
        let err = |text: &str| parse(doc(), text).and_then(|t| speedups(doc(), &t).and(bandwidths(doc(), &t)));
        let cases = [
            (
                sample.replace("<!-- bench:train:end -->", ""),
                "docs/benchmarks.md:16: section bench:train: expected `<!-- bench:train:end -->` (its begin is on line 5), found \"<!-- bench:allreduce:begin -->\"",
            ),
            (
                sample.replacen("| --- | --- | --- | --- | --- | --- |\n", "", 1),
                "docs/benchmarks.md:9: section bench:train: expected the table's `| --- |` rule under its header, found \"| 1 process × 2 threads | 1427.7 (1095.5–1759.9) | 1148.6 (780.6–1516.7) | **0.80** | **missed** | 2 |\"",
            ),
            (
                sample.replace("| 2 | 1 MiB | 1,031", "| 2 | 1 MiB | 1 | 1,031"),
                "docs/benchmarks.md:22: section bench:allreduce: expected 9 cells as in the header on line 19, found 10",
            ),
            (
                sample.replace("**2.83**", "**fast**"),
                "docs/benchmarks.md:22: section bench:allreduce: expected a bold number like **1.23** in column \"speed-up\", found \"**fast**\"",
            ),
            (
                sample.replace("| 4 | 1 MiB |", "| 4 | 1 MB |"),
                "docs/benchmarks.md:24: section bench:allreduce: expected a size like \"4 KiB\" or \"64 MiB\", found \"1 MB\"",
            ),
            (
                sample.replace("| 0.21 | 0.12 |", "| 0.21 | n/a |"),
                "docs/benchmarks.md:24: section bench:allreduce: expected a number of GB/s in column \"gloo busbw GB/s\", found \"n/a\"",
            ),
            (
                sample.replace("bench:allreduce:", "bench:ring:"),
                "docs/benchmarks.md:0: section bench:allreduce: expected a table with columns \"processes\", \"size …\" and at least one \"… GB/s\"",
            ),
            (
                format!("{sample}\n<!-- bench:fanout:end -->\n"),
                "docs/benchmarks.md:60: outside any bench section: \"<!-- bench:fanout:end -->\" closes a section that was never begun",
            ),
            (
                sample.replace("<!-- bench:fanout:end -->", ""),
                "docs/benchmarks.md:54: section bench:fanout: expected `<!-- bench:fanout:end -->` before the end of the file",
            ),
        ];
        for (text, want) in cases {
            assert_eq!(err(&text).map(|_| ()).map_err(|e| e.to_string()), Err(want.to_string()));
        }
    }

    #[test]
    fn sizes_read_in_binary_units() {
        use super::*;
        assert_eq!(bytes("4 KiB"), Some(4096));
        assert_eq!(bytes("64 MiB"), Some(64 << 20));
        assert_eq!(bytes("512 B"), Some(512));
        assert_eq!(bytes("4KiB"), None);
        assert_eq!(bytes("4 kB"), None);
    }
}
