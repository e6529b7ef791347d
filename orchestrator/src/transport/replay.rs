//! The `replay` transport: no GPU, no worker. Each submitted config is
//! answered with the recorded measurement of the same config (same
//! [`facts::RunConfig::hash`], same GPU) from a records file (the group's
//! `data/vram-measurements.jsonl`, or any `measurements.jsonl`).
//!
//! (Same hash: one notation per model, [`facts::canonical`]. A record that
//! does not give a field of the config, as the group's records never give
//! GroupNorm groups, matches on the fields it gives, and its answer says
//! which it assumed.)
//!
//! It goes through the same path as a real cluster: the rendered sbatch
//! script and its manifest are read as a job array, every task writes the
//! event stream a worker would (`start`, one `phase_end` per recorded phase,
//! `result`) to `<state>/<experiment>/runs/<hash>/events.jsonl`, and polls
//! answer with SLURM task states and exit codes (0 ok, 3 oom, 1 failed), so
//! `status`, `report` and `resume` work unchanged. Every output says it
//! replays: the environment's host and backend are `replay`, the result's
//! message names the record and the file, the task log says so, and
//! [`Transport::describe`] too. A config with no record fails with that reason.
//!
//! Tasks end at submission (a replay has nothing to wait for); each job is
//! `<state>/.replay-jobs/<id>.json`, on disk before its first task is
//! answered, so a submission interrupted anywhere is all or nothing
//! ([`replay_job`](super::replay_job)).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use super::disk::OnDisk;
use super::local::{directives, reserve_ids};
use super::replay_job::{answered, Jobs, ReplayJob};
use super::{CounterSnapshot, Counters, FileStore, Poll, Scheduler, Transport, TransportError, WorkerProbe};
use crate::cluster::ClusterConfig;
use crate::slurm::{expand_ranges, JobId, SlurmState, TaskObservation};
use facts::event::{Event, Phase, PhasePeaks, RunEnvironment, RunStatus};
use facts::record::{MeasuredStatus, MeasurementRecord, Unstated};
use facts::run::{ConfigHash, Manifest};
use facts::{ModelSpec, PerLevel, RunConfig};

const GIB: f64 = (1u64 << 30) as f64;

/// The records a replay answers from, by config hash (file order kept).
#[derive(Debug, Clone, Default)]
pub struct Records {
    /// What the records came from, shown in every output.
    pub source: String,
    /// By [`key`] over the fields each record gives.
    by_hash: BTreeMap<ConfigHash, Vec<(usize, MeasurementRecord)>>,
    /// The sets of fields some record does not give, fewest first.
    unstated: BTreeSet<(usize, Vec<Unstated>)>,
}

/// A record that answers a config: its line, and the config's fields it does
/// not give (matched on the others; the config's values assumed).
#[derive(Debug, Clone, Copy)]
pub struct Found<'a> {
    pub line: usize,
    pub record: &'a MeasurementRecord,
    pub assumed: &'a [Unstated],
}

impl Records {
    /// Reads a records file; an unreadable line is an error naming file and line.
    pub fn load(path: &Path) -> Result<Records, TransportError> {
        let text = std::fs::read_to_string(path).map_err(|e| ferr(path, e))?;
        let recs = facts::record::read_jsonl(&text)
            .map_err(|(line, e)| TransportError::Other(format!("{}:{line}: {e}", path.display())))?;
        Ok(Records::new(path.display().to_string(), recs.into_iter().enumerate().map(|(i, r)| (i + 1, r))))
    }

    /// Records with their 1-based line numbers; superseded records and records
    /// that describe no model are left out (a replay answers only with what
    /// still stands).
    pub fn new(source: String, recs: impl IntoIterator<Item = (usize, MeasurementRecord)>) -> Records {
        let mut out = Records { source, ..Records::default() };
        for (line, r) in recs {
            if r.superseded.is_some() {
                continue;
            }
            if let Ok(cfg) = r.run_config() {
                let unstated = r.unstated();
                out.by_hash.entry(key(&cfg, &unstated)).or_default().push((line, r));
                out.unstated.insert((unstated.len(), unstated));
            }
        }
        out
    }

