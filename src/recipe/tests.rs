//! Recipe tests: every shipped recipe loads, defaults and `--set` behave; helpers shared with
//! `tests_invalid.rs`.
use super::raw::{OneOrMany, RawAnalysis, RawDpo, RawEval, RawGrpo, RawInit, RawRecovery};
use super::raw::{RawCheckpoint, RawCluster, RawCommand, RawData, RawFault, RawModel};
use super::raw::{RawParallel, RawRecipe, RawTelemetry, RawTrain, TABLES, TOP_KEYS};
use super::*;
use std::path::PathBuf;

pub(super) fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub(super) fn bad_dir() -> PathBuf {
    root().join("tests/fixtures/recipes/bad")
}

/// Loads a bad fixture, which must fail.
pub(super) fn bad(file: &str) -> RecipeError {
    match load_file(&bad_dir().join(file), &[]) {
        Ok(recipe) => panic!("{file} loaded but must not: {recipe:?}"),
        Err(e) => e,
    }
}

#[track_caller]
pub(super) fn assert_mentions(err: &RecipeError, parts: &[&str]) {
    let message = err.to_string();
    for part in parts {
        assert!(message.contains(part), "message lacks {part:?}:\n{message}");
    }
}

pub(super) const MINIMAL: &str = r#"
name = "t"
[model]
n_layer = 2
n_head = 4
d_model = 128
context = 64
vocab = 16
[data]
source = "synthetic:arith"
[train]
steps = 200
batch_per_rank = 16
lr = 3e-3
"#;

pub(super) fn set(args: &[&str]) -> Vec<String> {
    args.iter().map(|a| a.to_string()).collect()
}

pub(super) fn with_set(args: &[&str]) -> Result<Recipe, RecipeError> {
    parse_str(MINIMAL, "recipes/t.toml", &set(args))
}

// --- shipped recipes ---

#[test]
fn every_shipped_recipe_loads() {
    let mut loaded = 0;
    for entry in std::fs::read_dir(root().join("recipes")).expect("recipes/ exists") {
        let path = entry.expect("readable entry").path();
        if path.extension().is_some_and(|e| e == "toml") {
            if let Err(e) = load_file(&path, &[]) {
                panic!("shipped recipe does not load:\n{e}");
            }
            loaded += 1;
        }
    }
    assert!(loaded >= 1, "no recipes found");
}

#[test]
fn tiny_gpt_is_the_documented_default() {
    let r = load_file(&root().join("recipes/tiny-gpt.toml"), &[]).expect("tiny-gpt loads");
    assert_eq!((r.name.as_str(), r.kind), ("tiny-gpt", Kind::Pretrain));
    assert_eq!(r.data.source, DataSource::Synthetic { generator: "arith".into() });
    let m = &r.model;
    assert_eq!((m.n_layer, m.n_head, m.d_model, m.context, m.vocab), (2, 4, 128, 64, 16));
    let t = &r.train;
    assert_eq!((t.steps, t.batch_per_rank, t.lr, t.warmup), (200, 16, 3e-3, 20));
    assert_eq!((t.schedule, t.grad_clip), (Schedule::Cosine, 1.0));
    assert_eq!(r.cluster.hosts, vec!["local".to_string()]);
    assert_eq!((r.cluster.ranks_per_node, r.world_size()), (2, 2));
    assert!(r.is_local());
}

#[test]
fn defaults_fill_every_optional_key() {
    let r = parse_str(MINIMAL, "t.toml", &[]).expect("minimal recipe loads");
    assert_eq!(r.kind, Kind::Pretrain);
    assert_eq!(r.data.seed, 0);
    let t = &r.train;
    assert!((t.min_lr - 3e-4).abs() < 1e-12);
    assert_eq!((t.warmup, t.schedule, t.grad_clip, t.seed, t.dtype), (0, Schedule::Cosine, 1.0, 1337, Dtype::Fp32));
    assert_eq!((t.weight_decay, t.beta1, t.beta2), (0.1, 0.9, 0.95));
    let p = &r.parallel;
    assert_eq!((p.data, p.backend, p.bucket_bytes), (1, CollectiveBackend::Ring, 25 * 1024 * 1024));
    assert_eq!((r.checkpoint.every, r.checkpoint.keep, r.checkpoint.dir.as_str()), (0, 3, "checkpoints"));
    assert_eq!(
        (r.cluster.hosts.clone(), r.cluster.ranks_per_node, r.cluster.device),
        (vec!["local".to_string()], 1, Device::Cpu)
    );
    let tel = &r.telemetry;
    assert_eq!((tel.step_interval, tel.sample_interval_ms, tel.enabled), (1, 1000, true));
    assert!(r.faults.is_empty(), "no [fault]: none");
    assert_eq!(r.recovery, Recovery::default());
    assert_eq!(r.recovery.max_restarts, 0, "recovery is off unless asked");
    assert_eq!(r.command, None);
}

