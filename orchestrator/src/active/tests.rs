use super::*;
use crate::precheck::RiskReason;
use facts::record::read_jsonl;

fn table(name: &str) -> Vec<MeasurementRecord> {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../data/vram-measurements.jsonl"))
        .expect("the group's records");
    read_jsonl(&text).expect("parse").into_iter().filter(|r| r.table.as_deref() == Some(name)).collect()
}

fn configs(recs: &[MeasurementRecord]) -> Vec<(String, RunConfig)> {
    recs.iter().map(|r| (r.id.clone(), r.run_config().expect("config"))).collect()
}

/// The loop with the records as the measurement: rounds until it stops.
fn run(recs: &[MeasurementRecord], settings: &Settings) -> (BTreeMap<String, Answer>, Vec<Vec<String>>, Stop) {
    let cfgs = configs(recs);
    let by_id: BTreeMap<&str, &MeasurementRecord> = recs.iter().map(|r| (r.id.as_str(), r)).collect();
    let mut measured: BTreeMap<String, MeasurementRecord> = BTreeMap::new();
    let mut rounds = Vec::new();
    loop {
        let list: Vec<MeasurementRecord> = measured.values().cloned().collect();
        let refit = Refit::new(&Calibration::builtin(), &settings.runtime, &list);
        let ans = answers(&cfgs, &measured, &refit, settings.target_error);
        match choose(&cfgs, &ans, &refit, settings, measured.len(), &Default::default()) {
            Choice::Done(stop) => return (ans, rounds, stop),
            Choice::Measure(keys) => {
                for k in &keys {
                    assert!(!measured.contains_key(k), "{k} chosen twice");
                    measured.insert(k.clone(), by_id[k.as_str()].clone());
                }
                rounds.push(keys);
            }
        }
    }
}

fn settings(target: f64, max_runs: Option<usize>) -> Settings {
    Settings { runtime: Runtime::default(), target_error: target, max_runs, round_size: None }
}

#[test]
fn a_table_ends_settled_with_every_config_answered_and_no_config_run_twice() {
    let recs = table("dit_latent");
    assert!(recs.len() > 10);
    let (ans, rounds, stop) = run(&recs, &settings(0.25, None));
    assert_eq!(stop, Stop::Settled);
    assert_eq!(ans.len(), recs.len());
    assert!(ans.values().all(Answer::is_settled));
    assert!(!rounds.is_empty(), "an unmeasured family/regime gets an anchor");
    let s = Savings::of(&ans, &[]);
    assert_eq!(s.measured + s.predicted, recs.len());
    assert_eq!(s.measured, rounds.iter().map(Vec::len).sum::<usize>());
}

#[test]
fn the_budget_stops_the_loop() {
    let recs = table("dit_latent");
    let (ans, rounds, stop) = run(&recs, &settings(0.0, Some(3)));
    assert_eq!(stop, Stop::Budget);
    assert_eq!(rounds.iter().map(Vec::len).sum::<usize>(), 3);
    assert_eq!(ans.values().filter(|a| a.is_measured()).count(), 3);
}

#[test]
fn a_prediction_names_its_calibration_and_interval() {
    let recs = table("dit_latent");
    let cfgs = configs(&recs);
    let refit = Refit::new(&Calibration::builtin(), "pytorch", &[]);
    let Answer::Predicted { peak_gib, low_gib, high_gib, calibration, .. } = refit.predict(&cfgs[0].1, 0.05) else {
        panic!("a prediction")
    };
    assert!(low_gib < peak_gib && peak_gib < high_gib);
    assert!(calibration.starts_with("prior pytorch/bf16-amp #"), "{calibration}");
    let local = Refit::new(&Calibration::builtin(), "pytorch", &recs[..5]);
    let (_, id) = local.predictor(&cfgs[0].1).expect("predictor");
    assert!(id.starts_with("local pytorch/bf16-amp on A100"), "{id}");
}

fn keys_failing(keys: &[String], why: &str) -> BTreeMap<String, String> {
    keys.iter().map(|k| (k.clone(), format!("{why} {k}"))).collect()
}

