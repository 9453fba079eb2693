//! The report's markdown: a summary table of the runs, the charts (PNG embedded, SVG linked),
//! the recipe keys that differ between runs, checkpoints, and events and verdicts as a timeline.
use super::charts::Charts;
use super::{across_ranks, goodput, RunData};
use crate::units;
use std::collections::BTreeMap;
use std::fmt::Write;

/// Rows of a run's timeline past this are counted, not listed.
const MAX_EVENTS: usize = 100;

pub fn report(runs: &[RunData], charts: &Charts) -> String {
    let mut md = String::new();
    let title = match runs {
        [one] => format!("# {} ({})", one.name(), one.id()),
        _ => format!("# {} runs compared", runs.len()),
    };
    let _ = writeln!(md, "{title}\n\nWritten by flightdeck {}.\n", env!("CARGO_PKG_VERSION"));
    summary(&mut md, runs);
    if runs.len() > 1 {
        differences(&mut md, runs);
    }
    goodput_table(&mut md, runs);
    match &charts.missing_font {
        Some(why) => {
            let _ = writeln!(md, "## Charts\n\nNot drawn: {why}.\n");
        }
        None => {
            for d in &charts.drawn {
                let _ = writeln!(md, "## {}\n\n![{}]({}.png)\n\n[SVG]({}.svg)\n", d.title, d.title, d.stem, d.stem);
            }
        }
    }
    for run in runs {
        bandwidth(&mut md, run, runs.len() > 1);
        checkpoints(&mut md, run, runs.len() > 1);
        timeline(&mut md, run, runs.len() > 1);
    }
    md
}

/// A table cell: pipes escaped, one line.
fn cell(s: &str) -> String {
    s.replace('|', "\\|").replace(['\n', '\r'], " ")
}

fn summary(md: &mut String, runs: &[RunData]) {
    md.push_str("| run | name | kind | status | world | steps | wall time | final loss | best loss | started from |\n");
    md.push_str("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
    for run in runs {
        let Some(d) = &run.detail else { continue };
        let r = &d.run;
        let recipe: serde_json::Value = serde_json::from_str(&r.recipe_json).unwrap_or_default();
        let kind = recipe.pointer("/kind").and_then(|k| k.as_str()).unwrap_or("-");
        let wall = r.ended_ms.map_or("running".to_string(), |end| units::duration_ms(end.saturating_sub(r.created_ms)));
        let mean = across_ranks(&run.loss);
        let final_loss = mean.last().map_or("-".into(), |p| format!("{:.4}", p.1));
        let best = mean.iter().map(|p| p.1).min_by(f64::total_cmp).map_or("-".into(), |b| format!("{b:.4}"));
        let from = match (&r.resumed_from, &r.init_from, &r.parent) {
            (Some(res), _, Some(p)) => format!("resumed {p}@{}", res.step),
            (_, Some(init), _) => {
                format!("init {}@{}", init.run.as_ref().map_or(init.path.clone(), |i| i.to_string()), init.step)
            }
            _ => "-".into(),
        };
        let _ = writeln!(
            md,
            "| {} | {} | {kind} | {} | {} | {}/{} | {wall} | {final_loss} | {best} | {} |",
            r.id,
            cell(&r.name),
            r.status.name(),
            r.world_size,
            r.step,
            r.steps_planned,
            cell(&from)
        );
    }
    md.push('\n');
}

/// Every leaf of a JSON value as `a.b.c` → its text.
fn flatten(prefix: &str, v: &serde_json::Value, out: &mut BTreeMap<String, String>) {
    match v {
        serde_json::Value::Object(map) => {
            for (k, v) in map {
                let key = if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") };
                flatten(&key, v, out);
            }
        }
        other => {
            out.insert(prefix.to_string(), other.to_string());
        }
    }
}

fn differences(md: &mut String, runs: &[RunData]) {
    let recipes: Vec<BTreeMap<String, String>> = runs
        .iter()
        .map(|r| {
            let mut out = BTreeMap::new();
            let v = r.detail.as_ref().and_then(|d| serde_json::from_str(&d.run.recipe_json).ok()).unwrap_or_default();
            flatten("", &v, &mut out);
            out
        })
        .collect();
    let mut keys: Vec<&String> = recipes.iter().flat_map(|r| r.keys()).collect();
    keys.sort();
    keys.dedup();
    let differ: Vec<&&String> =
        keys.iter().filter(|k| recipes.iter().any(|r| r.get(**k) != recipes[0].get(**k))).collect();
    md.push_str("## Recipe keys that differ\n\n");
    if differ.is_empty() {
        md.push_str("None: the runs have the same recipe.\n\n");
        return;
    }
    let names: Vec<String> = runs.iter().map(|r| format!("{} {}", cell(&r.name()), r.id())).collect();
    let _ = writeln!(md, "| key | {} |", names.join(" | "));
    let _ = writeln!(md, "| --- |{}", " --- |".repeat(runs.len()));
    for k in differ {
        let vals: Vec<String> = recipes.iter().map(|r| cell(r.get(*k).map_or("-", String::as_str))).collect();
        let _ = writeln!(md, "| `{k}` | {} |", vals.join(" | "));
    }
    md.push('\n');
}

/// Where each finished run's wall time went (`goodput`), when its step times are known.
fn goodput_table(md: &mut String, runs: &[RunData]) {
    let split: Vec<(String, crate::goodput::Goodput)> = runs
        .iter()
        .zip(goodput::resumed_after(runs))
        .filter_map(|(r, after)| Some((r.id(), goodput::of_run(r, after)?)))
        .collect();
    if split.is_empty() {
        return;
    }
    md.push_str(
        "## Goodput\n\nWall time split: steps that count, failed work (steps redone after a resume by a later run \
         in this report), checkpoints' blocking time, a hang from its last progress to the run's end, and the \
         rest (start-up, teardown, evaluation, waits), as `flightdeck show` splits a lineage. Goodput = \
         productive ÷ wall.\n\n",
    );
    md.push_str("| run | wall | productive | failed (redone) | checkpoints | stalled | other | goodput |\n");
    md.push_str("| --- | --- | --- | --- | --- | --- | --- | --- |\n");
    let ms = |v: f64| if v < 1000.0 { format!("{v:.0} ms") } else { format!("{:.2} s", v / 1000.0) };
    for (id, g) in split {
        let _ = writeln!(
            md,
            "| {id} | {} | {} | {} | {} | {} | {} | **{:.1} %** |",
            ms(g.wall_ms),
            ms(g.productive_ms),
            ms(g.failed_ms),
            ms(g.checkpoint_ms),
            ms(g.stalled_ms),
            ms(g.other_ms),
            100.0 * g.ratio
        );
    }
    md.push('\n');
}

/// The collectives' bandwidth per op and size (the chart's numbers).
fn bandwidth(md: &mut String, run: &RunData, named: bool) {
    if run.bandwidth.is_empty() {
        return;
    }
    let who = if named { format!(" of {}", run.id()) } else { String::new() };
    let _ = writeln!(
        md,
        "## Collectives{who}\n\nFrom the flight records: each completed collective's time from start to end on \
         each rank, which includes waiting for the last rank to arrive; median and p90 over ranks and steps. \
         busbw = algbw × the op's bus factor (nccl-tests: 2(n−1)/n for all-reduce).\n"
    );
    md.push_str("| op | size | count | median | p90 | algbw GB/s | busbw GB/s |\n");
    md.push_str("| --- | --- | --- | --- | --- | --- | --- |\n");
    for b in &run.bandwidth {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {:.0} µs | {:.0} µs | {} | {} |",
            b.op.name(),
            units::bytes(b.bytes),
            b.count,
            b.median_us,
            b.p90_us,
            significant(b.algbw_gbps),
            significant(b.busbw_gbps)
        );
    }
    md.push('\n');
}