    /// The first record of `cfg` measured on its GPU, or why there is none: a
    /// record that gives every field first, then one that leaves fewest out
    /// (matched on the fields it gives).
    pub fn find(&self, cfg: &RunConfig) -> Result<Found<'_>, String> {
        let mut elsewhere: Vec<&str> = vec![];
        for (_, unstated) in &self.unstated {
            let all = self.by_hash.get(&key(cfg, unstated)).map(Vec::as_slice).unwrap_or_default();
            let same = all.iter().filter(|(_, r)| r.unstated() == *unstated);
            for (line, r) in same {
                if r.gpu() == Some(cfg.gpu) {
                    return Ok(Found { line: *line, record: r, assumed: unstated });
                }
                elsewhere.push(r.gpu.as_str());
            }
        }
        let hash = cfg.hash();
        Err(match elsewhere.is_empty() {
            true => format!("replay: {} has no record of config {} (hash {hash})", self.source, cfg.name),
            false => format!(
                "replay: {} has config {} (hash {hash}) only on {}, not on {}",
                self.source,
                cfg.name,
                elsewhere.join(", "),
                cfg.gpu.name()
            ),
        })
    }
}

impl Found<'_> {
    /// `replayed: record `id` of FILE line N`, and the assumed fields with the
    /// config's values.
    pub fn message(&self, source: &str, cfg: &RunConfig) -> String {
        let mut m = format!("replayed: record `{}` of {source} line {}", self.record.id, self.line);
        if !self.assumed.is_empty() {
            let values: Vec<String> = self.assumed.iter().map(|u| format!("{u} {}", stated(cfg, *u))).collect();
            m.push_str(&format!(" (matched without what it does not give: assumed {})", values.join(", ")));
        }
        m
    }
}

/// The config's value of a field a record may not give.
fn stated(cfg: &RunConfig, field: Unstated) -> String {
    match (&cfg.model, field) {
        (ModelSpec::Unet(u), Unstated::NormGroups) => u.norm_num_groups.to_string(),
        (ModelSpec::Unet(u), Unstated::ResBlocks) => u.num_res_blocks.to_string(),
        (ModelSpec::Unet(u), Unstated::HeadChannels) => u.num_head_channels.to_string(),
        _ => "-".into(),
    }
}

/// The hash a config is matched by: its [`RunConfig::hash`] (one notation
/// per model) with the `unstated` fields blanked, for a record that does not
/// give them and a config looked up against such records alike.
fn key(cfg: &RunConfig, unstated: &[Unstated]) -> ConfigHash {
    let mut c = cfg.clone();
    if let ModelSpec::Unet(u) = &mut c.model {
        for field in unstated {
            match field {
                Unstated::NormGroups => u.norm_num_groups = 0,
                Unstated::ResBlocks => u.num_res_blocks = PerLevel::Each(vec![]),
                Unstated::HeadChannels => u.num_head_channels = PerLevel::Each(vec![]),
            }
        }
    }
    c.hash()
}

pub struct ReplayTransport {
    jobs_dir: PathBuf,
    jobs: Jobs,
    state_root: PathBuf,
    records: Records,
    counters: Counters,
}

fn ferr(path: &Path, e: impl std::fmt::Display) -> TransportError {
    TransportError::File { target: "replay".into(), path: path.display().to_string(), message: e.to_string() }
}

impl ReplayTransport {
    /// The cluster's `records` file (relative to the working directory).
    pub fn new(cluster: &ClusterConfig, state_root: &Path) -> Result<Self, TransportError> {
        let path = cluster
            .records
            .as_deref()
            .ok_or_else(|| TransportError::Other("transport `replay` needs `records` (a measurements JSONL)".into()))?;
        Self::with_records(Records::load(path)?, state_root)
    }

    pub fn with_records(records: Records, state_root: &Path) -> Result<Self, TransportError> {
        let state_root = std::path::absolute(state_root).map_err(|e| ferr(state_root, e))?;
        Ok(ReplayTransport {
            jobs_dir: state_root.join(".replay-jobs"),
            jobs: Jobs { dir: state_root.join(".replay-jobs") },
            state_root,
            records,
            counters: Counters::default(),
        })
    }