#[test]
fn a_round_whose_runs_all_failed_stops_the_loop_with_nothing_settled_or_saved() {
    let recs = table("dit_latent");
    let cfgs = configs(&recs);
    let s = settings(0.25, None);
    let refit = Refit::new(&Calibration::builtin(), "pytorch", &[]);
    let first = match choose(&cfgs, &answers(&cfgs, &BTreeMap::new(), &refit, 0.25), &refit, &s, 0, &Default::default())
    {
        Choice::Measure(keys) => keys,
        other => panic!("an unmeasured sweep measures first: {other:?}"),
    };
    // Every run of the first round failed: no measurement came back.
    let failed = keys_failing(&first, "worker crashed on");
    let ans = answers_after(&cfgs, &BTreeMap::new(), &failed, &refit, 0.25);
    assert!(first.iter().all(|k| matches!(&ans[k], Answer::Failed { .. }) && !ans[k].is_settled()));
    assert!(round_failed(&first, &ans), "the loop stops after a round that measured nothing");
    // Nothing anchors the groups the failed runs were in: no prediction there is settled.
    let savings = Savings::of(&ans, &[]);
    assert_eq!((savings.measured, savings.failed), (0, first.len()));
    assert_eq!(savings.runs_saved, savings.settled, "only settled predictions save a run");
    assert_eq!(savings.runs_saved, 0, "{ans:#?}");
    // The failures, grouped by cause with the config's own name taken out.
    let text = failures_text(&ans);
    assert!(text.starts_with(&format!("{} could not be measured:\n", configs_words(first.len()))), "{text}");
    assert!(text.contains("worker crashed on each config"), "{text}");
    // Chosen again, the loop never asks for a failed config.
    let tried: BTreeSet<String> = first.iter().cloned().collect();
    if let Choice::Measure(next) = choose(&cfgs, &ans, &refit, &s, first.len(), &tried) {
        assert!(next.iter().all(|k| !tried.contains(k)), "{next:?}");
    }
}

fn configs_words(n: usize) -> String {
    super::configs(n)
}

#[test]
fn when_only_failed_configs_are_left_the_stop_is_not_settled() {
    let recs = table("dit_latent");
    let cfgs = configs(&recs);
    let refit = Refit::new(&Calibration::builtin(), "pytorch", &[]);
    // Everything measured but one config, which failed.
    let mut measured: BTreeMap<String, MeasurementRecord> = recs.iter().map(|r| (r.id.clone(), r.clone())).collect();
    let lost = recs[0].id.clone();
    measured.remove(&lost);
    let failed = BTreeMap::from([(lost.clone(), "TIMEOUT".to_string())]);
    let ans = answers_after(&cfgs, &measured, &failed, &refit, 0.25);
    let tried: BTreeSet<String> = cfgs.iter().map(|(k, _)| k.clone()).collect();
    let choice = choose(&cfgs, &ans, &refit, &settings(0.25, None), cfgs.len(), &tried);
    assert_eq!(choice, Choice::Done(Stop::Unmeasured));
    assert!(!Stop::Unmeasured.to_string().contains("Unmeasured"), "words, not the enum's name");
    assert!(!round_failed(&[lost], &BTreeMap::new()), "a round of configs with no answer is no failed round");
}

#[test]
fn a_config_predicted_above_what_a_run_may_use_is_settled_whatever_its_band_and_never_chosen() {
    let recs = table("dit_latent");
    let cfgs = configs(&recs);
    // Held to 1 MiB, every config is far above it; a target of 0.01% no band meets.
    let refit = Refit::new(&Calibration::builtin(), "pytorch", &[]).with_limit(Some(1.0 / 1024.0));
    let ans = answers(&cfgs, &BTreeMap::new(), &refit, 0.0001);
    for a in ans.values() {
        let Answer::Predicted { verdict, band, settled, low_gib, .. } = a else { panic!("{a:?}") };
        assert_eq!(*verdict, VerdictKind::Oom);
        assert!(*band > 0.0001 && *low_gib > 1.0 / 1024.0);
        assert!(settled, "a run could only say oom: {a:?}");
    }
    let choice = choose(&cfgs, &ans, &refit, &settings(0.0001, None), 0, &Default::default());
    assert_eq!(choice, Choice::Done(Stop::Settled), "no GPU job spent on a config that can only say oom");
}

