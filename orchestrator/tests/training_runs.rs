//! The training prediction against the group's training runs
//! (`data/training-runs.jsonl`, docs/training.md): the targets it is held to,
//! and the group's launchers, written as experiment files, beside the runs
//! they launched.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root").to_path_buf()
}

fn run(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_orchestrator"))
        .current_dir(root())
        .env_remove("RUST_LOG")
        .args(args)
        .output()
        .expect("orchestrator runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).expect("utf-8")
}

/// Every run's recorded peak (GiB) and family, by id.
fn recorded() -> BTreeMap<String, (f64, String)> {
    let text = std::fs::read_to_string(root().join("data/training-runs.jsonl")).expect("data/training-runs.jsonl");
    text.lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("a JSON line"))
        .map(|v| {
            (
                v["id"].as_str().unwrap().to_string(),
                (v["peak_gib"].as_f64().unwrap(), v["family"].as_str().unwrap().into()),
            )
        })
        .collect()
}

#[test]
fn every_run_is_predicted_within_the_targets() {
    let runs = recorded();
    let mut errors = Vec::new();
    let mut mamba = Vec::new();
    for line in run(&["predict", "--records", "data/training-runs.jsonl"]).lines() {
        let v: serde_json::Value = serde_json::from_str(line).expect("a JSON line");
        let id = v["id"].as_str().unwrap();
        let (peak, family) = &runs[id];
        // Every family has a walk now: no run goes unpredicted.
        let g = v["train_gib"].as_f64().unwrap_or_else(|| panic!("unpredicted: {line}"));
        assert!(v["phase"].is_string() && v["band_gib"].is_array(), "{line}");
        errors.push(g / peak - 1.0);
        if family == "mamba" {
            mamba.push((id.to_string(), g, *peak));
        }
    }
    assert_eq!(errors.len(), runs.len());
    // The two public MambaDiff-L runs (exp34, checkpointed): the fifth family's walk.
    assert_eq!(mamba.len(), 2, "{mamba:?}");
    for (id, g, peak) in &mamba {
        let e = g / peak - 1.0;
        println!("{id}: predicted {g:.2} GiB, recorded {peak:.2} GiB, error {:+.1} %", 100.0 * e);
        assert!(e.abs() <= 0.15, "{id}: {:+.1} %", 100.0 * e);
    }
    let mut abs: Vec<f64> = errors.iter().map(|e| e.abs()).collect();
    abs.sort_by(f64::total_cmp);
    let q = |f: f64| abs[((abs.len() - 1) as f64 * f).round() as usize];
    let under = errors.iter().filter(|&&e| e < -0.10).count();
    assert!(q(0.5) <= 0.05, "median |error| {:.1} %", 100.0 * q(0.5));
    assert!(q(0.9) <= 0.15, "p90 |error| {:.1} %", 100.0 * q(0.9));
    // Five, each named with its reason in docs/training.md (the fifth, SiT-B
    // p8 at 10.5 %, has a twin run of the same config at 4.3 %).
    assert!(under <= 5, "{under} runs more than 10 % under");
}

/// docs/training.md's table of the group's launchers: each file's `plan`
/// Train figure and phase beside the recorded peak of the run it launched.
#[test]
fn the_launchers_table_is_what_plan_says_beside_the_recorded_peaks() {
    let runs = recorded();
    let page = std::fs::read_to_string(root().join("docs/training.md")).expect("docs/training.md");
    let mut rows = 0;
    for line in page.lines().filter(|l| l.starts_with("| exp")) {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let (name, peak, train, phase) = (cells[1], cells[2], cells[3], cells[4]);
        let file = format!("experiments/train/{name}.yaml");
        let planned = run(&["plan", &file, "--json"]);
        let row: serde_json::Value = serde_json::from_str(planned.lines().next().unwrap()).unwrap();
        let gib = row["train_gib"].as_f64().unwrap();
        assert_eq!(train, format!("{gib:.1} GiB"), "{name}");
        let long = match row["train_phase"].as_str().unwrap() {
            "gen" => "generation",
            "val" => "validation",
            "start" => "start-up",
            other => other,
        };
        assert_eq!(phase, long, "{name}");
        // The run the file's header cites, and its recorded peak.
        let header = std::fs::read_to_string(root().join(&file)).unwrap();
        let (id, (recorded, _)) =
            runs.iter().find(|(id, _)| header.contains(id.as_str())).expect("the file cites its run");
        assert!(peak.starts_with(&format!("{recorded:.1} GiB")), "{name}: {peak} vs {id} {recorded}");
        rows += 1;
    }
    assert_eq!(rows, 6);
}
