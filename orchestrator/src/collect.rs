//! Reading a worker's event stream (`<state>/<experiment>/runs/<config>/events.jsonl`,
//! format `facts::event::Event`) into live progress, and a finished run into a
//! measurement record the precheck can calibrate on.
//!
//! The file may be read while the worker is still appending (locally or pulled
//! over SFTP), so a torn last line is expected and skipped. A retried run
//! appends a new `start`; only the last attempt counts.

use facts::chain::SegmentNext;
use facts::event::{Event, Phase, PhasePeaks, RunEnvironment, RunResult, RunStatus, COMMAND_BACKEND};
use facts::record::{MeasuredStatus, MeasurementRecord};
use facts::run::ConfigHash;
use facts::{ModelSpec, RunConfig};
use serde::Serialize;

/// The group's policy: a run above this peak is flagged `>60GB` (over budget).
pub const BUDGET_GIB: f64 = 60.0;

const GIB: f64 = (1u64 << 30) as f64;

/// What the worker's own event stream says about one attempt; SLURM's state
/// alone cannot tell a measured OOM (exit 3, FAILED) from a crash or a kill.
///
/// In a config record it is the attempt's `worker` field: absent (not
/// started), `"started"`, or the result's status (`"ok"`, `"oom"`, ...).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WorkerOutcome {
    /// No `start` line of this attempt: the worker never ran (or its events
    /// could not be read).
    #[default]
    NotStarted,
    /// A `start` line but no `result`: the worker was killed from outside.
    NoResult,
    /// A chained run's segment ended with the chain to go on (`segment`, no
    /// `result`): requeued by the worker, or left for `resume` to continue.
    SegmentEnded,
    /// The worker's own final word.
    Result(RunStatus),
}

impl WorkerOutcome {
    pub fn is_not_started(&self) -> bool {
        *self == WorkerOutcome::NotStarted
    }

    /// The word a config record keeps: `None`, `started`, or the result's status.
    pub fn word(self) -> Option<&'static str> {
        match self {
            WorkerOutcome::NotStarted => None,
            WorkerOutcome::NoResult => Some("started"),
            WorkerOutcome::SegmentEnded => Some("segment-ended"),
            WorkerOutcome::Result(s) => Some(s.name()),
        }
    }

    /// The outcome a kept word stands for (a word this version does not know
    /// means the worker started and said nothing more that counts).
    pub fn from_word(word: Option<&str>) -> WorkerOutcome {
        match word {
            None => WorkerOutcome::NotStarted,
            Some("ok") => WorkerOutcome::Result(RunStatus::Ok),
            Some("oom") => WorkerOutcome::Result(RunStatus::Oom),
            Some("failed") => WorkerOutcome::Result(RunStatus::Failed),
            Some("cancelled") => WorkerOutcome::Result(RunStatus::Cancelled),
            Some("segment-ended") => WorkerOutcome::SegmentEnded,
            Some(_) => WorkerOutcome::NoResult,
        }
    }
}

impl serde::Serialize for WorkerOutcome {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.word().serialize(s)
    }
}

impl<'de> serde::Deserialize<'de> for WorkerOutcome {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(WorkerOutcome::from_word(Option::<String>::deserialize(d)?.as_deref()))
    }
}

/// What the events say about the latest attempt of one run.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunProgress {
    pub config: Option<String>,
    pub config_hash: Option<ConfigHash>,
    pub env: Option<RunEnvironment>,
    /// Attempts started (`start` events) in the file.
    pub attempts: u32,
    /// The phase last reported (heartbeat or phase end).
    pub phase: Option<Phase>,
    pub current_bytes: u64,
    /// Highest peak seen in this attempt so far.
    pub peak_bytes: u64,
    /// Peaks of the phases that ended in this attempt.
    pub phase_peaks: PhasePeaks,
    /// Time of the last event (a stale value means a dead worker).
    pub last_t: Option<f64>,
    /// The attempt's result, once written.
    pub result: Option<RunResult>,
    /// Lines that did not parse (a torn last line included).
    pub skipped_lines: usize,
    /// A chained run's segments over every attempt in the file.
    pub chain: Option<ChainTally>,
}

