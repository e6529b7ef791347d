use super::*;
use spec::record::read_jsonl;

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
        let refit = Refit::new(&Calibration::builtin(), &settings.framework, &list);
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
    Settings { framework: "pytorch".into(), target_error: target, max_runs, round_size: None }
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