    /// Writes the event stream of config `cfg` of array task `task` and its
    /// log line; returns the status its result says.
    fn answer(&self, cfg: &RunConfig, job: u64, task: u32, log: &Path) -> Result<RunStatus, TransportError> {
        let found = self.records.find(cfg);
        let env = environment(cfg, found.as_ref().ok().map(|f| f.record), job, task);
        let t = crate::fsio::now();
        let mut events = vec![Event::Start { t, config: cfg.name.clone(), config_hash: cfg.hash(), env }];
        let (code, text) = match &found {
            Ok(f) => {
                let (r, message) = (f.record, f.message(&self.records.source, cfg));
                events.extend(recorded(r, t, message.clone()));
                (if r.status == MeasuredStatus::Oom { RunStatus::Oom } else { RunStatus::Ok }, message)
            }
            Err(why) => {
                events.push(failed(t, why.clone()));
                (RunStatus::Failed, why.clone())
            }
        };
        let path = self.state_root.join(&cfg.experiment).join(cfg.events_rel());
        let mut bytes = Vec::new();
        for e in &events {
            serde_json::to_writer(&mut bytes, e).map_err(|e| TransportError::Other(e.to_string()))?;
            bytes.push(b'\n');
        }
        append(&path, &bytes)?;
        append(log, format!("replay cluster (no GPU run): {text}\n").as_bytes())?;
        Ok(code)
    }
}

impl ReplayTransport {
    /// Answers the job's pending tasks, then records their exit codes.
    /// `again`: a task of a submitter that died may have answered some of its
    /// configs already; one whose events hold this task's `start` keeps that
    /// answer (nothing is answered twice).
    fn run(&self, job: &mut ReplayJob, manifest: &Manifest, again: bool) -> Result<(), TransportError> {
        for t in job.pending.clone() {
            let log = job.log(t);
            let code = match manifest.task(t) {
                Some(cfgs) => {
                    let mut statuses = Vec::with_capacity(cfgs.len());
                    for cfg in cfgs {
                        let events = self.state_root.join(&cfg.experiment).join(cfg.events_rel());
                        let before = if again { answered(&events, job.task_job_id(t))? } else { None };
                        statuses.push(match before {
                            Some(status) => status,
                            None => self.answer(cfg, job.id, t, &log)?,
                        });
                    }
                    task_exit_code(&statuses)
                }
                None => 1,
            };
            job.tasks.insert(t, code);
            crate::util::failpoint::hit("replay:task-answered");
        }
        job.pending.clear();
        self.jobs.save(job)
    }

    /// A job with pending tasks, as a poll finds it: its submitter still
    /// answering (the lock is taken: as it is), or dead (answered here).
    fn finish(&self, job: ReplayJob) -> Result<ReplayJob, TransportError> {
        let Some(_answering) = self.jobs.lock(job.id, false)? else { return Ok(job) };
        // Read again under the lock: another poll may have finished it meanwhile.
        let Some(mut job) = self.jobs.load(job.id)? else { return Ok(job) };
        if job.pending.is_empty() {
            return Ok(job);
        }
        let path = job.manifest.clone().ok_or_else(|| {
            TransportError::Other(format!("replay job {} has unanswered tasks and names no manifest", job.id))
        })?;
        self.run(&mut job, &load_manifest(&path)?, true)?;
        Ok(job)
    }
}

fn load_manifest(path: &Path) -> Result<Manifest, TransportError> {
    crate::fsio::read_json(path).map_err(|e| ferr(path, e))?.ok_or_else(|| ferr(path, "no manifest beside the script"))
}

