//! `plan` wall time on every shipped experiment: read + expand + validate +
//! count + predict + render, as `orchestrator plan FILE` does it (target: the
//! largest experiment in < 50 ms). Run with `cargo bench -p orchestrator --bench plan`.

use orchestrator::{plan, precheck::Predictor, sweep};
use std::path::Path;
use std::time::Instant;

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
}