#[test]
fn the_budget_judges_predictions_as_plan_does() {
    let recs = table("dit_latent");
    let cfgs = configs(&recs);
    let (_, cfg) = &cfgs[0];
    let bare = Refit::new(&Calibration::builtin(), "pytorch", &[]);
    let Answer::Predicted { peak_gib, low_gib, high_gib, .. } = bare.predict(cfg, 0.5) else { panic!("a prediction") };
    // The budget inside the interval: risky, near the budget, for a run to decide.
    let near = Refit::new(&Calibration::builtin(), "pytorch", &[]).with_budget(Some((peak_gib + high_gib) / 2.0));
    let a = near.predict(cfg, 0.5);
    assert!(
        matches!(
            a,
            Answer::Predicted { verdict: VerdictKind::Risky, reason: Some(RiskReason::NearBudget), settled: false, .. }
        ),
        "{a:?}"
    );
    assert!(a.predicted_words().is_some_and(|w| w.starts_with("risky (near budget), predicted ")), "{a:?}");
    // The whole interval over the budget (and under the capacity): settled, over budget.
    let over = Refit::new(&Calibration::builtin(), "pytorch", &[]).with_budget(Some(low_gib * 0.9));
    let a = over.predict(cfg, 0.5);
    assert!(matches!(a, Answer::Predicted { reason: Some(RiskReason::OverBudget), settled: true, .. }), "{a:?}");
}

#[test]
fn an_interval_narrower_than_its_digits_is_said_as_a_band() {
    assert_eq!(peak_interval(2.5, 2.49, 2.51, 0.004), "2.5G (±0.40%)");
    assert_eq!(peak_interval(2.5, 2.0, 3.2, 0.25), "2.5G (2.0–3.2G)");
    assert_eq!(peak_interval(2.5, 1.3, f64::INFINITY, 1.0), "2.5G (1.3G or more)");
    assert_eq!(interval(2.0, 3.0), (1.0, f64::INFINITY), "a band above 100% is taken as 100%, as verdicts take it");
}

#[test]
fn causes_group_without_the_configs_names_and_hashes() {
    let fail = |c: &str| Answer::Failed { cause: c.to_string() };
    let ans = BTreeMap::from([
        ("a".to_string(), fail("replay: f has no record of config a (hash 0123456789ab)\nmore")),
        ("bb".to_string(), fail("replay: f has no record of config bb (hash ba9876543210)")),
        ("c".to_string(), fail("exit code 1:0")),
    ]);
    let groups = failures(&ans);
    assert_eq!(groups.len(), 2, "{groups:?}");
    assert_eq!(groups[0].0, "replay: f has no record of config <config> (hash <hash>)");
    assert_eq!(groups[0].1, vec!["a".to_string(), "bb".to_string()]);
    let text = failures_text(&ans);
    assert!(text.starts_with("3 configs could not be measured:\n  2 configs (a, bb): replay"), "{text}");
    assert!(text.contains("\n  1 config (c): exit code 1:0\n"), "{text}");
    // Said to the user: one config's own name and hash, several worded; never a placeholder.
    assert!(text.contains("  2 configs (a, bb): replay: f has no record of these configs\n"), "{text}");
    let one = failures_text(&BTreeMap::from([("a".to_string(), ans["a"].clone())]));
    assert_eq!(
        one,
        "1 config could not be measured:\n  1 config (a): replay: f has no record of config a (hash 0123456789ab)\n"
    );
    let elsewhere = ans
        .keys()
        .map(|n| (n.clone(), fail(&format!("replay: f has config {n} (hash 0123456789ab) only on H100, not on A100"))));
    let text = failures_text(&elsewhere.collect());
    assert!(text.contains(": replay: f has these configs only on H100, not on A100\n"), "{text}");
    assert!(!text.contains('<'), "{text}");
}

#[test]
fn a_measured_answer_is_the_exact_bytes_old_records_their_gib() {
    let recs = table("dit_latent");
    let mut r = recs[0].clone();
    assert!(r.peak_bytes.is_none(), "the group's records give GiB");
    assert_eq!(measured(&r), Answer::Measured { peak_gib: r.peak_gb, oom: false });
    r.peak_bytes = Some(3_834_989);
    r.peak_gb = Some(0.004);
    let Answer::Measured { peak_gib: Some(p), .. } = measured(&r) else { panic!("measured") };
    assert_eq!(p * (1u64 << 30) as f64, 3_834_989.0);
}

