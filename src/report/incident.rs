//! Incident pictures: each rank's collective sequence numbers before a hang verdict, drawn at
//! the verdict by the server (from the records its analysis keeps) and again by
//! `flightdeck report RUN --incident` (from the records the history keeps), beside the report
//! the history stored at the verdict.
use super::{charts, ReportError};
use crate::record::{CollectiveRecord, Verdict, VerdictRecord};
use std::path::{Path, PathBuf};

/// One rank's line in the picture: the rank and its (seconds before the verdict, seq entered).
pub type RankLine = (u32, Vec<(f64, u64)>);

/// Records per rank the picture draws: as many as the analysis keeps.
pub const RECORDS: usize = 32;

/// One rank's records as (seconds before the verdict, seq entered), in the order given.
pub fn progress_points<'a>(v: &Verdict, records: impl Iterator<Item = &'a CollectiveRecord>) -> Vec<(f64, u64)> {
    let at = |us: u64| (us as f64 / 1000.0 - v.detected_ms as f64) / 1000.0;
    records.filter_map(|rec| rec.start_us.map(|us| (at(us), rec.seq))).collect()
}

/// The last `RECORDS` of a rank's stored records that had started by the verdict.
pub fn before_verdict(v: &Verdict, records: &[CollectiveRecord]) -> Vec<(f64, u64)> {
    let limit_us = v.detected_ms.saturating_mul(1000);
    let started: Vec<&CollectiveRecord> =
        records.iter().filter(|r| r.start_us.is_some_and(|us| us <= limit_us)).collect();
    progress_points(v, started[started.len().saturating_sub(RECORDS)..].iter().copied())
}

/// The report's section naming its picture (`png`: the file name beside the report).
pub fn progress_section(v: &Verdict, png: &str) -> String {
    let culprits: Vec<String> = v.culprits.iter().map(|c| c.rank.to_string()).collect();
    format!(
        "\n## Progress\n\nEach rank's collective sequence numbers before the verdict; the culprit (rank {}) in \
         red, its line flat from where it stopped.\n\n![each rank's collectives before the verdict]({png})\n",
        culprits.join(", ")
    )
}

/// Draws a verdict's picture into `dir`; returns the PNG's file name.
pub fn draw(dir: &Path, v: &Verdict, run_name: &str, ranks: &[RankLine]) -> Result<String, ReportError> {
    let stem = dir.join(v.chart_stem());
    let culprits: Vec<u32> = v.culprits.iter().map(|c| c.rank).collect();
    charts::progress(&stem, &format!("{}: {run_name}", v.kind.name()), ranks, &culprits)?;
    Ok(format!("{}.png", v.chart_stem()))
}

/// Writes one stored incident report into `dir` with its picture drawn again from `ranks`; a
/// report from before pictures gains its progress section ahead of the timeline. Returns the
/// report's path and the picture's (SVG, PNG).
pub fn rewrite(
    dir: &Path,
    record: &VerdictRecord,
    run_name: &str,
    ranks: &[RankLine],
) -> Result<Vec<PathBuf>, ReportError> {
    let v = &record.verdict;
    let mut md = record.report_md.clone().unwrap_or_default();
    let png = draw(dir, v, run_name, ranks)?;
    if !md.contains("\n## Progress\n") {
        let section = progress_section(v, &png);
        match md.find("\n## Timeline") {
            Some(at) => md.insert_str(at, &section),
            None => md.push_str(&section),
        }
    }
    let path = dir.join(v.report_file_name());
    std::fs::write(&path, md).map_err(|source| ReportError::Io { path: path.display().to_string(), source })?;
    let stem = dir.join(v.chart_stem());
    Ok(vec![path, stem.with_extension("svg"), stem.with_extension("png")])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::Step;
    use crate::record::{CollectiveOp, CollectiveState, VerdictKind};

    fn rec(seq: u64, start_ms: u64) -> CollectiveRecord {
        CollectiveRecord {
            seq,
            op: CollectiveOp::AllReduce,
            dtype: "float32".into(),
            elements: 1,
            bytes: 4,
            enqueue_us: start_ms * 1000,
            start_us: Some(start_ms * 1000),
            end_us: None,
            state: CollectiveState::Started,
            step: Step(seq),
        }
    }

    fn verdict(detected_ms: u64) -> Verdict {
        Verdict {
            kind: VerdictKind::NeverEntered,
            culprits: vec![],
            collective: None,
            waiting: vec![1],
            since_ms: detected_ms - 5_000,
            detected_ms,
            summary: "rank 0 never entered all_reduce #40".into(),
        }
    }

    #[test]
    fn the_picture_takes_the_last_records_started_by_the_verdict_in_seconds_before_it() {
        let v = verdict(100_000);
        // 50 records a second apart from t = 50 s, then one after the verdict.
        let mut records: Vec<CollectiveRecord> = (1..=50).map(|s| rec(s, 49_000 + s * 1000)).collect();
        records.push(rec(51, 101_000));
        let pts = before_verdict(&v, &records);
        assert_eq!(pts.len(), RECORDS);
        assert_eq!(pts.first(), Some(&(-32.0, 19)));
        assert_eq!(pts.last(), Some(&(-1.0, 50)), "the record after the verdict is left out");
    }

    #[test]
    fn a_report_without_a_progress_section_gains_one_before_its_timeline() {
        let v = verdict(100_000);
        let dir = tempfile::tempdir().expect("tempdir");
        let record = VerdictRecord {
            verdict: v.clone(),
            report_path: None,
            report_md: Some("# Incident\n\n## Culprits\n\n## Timeline (UTC)\n\n- x\n".into()),
        };
        match rewrite(dir.path(), &record, "tiny", &[(0, vec![(-2.0, 3)]), (1, vec![(-1.0, 4)])]) {
            Ok(files) => {
                let md = std::fs::read_to_string(&files[0]).expect("written");
                let progress = md.find("## Progress").expect("a progress section");
                assert!(progress < md.find("## Timeline").expect("timeline"), "{md}");
                assert!(md.contains(&format!("]({}.png)", v.chart_stem())), "{md}");
                assert!(files[1..].iter().all(|f| f.is_file()), "{files:?}");
            }
            // Without a font nothing is drawn, and the report says why rather than linking nothing.
            Err(ReportError::Draw { reason, .. }) => assert!(reason.contains("font"), "{reason}"),
            Err(e) => panic!("{e}"),
        }
    }
}
