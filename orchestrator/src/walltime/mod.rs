//! Sizing SLURM's `time:` from the wall time a task is expected to take.
//!
//! A task runs `worker.configs_per_task` configs in turn in one process. The
//! first pays for compiling (and autotuning) every kernel its node has not
//! cached yet, *cold*; the later ones find them compiled, *warm*. So a task
//! needs `cold + (K - 1) x warm`, plus a margin. Both figures come from the
//! sweep's own runs where it has any (each `result`'s `wall_s`; a run is warm
//! when its kernel cache was reused or an earlier config of its SLURM job ran
//! first, and a cold run that trained two steps or more also tells its warm
//! time: its wall time less what its first step's phases took over its
//! second's), else from a stated default. A config's cold run is never
//! quicker than its warm one: the cold figure is the slowest run of the
//! sweep, warm runs included (a later, larger config counted warm outlasts a
//! small first one). The CPU backend compiles no kernels: there every run is
//! cold, whatever its kernel cache says, and a sweep the `local` cluster runs
//! on this machine's CPU is sized by this CPU's runs, not by a GPU's.

use std::collections::BTreeMap;
use std::fmt;

use facts::event::{CacheState, Event, Phase, RunStatus};

use crate::collect::complete_lines;
use crate::experiment::WorkerBackend;
use crate::sweep::Sweep;

/// What is added to the expected wall time of a task.
pub const MARGIN: f64 = 0.5;

/// A config's first run on a GPU without a kernel cache: the slowest of the
/// January H100 runs (docs/gpu.md: 100-400 s, nearly all of it compiling); on
/// an H200 (2026-11-26) no cold run ended within its 120-130 s.
const GPU_COLD_S: f64 = 400.0;
/// A GPU config after another one on the same node: its kernels are compiled
/// for the other config's shapes only, and CubeCL compiles and autotunes per
/// shape. Measured on an H200 (docs/gpu.md, "The GPU check on an H200"): the
/// smallest DiT-S at twice the tokens of the config before it, 86.7 s; the
/// same config again, 1.5 s.
const GPU_WARM_S: f64 = 90.0;
/// A config on the CPU backend, which compiles no kernels: cold and warm alike.
const CPU_S: f64 = 60.0;

/// Seconds per config and where they came from.
#[derive(Debug, Clone, PartialEq)]
pub struct Estimate {
    pub seconds: f64,
    pub from: String,
}

/// A suggested time limit per array task, and what the experiment sets.
#[derive(Debug, Clone, PartialEq)]
pub struct Suggestion {
    /// Configs one task runs (the experiment's `configs_per_task`, at most the sweep's configs).
    pub configs: u32,
    pub cold: Estimate,
    pub warm: Estimate,
    /// The suggested limit, rounded up to a whole minute.
    pub limit_s: u64,
    /// The experiment's `slurm.time` as written.
    pub set: Option<String>,
}

/// What the sweep's own runs measured: wall times of `ok` runs.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Measured {
    pub cold: Vec<f64>,
    pub warm: Vec<f64>,
    /// Warm times told by cold runs of two steps or more (wall time less the compile share).
    pub warm_from_steps: Vec<f64>,
}

/// One run read from an events file: its job, start time, cache, phases and result.
#[derive(Debug, Default)]
struct Run {
    job: Option<String>,
    t: f64,
    cache: Option<CacheState>,
    /// Seconds of each (phase, step) of steps 0 and 1.
    phases: BTreeMap<(Phase, u32), f64>,
    /// Run by the CPU backend (`flex`), which compiles no kernels.
    cpu: bool,
    wall_s: Option<f64>,
}

impl Run {
    /// What its first step's phases took over its second's: the compile share.
    fn compile_s(&self) -> Option<f64> {
        let second: Vec<(&(Phase, u32), &f64)> = self.phases.iter().filter(|((_, step), _)| *step == 1).collect();
        if second.is_empty() {
            return None;
        }
        let first = |phase: Phase| self.phases.get(&(phase, 0)).copied().unwrap_or(0.0);
        Some(second.iter().map(|((phase, _), s)| (first(*phase) - **s).max(0.0)).sum())
    }
}

/// The `ok` runs of an events file (a config's attempts, in order), but
/// for replayed ones.
fn runs_of(bytes: &[u8]) -> Vec<Run> {
    let (events, _, _) = complete_lines(bytes);
    let mut out: Vec<Run> = Vec::new();
    let mut current: Option<Run> = None;
    for (event, _) in events {
        match event {
            // A replayed run (the `replay` cluster) measured no time.
            Event::Start { env, .. } if env.backend == "replay" => current = None,
            Event::Start { t, env, .. } => {
                let cpu = env.backend == WorkerBackend::Flex.name();
                current = Some(Run { job: env.slurm_job_id, t, cache: env.kernel_cache, cpu, ..Run::default() });
            }
            Event::PhaseEnd { phase, seconds, step: Some(step), .. } if step <= 1 => {
                if let Some(r) = current.as_mut() {
                    r.phases.insert((phase, step), seconds);
                }
            }
            Event::Result { status: RunStatus::Ok, wall_s, .. } => {
                if let Some(mut r) = current.take() {
                    r.wall_s = Some(wall_s);
                    out.push(r);
                }
            }
            Event::Result { .. } => current = None,
            _ => {}
        }
    }
    out
}

