//! `flightdeck report` end to end: a finished 2-rank run, its resume and a third run with
//! another learning rate, reported alone and compared; every image the markdown names exists,
//! each PNG is the chart's size and not blank, the resume is marked, and the recipe key that
//! differs is listed.
mod common;

use common::{ok, recipe, run_id, Db};
use std::path::Path;

const FONT: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";

/// The files `report.md` links to (`![..](X)` and `[SVG](X)`).
fn links(md: &str) -> Vec<String> {
    md.split("](").skip(1).filter_map(|rest| rest.split(')').next()).map(str::to_string).collect()
}

/// Checks every linked file exists and every PNG is a 960×420 chart with real content;
/// returns the linked file names.
fn check_images(dir: &Path, md: &str) -> Vec<String> {
    let files = links(md);
    assert!(!files.is_empty(), "no charts linked:\n{md}");
    for f in &files {
        let path = dir.join(f);
        assert!(path.is_file(), "{f} is linked but missing");
        if f.ends_with(".png") {
            let img = image::open(&path).unwrap_or_else(|e| panic!("{f}: {e}")).to_rgb8();
            assert_eq!(img.dimensions(), (960, 420), "{f}");
            let lum: Vec<f64> = img.pixels().map(|p| f64::from(p[0]) + f64::from(p[1]) + f64::from(p[2])).collect();
            let mean = lum.iter().sum::<f64>() / lum.len() as f64;
            let var = lum.iter().map(|l| (l - mean).powi(2)).sum::<f64>() / lum.len() as f64;
            let dark = lum.iter().filter(|&&l| l < 600.0).count();
            assert!(var > 100.0 && dark > 2_000, "{f} looks blank: variance {var:.1}, {dark} drawn pixels");
        }
    }
    files
}

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
    let charts = Path::new(FONT).exists();
    if !charts {
        common::skipped(file!(), &format!("{FONT} is missing (fonts-dejavu-core): the charts' checks are skipped"));
    }

    let one = out.path().join("one");
    let said = ok(&db.run(&["report", &parent, "--out", one.to_str().unwrap()]));
    assert!(said.starts_with("report written: "), "{said}");
    let md = std::fs::read_to_string(one.join("report.md")).expect("report.md");
    assert!(md.starts_with(&format!("# tiny-gpt ({parent})")), "{md}");
    let row = md.lines().find(|l| l.starts_with(&format!("| {parent} |"))).expect("the summary row");
    assert!(row.contains("| pretrain | succeeded | 2 | 30/30 |"), "{row}");
    assert!(md.contains("## Checkpoints") && md.contains("| 10 |") && md.contains("| 30 |"), "{md}");
    assert!(md.contains("| run_started |") && md.contains("| checkpoint_saved |"), "{md}");
    if charts {
        let files = check_images(&one, &md);
        for stem in ["loss", "step_time", "throughput"] {
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
    ] {
        let o = db.run(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        assert!(String::from_utf8_lossy(&o.stderr).contains(says), "{args:?}: {}", String::from_utf8_lossy(&o.stderr));
    }
    assert!(!Path::new("/tmp/never-written").exists());
    db.finish();
}
