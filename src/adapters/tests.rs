//! The adapters against their fixtures (tests/fixtures/logs, each written from its framework's own format strings), the traps, and random bytes.
use super::*;
use std::path::PathBuf;

fn fixtures() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/logs"))
}

fn read(choice: Choice, bytes: &[u8]) -> Vec<Record> {
    let mut reader = LogReader::new(choice);
    let mut out = Vec::new();
    for (i, line) in bytes.split(|b| *b == b'\n').enumerate() {
        out.extend(reader.push(i as u64 + 1, line));
    }
    out.extend(reader.finish());
    out
}

fn as_json(records: &[Record]) -> Vec<serde_json::Value> {
    records.iter().map(json::to_json).collect()
}

/// Every `*.log` under the fixtures, in subfolders too (`NAME/VERSION.log`), in a stable order.
fn fixture_logs() -> Vec<PathBuf> {
    fn walk(dir: &std::path::Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).expect("fixtures") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "log") {
                out.push(path);
            }
        }
    }
    let mut out = Vec::new();
    walk(&fixtures(), &mut out);
    out.sort();
    out
}

/// Where two record lists part: the first differing pair, for a failure message that fits.
fn first_difference(got: &[serde_json::Value], want: &[serde_json::Value]) -> String {
    let at = got.iter().zip(want).position(|(a, b)| a != b).unwrap_or(got.len().min(want.len()));
    format!(
        "{} records, {} expected; first difference:\n  got  {}\n  want {}",
        got.len(),
        want.len(),
        got.get(at).map_or("(none)".to_string(), ToString::to_string),
        want.get(at).map_or("(none)".to_string(), ToString::to_string)
    )
}

/// The format a fixture is named for: its file's stem (`hf.log`) or its folder (`hf/trl-0.9.log`).
fn own_format(path: &std::path::Path) -> Option<Choice> {
    let stem = path.file_stem().and_then(|s| s.to_str())?;
    let folder = path.parent().and_then(|p| p.file_name()).and_then(|s| s.to_str())?;
    stem.parse().ok().or_else(|| folder.parse().ok()).filter(|c| *c != Choice::Auto && *c != Choice::None)
}

#[test]
fn every_fixture_reads_as_its_expected_records_in_auto_and_with_its_own_format() {
    let mut checked = 0;
    for path in fixture_logs() {
        let bytes = std::fs::read(&path).expect("fixture");
        let expected = std::fs::read_to_string(path.with_extension("expected.jsonl"))
            .unwrap_or_else(|e| panic!("{}: expected records: {e}", path.display()));
        let want: Vec<serde_json::Value> =
            expected.lines().filter(|l| !l.trim().is_empty()).map(|l| serde_json::from_str(l).expect("json")).collect();
        let got = as_json(&read(Choice::Auto, &bytes));
        assert!(got == want, "{} (auto): {}", path.display(), first_difference(&got, &want));
        if let Some(choice) = own_format(&path) {
            // Its own format reads its framework's lines (and failures): the same records, less
            // those of other frameworks the fixture also holds (verl's tqdm bar).
            let own = as_json(&read(choice, &bytes));
            assert!(!own.is_empty() || want.is_empty(), "{} (--format {}) read nothing", path.display(), choice.name());
            assert!(own.iter().all(|r| want.contains(r)), "{} (--format {}): {own:#?}", path.display(), choice.name());
        }
        checked += 1;
    }
    assert!(checked >= 10, "only {checked} fixtures");
}

#[test]
fn lines_that_only_look_like_metrics_give_nothing() {
    let traps = [
        "  lr .............................................. 0.0003",
        "{'model_name_or_path': 'gpt2', 'learning_rate': 5e-05, 'num_train_epochs': 3}",
        "{'lr': 0.0003, 'batch_size': 32}",
        "step: 10 of 1000 warmup steps done, lr: 3e-4",
        "WARNING: lm loss went up, check the learning rate",
        "UserWarning: the loss is {'loss': 'not a number'}",
        "banner | lr: 3e-4 | welcome",
        "iteration limit reached",
        "step 3 finished",
        "Loading: 100%|██████████| 2/2",
        // A comms-summary row outside its table (no header, no op above it).
        "                    1.0 MB              100                 100.00              23.46               1.00                0.23",
    ];
    for t in traps {
        assert_eq!(as_json(&read(Choice::Auto, t.as_bytes())), Vec::<serde_json::Value>::new(), "{t}");
    }
}

