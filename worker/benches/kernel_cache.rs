//! Where a GPU config's time goes, cold and warm: a small mixed sweep (one
//! config per model family: `worker::warm::sweep`, what `worker warm` runs)
//! run through the Vulkan backend twice, one worker process per config as
//! SLURM runs them, with one kernel cache
//! (`--cache-dir`): the first pass starts from an empty cache (every kernel
//! compiled, its pipeline built, matmuls tuned), the second reads what the
//! first stored. Prints per config the process's wall time, the first
//! training step's seconds, and the peak (which the cache must not change).
//!
//!     cargo bench -p worker --features vulkan --bench kernel_cache
//!
//! Without a GPU it runs on lavapipe, the CPU Vulkan device of
//! `scripts/lavapipe.sh` (`SWEEP_VULKAN_ROOT`); on a workstation, on the
//! Vulkan loader's first device. CI builds it and does not run it: its cold
//! pass compiles for minutes what the lavapipe tests' cold runs compile
//! already (`tests/vulkan_cpu.rs` checks the cache itself).
//! `BENCH_SPATIAL=D,H,W` sets the input size (default 8,8,8);
//! `BENCH_FAMILIES=dit,unet` keeps those families only (a cold config on
//! lavapipe takes minutes). In fp32: lavapipe compiles autocast's f16 kernels
//! ten times slower.

#[path = "../tests/common/mod.rs"]
mod common;

use std::path::Path;
use std::time::Instant;

use facts::event::{CacheState, Event};
use facts::{RunConfig, Spatial};

/// One config's run: the process's wall time, the first step's seconds
/// (fwd + bwd + step), its peak, the cache as the run found it, its status.
struct Timing {
    wall_s: f64,
    step_s: f64,
    peak_bytes: u64,
    cache: Option<CacheState>,
    status: String,
}

fn run(state: &Path, cache: &Path, cfg: &RunConfig) -> Timing {
    let t0 = Instant::now();
    let cache = cache.to_str().unwrap();
    let (out, events) =
        common::run_worker_as(common::gpu_worker(), state, cfg, &["--backend", "vulkan", "--cache-dir", cache]);
    let wall_s = t0.elapsed().as_secs_f64();
    // This run's events: from its (last) start on.
    let from = events.iter().rposition(|e| matches!(e, Event::Start { .. })).unwrap_or(0);
    let mut t =
        Timing { wall_s, step_s: 0.0, peak_bytes: 0, cache: None, status: format!("no result ({})", out.status) };
    for e in &events[from..] {
        match e {
            Event::Start { env, .. } => t.cache = env.kernel_cache,
            Event::PhaseEnd { phase, seconds, step: Some(0), .. } if phase.name() != "model" => t.step_s += seconds,
            Event::Result { status, peak_bytes, .. } => {
                t.peak_bytes = *peak_bytes;
                t.status = format!("{status:?}").to_lowercase();
            }
            _ => {}
        }
    }
    t
}

/// How the run found its cache, as the start event writes it.
fn cache_word(c: Option<CacheState>) -> String {
    c.map(|c| serde_json::to_value(c).unwrap().as_str().unwrap_or("?").to_string()).unwrap_or_else(|| "none".into())
}

fn main() {
    let spatial = std::env::var("BENCH_SPATIAL")
        .ok()
        .map(|s| {
            let v: Vec<u32> = s.split(',').map(|x| x.trim().parse().expect("BENCH_SPATIAL=D,H,W")).collect();
            Spatial::new(v[0], v[1], v[2])
        })
        .unwrap_or(Spatial::new(8, 8, 8));
    let work = tempfile::tempdir().unwrap();
    let cache = work.path().join("cache");
    let mut configs = worker::warm::sweep("bench", spatial);
    if let Ok(families) = std::env::var("BENCH_FAMILIES") {
        let families: Vec<&str> = families.split(',').map(str::trim).collect();
        if let Some(unknown) = families.iter().find(|f| !configs.iter().any(|c| c.name == **f)) {
            panic!("BENCH_FAMILIES: no family {unknown:?} (unet, dit, hdit, uvit)");
        }
        configs.retain(|c| families.contains(&c.name.as_str()));
    }
    let mut rows = Vec::new();
    for pass in ["cold", "warm"] {
        // Each pass keeps its own events (runs are kept by content), one cache for both.
        let state = work.path().join(pass);
        std::fs::create_dir_all(&state).unwrap();
        for cfg in &configs {
            let t = run(&state, &cache, cfg);
            eprintln!("{pass} {}: {:.1} s ({})", cfg.name, t.wall_s, t.status);
            rows.push((pass, cfg.name.clone(), t));
        }
    }
    println!("kernel cache, {} configs at {spatial} (Vulkan backend, one process per config)", configs.len());
    println!("| config | cold s | warm s | speed-up | first step cold s | warm s | peak cold B | warm B | status |");
    println!("|---|---|---|---|---|---|---|---|---|");
    let (mut cold_total, mut warm_total) = (0.0, 0.0);
    for cfg in &configs {
        let find = |pass: &str| &rows.iter().find(|(p, n, _)| *p == pass && *n == cfg.name).unwrap().2;
        let (c, w) = (find("cold"), find("warm"));
        cold_total += c.wall_s;
        warm_total += w.wall_s;
        println!(
            "| {} | {:.1} | {:.1} | {:.1}x | {:.1} | {:.1} | {} | {} | {}/{} (cache {}/{}) |",
            cfg.name,
            c.wall_s,
            w.wall_s,
            c.wall_s / w.wall_s,
            c.step_s,
            w.step_s,
            c.peak_bytes,
            w.peak_bytes,
            c.status,
            w.status,
            cache_word(c.cache),
            cache_word(w.cache)
        );
    }
    println!("| all | {cold_total:.1} | {warm_total:.1} | {:.1}x | | | | | |", cold_total / warm_total);
}