/// A chained run in sum: its segments, their wall time and the highest peak.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct ChainTally {
    /// Segments started (the chain's `start` lines).
    pub segments: u32,
    pub wall_s: f64,
    pub peak_bytes: u64,
}

impl RunProgress {
    pub fn finished(&self) -> bool {
        self.result.is_some()
    }
}

fn set_peak(peaks: &mut PhasePeaks, phase: Phase, bytes: u64) {
    let slot = match phase {
        Phase::Model => &mut peaks.model,
        Phase::Fwd => &mut peaks.fwd,
        Phase::Bwd => &mut peaks.bwd,
        Phase::Step => &mut peaks.step,
    };
    *slot = Some(slot.map_or(bytes, |old| old.max(bytes)));
}

impl RunProgress {
    /// Folds one event in (a `start` begins a new attempt).
    pub fn apply(&mut self, event: Event) {
        match event {
            Event::Start { t, config, config_hash, env } => {
                let mut chain = self.chain;
                if env.chain.is_some() {
                    chain.get_or_insert_with(ChainTally::default).segments += 1;
                }
                *self = RunProgress {
                    chain,
                    config: Some(config),
                    config_hash: Some(config_hash),
                    env: Some(env),
                    attempts: self.attempts + 1,
                    last_t: Some(t),
                    skipped_lines: self.skipped_lines,
                    ..RunProgress::default()
                };
            }
            Event::Heartbeat { t, phase, current_bytes, peak_bytes, .. } => {
                self.phase = Some(phase);
                self.current_bytes = current_bytes;
                self.peak_bytes = self.peak_bytes.max(peak_bytes);
                self.last_t = Some(t);
            }
            Event::PhaseEnd { t, phase, peak_bytes, .. } => {
                self.phase = Some(phase);
                set_peak(&mut self.phase_peaks, phase, peak_bytes);
                self.peak_bytes = self.peak_bytes.max(peak_bytes);
                self.last_t = Some(t);
            }
            e @ Event::Result { .. } => {
                let Ok(r) = RunResult::try_from(e) else { return };
                if let Some(ph) = r.phase {
                    self.phase = Some(ph);
                }
                self.peak_bytes = self.peak_bytes.max(r.peak_bytes);
                self.last_t = Some(r.t);
                if let Some(c) = self.chain.as_mut() {
                    c.wall_s += r.wall_s;
                    c.peak_bytes = c.peak_bytes.max(r.peak_bytes);
                }
                self.result = Some(r);
            }
            Event::Segment(end) => {
                self.peak_bytes = self.peak_bytes.max(end.peak_bytes);
                self.last_t = Some(end.t);
                // A refused requeue restates its segment's end: counted once.
                if let (Some(c), SegmentNext::Requeue) = (self.chain.as_mut(), &end.next) {
                    c.wall_s += end.wall_s;
                    c.peak_bytes = c.peak_bytes.max(end.peak_bytes);
                }
            }
        }
    }
}

/// The events in the complete lines of `bytes` (through the last newline),
/// each with the offset just past its line; how many bytes those lines span
/// (where the next read starts); and how many complete lines did not parse.
/// The text after the last newline is left for the next read, whole.
pub fn complete_lines(bytes: &[u8]) -> (Vec<(Event, usize)>, usize, usize) {
    let lines = facts::jsonl::read::<Event>(bytes);
    let mut skipped = 0;
    let mut events = Vec::new();
    for l in lines.complete {
        match l.value {
            Ok(e) => events.push((e, l.end)),
            Err(_) => skipped += 1,
        }
    }
    (events, lines.consumed, skipped)
}

/// Parse an events file's bytes. Never fails: unreadable lines are counted in
/// `skipped_lines` (a torn last line is the normal case while a run is live).
pub fn parse_events(bytes: &[u8]) -> RunProgress {
    let mut p = RunProgress::default();
    let lines = facts::jsonl::read::<Event>(bytes);
    p.skipped_lines += usize::from(lines.torn);
    for l in lines.all() {
        match l.value {
            Ok(e) => p.apply(e),
            Err(_) => p.skipped_lines += 1,
        }
    }
    p
}

/// The `result` event of the last attempt in an events file, whichever job
/// ran it (a torn last line is skipped).
pub fn last_result(text: &str) -> Option<RunResult> {
    parse_events(text.as_bytes()).result
}