#[test]
fn the_comms_table_ends_at_the_first_line_that_is_not_its_own() {
    let header = format!(
        "{:<20}{:<20}{:<20}{:<20}{:<20}",
        "Comm. Op", "Message Size", "Count", "Total Latency(ms)", "Avg Latency(ms)"
    );
    let row =
        format!("{:<20}{:<20}{:<20}{:<20}{:<20}{:<20}{:<20}", " ", "4.0 MB", 4, "10.50", "2.62", "12.78", "12.78");
    // A row before any op line is no record; a sentence ends the table, so a later row is none either.
    let text =
        [header.as_str(), row.as_str(), "all_gather", row.as_str(), "Training finished after 3 steps", row.as_str()];
    let records = read(Choice::Auto, text.join("\n").as_bytes());
    assert_eq!(records.len(), 1, "{records:#?}");
    assert_eq!(records[0].line, 4);
    assert_eq!(records[0].label("op"), Some(&Label::Text("all_gather".into())));
    assert_eq!(
        read(Choice::One(Format::Hf), text.join("\n").as_bytes()),
        Vec::new(),
        "only auto and deepspeed read it"
    );
}

#[test]
fn names_and_values_follow_the_rule() {
    assert_eq!(value::name("elapsed time per iteration (ms)"), "elapsed_time_per_iteration_ms");
    assert_eq!(value::name("lm loss"), "lm_loss");
    assert_eq!(value::name("rewards/chosen"), "rewards/chosen");
    assert_eq!(value::name("actor/pg_loss"), "actor/pg_loss");
    assert_eq!(value::number("2.133e+05"), Some(213300.0));
    assert_eq!(value::number("193,831"), Some(193831.0));
    assert_eq!(value::number("np.float64(0.5)"), Some(0.5));
    assert_eq!(value::number("'4e-05'"), Some(4e-05));
    assert!(value::number("nan").is_some_and(f64::is_nan));
    assert_eq!(value::number("inf"), Some(f64::INFINITY));
    assert!(value::number("NAN").is_some_and(f64::is_nan) && value::number("nan.0").is_some_and(f64::is_nan));
    assert_eq!(value::number("-INF"), Some(f64::NEG_INFINITY));
    assert_eq!(value::with_percent("9.46GiB(64.99%)"), Some((9.46, Some(64.99))));
    assert_eq!(value::size_mib("1.5 GiB"), Some(1536.0));
}

#[test]
fn a_nan_loss_is_also_an_event_and_named_formats_still_read_failures() {
    let got = read(Choice::One(Format::Nanogpt), b"iter 20: loss inf, time 1199.80ms, mfu 30.25%");
    assert_eq!(got.len(), 2, "{got:?}");
    assert_eq!(got[1].labels[0], ("event".to_string(), Label::Text("nan_loss".into())));
    let oom = b"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 1 has a total capacity of 79.15 GiB of which 1.00 GiB is free.";
    let got = read(Choice::One(Format::Hf), oom);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].metrics[0], ("tried_mib".to_string(), 2048.0));
    assert!(read(Choice::None, oom).is_empty(), "none reads nothing");
}

#[test]
fn long_lines_and_bad_bytes_are_counted_and_skipped() {
    let mut reader = LogReader::new(Choice::Auto);
    let long = vec![b'{'; MAX_LINE_BYTES + 1];
    assert!(reader.push(1, &long).is_empty());
    assert!(reader.push(2, b"{'loss': \xff1.0}").is_empty());
    assert_eq!(reader.skipped, Skipped { too_long: 1, invalid_utf8: 1 });
}

