//! Invalid recipes: one test per kind, each checking that the message names the file, the key
//! and what would be valid. The files live in tests/fixtures/recipes/bad/ for the CLI's tests.
use super::tests::{assert_mentions, bad, bad_dir, with_set};
use super::*;

#[test]
fn every_bad_fixture_is_listed_and_fails_as_expected() {
    let expected = std::fs::read_to_string(bad_dir().join("EXPECTED.txt")).expect("EXPECTED.txt");
    let mut listed = Vec::new();
    for line in expected.lines().filter(|l| !l.trim().is_empty() && !l.starts_with('#')) {
        let (file, substring) = line.split_once('\t').unwrap_or_else(|| panic!("no tab in {line:?}"));
        assert_mentions(&bad(file), &[substring]);
        listed.push(file.to_string());
    }
    for entry in std::fs::read_dir(bad_dir()).expect("bad dir") {
        let name = entry.expect("entry").file_name().to_string_lossy().into_owned();
        if name.ends_with(".toml") {
            assert!(listed.contains(&name), "{name} is not listed in EXPECTED.txt");
        }
    }
}

#[test]
fn syntax_error_has_line_and_column() {
    let e = bad("syntax.toml");
    assert_eq!((e.kind(), e.line_col()), (ErrorKind::Syntax, Some((5, 9))));
    assert!(e.origin().ends_with("bad/syntax.toml"));
    assert_mentions(&e, &["bad/syntax.toml:5:9: TOML syntax error", "5 | n_layer 2"]);
    assert_eq!(bad("duplicate-key.toml").kind(), ErrorKind::Syntax);
}

#[test]
fn unknown_keys_list_the_valid_ones() {
    let e = bad("unknown-key-top.toml");
    assert_eq!((e.kind(), e.key()), (ErrorKind::UnknownKey, Some("epochs")));
    assert_mentions(
        &e,
        &[
            "unknown-key-top.toml: unknown key epochs",
            "valid top-level keys: name, kind",
            "valid tables: model, data, train, parallel, checkpoint, cluster, telemetry, fault, command",
        ],
    );
    let e = bad("unknown-key-nested.toml");
    assert_eq!(e.key(), Some("model.n_heads"));
    assert_mentions(
        &e,
        &[
            "unknown-key-nested.toml: unknown key model.n_heads",
            "valid keys in [model]: n_layer, n_head, d_model, context, vocab",
        ],
    );
    assert_mentions(&bad("unknown-table.toml"), &["unknown key optimiser", "valid tables: model"]);
    assert_mentions(&bad("name-after-table.toml"), &["unknown key model.name", "move it above the first [table]"]);
}

#[test]
fn wrong_types_name_key_got_and_expected() {
    let e = bad("wrong-type.toml");
    assert_eq!((e.kind(), e.key()), (ErrorKind::WrongType, Some("train.lr")));
    assert_mentions(&e, &["wrong-type.toml: train.lr = \"fast\"", "expected a number, got a string"]);
    assert_mentions(&bad("table-as-value.toml"), &["model = 5", "expected a table [model]", "got an integer"]);
    assert_mentions(&bad("float-for-integer.toml"), &["train.steps = 200.0", "expected an integer", "got a float"]);
}

#[test]
fn n_head_must_divide_d_model() {
    let e = bad("n-head-not-dividing.toml");
    assert_eq!((e.kind(), e.key()), (ErrorKind::Invalid, Some("model.n_head")));
    assert_mentions(
        &e,
        &[
            "n-head-not-dividing.toml: model.n_head = 5 does not divide model.d_model = 128",
            "choose n_head from 1, 2, 4, 8",
        ],
    );
}

#[test]
fn sizes_must_be_positive() {
    assert_mentions(&bad("zero-size.toml"), &["zero-size.toml: model.n_layer = 0 must be a positive integer"]);
    let e = bad("negative-steps.toml");
    assert_eq!(e.key(), Some("train.steps"));
    assert_mentions(&e, &["negative-steps.toml: train.steps = -5 must be a positive integer (1 or more)"]);
    assert!(!e.to_string().contains("u64"), "serde leaked through: {e}");
}

#[test]
fn world_size_must_fit_the_cluster() {
    let e = bad("world-too-large.toml");
    assert_eq!(e.key(), Some("parallel.data"));
    assert_mentions(&e, &["parallel.data = 8", "2 rank slots", "1 host", "cluster.ranks_per_node = 2", "from 1 to 2"]);
}

