//! The event stream writer: `facts::event::Event` as JSON lines appended to
//! `<state>/<experiment>/runs/<hash>/events.jsonl`, each line one `write(2)`
//! on an `O_APPEND` file, so a line is never interleaved with another writer's
//! and a reader (the orchestrator, possibly over SFTP) sees whole lines or a
//! torn last one, never a mix.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use facts::event::Event;

/// Seconds since the Unix epoch (the events' `t`).
pub fn now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

/// Where a config's events go: `<state>/<experiment>/runs/<hash>/events.jsonl`
/// (kept by what ran: [`facts::RunConfig::events_rel`]).
pub fn events_path(state_dir: &Path, cfg: &facts::RunConfig) -> PathBuf {
    state_dir.join(&cfg.experiment).join(cfg.events_rel())
}

/// What the runs of a config wrote at or after a time: whether one started,
/// and the last result. How a task, `warm` and `fidelity` read back what the
/// child process they ran wrote (an older run's lines are ignored).
#[derive(Debug, Default)]
pub struct Written {
    pub started: bool,
    pub result: Option<facts::event::RunResult>,
}

/// [`Written`] for `cfg` under `state_dir`, from `since` (seconds since the
/// epoch; 0 for everything). A missing file or a torn line reads as nothing.
pub fn written_since(state_dir: &Path, cfg: &facts::RunConfig, since: f64) -> Written {
    let Ok(bytes) = std::fs::read(events_path(state_dir, cfg)) else { return Written::default() };
    let mut out = Written::default();
    for event in facts::jsonl::read::<Event>(&bytes).all().filter_map(|l| l.value.ok()) {
        match event {
            Event::Start { t, .. } if t >= since => out.started = true,
            e @ Event::Result { .. } => {
                if let Ok(r) = facts::event::RunResult::try_from(e) {
                    if r.t >= since {
                        out.result = Some(r);
                    }
                }
            }
            _ => {}
        }
    }
    out
}

pub struct EventLog {
    file: Mutex<Sink>,
    fd: i32,
    path: PathBuf,
}

impl EventLog {
    /// Open (creating directories) for appending: a rerun appends after the
    /// previous attempt's lines, so history is kept and the last result wins.
    pub fn open(path: &Path) -> std::io::Result<EventLog> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let file = OpenOptions::new().create(true).append(true).open(path)?;
        let fd = file.as_raw_fd();
        Ok(EventLog { file: Mutex::new(Sink { file, ended: false }), fd, path: path.to_path_buf() })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The raw descriptor, for the allocation-free OOM writer.
    pub fn raw_fd(&self) -> i32 {
        self.fd
    }

    /// Append one event as one line. A run's lines end with its result: once
    /// one is written, later events are dropped (a phase that ends, or a
    /// heartbeat, on another thread while the signal thread records the run
    /// `cancelled` and ends the process).
    pub fn emit(&self, event: &Event) -> std::io::Result<()> {
        let mut line = serde_json::to_string(event).map_err(std::io::Error::other)?;
        line.push('\n');
        let mut sink = self.file.lock().unwrap_or_else(|p| p.into_inner());
        if sink.ended {
            return Ok(());
        }
        sink.ended = matches!(event, Event::Result { .. });
        sink.file.write_all(line.as_bytes())?;
        sink.file.flush()?;
        // On a shared filesystem the line must be on the server before the
        // job can end: the orchestrator may read it from another node.
        sink.file.sync_data()
    }
}

/// The event file and whether its run's result is written.
struct Sink {
    file: File,
    ended: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use facts::event::{Phase, RunResult, RunStatus};

    /// The signal thread records `cancelled` while the main thread ends a
    /// phase: the phase's line, written after the result, must not follow it.
    #[test]
    fn nothing_follows_a_runs_result() {
        let dir = tempfile::tempdir().unwrap();
        let log = EventLog::open(&dir.path().join("events.jsonl")).unwrap();
        let result = RunResult {
            t: 1.0,
            status: RunStatus::Cancelled,
            params: 0,
            peaks: Default::default(),
            peak_bytes: 0,
            phase: Some(Phase::Bwd),
            message: Some("received signal 15".into()),
            wall_s: 1.0,
            nvml_peak_bytes: None,
            as_pytorch_counts: None,
            group: None,
        };
        log.emit(&Event::from(result)).unwrap();
        let end = Event::PhaseEnd {
            t: 1.0,
            phase: Phase::Bwd,
            peak_bytes: 1,
            seconds: 0.1,
            nvml_bytes: None,
            readback: None,
            step: Some(8),
        };
        log.emit(&end).unwrap();
        let text = std::fs::read_to_string(log.path()).unwrap();
        assert_eq!(text.lines().count(), 1, "{text}");
        assert!(matches!(serde_json::from_str(text.trim()).unwrap(), Event::Result { .. }), "{text}");
    }
}