#[test]
#[ignore = "a measurement: cargo test --release -- --ignored adapters_throughput --nocapture"]
fn adapters_throughput() {
    let mut lines = Vec::new();
    for path in fixture_logs() {
        let text = std::fs::read(&path).expect("fixture");
        lines.extend(text.split(|b| *b == b'\n').map(<[u8]>::to_vec));
    }
    let mut reader = LogReader::new(Choice::Auto);
    let n = 1_000_000;
    let t0 = std::time::Instant::now();
    let mut records = 0;
    for i in 0..n {
        records += reader.push(i as u64, &lines[i % lines.len()]).len();
    }
    let s = t0.elapsed().as_secs_f64();
    println!("{n} lines in {s:.3} s: {:.0} lines/s, {records} records", n as f64 / s);
}

proptest::proptest! {
    #[test]
    fn random_bytes_and_random_splits_never_panic(
        bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..4096),
        cut in 0usize..4096,
    ) {
        let mut reader = LogReader::new(Choice::Auto);
        let cut = cut.min(bytes.len());
        for (i, part) in [&bytes[..cut], &bytes[cut..]].iter().enumerate() {
            for (j, line) in part.split(|b| *b == b'\n' || *b == b'\r').enumerate() {
                let _ = reader.push((i * 10_000 + j) as u64, line);
            }
        }
        let _ = reader.finish();
    }

    #[test]
    fn any_text_behind_any_wrapper_never_panics(
        wrapper in proptest::sample::select(WRAPPERS.iter().map(|w| w.1).collect::<Vec<_>>()),
        text in "\\PC{0,400}",
    ) {
        let mut reader = LogReader::new(Choice::Auto);
        let _ = reader.push(1, format!("{wrapper}{text}").as_bytes());
        let _ = reader.push(2, format!("{wrapper}{text}\r{text}").as_bytes());
        let _ = reader.explain(3, text.as_bytes());
        let _ = reader.finish();
    }

    #[test]
    fn framework_shaped_garbage_never_panics(
        head in proptest::sample::select(vec!["{'loss': ", "step:", "iter ", " [t] iteration ", "comm op: ", "step=", "  rank      : ", " 5%|", "WorkNCCL(", "CUDA out of memory. Tried to allocate "]),
        tail in "[ -~]{0,200}",
    ) {
        let mut reader = LogReader::new(Choice::Auto);
        let _ = reader.push(1, b"torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ");
        let _ = reader.push(2, b"[0]:");
        let _ = reader.push(3, format!("{head}{tail}").as_bytes());
        let _ = reader.push(4, tail.as_bytes());
        let _ = reader.finish();
    }
}

