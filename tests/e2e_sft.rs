//! Post-training end to end on two local ranks: a pretrained run fine-tuned with `kind = "sft"`
//! from its checkpoint (`[init] from`) answers far more held-out questions, the chain is in the
//! history, a stopped sft run resumes bit for bit, and an init of another shape is refused; DPO
//! widens its margins and GRPO raises its reward, each resuming bit for bit.
mod common;
use common::*;
use std::collections::BTreeMap;

/// (step, rank) → value of metric `key`.
fn series(db: &Db, run: &str, key: &str) -> BTreeMap<(u64, u32), f64> {
    let out = db.run(&["metrics", run, "--key", key, "--format", "csv"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    csv_rows(&String::from_utf8_lossy(&out.stdout)).into_iter().map(|(s, r, v)| ((s, r), v)).collect()
}

/// Rank 0's eval scores by step.
fn evals(db: &Db, run: &str) -> Vec<(u64, f64)> {
    series(db, run, "eval/exact_match").into_iter().filter(|((_, r), _)| *r == 0).map(|((s, _), v)| (s, v)).collect()
}

#[test]
fn a_pretrained_run_fine_tuned_from_its_checkpoint_answers_far_more_held_out_questions() {
    let db = Db::new();
    let pre = recipe("tiny-gpt.toml");
    let pre = run_id(&ok(&db.run(&[
        "run",
        pre.to_str().unwrap(),
        "--headless",
        "--set",
        "eval.every=100",
        "--set",
        "eval.prompts=256",
    ])));
    let pre_evals = evals(&db, &pre);
    assert_eq!(pre_evals.iter().map(|e| e.0).collect::<Vec<_>>(), vec![0, 100, 200], "{pre_evals:?}");

    // The shipped recipe as it is: init.from = "tiny-gpt", the newest run of that name.
    let sft = recipe("sft-arith.toml");
    let sft = run_id(&ok(&db.run(&["run", sft.to_str().unwrap(), "--headless"])));
    let scores = evals(&db, &sft);
    assert_eq!(scores.iter().map(|e| e.0).collect::<Vec<_>>(), vec![0, 100, 200, 300, 400], "{scores:?}");
    // Step 0 is the pretrained weights on the same held-out questions: the pretrain's last score.
    assert_eq!(scores[0].1, pre_evals[2].1, "sft {scores:?} pretrain {pre_evals:?}");
    let (before, after) = (scores[0].1, scores[4].1);
    assert!(after >= before + 0.2 && after >= 2.0 * before, "exact match {before} → {after}: {scores:?}");
    // Both ranks report the same eval (the counts are summed over them).
    let both = series(&db, &sft, "eval/exact_match");
    assert!(scores.iter().all(|(s, v)| both[&(*s, 1)] == *v), "{both:?}");
    // The token accuracy of the answers, every step, on every rank.
    let acc = series(&db, &sft, "mean_token_accuracy");
    assert_eq!(acc.len(), 400 * 2);
    assert!(acc.values().all(|v| (0.0..=1.0).contains(v)));
    let mean = |from: u64, to: u64| {
        let xs: Vec<f64> = acc.iter().filter(|((s, _), _)| (from..to).contains(s)).map(|(_, v)| *v).collect();
        xs.iter().sum::<f64>() / xs.len() as f64
    };
    assert!(mean(380, 401) > mean(1, 21), "token accuracy rises: {} → {}", mean(1, 21), mean(380, 401));

    // The chain, in the history.
    let show = db.json(&["show", &sft, "--json"]);
    assert_eq!(show["run"]["parent"], pre.as_str());
    assert_eq!(show["run"]["init_from"]["run"], pre.as_str());
    assert_eq!(show["run"]["init_from"]["step"], 200);
    assert!(show["run"]["resumed_from"].is_null());
    let text = ok(&db.run(&["show", &sft]));
    assert!(text.contains(&format!("lineage  started from the weights of run {pre} at step 200")), "{text}");
    assert!(text.contains("eval     exact match"), "{text}");
    let runs = ok(&db.run(&["runs"]));
    let row = runs.lines().find(|l| l.starts_with(&sft)).expect("the sft row");
    assert!(row.trim_end().ends_with(&format!("from {pre}@200")), "{row}");
    let events = show["events"].as_array().unwrap();
    assert!(
        events
            .iter()
            .any(|e| e["text"].as_str().unwrap().contains(&format!("from the weights of run {pre} at step 200"))),
        "{events:?}"
    );

    // Another shape, a step that was never saved, a run that does not exist: refused, nothing recorded.
    let sft_path = recipe("sft-arith.toml");
    for (set, says) in [
        (vec!["--set", "model.d_model=64"], "model.d_model = 64, the checkpoint's is 128".to_string()),
        (vec!["--set", "init.from=tiny-gpt@150"], "there is no checkpoint at step 150".into()),
        (vec!["--set", "init.from=no-such-run"], "init.from = \"no-such-run\": no run matches".into()),
    ] {
        let mut a = vec!["run", sft_path.to_str().unwrap(), "--headless"];
        a.extend(set);
        let out = db.run(&a);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(&says), "{a:?}: {err}");
    }
    assert_eq!(db.json(&["runs", "--json"])["runs"].as_array().unwrap().len(), 2);
    db.finish();
}

#[test]
fn a_stopped_sft_run_resumes_bit_for_bit() {
    let db = Db::new();
    let r = recipe("sft-arith.toml");
    let small = [
        "--set",
        "model.d_model=64",
        "--set",
        "model.context=32",
        "--set",
        "train.batch_per_rank=4",
        "--set",
        "train.steps=40",
        "--set",
        "eval.every=10",
        "--set",
        "eval.prompts=16",
        "--set",
        "checkpoint.every=20",
    ];
    // No [init] (fine-tuning fresh weights is a fine-tuning run too): the recipe without it.
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(&r).unwrap().replace("[init]\nfrom = \"tiny-gpt\"", "");
    let own = dir.path().join("sft-fresh.toml");
    std::fs::write(&own, text).unwrap();
    let mut a = vec!["run", own.to_str().unwrap(), "--headless"];
    a.extend(small);
    let straight = run_id(&ok(&db.run(&a)));
    let out = ok(&db.run(&["resume", &straight, "--step", "20", "--headless"]));
    let child = run_id(&out);
    for key in ["loss", "mean_token_accuracy", "eval/exact_match"] {
        let want: BTreeMap<_, _> = series(&db, &straight, key)
            .into_iter()
            .filter(|((s, _), _)| *s > 20)
            .map(|(k, v)| (k, v.to_bits()))
            .collect();
        let got: BTreeMap<_, _> = series(&db, &child, key).into_iter().map(|(k, v)| (k, v.to_bits())).collect();
        assert!(!want.is_empty(), "{key}");
        assert_eq!(got, want, "{key} after step 20 differs (bits)");
    }
    db.finish();
}

/// Rank 0's mean of `key` over steps `from..=to`.
fn mean_of(db: &Db, run: &str, key: &str, from: u64, to: u64) -> f64 {
    let xs: Vec<f64> = series(db, run, key)
        .into_iter()
        .filter(|((s, r), _)| *r == 0 && (from..=to).contains(s))
        .map(|(_, v)| v)
        .collect();
    assert!(!xs.is_empty(), "{key} {from}..={to}");
    xs.iter().sum::<f64>() / xs.len() as f64
}

#[test]
fn dpo_from_a_pretrained_run_widens_its_margins_and_resumes_bit_for_bit() {
    let db = Db::new();
    let pre = recipe("tiny-gpt.toml");
    let pre = run_id(&ok(&db.run(&["run", pre.to_str().unwrap(), "--headless"])));
    let dpo = recipe("dpo-arith.toml");
    let dpo_path = dpo.to_str().unwrap();
    let dpo = run_id(&ok(&db.run(&["run", dpo_path, "--headless", "--set", "init.from=tiny-gpt"])));
    // Against itself the first step's loss is log 2 and every reward 0.
    let loss = series(&db, &dpo, "loss");
    assert!((loss[&(1, 0)] - 2f64.ln()).abs() < 1e-6, "{}", loss[&(1, 0)]);
    assert_eq!(series(&db, &dpo, "rewards/margins")[&(1, 0)], 0.0);
    for key in ["rewards/margins", "rewards/accuracies"] {
        let (first, last) = (mean_of(&db, &dpo, key, 2, 50), mean_of(&db, &dpo, key, 151, 200));
        assert!(last > first, "{key} rises: {first:.3} over steps 2-50, {last:.3} over 151-200");
    }
    for key in ["rewards/chosen", "rewards/rejected", "logps/chosen", "logps/rejected", "eval/exact_match"] {
        assert!(!series(&db, &dpo, key).is_empty(), "{key}");
    }
    let show = db.json(&["show", &dpo, "--json"]);
    assert_eq!(show["run"]["init_from"]["run"], pre.as_str());

    // Resumed from step 100: the reference is rebuilt from the same init, so every step after
    // it repeats the straight run's bits.
    let child = run_id(&ok(&db.run(&["resume", &dpo, "--step", "100", "--headless"])));
    let show = db.json(&["show", &child, "--json"]);
    assert_eq!(
        (show["run"]["parent"].as_str(), show["run"]["resumed_from"]["step"].as_u64()),
        (Some(dpo.as_str()), Some(100))
    );
    assert_eq!(show["run"]["init_from"]["run"], pre.as_str(), "the lineage keeps the start");
    for key in ["loss", "rewards/margins", "logps/rejected"] {
        let want: BTreeMap<_, _> =
            series(&db, &dpo, key).into_iter().filter(|((s, _), _)| *s > 100).map(|(k, v)| (k, v.to_bits())).collect();
        let got: BTreeMap<_, _> = series(&db, &child, key).into_iter().map(|(k, v)| (k, v.to_bits())).collect();
        assert_eq!(got.len(), 200, "{key}");
        assert_eq!(got, want, "{key} after step 100 differs (bits)");
    }
    db.finish();
}

#[test]
fn grpo_from_a_fine_tuned_run_raises_its_reward_and_held_out_answers_and_resumes_bit_for_bit() {
    let db = Db::new();
    let pre = recipe("tiny-gpt.toml");
    let pre = run_id(&ok(&db.run(&["run", pre.to_str().unwrap(), "--headless"])));
    // A fine-tune stopped at 150 of its 400 steps: answers left for GRPO to learn (from the
    // full fine-tune it gains within the eval's noise; docs/decisions.md, GRPO).
    let sft = recipe("sft-arith.toml");
    let init = format!("init.from={pre}");
    let sft_sets = ["--set", &init, "--set", "train.steps=150", "--set", "checkpoint.every=50"];
    let sft = run_id(&ok(&db.run(&[&["run", sft.to_str().unwrap(), "--headless"][..], &sft_sets[..]].concat())));
    let grpo = recipe("grpo-arith.toml");
    let init = format!("init.from={sft}");
    let grpo = run_id(&ok(&db.run(&["run", grpo.to_str().unwrap(), "--headless", "--set", &init])));
    // Both ranks' sampled rewards, early against late.
    let reward = series(&db, &grpo, "reward");
    let mean = |from: u64, to: u64| {
        let xs: Vec<f64> = reward.iter().filter(|((s, _), _)| (from..=to).contains(s)).map(|(_, v)| *v).collect();
        assert_eq!(xs.len() as u64, 2 * (to - from + 1), "a reward per rank per step");
        xs.iter().sum::<f64>() / xs.len() as f64
    };
    let (first, last) = (mean(1, 20), mean(181, 200));
    assert!(last > first + 0.02, "reward rises: {first:.3} over steps 1-20, {last:.3} over 181-200");
    assert!(reward.values().all(|r| (0.0..=1.0).contains(r)), "exact match only: rewards in [0, 1]");
    for key in ["reward_std", "frac_reward_zero_std", "kl", "entropy", "clip_ratio", "completions/mean_length"] {
        assert_eq!(series(&db, &grpo, key).len(), 400, "{key}: every step of both ranks");
    }
    for key in ["time/generate_ms", "time/score_ms", "time/reference_ms", "time/update_ms"] {
        assert!(series(&db, &grpo, key).values().all(|ms| *ms >= 0.0), "{key}");
    }
    let exact = evals(&db, &grpo);
    assert_eq!(exact.iter().map(|e| e.0).collect::<Vec<_>>(), vec![0, 50, 100, 150, 200]);
    // Held-out greedy answers: well past the eval's noise (256 prompts, a standard error near 0.03).
    let (before, after) = (exact[0].1, exact[4].1);
    assert!(after > before + 0.05, "held-out exact match {before:.3} at step 0, {after:.3} at step 200");
    println!("grpo from sft@150: reward {first:.3} -> {last:.3}, held-out exact match {before:.3} -> {after:.3}");
    // The samples rank 0 prints say what was asked, answered and rewarded.
    let logs = run_logs(&db);
    assert!(
        logs.lines().any(|l| l.starts_with("sample step 200: ") && l.contains(" -> ") && l.contains("(reward ")),
        "{logs}"
    );
    let show = db.json(&["show", &grpo, "--json"]);
    assert_eq!(show["run"]["init_from"]["run"], sft.as_str());

    // Resumed from step 100: sampling is keyed by the prompts' indices and the reference is
    // rebuilt from the init, so every later rollout and update repeats the straight run's bits.
    let child = run_id(&ok(&db.run(&["resume", &grpo, "--step", "100", "--headless"])));
    for key in ["loss", "reward", "kl", "grad_norm"] {
        let want: BTreeMap<_, _> =
            series(&db, &grpo, key).into_iter().filter(|((s, _), _)| *s > 100).map(|(k, v)| (k, v.to_bits())).collect();
        let got: BTreeMap<_, _> = series(&db, &child, key).into_iter().map(|(k, v)| (k, v.to_bits())).collect();
        assert_eq!(got.len(), 200, "{key}");
        assert_eq!(got, want, "{key} after step 100 differs (bits)");
    }
    db.finish();
}
