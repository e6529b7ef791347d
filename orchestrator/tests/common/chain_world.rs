//! One chained sweep on the real test cluster: `experiments/chain-demo.yaml`
//! under a name of its own, over the local SLURM commands, SSH or slurmrestd,
//! with the worker installed in a fresh remote work directory; how a chain
//! test drives it (the orchestrator binary, as a user would) and what it
//! checks at the end (every config completed once, in segments that never
//! overlap, each resumed from its checkpoint).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use super::{text, worker_binary, Env};

/// How the world's cluster `test` is reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Over {
    /// SLURM's commands on this machine (`transport: local-slurm`).
    LocalSlurm,
    Ssh,
    Rest,
}

pub struct ChainWorld {
    _tmp: tempfile::TempDir,
    pub name: String,
    pub file: PathBuf,
    pub state: PathBuf,
    clusters: PathBuf,
    pub remote_work: String,
    slurm_conf: String,
}

/// The chain demo as `name` on the test cluster reached `over`, its worker installed.
pub fn chain_world(env: &Env, over: Over, name: &str) -> ChainWorld {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().to_path_buf();
    let remote_work = env.remote_work(name);
    let clusters = match over {
        Over::Ssh => env.ssh_clusters_file(&dir, &remote_work, "{partition: gpu}"),
        Over::Rest => env.rest_clusters_file(&dir, &remote_work, "{partition: gpu}"),
        Over::LocalSlurm => {
            let path = dir.join("clusters.yaml");
            let text = format!(
                "clusters:\n  test:\n    transport: local-slurm\n    work_dir: {remote_work}\n    defaults: {{partition: gpu}}\n"
            );
            std::fs::write(&path, text).expect("clusters file");
            path
        }
    };
    let demo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../experiments/chain-demo.yaml");
    let shipped = std::fs::read_to_string(&demo).expect("experiments/chain-demo.yaml");
    let text = shipped.replacen("name: chain-demo\n", &format!("name: {name}\ncluster: test\n"), 1);
    assert_ne!(text, shipped, "chain-demo.yaml names itself `chain-demo`");
    let file = dir.join(format!("{name}.yaml"));
    std::fs::write(&file, text).expect("experiment file");
    let w = ChainWorld {
        name: name.to_string(),
        file,
        state: dir.join("state"),
        clusters,
        remote_work,
        slurm_conf: env.get("SLURM_CONF"),
        _tmp: tmp,
    };
    let out = w.cmd("install").args(["--cluster", "test", "--worker"]).arg(worker_binary()).output().expect("runs");
    assert!(out.status.success(), "install: {}", text_of(&out));
    w
}

fn text_of(out: &Output) -> String {
    text(out)
}

impl ChainWorld {
    /// The orchestrator binary running `sub` on this world's state and clusters.
    pub fn cmd(&self, sub: &str) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_orchestrator"));
        c.arg(sub)
            .arg("--state-dir")
            .arg(&self.state)
            .arg("--clusters")
            .arg(&self.clusters)
            .env("SLURM_CONF", &self.slurm_conf)
            .env("NO_COLOR", "1")
            .env_remove("SLURM_JWT")
            .env_remove("ORCHESTRATOR_FAILPOINT");
        c
    }

    /// `sub FILE ARGS`, which must succeed; its output.
    pub fn run(&self, sub: &str, args: &[&str]) -> String {
        let out = self.cmd(sub).arg(&self.file).args(args).args(["--result-grace", "3"]).output().expect("runs");
        let said = text_of(&out);
        assert!(out.status.success(), "{} {sub}: {said}", self.name);
        said
    }

    /// `status --json`: one object per config.
    pub fn status(&self) -> Vec<serde_json::Value> {
        let out = self.cmd("status").arg(&self.name).args(["--json", "--result-grace", "3"]).output().expect("runs");
        assert!(out.status.success(), "{} status: {}", self.name, text_of(&out));
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.lines().filter(|l| l.starts_with('{')).map(|l| serde_json::from_str(l).expect("a status row")).collect()
    }

    /// Polls `status` until `done` holds of its rows (or panics after `limit`).
    pub fn wait(
        &self,
        what: &str,
        limit: Duration,
        done: impl Fn(&[serde_json::Value]) -> bool,
    ) -> Vec<serde_json::Value> {
        let deadline = Instant::now() + limit;
        loop {
            let rows = self.status();
            if done(&rows) {
                return rows;
            }
            assert!(Instant::now() < deadline, "{}: not {what} within {limit:?}: {rows:#?}", self.name);
            std::thread::sleep(Duration::from_secs(2));
        }
    }

    /// The config records of this world's state.
    pub fn records(&self) -> BTreeMap<String, orchestrator::state::ConfigRecord> {
        super::records(&self.state, &self.name)
    }

    /// The run directory of config `hash` on the cluster (this machine's disk).
    pub fn run_dir(&self, hash: &str) -> PathBuf {
        PathBuf::from(&self.remote_work).join("state").join(&self.name).join("runs").join(hash)
    }

    /// The job id the config `name` runs under now (its latest attempt's own).
    pub fn job_of(&self, name: &str) -> String {
        let records = self.records();
        let r = records.values().find(|r| r.name() == name).expect("a record");
        r.latest().and_then(|a| a.job_id()).map(|j| j.to_string()).expect("a job id")
    }
}