/// A calibration that missed the sweep's regime says so in its intervals
/// (issue 32, item 6). The shipped calibration predicts `hdit_256` within 2 %;
/// here the table's peaks read 15 % higher, as a site whose runtime keeps
/// more would measure them: the prior's intervals miss most of the configs
/// the loop does not measure; widened by the runs it measures, they hold all.
#[test]
fn the_sweep_s_own_runs_widen_the_band_of_its_unmeasured_configs() {
    let recs: Vec<MeasurementRecord> = table("hdit_256")
        .into_iter()
        .filter(|r| r.peak_gb.is_some())
        .map(|r| MeasurementRecord { peak_gb: r.peak_gb.map(|g| g * 1.15), ..r })
        .collect();
    assert_eq!(recs.len(), 12);
    let (ans, rounds, _) = run(&recs, &settings(0.2, Some(2)));
    let bare = Refit::new(&Calibration::builtin(), "pytorch", &[]);
    let (mut predicted, mut inside_before, mut inside) = (0, 0, 0);
    for r in &recs {
        let Answer::Predicted { low_gib, high_gib, distance, .. } = &ans[&r.id] else { continue };
        let Answer::Predicted { low_gib: lo, high_gib: hi, .. } = bare.predict(&r.run_config().expect("config"), 0.2)
        else {
            panic!("a prediction")
        };
        let measured = r.peak_gib().expect("a peak");
        predicted += 1;
        inside_before += usize::from((lo..=hi).contains(&measured));
        inside += usize::from((*low_gib..=*high_gib).contains(&measured));
        let why = distance.as_deref().unwrap_or_default();
        assert!(why.starts_with("this sweep's ") && why.contains("% off this calibration"), "{}: {why}", r.id);
    }
    let measured = rounds.iter().map(Vec::len).sum::<usize>();
    assert!((1..=2).contains(&measured), "the budget of 2 runs: {rounds:?}");
    assert_eq!(predicted, 12 - measured);
    assert!(inside_before < predicted / 2, "the prior misses most: {inside_before} of {predicted} inside");
    assert_eq!(inside, predicted, "widened by the sweep's run, every interval holds its peak");
}

/// An `oom` is a censored observation: predicted to fit the memory it ran
/// out of, the calibration was off by at least the difference, and the band
/// of the family's other configs says so; predicted above it, nothing moves.
#[test]
fn an_oom_the_calibration_did_not_expect_widens_the_band() {
    let recs = table("dit_latent");
    let cfg = recs[0].run_config().expect("config");
    let bare = Refit::new(&Calibration::builtin(), "pytorch", &[]);
    let Answer::Predicted { band: before, .. } = bare.predict(&cfg, 0.2) else { panic!("a prediction") };
    let Answer::Predicted { peak_gib: other_peak, .. } = bare.predict(&recs[1].run_config().expect("config"), 0.2)
    else {
        panic!("a prediction")
    };
    // recs[1] ran out of memory at 1.25x its prediction (a limit it was held to).
    let oom_at = |gib: f64| MeasurementRecord {
        status: MeasuredStatus::Oom,
        peak_gb: None,
        peak_bytes: None,
        memory_limit_gb: Some(gib),
        ..recs[1].clone()
    };
    let Answer::Predicted { band, distance, .. } =
        Refit::new(&Calibration::builtin(), "pytorch", &[oom_at(other_peak * 1.25)]).predict(&cfg, 0.2)
    else {
        panic!("a prediction")
    };
    assert!((band - 1.5 * 0.25 / 1.25).abs() < 1e-9 && band > before, "{band} vs {before}");
    assert_eq!(distance.as_deref(), Some("this sweep's run measured 25.0% off this calibration"));
    let Answer::Predicted { band: unmoved, .. } =
        Refit::new(&Calibration::builtin(), "pytorch", &[oom_at(other_peak * 0.8)]).predict(&cfg, 0.2)
    else {
        panic!("a prediction")
    };
    assert_eq!(unmoved, before);
}
