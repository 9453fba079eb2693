//! `flightdeck report` end to end: a finished 2-rank run, its resume and a third run with
//! another learning rate, reported alone and compared; every image the markdown names exists,
//! each PNG is the chart's size and not blank, the resume is marked, and the recipe key that
//! differs is listed.
mod common;

use common::charts::{check_images, have_font, FONT};
use common::{ok, recipe, run_id, Db};
use std::path::Path;

#[test]
fn a_run_its_resume_and_a_comparison_are_reported_with_charts_that_exist_and_are_not_blank() {
    let db = Db::new();
    let r = recipe("tiny-gpt.toml");
    let sets = ["train.steps=30", "checkpoint.every=10", "cluster.ranks_per_node=2"];
    let launch = |extra: &[&str]| {
        let mut args = vec!["run", r.to_str().unwrap(), "--headless"];
        for s in sets.iter().chain(extra) {
            args.extend(["--set", s]);
        }
        run_id(&ok(&db.run(&args)))
    };
    let parent = launch(&[]);
    let child = run_id(&ok(&db.run(&["resume", &parent, "--step", "20", "--headless"])));
    let other = launch(&["train.lr=1e-3"]);
    let out = tempfile::tempdir().expect("tempdir");
    let charts = have_font();
    if !charts {
        common::skipped(file!(), &format!("{FONT} is missing (fonts-dejavu-core): the charts' checks are skipped"));
    }

    let one = out.path().join("one");
    let said = ok(&db.run(&["report", &parent, "--per-rank", "--out", one.to_str().unwrap()]));
    assert!(said.starts_with("report written: "), "{said}");
    let md = std::fs::read_to_string(one.join("report.md")).expect("report.md");
    assert!(md.starts_with(&format!("# tiny-gpt ({parent})")), "{md}");
    let row = md.lines().find(|l| l.starts_with(&format!("| {parent} |"))).expect("the summary row");
    assert!(row.contains("| pretrain | succeeded | 2 | 30/30 |"), "{row}");
    assert!(md.contains("## Checkpoints") && md.contains("| 10 |") && md.contains("| 30 |"), "{md}");
    assert!(md.contains("| run_started |") && md.contains("| checkpoint_saved |"), "{md}");
    // The ring's gradient all-reduce from the flight records, per size, and the goodput split.
    let collectives = md.split("## Collectives").nth(1).unwrap_or_else(|| panic!("a collectives table:\n{md}"));
    assert!(collectives.contains("\n| all_reduce | "), "{collectives}");
    let goodput = md.lines().find(|l| l.starts_with(&format!("| {parent} |")) && l.ends_with("%** |"));
    let pct: f64 = goodput
        .and_then(|l| l.rsplit("**").nth(1))
        .and_then(|g| g.trim_end_matches(" %").parse().ok())
        .unwrap_or_else(|| panic!("a goodput row:\n{md}"));
    assert!(pct > 0.0 && pct <= 100.0, "goodput {pct}");
    if charts {
        assert!(md.contains("## Loss (thin lines: each rank)"), "--per-rank: {md}");
        let files = check_images(&one, &md);
        for stem in ["loss", "step_time", "throughput", "bandwidth"] {
            assert!(
                files.contains(&format!("{stem}.png")) && files.contains(&format!("{stem}.svg")),
                "{stem}: {files:?}"
            );
        }
    } else {
        assert!(md.contains("Not drawn: no TrueType font"), "{md}");
    }

    let resumed = out.path().join("resumed");
    ok(&db.run(&["report", &child, "--out", resumed.to_str().unwrap()]));
    let md = std::fs::read_to_string(resumed.join("report.md")).expect("report.md");
    assert!(md.contains(&format!("resumed {parent}@20")), "{md}");
    if charts {
        check_images(&resumed, &md);
        let svg = std::fs::read_to_string(resumed.join("loss.svg")).expect("loss.svg");
        assert!(svg.contains("resumed from step 20"), "the resume is marked on the loss chart");
    }

    // The lineage together: the parent's steps after the resume point were computed again.
    let lineage = out.path().join("lineage");
    ok(&db.run(&["report", &parent, &child, "--out", lineage.to_str().unwrap()]));
    let md = std::fs::read_to_string(lineage.join("report.md")).expect("report.md");
    let row = md.lines().find(|l| l.starts_with(&format!("| {parent} |")) && l.ends_with("%** |")).expect("goodput");
    let recomputed = row.split(" | ").nth(3).expect("the failed (redone) cell");
    assert!(recomputed != "0 ms", "steps 21-30 of the parent were redone: {row}");

    let cmp = out.path().join("cmp");
    ok(&db.run(&["report", &parent, &other, "--out", cmp.to_str().unwrap()]));
    let md = std::fs::read_to_string(cmp.join("report.md")).expect("report.md");
    assert!(md.starts_with("# 2 runs compared"), "{md}");
    let lr = md.lines().find(|l| l.starts_with("| `train.lr` |")).unwrap_or_else(|| panic!("train.lr differs:\n{md}"));
    assert!(lr.contains("0.003") && lr.contains("0.001"), "{lr}");
    if charts {
        let files = check_images(&cmp, &md);
        assert!(files.contains(&"compare_loss.png".to_string()), "{files:?}");
        assert!(files.contains(&"loss_1.svg".to_string()), "each run's own charts too: {files:?}");
    }

    // Bad input: exit 2 with the reason.
    for (args, says) in [
        (vec!["report", "nope", "--out", "/tmp/never-written"], "nope"),
        (vec!["report", &parent, "--out", one.to_str().unwrap()], "is not empty"),
        // "(no verdicts ...)", or "(verdicts straggler; ...)" when a busy machine slowed a rank.
        (vec!["report", &parent, "--incident"], "has no incident report ("),
        (vec!["report", &parent, &child, "--incident"], "one run at a time"),
    ] {
        let o = db.run(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        assert!(String::from_utf8_lossy(&o.stderr).contains(says), "{args:?}: {}", String::from_utf8_lossy(&o.stderr));
    }
    assert!(!Path::new("/tmp/never-written").exists());
    db.finish();
}