/// Launchers, containers and loggers a rank's lines arrive behind, each with the rank, local
/// rank and host it names.
/// (what, prefix, rank, local rank, host).
type Wrapped = (&'static str, &'static str, Option<i64>, Option<i64>, Option<&'static str>);

const WRAPPERS: [Wrapped; 14] = [
    ("torchrun", "[rank3]:", Some(3), None, None),
    ("torchrun --tee", "[default2]:", None, Some(2), None),
    ("ray actor", "(WorkerDict pid=123, ip=10.0.0.1) ", None, None, Some("10.0.0.1")),
    ("ray driver", "(TaskRunner pid=4242) ", None, None, None),
    ("srun -l", "5: ", Some(5), None, None),
    ("srun -l, padded", " 5: ", Some(5), None, None),
    ("pdsh", "node-7: ", None, None, Some("node-7")),
    ("mpirun --tag-output", "[1,3]<stdout>:", Some(3), None, None),
    ("docker logs -t", "2024-05-01T12:00:00.123456789Z ", None, None, None),
    ("a CRI container log", "2024-05-01T12:00:00.123456789+00:00 stdout F ", None, None, None),
    ("journald", "May  1 12:00:00 node7 python[4242]: ", None, None, Some("node7")),
    ("kubectl --timestamps, then srun -l", "2024-05-01T12:00:00Z 5: ", Some(5), None, None),
    ("pdsh, then torchrun", "worker-0: [rank3]:", Some(3), None, Some("worker-0")),
    ("srun -l, then Ray", "5: (RayTrainWorker pid=9, ip=10.0.0.2) ", Some(5), None, Some("10.0.0.2")),
];

/// A record as JSON without the labels a wrapper can add.
fn without_origin(mut v: serde_json::Value) -> serde_json::Value {
    if let Some(labels) = v.get_mut("labels").and_then(|l| l.as_object_mut()) {
        for key in ["rank", "local_rank", "host"] {
            labels.remove(key);
        }
    }
    v
}

#[test]
fn every_fixture_line_behind_every_launchers_prefix_reads_the_same() {
    let mut checked = 0;
    for path in fixture_logs() {
        let bytes = std::fs::read(&path).expect("fixture");
        let plain = as_json(&read(Choice::Auto, &bytes));
        for (what, prefix, rank, local_rank, host) in WRAPPERS {
            let wrapped: Vec<u8> = bytes
                .split(|b| *b == b'\n')
                .map(|l| if l.is_empty() { Vec::new() } else { [prefix.as_bytes(), l].concat() })
                .collect::<Vec<_>>()
                .join(&b'\n');
            let got = as_json(&read(Choice::Auto, &wrapped));
            // A bar on a pdsh stream's first line, before its host is known, keeps the host in
            // its desc (`node-7: Loading checkpoint shards`): its values are right, its desc is
            // compared without the host.
            let desc_host = |mut v: serde_json::Value| {
                if what.starts_with("pdsh") {
                    if let Some(d) = v["labels"].get_mut("desc") {
                        if let Some(t) = d.as_str().and_then(|t| t.strip_prefix(prefix.trim_start())) {
                            *d = serde_json::Value::from(t.to_string());
                        }
                    }
                }
                v
            };
            let strip =
                |v: &[serde_json::Value]| v.iter().cloned().map(without_origin).map(desc_host).collect::<Vec<_>>();
            let (g, p) = (strip(&got), strip(&plain));
            assert!(g == p, "{} behind {what} ({prefix:?}): {}", path.display(), first_difference(&g, &p));
            // The rank and host the prefix names land on records that named none of their own.
            for (g, p) in got.iter().zip(&plain) {
                for (key, want) in [
                    ("rank", rank.map(serde_json::Value::from)),
                    ("local_rank", local_rank.map(Into::into)),
                    ("host", host.map(Into::into)),
                ] {
                    if let (Some(want), None) = (want, p["labels"].get(key)) {
                        // pdsh's host is a candidate only: an adapter that reads the whole line
                        // (DeepSpeed's `[Rank 0] step=` anywhere in it) gives no host, never a wrong one.
                        let got = g["labels"].get(key);
                        if !(what.starts_with("pdsh") && key == "host" && got.is_none()) {
                            assert_eq!(got, Some(&want), "{} behind {what}: {key} of {g}", path.display());
                        }
                    }
                }
            }
        }
        checked += 1;
    }
    assert!(checked >= 10);
}

#[test]
fn a_colour_wrapped_line_reads_as_the_plain_one() {
    for path in fixture_logs() {
        let bytes = std::fs::read(&path).expect("fixture");
        let plain = as_json(&read(Choice::Auto, &bytes));
        let coloured: Vec<u8> = bytes
            .split(|b| *b == b'\n')
            .map(
                |l| if l.is_empty() { Vec::new() } else { [b"\x1b[38;2;10;20;30m".as_slice(), l, b"\x1b[0m"].concat() },
            )
            .collect::<Vec<_>>()
            .join(&b'\n');
        assert_eq!(as_json(&read(Choice::Auto, &coloured)), plain, "{} in 24-bit colour", path.display());
    }
}

proptest::proptest! {
    #[test]
    fn scan_finds_what_str_finds_inside_and_outside_a_message(
        hay in "[ a-c\\[\\]:=|•]{0,40}",
        needle in "[ a-d\\[\\]:=|•]{1,4}",
        from in 0usize..40,
    ) {
        use super::value::{with_message, Scan};
        let from = (0..=from.min(hay.len())).rev().find(|i| hay.is_char_boundary(*i)).unwrap_or(0);
        let slice = &hay[from..];
        proptest::prop_assert_eq!(slice.at(&needle), slice.find(needle.as_str()));
        with_message(&hay, || {
            proptest::prop_assert_eq!(slice.at(&needle), slice.find(needle.as_str()));
            proptest::prop_assert_eq!(slice.cut(&needle), slice.split_once(needle.as_str()));
            proptest::prop_assert_eq!(needle.as_str().has(slice), needle.contains(slice));
            Ok(())
        })?;
    }
}
