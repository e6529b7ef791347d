//! The closed loop's cost: refitting the local calibration overlay when a
//! sweep's measurements change (what the first `plan`/`submit` after a sweep
//! pays), and reading it back when nothing changed (what every later one pays).
//! The group's 152 records stand in for a state root with 12 experiments.
//! Run: `cargo bench -p orchestrator --bench overlay`. Target: refit < 2 s,
//! read-back < 5 ms.

use std::time::Instant;

use orchestrator::state::overlay;

fn main() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../data/vram-measurements.jsonl");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let recs = facts::record::read_jsonl(&text).unwrap_or_else(|(l, e)| panic!("{}:{l}: {e}", path.display()));
    let state = tempfile::tempdir().expect("tempdir");
    let mut files = std::collections::BTreeMap::<String, String>::new();
    for (line, r) in text.lines().zip(&recs) {
        let table = r.table.clone().unwrap_or_else(|| "records".into());
        files.entry(table).or_default().push_str(&format!("{line}\n"));
    }
    for (table, body) in &files {
        std::fs::create_dir_all(state.path().join(table)).expect("mkdir");
        std::fs::write(state.path().join(table).join("measurements.jsonl"), body).expect("write");
    }
    println!("overlay benchmark: {} records in {} experiments", recs.len(), files.len());
    let t = Instant::now();
    let o = overlay(state.path()).expect("overlay");
    let refit = t.elapsed();
    for e in o.entries.values() {
        println!(
            "  {} on {}: {} measured, {} oom; shipped median {:.1}% p90 {:.1}%, overlay held out median {:.1}% p90 {:.1}%",
            e.runtime,
            e.device,
            e.measured,
            e.oom,
            100.0 * e.shipped_error.0,
            100.0 * e.shipped_error.1,
            100.0 * e.overlay_error.0,
            100.0 * e.overlay_error.1
        );
    }
    println!("  refit (measurements changed): {:.0} ms", refit.as_secs_f64() * 1e3);
    let n = 200;
    let t = Instant::now();
    for _ in 0..n {
        std::hint::black_box(overlay(state.path()).expect("overlay"));
    }
    println!("  read back (unchanged):        {:.2} ms", t.elapsed().as_secs_f64() * 1e3 / n as f64);
}