/// A row's chain segment and whether it is running.
pub fn segment(row: &serde_json::Value) -> (u64, bool) {
    let seg = row["chain"]["segment"].as_u64().unwrap_or(0);
    (seg, row["state"] == "RUNNING" && row["chain"]["between"] == false)
}

/// Whether every row ended `ok`.
pub fn all_completed(rows: &[serde_json::Value]) -> bool {
    !rows.is_empty() && rows.iter().all(|r| r["result"] == "ok")
}

/// What a finished chain must show, with `jobs` SLURM jobs per config
/// (config name → count): every config completed once, at least
/// `min_segments` segments each, each segment after the first resumed from
/// a checkpoint (not from step 1), no step trained twice but those a kill
/// lost, and the config's SLURM runs never overlapping in time.
pub fn verify(env: &Env, w: &ChainWorld, jobs: &BTreeMap<String, usize>, min_segments: usize) -> Result<(), String> {
    let records = w.records();
    let per = env.jobs_per_config(&w.state, &w.name);
    for r in records.values() {
        let name = r.name();
        if r.result_status() != Some(facts::event::RunStatus::Ok) {
            return Err(format!("{name}: not completed: {:?}", r.result_status()));
        }
        let want = jobs.get(name).copied().unwrap_or(1);
        if per.get(r.hash().as_str()) != Some(&want) {
            return Err(format!(
                "{name}: {:?} SLURM jobs, expected {want} (per config: {per:?})",
                per.get(r.hash().as_str())
            ));
        }
        let dir = w.run_dir(r.hash().as_str());
        let began = std::fs::read_to_string(dir.join("segments.log")).map_err(|e| format!("{name}: {e}"))?;
        let firsts: Vec<u32> = began
            .lines()
            .map(|l| l.split_whitespace().nth(3).and_then(|s| s.parse().ok()).expect("began at step N job J"))
            .collect();
        if firsts.len() < min_segments || firsts[0] != 1 || firsts[1..].iter().any(|&s| s <= 1) {
            return Err(format!("{name}: segments began at steps {firsts:?} (at least {min_segments}, each resumed)"));
        }
        let steps = std::fs::read_to_string(dir.join("steps.log")).map_err(|e| format!("{name}: {e}"))?;
        let mut seen: BTreeMap<u32, usize> = BTreeMap::new();
        for s in steps.lines().filter_map(|l| l.trim().parse().ok()) {
            *seen.entry(s).or_default() += 1;
        }
        let redone = seen.values().filter(|&&n| n > 1).count();
        // A kill loses at most the steps since the last save (every 5).
        if redone > 5 * (want - 1) {
            return Err(format!("{name}: {redone} steps trained more than once with {} kill(s)", want - 1));
        }
        overlap_free(env, w, r)?;
    }
    Ok(())
}

/// The config's SLURM runs (every requeue of each of its jobs: `sacct
/// --duplicates`) one after another, never two at once.
fn overlap_free(env: &Env, w: &ChainWorld, r: &orchestrator::state::ConfigRecord) -> Result<(), String> {
    let mut spans: Vec<(String, String, String)> = Vec::new();
    for a in r.attempts().iter().filter(|a| !a.abandoned()) {
        // By array and task: an array's last task runs under the array's own
        // id, and `--jobs <that id>` would list every task of the array.
        let Some(array) = a.array_job_id() else { continue };
        let job = format!("{array}_{}", a.task_id());
        let out = env.slurm(&[
            "sacct",
            "--duplicates",
            "--allocations",
            "--noheader",
            "--parsable2",
            "--format=JobIDRaw,Start,End",
            "--jobs",
            &job,
        ]);
        for l in out.lines() {
            let f: Vec<&str> = l.split('|').collect();
            if f.len() == 3 && f[1] != "Unknown" && f[1] != "None" {
                spans.push((f[1].to_string(), f[2].to_string(), f[0].to_string()));
            }
        }
    }
    spans.sort();
    for pair in spans.windows(2) {
        let (a, b) = (&pair[0], &pair[1]);
        if a.1 == "Unknown" || b.0 < a.1 {
            return Err(format!("{} ({}): runs overlap: {a:?} then {b:?}", r.name(), w.name));
        }
    }
    Ok(())
}
