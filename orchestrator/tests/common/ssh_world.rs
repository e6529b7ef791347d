//! One cluster test's world over SSH (or slurmrestd): a local state
//! directory, a clusters file naming the test cluster with a fresh remote
//! work directory, a light job template, an experiment file; and how such a
//! test follows its sweep.

use orchestrator::submit::{self, Options, StatusReport, Watch};
use orchestrator::sweep::{self, Sweep};
use orchestrator::transport::ssh::SshShell;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use super::{rt, Env};

/// One test's world: a local state dir, a clusters file naming the test
/// cluster over SSH with a fresh remote work dir, a template, an experiment file.
pub struct World {
    _tmp: tempfile::TempDir,
    pub dir: PathBuf,
    pub opts: Options,
    pub exp_file: PathBuf,
    pub remote_work: String,
}

/// The record template ([`super::RECORD_TEMPLATE`]: copies task i's manifest
/// line to a file) that also writes the description, then sleeps `sleep` seconds.
pub fn template(sleep: f64) -> String {
    let head = super::RECORD_TEMPLATE
        .strip_suffix("sleep \"${SWEEP_TEST_SLEEP:-0}\"\n")
        .expect("RECORD_TEMPLATE ends with its sleep");
    format!(
        "{}printf '%s' {{{{sh description}}}} > {{{{sh submission_dir}}}}/description-$SLURM_ARRAY_TASK_ID.txt\nsleep {sleep}\n",
        head
    )
}

/// How the world's cluster `test` is reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Over {
    Ssh,
    Rest,
}

pub fn world(env: &Env, test: &str, n: usize, parallel: u32, sleep: f64) -> World {
    world_over(Over::Ssh, env, test, n, parallel, sleep)
}

/// [`world`] with the cluster reached `over` SSH or slurmrestd.
pub fn world_over(over: Over, env: &Env, test: &str, n: usize, parallel: u32, sleep: f64) -> World {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().to_path_buf();
    let remote_work = env.remote_work(test);
    let clusters = match over {
        Over::Ssh => env.ssh_clusters_file(&dir, &remote_work, "{partition: gpu}"),
        Over::Rest => env.rest_clusters_file(&dir, &remote_work, "{partition: gpu}"),
    };
    std::fs::write(dir.join("record.sbatch.hbs"), template(sleep)).expect("template");
    let exp = super::batch_grid_experiment(test, "cluster test", "test", &dir.join("record.sbatch.hbs"), n, parallel);
    let exp_file = dir.join(format!("{test}.yaml"));
    std::fs::write(&exp_file, exp).expect("experiment file");
    let opts = Options {
        state_root: dir.join("state"),
        clusters_file: Some(clusters),
        template_dirs: vec![],
        // The record template runs no worker: no result line ever comes, so no lag grace.
        result_grace: Duration::from_secs(2),
        ..Options::default()
    };
    World { _tmp: tmp, dir, opts, exp_file, remote_work }
}

impl World {
    pub fn sweep(&self) -> Sweep {
        sweep::load(&self.exp_file, &[]).expect("experiment loads")
    }

    pub fn shell(&self) -> SshShell {
        let (file, label) =
            orchestrator::cluster::ClustersFile::load_or_default(self.opts.clusters_file.as_deref()).expect("clusters");
        let (_, c) = file.get("test", &label).expect("test cluster");
        SshShell::new("test", &c).expect("ssh target")
    }

    pub fn records(&self, exp: &str) -> BTreeMap<String, orchestrator::state::ConfigRecord> {
        super::records(&self.opts.state_root, exp)
    }

    /// The orchestrator binary running `sub ARG` on this world's state and clusters.
    pub fn binary(&self, sub: &str, arg: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_orchestrator"));
        c.arg(sub).arg(arg);
        c.arg("--state-dir")
            .arg(&self.opts.state_root)
            .arg("--clusters")
            .arg(self.opts.clusters_file.as_ref().expect("file"));
        c.arg("--result-grace").arg(self.opts.result_grace.as_secs_f64().to_string());
        // The REST cluster's token is its token file's, never the caller's.
        c.env_remove("SLURM_JWT");
        c
    }
}

/// `status --watch` until every config settled (or `limit`), returning the last report.
pub fn watch(w: &World, exp: &str, limit: Duration) -> StatusReport {
    let watch = Watch {
        min: Duration::from_millis(700),
        max: Duration::from_secs(3),
        max_polls: Some((limit.as_secs_f64() / 0.7) as u32 + 1),
    };
    let r = rt().block_on(submit::status(exp, &w.opts, Some(watch), &mut |_| {})).expect("status --watch");
    assert!(r.settled, "not settled within {limit:?}:\n{}", r.table());
    r
}

/// How many SLURM tasks run each config (every value must be 1: no duplicates).
pub fn jobs_per_config(env: &Env, w: &World, exp: &str) -> BTreeMap<String, usize> {
    env.jobs_per_config(&w.opts.state_root, exp)
}
