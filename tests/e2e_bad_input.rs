//! Bad input through the real binary: every invalid recipe exits 2 with its message and
//! writes nothing to the history.
mod common;
use common::*;

#[test]
fn every_invalid_recipe_exits_2_with_its_message_and_records_nothing() {
    let db = Db::new();
    let dir = repo().join("tests/fixtures/recipes/bad");
    let expected = std::fs::read_to_string(dir.join("EXPECTED.txt")).expect("EXPECTED.txt");
    let mut checked = 0;
    for line in expected.lines().filter(|l| !l.trim().is_empty() && !l.starts_with('#')) {
        let (file, needle) = line.split_once('\t').expect("file<TAB>substring");
        let path = dir.join(file);
        let out = db.run(&["run", path.to_str().unwrap(), "--headless"]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{file}: {stderr}");
        assert!(stderr.contains(needle), "{file}: expected {needle:?} in {stderr}");
        assert!(stderr.contains(file), "{file}: the message names the file: {stderr}");
        checked += 1;
    }
    assert!(checked >= 10, "only {checked} cases");
    // `--set` on a key that does not exist, and an unparsable value.
    let good = recipe("tiny-gpt.toml");
    let out = db.run(&["run", good.to_str().unwrap(), "--headless", "--set", "model.n_heads=4"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("model.n_heads"));
    let out = db.run(&["run", good.to_str().unwrap(), "--headless", "--set", "train.steps"]);
    assert_eq!(out.status.code(), Some(2));
    // Nothing reached the store: no server was even needed, and the history is empty.
    let runs = db.json(&["runs", "--json"]);
    assert_eq!(runs["runs"].as_array().unwrap().len(), 0, "{runs}");
    db.finish();
}

#[test]
fn an_unknown_run_is_bad_input_not_a_crash() {
    let db = Db::new();
    let out = db.run(&["show", "no-such-run"]);
    assert_eq!(out.status.code(), Some(2));
    let said = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(said.contains("no run matches"), "{said}");
    // attach says the same before it needs a terminal (this test has none).
    let out = db.run(&["attach", "no-such-run"]);
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stderr), said);
    db.finish();
}

#[test]
fn doctor_reports_libtorch_and_says_nvml_is_absent_without_failing() {
    let db = Db::new();
    let out = db.run(&["doctor"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.lines().any(|l| l.starts_with("libtorch") && l.contains(" ok ")), "{text}");
    assert!(text.lines().any(|l| l.starts_with("nvml")), "{text}");
}

/// Output cut short by its reader (`| head -1`) ends the command quietly: no panic and no
/// `Broken pipe` error line, as with `cat`.
#[test]
fn a_reader_that_goes_away_ends_a_printing_command_quietly() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("big.log");
    let line = std::fs::read_to_string(common::repo().join("tests/fixtures/logs/deepspeed.log")).expect("fixture");
    // Far more output than a pipe holds, so the writer meets the closed pipe.
    std::fs::write(&log, line.repeat(2000)).expect("write");
    let script = format!("{} parse-log {} | head -1", common::bin().display(), log.display());
    let out = std::process::Command::new("sh").arg("-c").arg(&script).output().expect("sh");
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "{err}");
    assert_eq!(String::from_utf8_lossy(&out.stdout).lines().count(), 1);
    assert!(!err.contains("panicked") && !err.contains("Broken pipe"), "{err}");
}
