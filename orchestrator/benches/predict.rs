//! Precheck throughput on one core: full breakdowns and verdicts per second over
//! the published records (all four families, UNets up to 5 levels).
//! Run: `cargo bench -p orchestrator --bench predict`. Target: >= 1M predictions/s.

use std::hint::black_box;
use std::time::{Duration, Instant};

use facts::RunConfig;
use orchestrator::precheck::Predictor;

fn configs() -> Vec<RunConfig> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../data/vram-measurements.jsonl");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let recs = facts::record::read_jsonl(&text).unwrap_or_else(|(l, e)| panic!("{}:{l}: {e}", path.display()));
    recs.iter().filter_map(|r| r.run_config().ok()).collect()
}

/// Run `f` over all configs repeatedly for about `budget`; returns calls per second.
fn rate(cfgs: &[RunConfig], budget: Duration, mut f: impl FnMut(&RunConfig) -> f64) -> (f64, f64) {
    let start = Instant::now();
    let mut n = 0u64;
    let mut acc = 0.0;
    while start.elapsed() < budget {
        for c in cfgs {
            acc += f(black_box(c));
        }
        n += cfgs.len() as u64;
    }
    (n as f64 / start.elapsed().as_secs_f64(), acc)
}

fn main() {
    let cfgs = configs();
    let p = Predictor::pytorch();
    let budget = Duration::from_secs(2);
    println!("precheck benchmark: {} configs (unet, dit, hdit, uvit), one thread", cfgs.len());
    let (r, acc) = rate(&cfgs, budget, |c| p.predict(c).map(|x| x.peak_bytes).unwrap_or(0.0));
    println!("  predict (full breakdown):  {:>10.0} predictions/s  ({:.0} ns each)  [checksum {acc:.3e}]", r, 1e9 / r);
    let (r, acc) = rate(&cfgs, budget, |c| p.predict_peak(c).map(|x| x.peak_bytes).unwrap_or(0.0));
    println!("  predict_peak (no terms):    {:>9.0} predictions/s  ({:.0} ns each)  [checksum {acc:.3e}]", r, 1e9 / r);
    // The same without per-family bands and the coverage check: what the bands cost.
    let bare = Predictor::new(p.runtime(), *p.coefficients());
    let (r, acc) = rate(&cfgs, budget, |c| bare.predict_peak(c).map(|x| x.peak_bytes).unwrap_or(0.0));
    println!("  predict_peak, no bands:     {:>9.0} predictions/s  ({:.0} ns each)  [checksum {acc:.3e}]", r, 1e9 / r);
    let (r, acc) = rate(&cfgs, budget, |c| p.verdict(c, Some(60.0)).predicted_gib().unwrap_or(0.0));
    println!("  verdict (validate+predict): {:>9.0} verdicts/s     ({:.0} ns each)  [checksum {acc:.3e}]", r, 1e9 / r);
    for family in ["unet", "dit", "hdit", "uvit"] {
        let sub: Vec<RunConfig> = cfgs.iter().filter(|c| c.model.family().name() == family).cloned().collect();
        if sub.is_empty() {
            continue;
        }
        let (full, _) = rate(&sub, Duration::from_millis(500), |c| p.predict(c).map(|x| x.peak_bytes).unwrap_or(0.0));
        let (peak, _) =
            rate(&sub, Duration::from_millis(500), |c| p.predict_peak(c).map(|x| x.peak_bytes).unwrap_or(0.0));
        println!("    {family:<5} {:>10.0} full/s  {:>10.0} peak-only/s", full, peak);
    }
}