fn gib(bytes: u64) -> f64 {
    // To 1e-9 GiB, about a byte: what was measured (a CPU run of a few MiB lost
    // a tenth of its peak to 0.001 GiB), in digits that read back from JSON as
    // written. The peak's exact bytes are kept beside it (`peak_bytes`).
    (bytes as f64 / GIB * 1e9).round() / 1e9
}

/// A finished run as a measurement record (`framework` `burn-<backend>`, peaks in
/// GiB, unrounded, and the peak's exact bytes). `None` unless the run measured something: `ok` (or over budget) and
/// `oom` give records; `failed`, `cancelled` and unfinished runs do not, nor
/// does a user's command run by `worker watch` (backend `command`: its peak is
/// the command's, not a Burn runtime's to calibrate).
pub fn to_record(cfg: &RunConfig, progress: &RunProgress) -> Option<MeasurementRecord> {
    let result = progress.result.as_ref()?;
    let env = progress.env.as_ref();
    if env.is_some_and(|e| e.backend == COMMAND_BACKEND) {
        return None;
    }
    let backend = env.map(|e| e.backend.as_str()).unwrap_or("unknown");
    let peak = gib(result.peak_bytes);
    let status = match result.status {
        RunStatus::Ok if peak > BUDGET_GIB => MeasuredStatus::OverBudget,
        RunStatus::Ok => MeasuredStatus::Ok,
        RunStatus::Oom => MeasuredStatus::Oom,
        RunStatus::Failed | RunStatus::Cancelled => return None,
    };
    let oom = status == MeasuredStatus::Oom;
    let hash = progress.config_hash.clone().unwrap_or_else(|| cfg.hash());
    let mut r = MeasurementRecord {
        id: format!("{}/{}@{}", cfg.experiment, cfg.name, hash),
        table: Some(cfg.experiment.clone()),
        family: cfg.model.family(),
        framework: format!("burn-{backend}"),
        gpu: env.map(|e| e.device.clone()).unwrap_or_else(|| "unknown".into()),
        // What ran, not what was asked: a device without the type fell back to f32.
        precision: match env {
            Some(e) if e.requested_dtype.is_some() && e.dtype == "f32" => facts::Precision::Fp32,
            _ => cfg.precision,
        },
        grad_ckpt: cfg.grad_ckpt,
        batch: cfg.batch,
        in_channels: cfg.input.channels,
        out_channels: cfg.out_channels,
        spatial: cfg.input.spatial.dims(),
        channels: None,
        attention_levels: None,
        num_res_blocks: None,
        num_head_channels: None,
        norm_num_groups: None,
        variant: None,
        hidden: None,
        heads: None,
        depth: None,
        patch: None,
        tokens: None,
        level_depths: None,
        params_m: Some((result.params as f64 / 1e5).round() / 10.0),
        peak_gb: (!oom).then_some(peak),
        peak_bytes: (!oom).then_some(result.peak_bytes),
        model_gb: result.peaks.model.map(gib),
        fwd_gb: result.peaks.fwd.map(gib),
        bwd_gb: result.peaks.bwd.map(gib),
        oom_reported_gb: oom.then_some(peak),
        status,
        // Unrounded: an OOM is scored against exactly the memory the run had.
        device_memory_gb: env.and_then(|e| e.device_memory_bytes).map(|b| b as f64 / GIB),
        memory_limit_gb: env.and_then(|e| e.memory_limit_bytes).map(|b| b as f64 / GIB),
        config_name: Some(cfg.name.clone()),
        note: env.map(|e| note(e, oom.then_some(result.phase).flatten())),
        superseded: None,
    };
    model_fields(&mut r, cfg);
    Some(r)
}

/// `flex on host, dtype f32, driver …, oom in bwd`: where and how a run ran.
fn note(e: &RunEnvironment, oom_in: Option<Phase>) -> String {
    let mut note = format!("{} on {}, dtype {}", e.backend, e.host, e.dtype);
    if let Some(d) = &e.driver {
        note.push_str(&format!(", driver {d}"));
    }
    if let Some(ph) = oom_in {
        note.push_str(&format!(", oom in {}", ph.name()));
    }
    note
}