/// The `ok` runs in a sweep's events files, split cold and warm: those of
/// GPU backends, or (`on_cpu`) those of the CPU backend, every one cold.
pub fn measured(events_files: &[Vec<u8>], on_cpu: bool) -> Measured {
    classify(events_files.iter().flat_map(|bytes| runs_of(bytes)).filter(|r| r.cpu == on_cpu).collect())
}

/// A GPU run is warm when its kernel cache was reused, or when an earlier
/// config of its SLURM job (a task of several configs) ran before it in that
/// process; a CPU run is cold (there is nothing to compile, nothing to reuse).
fn classify(runs: Vec<Run>) -> Measured {
    let mut first_of_job: BTreeMap<String, f64> = BTreeMap::new();
    for r in &runs {
        if let Some(job) = &r.job {
            let t = first_of_job.entry(job.clone()).or_insert(r.t);
            *t = t.min(r.t);
        }
    }
    let mut m = Measured::default();
    for r in runs {
        let Some(wall) = r.wall_s else { continue };
        let later_in_job = r.job.as_ref().is_some_and(|j| first_of_job.get(j).is_some_and(|t| *t < r.t));
        if !r.cpu && (r.cache == Some(CacheState::Reused) || later_in_job) {
            m.warm.push(wall);
        } else {
            m.cold.push(wall);
            if let Some(compile) = r.compile_s() {
                m.warm_from_steps.push((wall - compile).max(0.0));
            }
        }
    }
    m
}

/// The suggestion for `sweep` from its runs' events files, against the limit `set`.
pub fn for_sweep(sweep: &Sweep, events_files: &[Vec<u8>], set: Option<&str>) -> Suggestion {
    suggest(sweep, &measured(events_files, !on_gpu(sweep)), set)
}

fn slowest(v: &[f64]) -> f64 {
    v.iter().copied().fold(0.0, f64::max)
}

/// `1 cold run`, `2 warm runs`.
fn runs(n: usize, kind: &str) -> String {
    format!("{n} {kind} run{}", if n == 1 { "" } else { "s" })
}

/// Whether the experiment's configs run on a GPU backend (kernels to compile):
/// its worker backend, else a Burn runtime's (`burn-flex`: the CPU), else
/// (PyTorch's, which names no backend) on a GPU, but where the `local`
/// cluster runs the worker on this machine's CPU.
fn on_gpu(sweep: &Sweep) -> bool {
    let runtime = &sweep.experiment.runtime;
    match sweep.experiment.worker.backend {
        Some(b) => b != WorkerBackend::Flex,
        None if runtime.as_str().starts_with("burn-") => !runtime.is_cpu(),
        None => sweep.host_memory_gib.is_none(),
    }
}

/// The suggestion for `sweep`, from its measured runs `m` where there are
/// any, and what the experiment sets (`set`: its `slurm.time`).
pub fn suggest(sweep: &Sweep, m: &Measured, set: Option<&str>) -> Suggestion {
    let valid = sweep.configs.iter().filter(|c| c.is_valid()).count().max(1);
    let configs = sweep.experiment.worker.configs_per_task.clamp(1, u32::try_from(valid).unwrap_or(u32::MAX));
    let gpu = on_gpu(sweep);
    let warm_measured = if !m.warm.is_empty() {
        Some(Estimate {
            seconds: slowest(&m.warm),
            from: format!("the slowest of this sweep's {}", runs(m.warm.len(), "warm")),
        })
    } else if !m.warm_from_steps.is_empty() {
        Some(Estimate {
            seconds: slowest(&m.warm_from_steps),
            from: format!("{} less the first step's compile share", runs(m.warm_from_steps.len(), "cold")),
        })
    } else {
        None
    };
    let cold = match (m.cold.is_empty(), gpu, &warm_measured) {
        // A config's cold run takes at least its warm time: a warm run slower
        // than every cold one (a larger config after a small first) sets it.
        (false, _, _) if slowest(&m.warm) > slowest(&m.cold) => Estimate {
            seconds: slowest(&m.warm),
            from: format!(
                "the slowest of this sweep's {} runs, a warm one ({}: no config runs quicker cold than warm)",
                m.cold.len() + m.warm.len(),
                runs(m.cold.len(), "cold")
            ),
        },
        (false, _, _) => Estimate {
            seconds: slowest(&m.cold),
            from: format!("the slowest of this sweep's {}", runs(m.cold.len(), "cold")),
        },
        (true, true, _) => Estimate {
            seconds: GPU_COLD_S,
            from: "the default (no cold run of this sweep yet; an H100's first runs took 100-400 s, docs/gpu.md)"
                .into(),
        },
        (true, false, Some(w)) => {
            Estimate { seconds: w.seconds, from: "the warm figure (the CPU backend compiles no kernels)".into() }
        }
        (true, false, None) => {
            Estimate { seconds: CPU_S, from: "the CPU backend's default (no run of this sweep yet)".into() }
        }
    };
    let warm = match warm_measured {
        Some(w) => w,
        None if gpu => Estimate {
            seconds: GPU_WARM_S,
            from:
                "the default (no warm run of this sweep yet; on an H200 a config after another took 87 s, docs/gpu.md)"
                    .into(),
        },
        None => {
            Estimate { seconds: cold.seconds, from: "the cold figure (the CPU backend compiles no kernels)".into() }
        }
    };
    let expected = cold.seconds + f64::from(configs - 1) * warm.seconds;
    let limit_s = ((expected * (1.0 + MARGIN) / 60.0).ceil().max(1.0) * 60.0) as u64;
    Suggestion { configs, cold, warm, limit_s, set: set.map(str::to_string) }
}