#[test]
fn world_size_defaults_to_hosts_times_ranks_per_node() {
    let r = with_set(&[r#"cluster.hosts=["node-a", "user@node-b:2222"]"#, "cluster.ranks_per_node=4"]).expect("loads");
    assert_eq!(r.world_size(), 8);
    assert!(!r.is_local());
}

#[test]
fn command_recipes_need_no_model() {
    let text = "name = \"c\"\nkind = \"command\"\n[command]\nargv = [\"python\", \"train.py\"]\n";
    let r = parse_str(text, "c.toml", &[]).expect("command recipe loads");
    assert_eq!(
        r.command,
        Some(Command {
            argv: vec!["python".into(), "train.py".into()],
            log_format: crate::adapters::Choice::Auto,
            observe: true,
            instrument: true,
            env: Vec::new(),
            cwd: r.command.as_ref().and_then(|c| c.cwd.clone()),
            launcher: Launcher::Direct,
        })
    );
}

#[test]
fn torchrun_is_a_launcher_and_never_a_rank_program() {
    let recipe = |argv: &str, launcher: &str| {
        let text = format!("name = \"c\"\nkind = \"command\"\n[command]\nargv = {argv}\n{launcher}");
        parse_str(&text, "c.toml", &[])
    };
    for argv in
        [r#"["python", "train.py"]"#, r#"["torchrun", "train.py", "--lr", "1"]"#, r#"["python", "-m", "pkg.train"]"#]
    {
        let r = recipe(argv, "launcher = \"torchrun\"").unwrap_or_else(|e| panic!("{argv}: {e}"));
        assert_eq!(r.command.expect("a command").launcher, Launcher::Torchrun);
    }
    let ok = recipe(r#"["/venv/bin/torchrun", "--monitor-interval=1", "t.py"]"#, "launcher = \"torchrun\"");
    assert!(ok.is_ok(), "torchrun options Flightdeck does not set pass through: {ok:?}");

    let e = recipe(r#"["torchrun", "--nproc-per-node", "8", "train.py"]"#, "").expect_err("a torchrun per rank");
    assert_eq!(e.key(), Some("command.argv"));
    assert_mentions(&e, &["starts torchrun", r#"launcher = "torchrun""#]);
    let e = recipe(r#"["python", "-m", "torch.distributed.run", "t.py"]"#, "").expect_err("the same");
    assert_mentions(&e, &["starts torchrun"]);
    let e = recipe(r#"["torchrun", "--nproc_per_node=8", "t.py"]"#, "launcher = \"torchrun\"").expect_err("set here");
    assert_mentions(&e, &["\"--nproc_per_node=8\"", "Flightdeck sets itself", "leave it out"]);
    let e =
        recipe(r#"["torchrun", "--rdzv-backend", "c10d", "t.py"]"#, "launcher = \"torchrun\"").expect_err("set here");
    assert_mentions(&e, &["\"--rdzv-backend\""]);
    let e = recipe(r#"["python", "-u", "t.py"]"#, "launcher = \"torchrun\"").expect_err("a Python option");
    assert_mentions(&e, &["\"-u\"", "[command] env"]);
    let e = recipe(r#"["torchrun"]"#, "launcher = \"torchrun\"").expect_err("no script");
    assert_mentions(&e, &["names no script"]);
    let e = recipe(r#"["python", "t.py"]"#, "launcher = \"mpirun\"").expect_err("no such launcher");
    assert_mentions(&e, &["command.launcher = \"mpirun\"", "valid: direct, torchrun"]);
}

#[test]
fn file_sources_resolve_against_the_recipe_directory() {
    let text = MINIMAL.replace("synthetic:arith", "file:data/corpus.txt").replace("vocab = 16", "vocab = 256");
    let r = parse_str(&text, "recipes/t.toml", &[]).expect("loads");
    assert_eq!(r.data.source, DataSource::File { path: PathBuf::from("recipes/data/corpus.txt") });
    let r = parse_str(&text.replace("data/corpus", "/srv/corpus"), "recipes/t.toml", &[]).expect("loads");
    assert_eq!(r.data.source, DataSource::File { path: PathBuf::from("/srv/corpus.txt") });

    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("r.toml");
    std::fs::write(&file, &text).expect("write");
    let r = load_file(&file, &[]).expect("loads");
    assert_eq!(r.data.source, DataSource::File { path: dir.path().join("data/corpus.txt") });
}

#[test]
fn file_sources_need_the_byte_vocabulary() {
    let text = MINIMAL.replace("synthetic:arith", "file:corpus.txt");
    let e = parse_str(&text, "t.toml", &[]).expect_err("vocab 16 < 256");
    assert_mentions(&e, &["t.toml: model.vocab = 16 is smaller than the 256", "file:corpus.txt", "256 or more"]);
}

// --- --set overrides ---

#[test]
fn set_overrides_parse_toml_values_and_bare_strings() {
    let r = with_set(&[
        "train.steps=60",
        "train.lr=3e-4",
        r#"cluster.hosts=["local"]"#,
        "cluster.device=cuda",
        "parallel.backend=nccl",
        "name=2024",
        "telemetry.enabled=false",
        "train.steps = 70",
    ])
    .expect("overrides apply");
    assert_eq!((r.train.steps, r.train.lr), (70, 3e-4));
    assert_eq!((r.cluster.device, r.parallel.backend), (Device::Cuda, CollectiveBackend::Nccl));
    assert_eq!((r.name.as_str(), r.telemetry.enabled), ("2024", false));
}

#[test]
fn set_can_add_a_table_the_file_lacks() {
    let r = with_set(&["fault.kind=slow", "fault.slow_pct=200"]).expect("loads");
    assert_eq!((r.faults[0].kind, r.faults[0].slow_pct), (FaultKind::Slow, 200.0));
}

#[test]
fn faults_can_be_a_list_checked_each_by_its_place() {
    let write = |body: &str| parse_str(&format!("{MINIMAL}\n{body}"), "recipes/t.toml", &[]);
    let r = write("[[fault]]\nkind = \"crash\"\nstep = 15\n[[fault]]\nkind = \"hang-before-collective\"\nstep = 30\n")
        .expect("two faults");
    assert_eq!(
        r.faults.iter().map(|f| (f.kind, f.step)).collect::<Vec<_>>(),
        [(FaultKind::Crash, 15), (FaultKind::HangBeforeCollective, 30)]
    );
    // The stored recipe reads back, and so does one stored before lists (a single table).
    let back: Recipe = serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
    assert_eq!(back.faults, r.faults);
    // One fault or none is stored as one table, as before lists, so a resume's --set applies.
    let one = with_set(&["fault.kind=slow"]).unwrap();
    assert!(serde_json::to_value(&one).unwrap()["fault"].is_object());
    let none = serde_json::to_value(parse_str(MINIMAL, "t.toml", &[]).unwrap()).unwrap();
    assert_eq!(none["fault"]["kind"], "none");
    assert!(serde_json::from_value::<Recipe>(none).unwrap().faults.is_empty());
    let mut old = serde_json::to_value(&r).unwrap();
    old["fault"] = serde_json::json!({"kind": "slow", "rank": 0, "step": 3, "slow_pct": 50.0});
    assert_eq!(serde_json::from_value::<Recipe>(old).unwrap().faults[0].kind, FaultKind::Slow);
    let e = write("[[fault]]\nkind = \"crash\"\n[[fault]]\nkind = \"crash\"\nstep = 999\n").unwrap_err().to_string();
    assert!(e.contains("fault[1].step") && e.contains("after the last step"), "{e}");
    let e = write("[[fault]]\nkind = \"crash\"\nsteps = 2\n").unwrap_err().to_string();
    assert!(e.contains("fault[0].steps"), "{e}");
}

#[test]
fn recovery_budgets_default_to_max_restarts_and_out_of_range_values_are_refused() {
    let r = with_set(&["recovery.max_restarts=3", "recovery.hang=1"]).expect("loads");
    assert_eq!((r.recovery.max_restarts, r.recovery.crash, r.recovery.hang, r.recovery.node_lost), (3, 3, 1, 3));
    assert_eq!((r.recovery.budget(crate::record::Cause::Hang), r.recovery.backoff_s), (1, 1.0));
    for (set, says) in [
        ("recovery.max_restarts=101", "recovery.max_restarts"),
        ("recovery.max_restarts=-1", "recovery.max_restarts"),
        ("recovery.backoff_s=601", "recovery.backoff_s"),
    ] {
        let e = with_set(&[set]).unwrap_err().to_string();
        assert!(e.contains(says), "{set}: {e}");
    }
    let e = with_set(&["recovery.max_restarts=2", "recovery.crash=3"]).unwrap_err().to_string();
    assert!(e.contains("recovery.crash"), "a cause cannot take more than max_restarts: {e}");
}

#[test]
fn on_nan_is_ignore_by_default_and_restart_needs_a_budget() {
    use crate::record::Cause;
    let r = with_set(&[]).expect("loads");
    assert_eq!((r.recovery.on_nan, r.data.skip_batches), (OnNan::Ignore, 0));
    let r = with_set(&["recovery.max_restarts=2", "recovery.on_nan=restart", "data.skip_batches=3"]).expect("loads");
    assert_eq!((r.recovery.on_nan, r.recovery.budget(Cause::Nan), r.data.skip_batches), (OnNan::Restart, 2, 3));
    let r = with_set(&["recovery.max_restarts=2", "recovery.on_nan=stop"]).expect("loads");
    assert_eq!(r.recovery.budget(Cause::Nan), 0, "stop never restarts");
    let e = with_set(&["recovery.on_nan=restart"]).unwrap_err().to_string();
    assert!(e.contains("restarts nothing while recovery.max_restarts = 0"), "{e}");
    let e = with_set(&["recovery.on_nan=retry"]).unwrap_err().to_string();
    assert!(e.contains("recovery.on_nan") && e.contains("restart"), "{e}");
    let e = with_set(&["data.skip_batches=-1"]).unwrap_err().to_string();
    assert!(e.contains("data.skip_batches"), "{e}");
}

#[test]
fn set_unknown_key_names_the_key_and_the_valid_ones() {
    let e = with_set(&["foo.bar=1"]).expect_err("no table foo");
    assert_eq!(e.kind(), ErrorKind::BadOverride);
    assert_mentions(&e, &["recipes/t.toml: --set foo.bar=1: unknown key foo.bar", "valid tables: model, data, train"]);
    let e = with_set(&["model.n_heads=4"]).expect_err("no key n_heads");
    assert_mentions(
        &e,
        &[
            "--set model.n_heads=4: unknown key model.n_heads",
            "did you mean n_head?",
            "valid keys in [model]: n_layer, n_head",
        ],
    );
    let e = with_set(&["model=4"]).expect_err("a table");
    assert_mentions(&e, &["--set model=4: model is a table", "n_layer, n_head"]);
}

#[test]
fn set_unparsable_value_says_how_to_write_one() {
    let e = with_set(&[r#"cluster.hosts=["a""#]).expect_err("unterminated list");
    assert_eq!(e.kind(), ErrorKind::BadOverride);
    assert_mentions(
        &e,
        &[
            r#"--set cluster.hosts=["a": cannot parse ["a" as a TOML value"#,
            r#"e.g. --set cluster.hosts='["node-a", "node-b"]'"#,
        ],
    );
    let e = with_set(&["train.steps"]).expect_err("no =");
    assert_mentions(&e, &["--set train.steps: expected KEY=VALUE"]);
    let e = with_set(&["train.steps="]).expect_err("no value");
    assert_mentions(&e, &["--set train.steps=: no value", "e.g. --set train.steps=60"]);
}

#[test]
fn set_wrong_type_names_key_got_and_expected() {
    let e = with_set(&["train.steps=many"]).expect_err("not an integer");
    assert_eq!((e.kind(), e.key()), (ErrorKind::WrongType, Some("train.steps")));
    assert_mentions(&e, &["--set train.steps=many: train.steps must be an integer, got a string \"many\""]);
}

#[test]
fn set_values_are_validated_and_marked() {
    let e = with_set(&["train.steps=-5"]).expect_err("negative");
    assert_mentions(&e, &["recipes/t.toml: train.steps = -5 (from --set) must be a positive integer"]);
}

#[test]
fn command_table_only_with_command_kind() {
    let text = format!("{MINIMAL}[command]\nargv = [\"x\"]\n");
    let e = parse_str(&text, "t.toml", &[]).expect_err("command table on pretrain");
    assert_mentions(&e, &["[command] is only read when kind = \"command\"", "kind = \"pretrain\""]);
}

#[test]
fn missing_file_lists_the_recipes_beside_it() {
    let e = load_file(&root().join("recipes/tiny-gtp.toml"), &[]).expect_err("typo");
    assert_eq!(e.kind(), ErrorKind::Io);
    assert_mentions(&e, &["recipes/tiny-gtp.toml: no such file", "tiny-gpt.toml"]);
}

#[test]
fn schema_and_raw_structs_name_the_same_keys() {
    let full = RawRecipe {
        model: Some(RawModel::default()),
        data: Some(RawData::default()),
        train: Some(RawTrain::default()),
        parallel: Some(RawParallel::default()),
        checkpoint: Some(RawCheckpoint::default()),
        cluster: Some(RawCluster::default()),
        telemetry: Some(RawTelemetry::default()),
        fault: Some(OneOrMany::One(RawFault::default())),
        command: Some(RawCommand::default()),
        analysis: Some(RawAnalysis::default()),
        init: Some(RawInit::default()),
        eval: Some(RawEval::default()),
        dpo: Some(RawDpo::default()),
        grpo: Some(RawGrpo::default()),
        recovery: Some(RawRecovery::default()),
        ..RawRecipe::default()
    };
    let json = serde_json::to_value(&full).expect("serialises");
    let obj = json.as_object().expect("object");
    let mut top: Vec<&str> = obj.iter().filter(|(_, v)| !v.is_object()).map(|(k, _)| k.as_str()).collect();
    let mut want: Vec<&str> = TOP_KEYS.iter().map(|(k, _)| *k).collect();
    top.sort();
    want.sort();
    assert_eq!(top, want);
    for (table, keys) in TABLES {
        let section = obj.get(*table).and_then(|v| v.as_object()).unwrap_or_else(|| panic!("no raw [{table}]"));
        let mut got: Vec<&str> = section.keys().map(String::as_str).collect();
        let mut want: Vec<&str> = keys.iter().map(|(k, _)| *k).collect();
        got.sort();
        want.sort();
        assert_eq!(got, want, "[{table}]");
    }
    assert_eq!(obj.values().filter(|v| v.is_object()).count(), TABLES.len());
}

#[test]
fn docs_name_every_key() {
    let docs = std::fs::read_to_string(root().join("docs/recipes.md")).expect("docs/recipes.md");
    for (table, keys) in TABLES {
        assert!(docs.contains(&format!("[{table}]")), "docs lack [{table}]");
        for (key, _) in *keys {
            assert!(docs.contains(&format!("`{table}.{key}`")), "docs lack `{table}.{key}`");
        }
    }
}

#[test]
fn gpt_small_cuda_is_gpt2_small_on_gpus_with_nccl_and_bf16() {
    let r = load_file(&root().join("recipes/gpt-small-cuda.toml"), &[]).expect("gpt-small-cuda loads");
    let m = &r.model;
    assert_eq!((m.n_layer, m.n_head, m.d_model, m.context, m.vocab), (12, 12, 768, 1024, 50304));
    assert_eq!(crate::mfu::total_params(m), 124_475_904, "GPT-2 small: about 124M parameters");
    assert_eq!(r.data.source, DataSource::Synthetic { generator: "tokens".into() });
    assert_eq!(
        (r.cluster.device, r.parallel.backend, r.train.dtype),
        (Device::Cuda, CollectiveBackend::Nccl, Dtype::Bf16)
    );
    // The dry run of scripts/gpu-check.sh turns it into a CPU recipe with these overrides.
    let cpu = load_file(
        &root().join("recipes/gpt-small-cuda.toml"),
        &set(&["cluster.device=cpu", "parallel.backend=ring", "train.dtype=fp32", "model.n_layer=1"]),
    )
    .expect("the dry run's overrides validate");
    assert_eq!(cpu.cluster.device, Device::Cpu);
}