/// The environment a replayed run reports: host and backend `replay`.
fn environment(cfg: &RunConfig, r: Option<&MeasurementRecord>, job: u64, task: u32) -> RunEnvironment {
    RunEnvironment {
        host: "replay".into(),
        device: r.map(|r| r.gpu.clone()).unwrap_or_else(|| cfg.gpu.name().to_string()),
        driver: None,
        backend: "replay".into(),
        dtype: cfg.precision.name().to_string(),
        grad_ckpt: cfg.grad_ckpt,
        requested_dtype: None,
        checkpointing: None,
        dtype_policy: None,
        attention: None,
        meter: None,
        device_memory_bytes: r.and_then(|r| r.device_memory_gb).map(bytes),
        memory_limit_bytes: r.and_then(|r| r.memory_limit_gb).map(bytes),
        kernel_cache: None,
        slurm_job_id: Some((job + 1 + u64::from(task)).to_string()),
        slurm_array_task_id: Some(task.to_string()),
        chain: None,
    }
}

fn bytes(gib: f64) -> u64 {
    (gib * GIB).round() as u64
}

/// `phase_end` lines for the recorded phases, then the `result`.
fn recorded(r: &MeasurementRecord, t: f64, message: String) -> Vec<Event> {
    let peaks =
        PhasePeaks { model: r.model_gb.map(bytes), fwd: r.fwd_gb.map(bytes), bwd: r.bwd_gb.map(bytes), step: None };
    let mut out: Vec<Event> = [(Phase::Model, peaks.model), (Phase::Fwd, peaks.fwd), (Phase::Bwd, peaks.bwd)]
        .into_iter()
        .filter_map(|(phase, p)| {
            p.map(|peak_bytes| Event::PhaseEnd {
                t,
                phase,
                peak_bytes,
                seconds: 0.0,
                nvml_bytes: None,
                readback: None,
                step: None,
            })
        })
        .collect();
    let oom = r.status == MeasuredStatus::Oom;
    let peak = if oom { r.oom_reported_gb } else { r.peak_gb };
    out.push(Event::Result {
        t,
        status: if oom { RunStatus::Oom } else { RunStatus::Ok },
        params: r.params_m.map_or(0, |m| (m * 1e6).round() as u64),
        peaks,
        peak_bytes: peak.map_or(0, bytes),
        phase: None,
        message: Some(message),
        wall_s: 0.0,
        nvml_peak_bytes: None,
        as_pytorch_counts: None,
        group: None,
    });
    out
}

/// The exit code of a task that ran configs ending in `statuses`, as the
/// worker exits: 0 when every one was ok, 143 when one was cancelled, else
/// 1 when one failed, else 3 (an oom).
fn task_exit_code(statuses: &[RunStatus]) -> i32 {
    if statuses.contains(&RunStatus::Cancelled) {
        143
    } else if statuses.contains(&RunStatus::Failed) {
        1
    } else if statuses.contains(&RunStatus::Oom) {
        3
    } else {
        0
    }
}

fn failed(t: f64, message: String) -> Event {
    Event::Result {
        t,
        status: RunStatus::Failed,
        params: 0,
        peaks: PhasePeaks::default(),
        peak_bytes: 0,
        phase: None,
        message: Some(message),
        wall_s: 0.0,
        nvml_peak_bytes: None,
        as_pytorch_counts: None,
        group: None,
    }
}

fn append(path: &Path, data: &[u8]) -> Result<(), TransportError> {
    use std::io::Write;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| ferr(dir, e))?;
    }
    let mut f = std::fs::OpenOptions::new().create(true).append(true).open(path).map_err(|e| ferr(path, e))?;
    f.write_all(data).map_err(|e| ferr(path, e))
}

impl Transport for ReplayTransport {
    fn describe(&self) -> String {
        format!("replay of {} (recorded measurements, no GPU runs)", self.records.source)
    }

    fn files(&self) -> &dyn FileStore {
        self
    }

    fn counters(&self) -> CounterSnapshot {
        self.counters.snapshot()
    }
}

impl OnDisk for ReplayTransport {
    const NAME: &'static str = "replay";

    fn root(&self) -> &Path {
        &self.state_root
    }

    fn file_counters(&self) -> &Counters {
        &self.counters
    }

    fn worker(&self) -> Result<String, TransportError> {
        Ok("replay".into())
    }