impl Suggestion {
    /// The experiment's limit when it is shorter than the suggestion.
    pub fn too_short(&self) -> Option<&str> {
        let set = self.set.as_deref()?;
        match parse_slurm_time(set) {
            Some(Some(s)) if s < self.limit_s => Some(set),
            _ => None,
        }
    }

    /// The warning for a limit shorter than the suggestion.
    pub fn warning(&self) -> Option<String> {
        self.too_short().map(|set| {
            format!(
                "slurm.time {set} is shorter than the {} a task is expected to need: tasks may end in TIMEOUT \
                 (resume retries them, but their time is spent); set `slurm.time: \"{}\"`",
                hms(self.limit_s),
                hms(self.limit_s)
            )
        })
    }
}

impl fmt::Display for Suggestion {
    /// Two lines: the suggestion against the experiment's limit, then where the figures came from.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (k, cold, warm) = (self.configs, self.cold.seconds, self.warm.seconds);
        let pct = (MARGIN * 100.0).round();
        let (cold, warm) = (secs(cold), secs(warm));
        let sum = match k {
            1 => format!("1 config: 1 cold x {cold} s, +{pct}%"),
            _ => format!("{k} configs: 1 cold x {cold} s + {} warm x {warm} s, +{pct}%", k - 1),
        };
        let against = match (self.set.as_deref(), parse_slurm_time(self.set.as_deref().unwrap_or(""))) {
            (None, _) => "no slurm.time set (the partition's default limit applies)".to_string(),
            (Some(set), None) => format!("slurm.time `{set}` is not a SLURM time"),
            (Some(set), Some(_)) if self.too_short().is_some() => format!("slurm.time {set} is too short"),
            (Some(set), Some(_)) => format!("slurm.time {set} is enough"),
        };
        writeln!(f, "time: suggest {} per task ({sum}); {against}", hms(self.limit_s))?;
        write!(f, "time: cold {cold} s from {}", self.cold.from)?;
        if k > 1 {
            write!(f, "; warm {warm} s from {}", self.warm.from)?;
        }
        Ok(())
    }
}

/// Seconds of a run: a tenth where they are few.
fn secs(s: f64) -> String {
    match s < 10.0 {
        true => format!("{s:.1}"),
        false => format!("{s:.0}"),
    }
}

/// Seconds as SLURM writes a time limit: `HH:MM:SS`, or `D-HH:MM:SS` from a day.
pub fn hms(s: u64) -> String {
    let (d, h, m, sec) = (s / 86_400, s / 3600 % 24, s / 60 % 60, s % 60);
    match d {
        0 => format!("{h:02}:{m:02}:{sec:02}"),
        _ => format!("{d}-{h:02}:{m:02}:{sec:02}"),
    }
}

/// A SLURM time limit in seconds: `MM`, `MM:SS`, `HH:MM:SS`, `D-HH`,
/// `D-HH:MM`, `D-HH:MM:SS`; `Some(None)` for `UNLIMITED`/`INFINITE`; `None`
/// when it is none of these.
pub fn parse_slurm_time(s: &str) -> Option<Option<u64>> {
    let s = s.trim();
    if s.eq_ignore_ascii_case("unlimited") || s.eq_ignore_ascii_case("infinite") {
        return Some(None);
    }
    let num = |p: &str| match !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) {
        true => p.parse::<u64>().ok(),
        false => None,
    };
    let (days, rest) = match s.split_once('-') {
        Some((d, rest)) => (num(d)?, Some(rest)),
        None => (0, None),
    };
    let secs = match rest {
        // After a day count: HH, HH:MM, HH:MM:SS.
        Some(rest) => match rest.split(':').map(num).collect::<Option<Vec<u64>>>()?.as_slice() {
            [h] => h * 3600,
            [h, m] => h * 3600 + m * 60,
            [h, m, sec] => h * 3600 + m * 60 + sec,
            _ => return None,
        },
        // Alone: MM, MM:SS, HH:MM:SS.
        None => match s.split(':').map(num).collect::<Option<Vec<u64>>>()?.as_slice() {
            [m] => m * 60,
            [m, sec] => m * 60 + sec,
            [h, m, sec] => h * 3600 + m * 60 + sec,
            _ => return None,
        },
    };
    Some(Some(days * 86_400 + secs))
}

#[cfg(test)]
mod tests;
