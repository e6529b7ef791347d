//! What a config's `events.jsonl` says of its latest attempt, read a piece
//! at a time: each poll folds only the new complete lines into the
//! [`EventsRead`] the read before left, and the store records the result
//! ([`super::Change::Events`]).

use facts::chain::{ChainPosition, SegmentEnd};
use facts::event::{Event, Phase, RunResult};
use serde::{Deserialize, Serialize};

use crate::collect::WorkerOutcome;
use crate::slurm::JobId;

/// An attempt's events as read so far, and the config's result from them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EventsRead {
    /// `started` once the attempt's `start` line is read, then its result status.
    #[serde(default, skip_serializing_if = "WorkerOutcome::is_not_started")]
    pub worker: WorkerOutcome,
    /// Bytes of the file read (the next read starts here).
    pub offset: u64,
    /// The last `start` line read was this attempt's own (its lines follow).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub mine: bool,
    /// The worker's last reported phase and peak, while it runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub live: Option<Live>,
    /// The worker's final `result` event for this attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<RunResult>,
    /// A chained run's segments (`worker watch --chain`), as far as read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chain: Option<ChainRead>,
}

/// What a chained attempt's events said of its segments: the one running
/// (or last started), those that ended with the chain going on, and the
/// command's last progress line.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ChainRead {
    /// The segment last started, of how many at most.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub position: Option<ChainPosition>,
    /// Each segment that ended with the chain going on, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ended: Vec<SegmentEnd>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<String>,
}

impl EventsRead {
    /// Folds `events` (each with the byte offset where its line ends, from
    /// the start of this read) into what the attempt that ran as SLURM job
    /// `job_id` has read so far. Returns where folding stopped early (a
    /// `start` of a job the poll has not named yet is left for a later
    /// read), `None` when every event was used. The offset is the caller's.
    pub fn fold(&mut self, job_id: Option<&JobId>, events: Vec<(Event, usize)>) -> Option<usize> {
        let mut last_end = 0;
        for (event, end) in events {
            match event {
                Event::Start { t, env, .. } => {
                    let mine = match (env.slurm_job_id.as_deref(), job_id.map(JobId::as_str)) {
                        (None, _) => true,                        // a worker run by hand: the latest attempt's
                        (Some(_), None) => return Some(last_end), // not decidable yet: keep it for the next read
                        (Some(j), Some(ours)) => j == ours,
                    };
                    self.mine = mine;
                    if mine {
                        self.worker = WorkerOutcome::NoResult;
                        self.live = Some(Live { phase: Phase::Model, peak_bytes: 0, started_t: Some(t), t });
                        self.result = None;
                        // A requeued segment is the same job: its chain so far stays.
                        if let Some(position) = env.chain {
                            self.chain.get_or_insert_with(ChainRead::default).position = Some(position);
                        }
                    }
                }
                Event::Heartbeat { t, phase, peak_bytes, progress, .. } if self.mine => {
                    self.live_at(t, phase, peak_bytes);
                    if let (Some(p), Some(c)) = (progress, self.chain.as_mut()) {
                        c.progress = Some(p);
                    }
                }
                Event::PhaseEnd { t, phase, peak_bytes, .. } if self.mine => self.live_at(t, phase, peak_bytes),
                Event::Segment(end) if self.mine => {
                    self.worker = WorkerOutcome::SegmentEnded;
                    self.live = None;
                    let c = self.chain.get_or_insert_with(ChainRead::default);
                    if end.progress.is_some() {
                        c.progress.clone_from(&end.progress);
                    }
                    // A requeue refused after it was recorded says so for the same segment.
                    match c.ended.last_mut() {
                        Some(last) if last.segment == end.segment => *last = end,
                        _ => c.ended.push(end),
                    }
                }
                e @ Event::Result { .. } if self.mine => {
                    if let Ok(res) = RunResult::try_from(e) {
                        self.worker = WorkerOutcome::Result(res.status);
                        self.result = Some(res);
                    }
                }
                _ => {}
            }
            last_end = end;
        }
        None
    }

    fn live_at(&mut self, t: f64, phase: Phase, peak_bytes: u64) {
        let l = self.live.get_or_insert(Live { phase, peak_bytes: 0, started_t: None, t });
        l.phase = phase;
        l.peak_bytes = l.peak_bytes.max(peak_bytes);
        l.t = t;
    }
}

