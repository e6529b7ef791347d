//! `plan` wall time: every shipped experiment (read + expand + validate +
//! count + predict + render, as `orchestrator plan FILE` does it; target: the
//! largest experiment in < 50 ms), then a synthetic sweep of 100,000 configs
//! of all four families, in this process (target: under 1 s) and as the
//! command `orchestrator plan scale.yaml --json` with its output read through
//! a pipe, the whole process timed (target: under 1 s on the project's 2-core
//! machine). Run with `cargo bench -p orchestrator --bench plan`.

use orchestrator::{plan, precheck::Predictor, sweep};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

/// 4 families x 10 batches x 10 input channels x 10 output channels x 25
/// shapes = 100,000 distinct configs.
fn scale_sweep() -> String {
    let shapes: Vec<String> = [16, 24, 32, 40, 48]
        .iter()
        .flat_map(|d| [32, 64, 96, 128, 160].map(|hw| format!("[{d}, {hw}, {hw}]")))
        .collect();
    format!(
        "name: scale\ngpu: A100-SXM4-80GB\nprecision: bf16-amp\ninput: {{channels: 1, spatial: [16, 32, 32]}}\n\
         output_channels: 1\nmodel: {{family: unet, channels: [32, 64, 128, 256], attention_levels: [false, false, true, true], \
         num_res_blocks: 2, num_head_channels: 32}}\n\
         sweep:\n  configs:\n\
         \x20   - {{name: unet}}\n\
         \x20   - {{name: dit, model: {{family: dit, variant: S, patch: 2}}}}\n\
         \x20   - {{name: hdit, model: {{family: hdit, variant: S, patch: 2, level_depths: [2, 4, 2]}}}}\n\
         \x20   - {{name: uvit, model: {{family: uvit, variant: S, patch: 4}}}}\n\
         \x20 grid:\n\
         \x20   batch: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]\n\
         \x20   input.channels: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]\n\
         \x20   output_channels: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]\n\
         \x20   input.spatial: [{}]\n",
        shapes.join(", ")
    )
}

fn main() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../experiments");
    let mut files: Vec<_> =
        std::fs::read_dir(&dir).expect("experiments/").filter_map(|e| e.ok()).map(|e| e.path()).collect();
    files.sort();
    println!("{:<14} {:>8} {:>12} {:>12}", "experiment", "configs", "median ms", "max ms");
    for f in files.iter().filter(|p| p.extension().is_some_and(|e| e == "yaml")) {
        let mut times = Vec::new();
        let mut configs = 0;
        for _ in 0..30 {
            let t = Instant::now();
            let s = sweep::load(f, &[]).expect("plans");
            let predictor = Predictor::pytorch();
            let rows = plan::rows(&s, &predictor);
            let text = plan::table(&s, &rows);
            std::hint::black_box(text);
            times.push(t.elapsed().as_secs_f64() * 1e3);
            configs = rows.len();
        }
        times.sort_by(f64::total_cmp);
        let name = f.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
        println!("{name:<14} {configs:>8} {:>12.2} {:>12.2}", times[times.len() / 2], times[times.len() - 1]);
    }

    let text = scale_sweep();
    let mut times = Vec::new();
    let mut stages = (0.0, 0.0, 0.0, 0.0);
    let mut configs = 0;
    for _ in 0..3 {
        let t = Instant::now();
        let s = sweep::parse(Path::new("scale.yaml"), &text, &[]).expect("the scale sweep plans");
        let expanded = t.elapsed().as_secs_f64();
        let rows = plan::rows(&s, &Predictor::pytorch());
        let predicted = t.elapsed().as_secs_f64();
        let table = plan::table(&s, &rows);
        std::hint::black_box(table);
        let total = t.elapsed().as_secs_f64();
        let mut json = Vec::new();
        plan::write_json(&s, &Predictor::pytorch(), &mut json).expect("JSON into memory");
        assert_eq!(json.iter().filter(|&&b| b == b'\n').count(), rows.len(), "a JSON line per config");
        times.push(total);
        stages = (expanded, predicted - expanded, total - predicted, t.elapsed().as_secs_f64() - total);
        configs = rows.len();
    }
    times.sort_by(f64::total_cmp);
    let best = times[0];
    println!(
        "\nplan of {configs} configs: {best:.3} s ({:.1} µs a config; expand {:.3} s, rows {:.3} s, table {:.3} s; \
         the rows as JSON instead {:.3} s){}",
        best / configs as f64 * 1e6,
        stages.0,
        stages.1,
        stages.2,
        stages.3,
        target_note(best)
    );
    command(&text, configs);
}

/// `orchestrator plan scale.yaml --json` as a user runs it: its own process
/// (reading the file, expanding, judging where it runs, predicting, writing
/// a JSON line per config into a pipe this process reads), timed whole.
fn command(text: &str, configs: usize) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    std::fs::write(dir.path().join("scale.yaml"), text).expect("writing scale.yaml");
    // A debug build only shows that it runs; a release build is timed over several runs.
    let runs = if cfg!(debug_assertions) { 1 } else { 5 };
    let mut times: Vec<f64> = (0..runs)
        .map(|_| {
            let t = Instant::now();
            let out = Command::new(env!("CARGO_BIN_EXE_orchestrator"))
                .args(["plan", "scale.yaml", "--json", "--state-dir", "state"])
                .current_dir(dir.path())
                .stdout(Stdio::piped())
                .output()
                .expect("running orchestrator plan");
            let wall = t.elapsed().as_secs_f64();
            assert!(out.status.success(), "plan --json failed: {}", String::from_utf8_lossy(&out.stderr));
            assert_eq!(out.stdout.iter().filter(|&&b| b == b'\n').count(), configs, "a JSON line per config");
            wall
        })
        .collect();
    times.sort_by(f64::total_cmp);
    println!(
        "`orchestrator plan --json` of {configs} configs, the whole process: median {:.3} s, best {:.3} s of {runs}{}",
        times[times.len() / 2],
        times[0],
        target_note(times[times.len() / 2])
    );
}

/// The 1 s targets are a release build's (`cargo bench`); a debug build (the
/// dev profile `scripts/test.sh` runs benches in) is only shown to run.
fn target_note(best: f64) -> &'static str {
    match (cfg!(debug_assertions), best < 1.0) {
        (true, _) => "  (a debug build: the 1 s target is for `cargo bench -p orchestrator --bench plan`)",
        (false, true) => "",
        (false, false) => "  -- over the 1 s target",
    }
}