#[test]
fn missing_keys_say_where_to_add_them() {
    let e = bad("missing-key.toml");
    assert_eq!((e.kind(), e.key()), (ErrorKind::Missing, Some("model.vocab")));
    assert_mentions(&e, &["missing-key.toml: model.vocab is missing", "under [model]"]);
    assert_mentions(&bad("missing-name.toml"), &["name is missing", "above the first [table]"]);
    assert_mentions(
        &bad("command-without-argv.toml"),
        &["command.argv is missing", r#"argv = ["python", "train.py"]"#],
    );
}

#[test]
fn enums_list_their_valid_values() {
    let e = bad("bad-enum.toml");
    assert_eq!(e.key(), Some("train.schedule"));
    assert_mentions(&e, &["bad-enum.toml: train.schedule = \"cosin\" is not valid; valid: constant, cosine, linear"]);
    assert_mentions(
        &bad("bad-fault-kind.toml"),
        &["hang-before-collective, hang-in-collective, crash, mismatch, slow"],
    );
    assert_mentions(&bad("unknown-generator.toml"), &["synthetic:shakespeare", "valid: synthetic:arith"]);
    let e = with_set(&["cluster.device=tpu"]).expect_err("no tpu");
    assert_mentions(&e, &["cluster.device = \"tpu\" (from --set) is not valid; valid: cpu, cuda"]);
}

#[test]
fn fault_must_hit_a_real_rank_and_step() {
    let e = bad("fault-rank.toml");
    assert_eq!(e.key(), Some("fault.rank"));
    assert_mentions(&e, &["fault-rank.toml: fault.rank = 2", "world size (parallel.data) is 2", "from 0 to 1"]);
    assert_mentions(&bad("fault-step.toml"), &["fault.step = 500", "train.steps = 200", "from 1 to 200"]);
}

#[test]
fn vocab_must_cover_the_generator() {
    let e = bad("vocab-too-small.toml");
    assert_eq!(e.key(), Some("model.vocab"));
    assert_mentions(&e, &["vocab-too-small.toml: model.vocab = 8", "16 token ids", "synthetic:arith", "16 or more"]);
}

#[test]
fn unsupported_data_and_devices_say_what_runs_today() {
    let e = bad("sft-on-sequences.toml");
    assert_mentions(&e, &["data.source = \"synthetic:arith\" makes plain sequences", "synthetic:arith-qa"]);
    assert_mentions(&bad("nccl-on-cpu.toml"), &["parallel.backend = \"nccl\" needs cluster.device = \"cuda\"", "ring"]);
    assert_mentions(&bad("bf16-on-cpu.toml"), &["train.dtype = \"bf16\" needs cluster.device = \"cuda\"", "fp32"]);
    let e = with_set(&["parallel.tensor=2"]).expect_err("no tensor parallelism yet");
    assert_mentions(&e, &["parallel.tensor = 2 (from --set)", "valid: 1"]);
}

#[test]
fn grpo_refuses_a_group_of_one_and_completions_past_the_context() {
    let e = bad("grpo-group-size-1.toml");
    assert_eq!(e.key(), Some("grpo.group_size"));
    assert_mentions(&e, &["grpo.group_size = 1 must be at least 2", "valid: 2 to 256"]);
    let e = bad("grpo-max-new-beyond-context.toml");
    assert_mentions(&e, &["grpo.max_new_tokens = 60 does not fit", "model.context = 64", "valid: 1 to 56"]);
    assert_mentions(&bad("grpo-on-sequences.toml"), &["kind = \"grpo\" needs prompts with checkable answers"]);
    for (set, says) in [
        ("grpo.beta=-0.1", "grpo.beta = -0.1 (from --set) must be 0 or more"),
        ("grpo.top_p=0", "grpo.top_p = 0 (from --set) must be above 0 and at most 1"),
        ("grpo.temperature=0", "must be above 0"),
        ("grpo.clip_eps=1.5", "must be above 0 and below 1"),
        ("grpo.ppo_epochs=0", "grpo.ppo_epochs = 0 (from --set) must be a positive integer"),
    ] {
        let e = with_set(&["kind=\"grpo\"", "data.source=\"synthetic:arith-qa\"", set]).expect_err(set);
        assert_mentions(&e, &[says]);
    }
    // [grpo] in another kind's recipe is a mistake, not ignored.
    let e = with_set(&["grpo.beta=0.1"]).expect_err("grpo table in a pretrain recipe");
    assert_mentions(&e, &["[grpo] is read by kind = \"grpo\" only"]);
}

#[test]
fn ranges_name_the_valid_interval() {
    assert_mentions(
        &bad("warmup-too-long.toml"),
        &["train.warmup = 300 is longer than train.steps = 200", "from 0 to 200"],
    );
    assert_mentions(&bad("beta-out-of-range.toml"), &["train.beta2 = 1 must be in [0, 1)"]);
    let e = with_set(&["train.lr=nan"]).expect_err("nan");
    assert_mentions(&e, &["train.lr = NaN (from --set) must be a positive number"]);
    let e = with_set(&["train.min_lr=1.0"]).expect_err("min_lr > lr");
    assert_mentions(&e, &["train.min_lr = 1 (from --set) must be between 0 and train.lr = 0.003"]);
    let e = with_set(&["telemetry.sample_interval_ms=10"]).expect_err("too fast");
    assert_mentions(&e, &["telemetry.sample_interval_ms = 10 (from --set) must be at least 250"]);
    let e = with_set(&["model.n_layer=5000000000"]).expect_err("too large");
    assert_mentions(&e, &["model.n_layer = 5000000000 (from --set) is too large; at most 4294967295"]);
}

#[test]
fn hosts_must_be_ssh_destinations() {
    assert_mentions(&bad("bad-host.toml"), &["cluster.hosts[0] = \"node a\"", "\"user@node-b:2222\""]);
    assert_mentions(&bad("empty-hosts.toml"), &["cluster.hosts = [] lists no host"]);
    for ok in ["local", "node-a", "user@node-b:2222", "10.0.0.1", "[::1]:22", "fe80::1"] {
        with_set(&[&format!("cluster.hosts=[{ok:?}]")]).unwrap_or_else(|e| panic!("{ok}: {e}"));
    }
    for (bad, why) in
        [("node:0", "port"), ("node:ssh", "port"), ("@node", "user"), ("user@", "host name"), ("[::1", "']'")]
    {
        let e = with_set(&[&format!("cluster.hosts=[{bad:?}]")]).expect_err(bad);
        assert_mentions(&e, &[why]);
    }
    let e = with_set(&[r#"cluster.hosts=["a", "a"]"#]).expect_err("duplicate");
    assert_mentions(&e, &["lists \"a\" twice"]);
}

#[test]
fn spare_hosts_are_unused_ssh_destinations_beside_ssh_hosts() {
    let hosts = r#"cluster.hosts=["a", "b"]"#;
    let ok = with_set(&[hosts, r#"cluster.spare_hosts=["c", "user@d:2222"]"#]).expect("spares");
    assert_eq!(ok.cluster.spare_hosts, vec!["c".to_string(), "user@d:2222".to_string()]);
    for (spares, why) in [
        (r#"["b"]"#, "cluster.spare_hosts[0] = \"b\" is also in cluster.hosts"),
        (r#"["c", "c"]"#, "cluster.spare_hosts[1] = \"c\" is listed twice"),
        (r#"["local"]"#, "is this machine"),
        (r#"["node:0"]"#, "port"),
    ] {
        let e = with_set(&[hosts, &format!("cluster.spare_hosts={spares}")]).expect_err(spares);
        assert_mentions(&e, &[why]);
    }
    let e = with_set(&[r#"cluster.spare_hosts=["c"]"#]).expect_err("local hosts");
    assert_mentions(&e, &["cluster.spare_hosts", "needs SSH hosts in cluster.hosts"]);
    let slurm = ["cluster.launcher=\"slurm\"", "cluster.nodes=2", r#"cluster.spare_hosts=["c"]"#];
    assert_mentions(&with_set(&slurm).expect_err("slurm"), &["cluster.spare_hosts", "exclude each other"]);
}

#[test]
fn train_threads_is_a_count_and_zero_keeps_the_nodes_rule() {
    assert_eq!(with_set(&["train.threads=2"]).expect("2 threads").train.threads, 2);
    assert_eq!(with_set(&[]).expect("default").train.threads, 0, "0: the node's cores shared by its ranks");
    let e = with_set(&["train.threads=-1"]).expect_err("negative");
    assert_mentions(&e, &["train.threads", "-1"]);
    let e = with_set(&["train.threads=\"two\""]).expect_err("a string");
    assert_mentions(&e, &["train.threads"]);
}
