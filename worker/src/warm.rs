//! `worker warm --cache-dir DIR`: fills a node's kernel cache before a sweep
//! needs it, by running one small config of each model family (see
//! [`sweep`]) through `worker run` with that cache, one process per config
//! as a job of one config per task runs it, in each precision asked for
//! (fp32 and the experiments' bf16-amp by default).
//!
//! The runs' events go to a scratch state directory (a temp dir unless one is
//! given), never to a sweep's. Each config prints one line with its wall
//! seconds and status; the whole is ok when every config ended `ok`.
//! `orchestrator install --warm` submits it as a SLURM job on the cluster's
//! GPU nodes (`templates/warm.sbatch.hbs`).

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use facts::event::RunStatus;
use facts::{DitSpec, HditSpec, Input, ModelSpec, PerLevel, Precision, RunConfig, Spatial, UnetSpec, UvitSpec};

use crate::events::now;

/// The experiment name of the warm-up runs (their events' directory).
pub const EXPERIMENT: &str = "warm";

/// A profile run of `model` at `spatial`, one channel, batch 1, fp32.
pub fn config(experiment: &str, name: &str, model: ModelSpec, spatial: Spatial) -> RunConfig {
    RunConfig::profile(experiment, name, model, Input { channels: 1, spatial })
}

/// One small config of each family (unet, dit, hdit, uvit, named so) at
/// `spatial`, in fp32: every family's kernels (convolutions, attention,
/// norms, matmuls, AdamW) run once.
pub fn sweep(experiment: &str, s: Spatial) -> Vec<RunConfig> {
    let unet = ModelSpec::Unet(UnetSpec {
        channels: vec![16, 32],
        attention_levels: vec![false, true],
        num_res_blocks: PerLevel::All(1),
        num_head_channels: PerLevel::All(16),
        norm_num_groups: 8,
    });
    let dit = ModelSpec::Dit(DitSpec { variant: None, hidden: Some(64), heads: Some(4), depth: Some(2), patch: 2 });
    let hdit = ModelSpec::Hdit(HditSpec {
        variant: None,
        hidden: Some(32),
        heads: Some(2),
        patch: 2,
        level_depths: vec![1, 1, 1],
    });
    let uvit = ModelSpec::Uvit(UvitSpec { variant: None, hidden: Some(64), heads: Some(4), depth: Some(3), patch: 2 });
    vec![
        config(experiment, "unet", unet, s),
        config(experiment, "dit", dit, s),
        config(experiment, "hdit", hdit, s),
        config(experiment, "uvit", uvit, s),
    ]
}

/// What `worker warm` runs: [`sweep`] at 8^3 in each of `precisions`, named
/// `<family>-<precision>`.
pub fn configs(precisions: &[Precision]) -> Vec<RunConfig> {
    let mut out = Vec::new();
    for &p in precisions {
        for mut cfg in sweep(EXPERIMENT, Spatial::new(8, 8, 8)) {
            cfg.name = format!("{}-{}", cfg.name, p.name());
            cfg.precision = p;
            out.push(cfg);
        }
    }
    out
}

/// One warm-up run: the config, its process's wall seconds, how it ended.
#[derive(Debug, Clone)]
pub struct Warmed {
    pub name: String,
    pub wall_s: f64,
    /// The run's result, or `None` when the process recorded none.
    pub status: Option<RunStatus>,
    /// The result's message, or how the process ended without one.
    pub detail: Option<String>,
}

impl Warmed {
    pub fn ok(&self) -> bool {
        self.status == Some(RunStatus::Ok)
    }

    /// The line `worker warm` prints for it.
    pub fn line(&self) -> String {
        let status = self.status.map_or("no result", RunStatus::name);
        let detail = self.detail.as_deref().map(|d| format!(" ({d})")).unwrap_or_default();
        format!("warm {}: {status} in {:.2} s{detail}", self.name, self.wall_s)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum WarmError {
    #[error("cannot write the warm-up config {path}: {source}")]
    Config { path: std::path::PathBuf, source: std::io::Error },
    #[error("cannot start the worker for {name}: {source}")]
    Spawn { name: String, source: std::io::Error },
}

/// Runs each of `cfgs` in a process of its own, `run(config_file)` being the
/// `worker run --config <file> …` command for it, events under `state_dir`;
/// `each` sees every run as it ends. Stops after a run that was cancelled.
pub fn run(
    cfgs: &[RunConfig],
    state_dir: &Path,
    run: impl Fn(&Path) -> Command,
    mut each: impl FnMut(&Warmed),
) -> Result<Vec<Warmed>, WarmError> {
    let dir = state_dir.join(EXPERIMENT).join("configs");
    std::fs::create_dir_all(&dir).map_err(|source| WarmError::Config { path: dir.clone(), source })?;
    let mut out = Vec::with_capacity(cfgs.len());
    for cfg in cfgs {
        let path = dir.join(format!("{}.json", cfg.name));
        let json = serde_json::to_vec(cfg).expect("a config serialises");
        std::fs::write(&path, json).map_err(|source| WarmError::Config { path: path.clone(), source })?;
        let (t0, since) = (Instant::now(), now());
        let exit = run(&path).status().map_err(|source| WarmError::Spawn { name: cfg.name.clone(), source })?;
        let wall_s = t0.elapsed().as_secs_f64();
        let result = crate::events::written_since(state_dir, cfg, since).result;
        let (status, message) = (result.as_ref().map(|r| r.status), result.and_then(|r| r.message));
        let detail = match status {
            Some(_) => message,
            None => Some(format!("the worker process ended ({exit}) without recording a result")),
        };
        let warmed = Warmed { name: cfg.name.clone(), wall_s, status, detail };
        each(&warmed);
        let cancelled = warmed.status == Some(RunStatus::Cancelled);
        out.push(warmed);
        if cancelled {
            break; // SIGTERM (the job's time limit, scancel): the rest would be cancelled too
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_family_in_every_precision_once() {
        let cfgs = configs(&[Precision::Fp32, Precision::Bf16Amp]);
        let names: Vec<&str> = cfgs.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "unet-fp32",
                "dit-fp32",
                "hdit-fp32",
                "uvit-fp32",
                "unet-bf16-amp",
                "dit-bf16-amp",
                "hdit-bf16-amp",
                "uvit-bf16-amp"
            ]
        );
        assert!(cfgs[4..].iter().all(|c| c.precision == Precision::Bf16Amp && c.experiment == EXPERIMENT));
        let runs: std::collections::BTreeSet<String> = cfgs.iter().map(|c| format!("{:?}", c.hash())).collect();
        assert_eq!(runs.len(), 8, "each its own run");
    }

    #[test]
    fn a_worker_that_records_no_result_is_not_ok_and_says_how_it_ended() {
        let state = tempfile::tempdir().unwrap();
        let cfgs = &configs(&[Precision::Fp32])[..1];
        let mut seen = Vec::new();
        let warmed = run(cfgs, state.path(), |_| Command::new("false"), |w| seen.push(w.line())).unwrap();
        assert!(!warmed[0].ok());
        assert_eq!(warmed[0].status, None);
        assert!(seen[0].starts_with("warm unet-fp32: no result in "), "{seen:?}");
        assert!(seen[0].contains("ended (exit status: 1) without recording a result"), "{seen:?}");
        assert!(state.path().join("warm/configs/unet-fp32.json").is_file(), "the config the worker was given");
    }
}
