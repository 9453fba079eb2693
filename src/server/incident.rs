//! The incident report: a markdown account of a hang, written into the run's history.
//!
//! Rendered from the analysis' view of the ranks (phases, flight records, last samples) and,
//! once they arrive, the grouped stacks. Written right at the verdict (so a report exists even
//! when no stacks can be read) and again when the stacks come back.
use crate::analysis::{Analyzer, RankState};
use crate::protocol::{CollectiveState, StackReport, Verdict};
use crate::store::RunRecord;
use std::fmt::Write;

/// Where the stacks stand when the report is rendered.
pub enum Stacks<'a> {
    Pending,
    Unavailable(String),
    Grouped(&'a StackReport),
}

/// `12:03:07.250 UTC`.
fn clock(ms: u64) -> String {
    let (_, _, _, h, mi, s) = crate::ids::civil_from_unix((ms / 1000) as i64);
    format!("{h:02}:{mi:02}:{s:02}.{:03}", ms % 1000)
}

fn date(ms: u64) -> String {
    let (y, mo, d, ..) = crate::ids::civil_from_unix((ms / 1000) as i64);
    format!("{y:04}-{mo:02}-{d:02}")
}

/// Ranks a report shows one by one: a report about a thousand ranks would be megabytes that no
/// one reads (and more than a client's frame carries); the culprits come first.
const REPORT_RANKS: usize = 64;

