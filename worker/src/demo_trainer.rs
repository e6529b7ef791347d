//! `worker demo-trainer`: a scripted trainer for chained runs on a cluster
//! without a GPU (the chain demo, `experiments/chain-demo.yaml`, and its
//! tests). It behaves as the group's `train.py` does toward its launcher:
//! it trains step by step, saves a checkpoint every few steps and when
//! SIGUSR1 comes (then exits 0, for the next segment to resume), resumes
//! from a checkpoint it is given, and marks the run complete at the end.
//! It holds some memory while it runs, so the watch has a peak to see.
//!
//! Everything happens in its working directory (the config's run
//! directory under `worker watch --chain-max`): `checkpoint.txt` (the last
//! step saved), `steps.log` (one line per step trained: a step trained twice
//! was lost to a kill and redone), `segments.log` (where each run began) and
//! the marker `.training_complete`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// How the demo trains.
#[derive(Debug, Clone)]
pub struct DemoTrainer {
    pub steps: u32,
    pub step: Duration,
    pub save_every: u32,
    /// The checkpoint to resume from (`--resume=PATH`).
    pub resume: Option<PathBuf>,
    pub hold_mb: usize,
}

pub const CHECKPOINT: &str = "checkpoint.txt";
pub const MARKER: &str = ".training_complete";

fn append(file: &str, line: &str) -> std::io::Result<()> {
    let mut f = std::fs::OpenOptions::new().create(true).append(true).open(file)?;
    writeln!(f, "{line}")?;
    f.sync_all()
}

/// Writes the checkpoint whole or not at all (a kill mid-write leaves the old one).
fn save(step: u32) -> std::io::Result<()> {
    let tmp = format!("{CHECKPOINT}.tmp");
    std::fs::write(&tmp, format!("{step}\n"))?;
    std::fs::File::open(&tmp)?.sync_all()?;
    std::fs::rename(&tmp, CHECKPOINT)
}

fn load(path: &Path) -> std::io::Result<u32> {
    let text = std::fs::read_to_string(path)?;
    text.trim()
        .parse()
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, format!("{}: {e}", path.display())))
}

/// Trains to the end or to SIGUSR1; the process's exit code.
pub fn run(t: &DemoTrainer) -> std::io::Result<i32> {
    let stop = Arc::new(AtomicBool::new(false));
    signal_hook::flag::register(signal_hook::consts::SIGUSR1, stop.clone())?;
    let first = match &t.resume {
        Some(p) => load(p)? + 1,
        None => 1,
    };
    append(
        "segments.log",
        &format!("began at step {first} job {}", std::env::var("SLURM_JOB_ID").unwrap_or_default()),
    )?;
    println!("demo-trainer: {} at step {first} of {}", if first > 1 { "resumed" } else { "started" }, t.steps);
    // Memory held for the run, touched so it is resident.
    let held = vec![1u8; t.hold_mb << 20];
    for step in first..=t.steps {
        if stop.load(Ordering::Relaxed) {
            save(step - 1)?;
            println!("demo-trainer: SIGUSR1: saved step {} and exiting for the next segment", step - 1);
            return Ok(0);
        }
        std::thread::sleep(t.step);
        append("steps.log", &step.to_string())?;
        println!("step {step}/{}", t.steps);
        if step % t.save_every.max(1) == 0 {
            save(step)?;
        }
    }
    save(t.steps)?;
    std::fs::write(MARKER, b"")?;
    println!("demo-trainer: complete ({} bytes held)", held.len());
    Ok(0)
}