/// The per-family columns of a record.
fn model_fields(r: &mut MeasurementRecord, cfg: &RunConfig) {
    match &cfg.model {
        ModelSpec::Unet(u) => {
            r.channels = Some(u.channels.clone());
            r.attention_levels = Some(u.attention_levels.clone());
            r.num_res_blocks = Some(u.num_res_blocks.clone());
            r.num_head_channels = Some(u.num_head_channels.clone());
            r.norm_num_groups = Some(u.norm_num_groups);
        }
        ModelSpec::Dit(_) | ModelSpec::Uvit(_) | ModelSpec::Hdit(_) => {
            let dims = cfg.model.transformer_dims().and_then(|d| d.ok());
            r.hidden = dims.map(|d| d.hidden);
            r.heads = dims.map(|d| d.heads);
            r.patch = cfg.model.patch();
            match &cfg.model {
                ModelSpec::Dit(m) => {
                    r.variant = m.variant;
                    r.depth = dims.map(|d| d.depth);
                    r.tokens = Some(cfg.input.spatial.div(m.patch.max(1)).voxels());
                }
                ModelSpec::Uvit(m) => {
                    r.variant = m.variant;
                    r.depth = dims.map(|d| d.depth);
                    r.tokens = Some(cfg.input.spatial.div(m.patch.max(1)).voxels());
                }
                ModelSpec::Hdit(m) => {
                    r.variant = m.variant;
                    r.level_depths = Some(m.level_depths.clone());
                }
                ModelSpec::Unet(_) | ModelSpec::Mamba(_) => {}
            }
        }
        // The measurement format has no MambaDiff fields (no worker builds
        // one): its variant, patch and first grid's tokens are what it can hold.
        ModelSpec::Mamba(m) => {
            r.variant = m.variant;
            r.patch = Some(m.patch_size);
            r.tokens = Some(cfg.input.spatial.div(m.patch_size.max(1)).voxels());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use facts::{Input, PerLevel, Precision, Spatial, UnetSpec};

    /// Lines as the worker writes them (a tiny UNet on flex, trimmed heartbeats).
    const START: &str = r#"{"event":"start","t":1760000000.5,"config":"tiny","config_hash":"0123456789ab","env":{"host":"node1","device":"cpu","backend":"flex","dtype":"f32","grad_ckpt":false}}"#;
    const BEAT: &str = r#"{"event":"heartbeat","t":1760000001.5,"phase":"fwd","current_bytes":1200,"peak_bytes":3000}"#;
    const MODEL_END: &str = r#"{"event":"phase_end","t":1760000001.0,"phase":"model","peak_bytes":1000,"seconds":0.5}"#;
    const FWD_END: &str = r#"{"event":"phase_end","t":1760000002.0,"phase":"fwd","peak_bytes":3500,"seconds":1.0}"#;
    const OK: &str = r#"{"event":"result","t":1760000003.0,"status":"ok","params":2664600000,"peaks":{"model":1000,"fwd":3500,"bwd":5000,"step":6000},"peak_bytes":6000,"wall_s":2.5}"#;

    fn cfg() -> RunConfig {
        let unet = UnetSpec {
            channels: vec![32, 64],
            attention_levels: vec![false, true],
            num_res_blocks: PerLevel::All(1),
            num_head_channels: PerLevel::All(32),
            norm_num_groups: 32,
        };
        RunConfig::profile("demo", "tiny", ModelSpec::Unet(unet), Input { channels: 1, spatial: Spatial::new(8, 8, 8) })
    }

    fn lines(ls: &[&str]) -> Vec<u8> {
        let mut s = ls.join("\n");
        s.push('\n');
        s.into_bytes()
    }

    #[test]
    fn live_run_with_torn_last_line() {
        let mut bytes = lines(&[START, MODEL_END, BEAT]);
        bytes.extend_from_slice(&FWD_END.as_bytes()[..30]); // the worker is mid-write
        let p = parse_events(&bytes);
        assert_eq!(p.attempts, 1);
        assert_eq!(p.phase, Some(Phase::Fwd));
        assert_eq!(p.current_bytes, 1200);
        assert_eq!(p.peak_bytes, 3000);
        assert_eq!(p.phase_peaks.model, Some(1000));
        assert_eq!(p.skipped_lines, 1);
        assert!(!p.finished());
        assert_eq!(p.env.as_ref().map(|e| e.backend.as_str()), Some("flex"));
        assert!(to_record(&cfg(), &p).is_none());
    }

    #[test]
    fn a_chains_segments_wall_and_peak_add_up_over_its_attempts_a_refused_requeue_once() {
        let start = |seg: u32| {
            START.replace(
                r#""grad_ckpt":false}"#,
                &format!(r#""grad_ckpt":false,"chain":{{"segment":{seg},"max_segments":20}}}}"#),
            )
        };
        let end = |seg: u32, wall: f64, peak: u64, next: &str| {
            format!(
                r#"{{"event":"segment","t":1760000002.0,"segment":{seg},"max_segments":20,"wall_s":{wall},"peak_bytes":{peak},"checkpoint":true,"next":{next}}}"#
            )
        };
        let (s1, s2, s3) = (start(1), start(2), start(3));
        let e1 = end(1, 10.0, 7000, r#"{"how":"requeue"}"#);
        let e2 = end(2, 20.0, 9000, r#"{"how":"requeue"}"#);
        let e2_refused = end(2, 20.0, 9000, r#"{"how":"resume","reason":"refused"}"#);
        let p = parse_events(&lines(&[&s1, &e1, &s2, &e2, &e2_refused, &s3, OK]));
        let c = p.chain.expect("a chain");
        assert_eq!(c.segments, 3);
        assert_eq!(c.wall_s, 10.0 + 20.0 + 2.5, "each segment's wall once, the last one's from its result");
        assert_eq!(c.peak_bytes, 9000, "the highest segment's, not the last one's 6000");
        assert!(parse_events(&lines(&[START, OK])).chain.is_none(), "one run is no chain");
    }

    #[test]
    fn a_watched_commands_run_is_no_measurement_record() {
        let start = START.replace(r#""backend":"flex""#, r#""backend":"command""#);
        assert_ne!(start, START);
        let p = parse_events(&lines(&[start.as_str(), BEAT, OK]));
        assert_eq!(p.result.as_ref().map(|r| r.status), Some(RunStatus::Ok));
        assert!(to_record(&cfg(), &p).is_none(), "a command's peak is not a Burn runtime's");
    }

    #[test]
    fn finished_run_becomes_a_record() {
        let p = parse_events(&lines(&[START, MODEL_END, BEAT, FWD_END, OK]));
        assert!(p.finished());
        let r = to_record(&cfg(), &p).expect("ok run gives a record");
        assert_eq!(r.framework, "burn-flex");
        assert_eq!(r.gpu, "cpu");
        assert_eq!(r.status, MeasuredStatus::Ok);
        assert_eq!(r.params_m, Some(2664.6));
        // 6000 bytes, kept exactly (0.001 GiB would have called it 0).
        assert_eq!(r.peak_bytes, Some(6000));
        assert_eq!(r.peak_gb, Some(0.000005588));
        assert_eq!(r.channels, Some(vec![32, 64]));
        assert_eq!(r.config_name.as_deref(), Some("tiny"));
        // The record round-trips through the shared JSONL format.
        let line = serde_json::to_string(&r).unwrap();
        assert_eq!(facts::record::read_jsonl(&line).unwrap()[0], r);
    }

    /// A bf16 config the device ran in f32 (the worker's fallback, as seen on
    /// NVIDIA through Vulkan) is recorded as fp32: calibration fits what ran.
    #[test]
    fn record_precision_is_what_ran() {
        let fell_back = r#"{"event":"start","t":1.0,"config":"tiny","config_hash":"0123456789ab","env":{"host":"n1","device":"NVIDIA H100 80GB HBM3","backend":"vulkan","dtype":"f32","requested_dtype":"bf16","grad_ckpt":false}}"#;
        let asked = RunConfig { precision: Precision::Bf16, ..cfg() };
        let r = to_record(&asked, &parse_events(&lines(&[fell_back, OK]))).unwrap();
        assert_eq!((r.precision, r.framework.as_str()), (Precision::Fp32, "burn-vulkan"));
        let r = to_record(&asked, &parse_events(&lines(&[START, OK]))).unwrap();
        assert_eq!(r.precision, Precision::Bf16);
    }

    #[test]
    fn over_budget_and_oom() {
        let big = r#"{"event":"result","t":1.0,"status":"ok","params":10,"peaks":{"bwd":70000000000},"peak_bytes":70000000000,"wall_s":1.0}"#;
        let r = to_record(&cfg(), &parse_events(&lines(&[START, big]))).unwrap();
        assert_eq!(r.status, MeasuredStatus::OverBudget);
        assert_eq!(r.peak_bytes, Some(70_000_000_000));
        assert_eq!(r.peak_gb, Some(65.192580223));
        assert_eq!(r.peak_gib(), Some(70_000_000_000.0 / GIB), "the exact bytes, read as GiB");

        let oom = r#"{"event":"result","t":1.0,"status":"oom","params":10,"peaks":{"model":1073741824,"fwd":2147483648},"peak_bytes":2147483648,"phase":"fwd","message":"allocation of 4096 bytes refused","wall_s":1.0}"#;
        let r = to_record(&cfg(), &parse_events(&lines(&[START, oom]))).unwrap();
        assert_eq!(r.status, MeasuredStatus::Oom);
        assert_eq!(r.peak_gb, None);
        assert_eq!(r.oom_reported_gb, Some(2.0));
        assert_eq!(r.model_gb, Some(1.0));
        assert!(r.note.unwrap().contains("oom in fwd"));
    }

    #[test]
    fn records_carry_the_memory_the_run_had() {
        // A CPU run held to 40 MiB: its OOM is scored against 40 MiB, not a GPU.
        let limited = r#"{"event":"start","t":1.0,"config":"tiny","config_hash":"0123456789ab","env":{"host":"n1","device":"cpu","backend":"flex","dtype":"f32","grad_ckpt":false,"memory_limit_bytes":41943040}}"#;
        let oom = r#"{"event":"result","t":1.0,"status":"oom","params":10,"peaks":{"fwd":41000000},"peak_bytes":41000000,"phase":"fwd","wall_s":1.0}"#;
        let r = to_record(&cfg(), &parse_events(&lines(&[limited, oom]))).unwrap();
        assert_eq!((r.gpu.as_str(), r.memory_limit_gb, r.device_memory_gb), ("cpu", Some(40.0 / 1024.0), None));
        assert_eq!(r.available_gib(), Some(40.0 / 1024.0));
        let gpu = r#"{"event":"start","t":1.0,"config":"tiny","config_hash":"0123456789ab","env":{"host":"n1","device":"NVIDIA H100 80GB HBM3","backend":"vulkan","dtype":"f32","grad_ckpt":false,"device_memory_bytes":85520809984}}"#;
        let r = to_record(&cfg(), &parse_events(&lines(&[gpu, oom]))).unwrap();
        assert!((r.available_gib().unwrap() - 79.647).abs() < 1e-3, "{:?}", r.available_gib());
        // Without a size or a limit, a CPU OOM cannot be scored.
        let r = to_record(&cfg(), &parse_events(&lines(&[START, oom]))).unwrap();
        assert_eq!(r.available_gib(), None);
    }

    #[test]
    fn failed_and_cancelled_give_no_record_and_retry_resets() {
        let failed = r#"{"event":"result","t":1.0,"status":"failed","params":10,"peaks":{},"peak_bytes":0,"phase":"model","message":"boom","wall_s":0.1}"#;
        let cancelled = r#"{"event":"result","t":1.0,"status":"cancelled","params":10,"peaks":{},"peak_bytes":5,"phase":"bwd","message":"received signal 15","wall_s":0.1}"#;
        for end in [failed, cancelled] {
            let p = parse_events(&lines(&[START, end]));
            assert!(p.finished());
            assert!(to_record(&cfg(), &p).is_none());
        }
        // A retry appends a new start: the earlier failure no longer counts.
        let p = parse_events(&lines(&[START, failed, START, MODEL_END]));
        assert_eq!(p.attempts, 2);
        assert!(!p.finished());
        assert_eq!(p.phase_peaks.model, Some(1000));
    }
}