/// The ranks the report and its picture show (the culprits, then the others in order, up to
/// [`REPORT_RANKS`]), in rank order, and how many were left out.
fn shown<'a>(v: &Verdict, analyzer: &'a Analyzer) -> (Vec<(u32, &'a RankState)>, usize) {
    let all = analyzer.ranks();
    let culprits = v.culprits.iter().map(|c| c.rank);
    let mut keep: Vec<u32> = culprits.chain(all.keys().copied()).collect();
    let mut seen = std::collections::BTreeSet::new();
    keep.retain(|k| all.contains_key(k) && seen.insert(*k));
    keep.truncate(REPORT_RANKS);
    keep.sort_unstable();
    let out: Vec<(u32, &RankState)> = keep.iter().filter_map(|k| all.get(k).map(|r| (*k, r))).collect();
    let left = all.len() - out.len();
    (out, left)
}

/// Each rank's collectives as the report's picture draws them, from the records the analysis
/// keeps.
pub fn progress(v: &Verdict, analyzer: &Analyzer) -> Vec<crate::report::incident::RankLine> {
    let (ranks, _) = shown(v, analyzer);
    ranks.iter().map(|(k, r)| (*k, crate::report::incident::progress_points(v, r.records.iter()))).collect()
}

/// `chart`: the picture's PNG beside the report (its file name), when it could be drawn.
pub fn render(record: &RunRecord, v: &Verdict, analyzer: &Analyzer, stacks: Stacks<'_>, chart: Option<&str>) -> String {
    let mut md = String::new();
    let (ranks, left) = shown(v, analyzer);
    // Writing to a String cannot fail; the results are ignored below for that reason.
    let _ = writeln!(md, "# Incident: {} in run {} ({})\n", v.kind.name(), record.id, record.name);
    let _ = writeln!(md, "**{}**\n", v.summary);
    let _ = writeln!(md, "- detected: {} {} UTC", date(v.detected_ms), clock(v.detected_ms));
    let _ = writeln!(
        md,
        "- condition since: {} UTC ({:.1} s before detection)",
        clock(v.since_ms),
        v.duration_ms() as f64 / 1e3
    );
    let p50 = analyzer.p50_step_ms().map_or("-".to_string(), |p| format!("{p:.1} ms"));
    let _ = writeln!(
        md,
        "- hang threshold now: {:.1} s (median step time {p50})",
        analyzer.hang_threshold_ms() as f64 / 1e3
    );
    let _ = writeln!(
        md,
        "- run: recipe {} ({}), world size {}, hosts {}",
        record.recipe_name,
        record.recipe_path,
        record.world_size,
        record.hosts.join(", ")
    );
    if let Some(c) = &v.collective {
        let _ = writeln!(
            md,
            "- collective: {} #{} of {} elements ({} bytes), step {}",
            c.op.name(),
            c.seq,
            c.elements,
            c.bytes,
            c.step.0
        );
    }
    let waiting: Vec<String> = v.waiting.iter().map(u32::to_string).collect();
    let _ = writeln!(md, "- ranks waiting: {}\n", if waiting.is_empty() { "-".into() } else { waiting.join(", ") });

    let _ = writeln!(md, "## Culprits\n\n| rank | host | pid | phase | step | last seq | what |\n| --- | --- | --- | --- | --- | --- | --- |");
    for c in &v.culprits {
        let pid = c.pid.map_or("-".into(), |p| p.to_string());
        let phase = c.phase.map_or("-", |p| p.name());
        let _ =
            writeln!(md, "| {} | {} | {pid} | {phase} | {} | {} | {} |", c.rank, c.host, c.step, c.last_seq, c.detail);
    }

    if let Some(png) = chart {
        md.push_str(&crate::report::incident::progress_section(v, png));
    }

    let _ = writeln!(md, "\n## Timeline (UTC)\n");
    for (t, what) in timeline(v, &ranks) {
        let _ = writeln!(md, "- {} {what}", clock(t));
    }

    let _ = writeln!(md, "\n## Phases\n");
    if left > 0 {
        let _ = writeln!(
            md,
            "{} of {} ranks here and below (the culprits first); every rank: `flightdeck show {} --json`.\n",
            ranks.len(),
            ranks.len() + left,
            record.id
        );
    }
    let _ = writeln!(
        md,
        "| rank | host | pid | phase | since | step | exit |\n| --- | --- | --- | --- | --- | --- | --- |"
    );
    for (k, r) in &ranks {
        let exit = r.exit.as_ref().map_or("-".into(), |e| e.describe());
        let _ = writeln!(
            md,
            "| {k} | {} | {} | {} | {} | {} | {exit} |",
            r.host,
            r.pid.map_or("-".into(), |p| p.to_string()),
            r.phase.map_or("-", |p| p.name()),
            if r.phase_since_ms > 0 { clock(r.phase_since_ms) } else { "-".into() },
            r.step
        );
    }

    let _ = writeln!(md, "\n## Last collectives per rank\n\n| rank | seq | op | elements | bytes | step | state | started | took |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    for (k, r) in &ranks {
        for rec in r.records.iter().rev().take(4).collect::<Vec<_>>().into_iter().rev() {
            let start = rec.start_us.map_or("-".into(), |u| clock(u / 1000));
            let took = match (rec.start_us, rec.end_us) {
                (Some(a), Some(b)) => format!("{:.2} ms", b.saturating_sub(a) as f64 / 1e3),
                _ => "-".into(),
            };
            let state = match rec.state {
                CollectiveState::Scheduled => "scheduled",
                CollectiveState::Started => "**started**",
                CollectiveState::Completed => "completed",
            };
            let _ = writeln!(
                md,
                "| {k} | {} | {} | {} | {} | {} | {state} | {start} | {took} |",
                rec.seq,
                rec.op.name(),
                rec.elements,
                rec.bytes,
                rec.step.0
            );
        }
    }

    if ranks.iter().any(|(_, r)| r.torch.is_some()) {
        render_flight_recorders(&mut md, &ranks);
    }

    let _ = writeln!(md, "\n## Stacks\n");
    match stacks {
        Stacks::Pending => {
            let _ = writeln!(
                md,
                "Being read; this report is rewritten when they arrive. By hand: `flightdeck stacks {}`.",
                record.id
            );
        }
        Stacks::Unavailable(why) => {
            let _ = writeln!(md, "Not available: {why}");
        }
        Stacks::Grouped(report) => render_stacks(&mut md, report),
    }

    let _ = writeln!(md, "\n## Last samples\n\n| rank | step | loss | step ms | data ms | fwd ms | bwd ms | comm ms | opt ms | cpu % | rss MiB |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    for (k, r) in &ranks {
        let _ = writeln!(md, "| {k} | {} |", samples(r));
    }
    let _ = writeln!(
        md,
        "\n## Next\n\n- `flightdeck stacks {0}` reads the stacks again; `flightdeck kill {0}` ends the run.",
        record.id
    );
    md
}

/// PyTorch's flight recorders as the shims last dumped them: per rank and process group the last
/// enqueued and completed sequence numbers, the collectives still open with their call sites, and
/// where the main thread was.
fn render_flight_recorders(md: &mut String, ranks: &[(u32, &RankState)]) {
    let _ = writeln!(
        md,
        "\n## Flight recorders (PyTorch)\n\n| rank | group | last enqueued | last completed | open collectives |\n| --- | --- | --- | --- | --- |"
    );
    for (k, r) in ranks {
        let Some(snap) = &r.torch else { continue };
        for g in &snap.dump.groups {
            let open: Vec<String> = snap
                .dump
                .pending()
                .filter(|e| e.group == g.name)
                .map(|e| {
                    let site = e.call_site().map(|f| format!(" at {}", f.site())).unwrap_or_default();
                    format!("#{} {}{site}", e.seq, e.shape())
                })
                .collect();
            let desc = if g.desc.is_empty() { String::new() } else { format!(" ({})", g.desc) };
            let open = if open.is_empty() { "-".to_string() } else { open.join("; ") };
            let _ = writeln!(md, "| {k} | {}{desc} | {} | {} | {open} |", g.name, g.last_enqueued, g.last_completed);
        }
    }
    for (k, r) in ranks {
        let Some(snap) = r.torch.as_ref().filter(|s| !s.main_stack.is_empty()) else { continue };
        let _ = writeln!(md, "\nrank {k}'s main thread (the shim's last look, innermost first):\n\n```");
        for f in &snap.main_stack {
            let _ = writeln!(md, "  {} ({}:{})", f.name, f.file, f.line);
        }
        let _ = writeln!(md, "```");
    }
}

fn samples(r: &RankState) -> String {
    let f = |x: Option<f64>, d: usize| x.map_or("-".into(), |v| format!("{v:.d$}"));
    let m = r.last_metrics.as_ref();
    [
        m.map_or("-".into(), |m| m.step.0.to_string()),
        f(m.map(|m| m.loss), 4),
        f(m.map(|m| m.step_time_ms), 1),
        f(m.map(|m| m.data_ms), 1),
        f(m.map(|m| m.fwd_ms), 1),
        f(m.map(|m| m.bwd_ms), 1),
        f(m.map(|m| m.comm_ms), 1),
        f(m.map(|m| m.opt_ms), 1),
        f(r.cpu_pct, 0),
        f(r.rss_bytes.map(|b| b as f64 / (1u64 << 20) as f64), 0),
    ]
    .join(" | ")
}

/// The last moves of every rank, then the verdict, in time order.
fn timeline(v: &Verdict, ranks: &[(u32, &RankState)]) -> Vec<(u64, String)> {
    let mut t: Vec<(u64, String)> = Vec::new();
    for (k, r) in ranks {
        for rec in r.records.iter().rev().take(2) {
            if let Some(s) = rec.start_us {
                t.push((s / 1000, format!("rank {k} entered {} #{} (step {})", rec.op.name(), rec.seq, rec.step.0)));
            }
            if let Some(e) = rec.end_us {
                t.push((e / 1000, format!("rank {k} completed {} #{}", rec.op.name(), rec.seq)));
            }
        }
        if let Some(p) = r.phase.filter(|_| r.phase_since_ms > 0) {
            t.push((r.phase_since_ms, format!("rank {k} reported phase {} of step {} (its last)", p.name(), r.step)));
        }
        if let Some(e) = &r.exit {
            t.push((r.exit_ms, format!("rank {k} exited: {}", e.describe())));
        }
    }
    t.push((v.since_ms, "last progress of any rank (the condition starts)".into()));
    t.push((v.detected_ms, format!("verdict: {}", v.kind.name())));
    t.sort_by_key(|x| x.0);
    t
}

fn render_stacks(md: &mut String, report: &StackReport) {
    for (rank, pid, tool, ms) in &report.timings {
        let _ = writeln!(md, "- rank {rank} (pid {pid}): {} in {ms} ms", tool.map_or("no tool", |t| t.name()));
    }
    for g in &report.groups {
        let ranks: Vec<String> = g.ranks.iter().map(u32::to_string).collect();
        let n = g.ranks.len();
        let _ = writeln!(
            md,
            "\n### {} {} ({n} {})\n\n```",
            if n == 1 { "rank" } else { "ranks" },
            ranks.join(", "),
            if n == 1 { "rank" } else { "ranks" }
        );
        for t in &g.threads {
            let _ =
                writeln!(md, "thread {}{}", t.tid, t.name.as_ref().map(|n| format!(" \"{n}\"")).unwrap_or_default());
            for (i, f) in t.frames.iter().enumerate() {
                let at = f.location.as_ref().map(|l| format!("  at {l}")).unwrap_or_default();
                let _ = writeln!(md, "  #{i:<2} {}{at}", f.function);
            }
        }
        let _ = writeln!(md, "```");
    }
    for (rank, why) in &report.failures {
        let _ = writeln!(md, "\n- rank {rank}: no stacks: {why}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::{Rank, RunId};
    use crate::protocol::{AgentEvent, VerdictKind};

    #[test]
    fn a_report_on_many_ranks_shows_the_culprits_and_a_bounded_number_of_others() {
        let mut a = Analyzer::new(crate::analysis::Config::from_recipe(&Default::default()), 100, 1_000);
        for r in 0..100 {
            let started =
                AgentEvent::RankStarted { rank: Rank(r), local_rank: r % 8, pid: 10 + r, host: format!("n{}", r / 8) };
            a.observe(1_000, (r / 8) as usize, &started);
        }
        let culprit = crate::protocol::Culprit {
            rank: 99,
            host: "n12".into(),
            pid: Some(109),
            phase: None,
            step: 3,
            last_seq: 0,
            detail: "on lost node n12".into(),
        };
        let v = Verdict {
            kind: VerdictKind::NodeLost,
            culprits: vec![culprit],
            collective: None,
            waiting: (0..96).collect(),
            since_ms: 1_000,
            detected_ms: 11_000,
            summary: "node n12 lost".into(),
        };
        let meta = crate::store::RunMeta {
            name: "big".into(),
            recipe_name: "r".into(),
            recipe_path: "-".into(),
            recipe_json: "{}".into(),
            world_size: 100,
            steps_planned: 10,
        };
        let record =
            RunRecord::starting(RunId("20260101T000000-big".into()), meta, vec!["n0".into()], Vec::new(), None);
        let md = render(&record, &v, &a, Stacks::Unavailable("lost".into()), None);
        assert!(md.contains("64 of 100 ranks here and below (the culprits first)"), "{md}");
        let phases = md.split("## Phases").nth(1).and_then(|p| p.split("## Last collectives").next()).unwrap();
        assert!(phases.contains("| 99 | n12 | 109 |"), "the culprit is shown: {phases}");
        assert!(phases.contains("| 62 | n7 |") && !phases.contains("| 63 | n7 |"), "63 others, in order: {phases}");
        assert_eq!(progress(&v, &a).len(), 64, "the picture draws the same ranks");
    }
}