/// Three significant digits, without an exponent: `2.34`, `0.0123`.
fn significant(v: f64) -> String {
    if v == 0.0 || !v.is_finite() {
        return format!("{v}");
    }
    let decimals = (2 - v.abs().log10().floor() as i32).clamp(0, 12) as usize;
    format!("{v:.decimals$}")
}

fn checkpoints(md: &mut String, run: &RunData, named: bool) {
    if run.checkpoints.is_empty() {
        return;
    }
    let who = if named { format!(" of {}", run.id()) } else { String::new() };
    let _ = writeln!(md, "## Checkpoints{who}\n\n| step | size | loss | blocking | written in | verified |");
    md.push_str("| --- | --- | --- | --- | --- | --- |\n");
    for c in &run.checkpoints {
        let loss = c.loss.map_or("-".into(), |l| format!("{l:.4}"));
        let verified = if c.verified {
            format!("yes ({})", c.checked)
        } else {
            format!("no: {}", c.problem.as_deref().unwrap_or("-"))
        };
        let _ = writeln!(
            md,
            "| {} | {} | {loss} | {:.1} ms | {:.1} ms | {} |",
            c.step,
            units::bytes(c.bytes),
            c.blocking_ms,
            c.write_ms,
            cell(&verified)
        );
    }
    md.push('\n');
}

fn timeline(md: &mut String, run: &RunData, named: bool) {
    let Some(d) = &run.detail else { return };
    let who = if named { format!(" of {}", run.id()) } else { String::new() };
    let _ = writeln!(md, "## Events and verdicts{who}\n");
    for v in &d.verdicts {
        let _ = writeln!(md, "- **{}**: {}", v.verdict.kind.name(), cell(&v.verdict.summary));
        if let Some(p) = &v.report_path {
            let _ = writeln!(md, "  (incident report: `{p}`)");
        }
    }
    if !d.verdicts.is_empty() {
        md.push('\n');
    }
    md.push_str("| time | kind | rank | what |\n| --- | --- | --- | --- |\n");
    for e in d.events.iter().take(MAX_EVENTS) {
        let t = units::duration_ms(e.t_ms.saturating_sub(d.run.created_ms));
        let rank = e.rank.map_or("-".into(), |r| r.to_string());
        let _ = writeln!(md, "| +{t} | {} | {rank} | {} |", e.kind.name(), cell(&e.text));
    }
    if d.events.len() > MAX_EVENTS {
        let _ = writeln!(md, "\n… and {} more events (`flightdeck show {}`).", d.events.len() - MAX_EVENTS, d.run.id);
    }
    md.push('\n');
}

#[cfg(test)]
mod tests {
    #[test]
    fn recipes_flatten_to_dotted_keys_and_cells_stay_one_line() {
        let mut out = std::collections::BTreeMap::new();
        super::flatten("", &serde_json::json!({"train": {"lr": 0.001, "steps": 30}, "name": "a"}), &mut out);
        assert_eq!(out.keys().collect::<Vec<_>>(), ["name", "train.lr", "train.steps"]);
        assert_eq!(out["train.lr"], "0.001");
        assert_eq!(super::cell("a|b\nc"), "a\\|b c");
        assert_eq!([2.344, 0.012345, 123.4, 0.0].map(super::significant), ["2.34", "0.0123", "123", "0"]);
    }
}