    /// Nothing is installed here.
    fn digest(&self, _path: &str) -> Result<Option<(u64, String)>, TransportError> {
        Ok(None)
    }

    /// No worker runs here: the replay answers for every backend.
    fn probe(&self, _path: &str, arg: &str) -> Result<WorkerProbe, TransportError> {
        Ok(WorkerProbe::Runs(match arg {
            "backends" => "flex\nwgpu\nvulkan\ncuda".into(),
            _ => "replay cluster (recorded measurements, no worker runs)".to_string(),
        }))
    }
}

impl Scheduler for ReplayTransport {
    fn max_array_size(&self) -> Result<u32, TransportError> {
        Ok(100_000)
    }

    fn submit(&self, script_path: &str) -> Result<JobId, TransportError> {
        self.counters.command();
        let script = std::fs::read_to_string(script_path).map_err(|e| ferr(Path::new(script_path), e))?;
        let d = directives(&script);
        let array = d.array.clone().unwrap_or_else(|| "0".into());
        let tasks = expand_ranges(&array).ok_or_else(|| TransportError::Other(format!("bad --array `{array}`")))?;
        let chdir = d.chdir.clone().ok_or_else(|| TransportError::Other(format!("{script_path}: no --chdir")))?;
        let manifest_path = Path::new(&chdir).join("manifest.json");
        let manifest = load_manifest(&manifest_path)?;
        let id = reserve_ids(&self.jobs_dir, tasks.iter().copied().max().unwrap_or(0) as u64 + 2)?;
        // Held from before the record exists: a poll meanwhile sees the tasks running.
        let _answering = self.jobs.lock(id, true)?;
        let mut job = ReplayJob {
            id,
            name: d.job_name.clone().unwrap_or_else(|| "job".into()),
            tasks: BTreeMap::new(),
            pending: tasks,
            manifest: Some(manifest_path),
            output: Some(d.output.clone().unwrap_or_else(|| format!("{chdir}/%a.out"))),
        };
        // From here the job exists, whatever becomes of this process.
        self.jobs.save(&job)?;
        self.run(&mut job, &manifest, false)?;
        Ok(JobId::from(id.to_string()))
    }

    fn poll(&self, names: &[String], _since: f64) -> Result<Poll, TransportError> {
        self.counters.command();
        let mut tasks = BTreeMap::new();
        for job in self.jobs.list() {
            if !names.contains(&job.name) {
                continue;
            }
            // A job its submitter left half answered is finished here; one that cannot be is a node failure.
            let (job, stuck) = match job.pending.is_empty() {
                true => (job, None),
                false => match self.finish(job.clone()) {
                    Ok(job) => (job, None),
                    Err(e) => (job, Some(format!("its tasks cannot be answered: {e}"))),
                },
            };
            let array = JobId::from(job.id.to_string());
            let answered = job.tasks.iter().map(|(&t, &code)| (t, Some(code)));
            for (t, code) in answered.chain(job.pending.iter().map(|&t| (t, None))) {
                let (state, detail) = match (code, &stuck) {
                    (Some(0), _) => (SlurmState::Completed, "0:0".to_string()),
                    (Some(code), _) => (SlurmState::Failed, format!("{code}:0")),
                    (None, None) => (SlurmState::Running, "being answered".to_string()),
                    (None, Some(why)) => (SlurmState::NodeFail, why.clone()),
                };
                tasks.insert(
                    (array.clone(), t),
                    TaskObservation {
                        array_job_id: array.clone(),
                        task_id: t,
                        job_id: Some(JobId::from(job.task_job_id(t).to_string())),
                        name: job.name.clone(),
                        state,
                        detail: Some(detail),
                    },
                );
            }
        }
        Ok(Poll { tasks, live_ok: true, history_ok: true, errors: vec![], commands: 1 })
    }

    fn cancel(&self, _job_ids: &[JobId]) -> Result<(), TransportError> {
        // Every task ended when it was submitted: nothing is left to cancel.
        self.counters.command();
        Ok(())
    }
}

#[cfg(test)]
#[path = "replay_tests.rs"]
mod tests;