/// Live progress of a running attempt, from its heartbeats.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Live {
    pub phase: facts::event::Phase,
    pub peak_bytes: u64,
    /// When the worker started (its `start` line).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_t: Option<f64>,
    /// Time of the last event.
    pub t: f64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collect::complete_lines;

    const START_11: &str = "{\"event\":\"start\",\"t\":1.0,\"config\":\"n\",\"config_hash\":\"0\",\"env\":{\"host\":\"h\",\"device\":\"cpu\",\"backend\":\"flex\",\"dtype\":\"f32\",\"grad_ckpt\":false,\"slurm_job_id\":\"11\"}}\n";
    const START_12: &str = "{\"event\":\"start\",\"t\":5.0,\"config\":\"n\",\"config_hash\":\"0\",\"env\":{\"host\":\"h\",\"device\":\"cpu\",\"backend\":\"flex\",\"dtype\":\"f32\",\"grad_ckpt\":false,\"slurm_job_id\":\"12\"}}\n";
    const BEAT: &str =
        "{\"event\":\"heartbeat\",\"t\":2.0,\"phase\":\"fwd\",\"current_bytes\":10,\"peak_bytes\":2048}\n";
    const OOM: &str = "{\"event\":\"result\",\"t\":3.0,\"status\":\"oom\",\"params\":1,\"peaks\":{},\"peak_bytes\":4096,\"phase\":\"bwd\",\"wall_s\":2.0}\n";

    /// Reads `text` in pieces (a lagging or live file), as a poll would: from the offset, complete lines only.
    fn read_in_pieces(r: &mut EventsRead, job: Option<&str>, text: &str, cuts: &[usize]) {
        let bytes = text.as_bytes();
        let job = job.map(JobId::from);
        for &cut in cuts.iter().chain([bytes.len()].iter()) {
            let off = r.offset as usize;
            let (events, consumed, _) = complete_lines(&bytes[off..cut]);
            let stopped = r.fold(job.as_ref(), events);
            r.offset = (off + stopped.unwrap_or(consumed)) as u64;
        }
    }

    #[test]
    fn incremental_reads_in_any_pieces_give_the_same_result_and_read_each_byte_once() {
        let text = format!("{START_11}{BEAT}{OOM}");
        for cuts in [vec![], vec![10], vec![START_11.len()], vec![START_11.len() + 5, START_11.len() + BEAT.len() + 3]]
        {
            let mut r = EventsRead::default();
            read_in_pieces(&mut r, Some("11"), &text, &cuts);
            assert_eq!(r.worker.word(), Some("oom"), "{cuts:?}");
            assert_eq!(r.result.as_ref().map(|v| v.peak_bytes), Some(4096));
            assert_eq!(r.offset as usize, text.len(), "everything consumed once");
        }
    }

    #[test]
    fn live_phase_and_peak_come_from_heartbeats() {
        let mut r = EventsRead::default();
        read_in_pieces(&mut r, Some("11"), &format!("{START_11}{BEAT}"), &[]);
        let live = r.live.clone().expect("live");
        assert_eq!((live.phase, live.peak_bytes, live.started_t), (Phase::Fwd, 2048, Some(1.0)));
        assert!(r.result.is_none());
    }

    #[test]
    fn another_jobs_lines_are_not_this_attempts() {
        // A retry (job 12) reads on after the first attempt (job 11)'s lines.
        let mut r = EventsRead::default();
        read_in_pieces(&mut r, Some("12"), &format!("{START_11}{OOM}{START_12}{BEAT}"), &[]);
        assert_eq!(r.worker.word(), Some("started"));
        assert!(r.result.is_none(), "job 11's oom is not job 12's");
    }

    #[test]
    fn a_start_of_an_unnamed_job_waits_for_the_poll_to_name_it() {
        let mut r = EventsRead::default();
        read_in_pieces(&mut r, None, &format!("{START_11}{OOM}"), &[]);
        assert_eq!(r.offset, 0, "nothing consumed");
        read_in_pieces(&mut r, Some("11"), &format!("{START_11}{OOM}"), &[]);
        assert_eq!(r.worker.word(), Some("oom"));
    }
}
