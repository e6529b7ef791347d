//! One model, one hash ([`facts::canonical`]). A state directory written
//! before a config's hash was that of its one notation keys a config written
//! in another notation (`num_res_blocks: [2, 2, 2, 2]`, a DiT's sizes beside
//! its variant) by the hash of what was written. Opening it
//! ([`super::StateDir::open`]) moves those configs to their hash now, in
//! one [`Change::Rehash`] journal line: the records (`configs/<hash>.json`),
//! each submission's task list and `sweep.json`. Run directories stay where
//! their workers wrote them: each moved attempt keeps the hash its
//! `runs/<hash>/` is named by, so a run still going (or on a cluster not yet
//! read) is read where it writes.
//!
//! Which hashes moved is found from what stored the configs themselves:
//! `sweep.json` and each submission's `manifest.json` (a stored hash that is
//! not its config's hash now). Every step can be done again: a crash part way
//! leaves what the next open finishes. A config written in the one notation
//! (most are: it is the experiment files') kept its hash, and nothing moves.

use std::collections::BTreeMap;

use facts::run::{ConfigHash, Manifest};
use facts::RunConfig;
use serde_json::Value;

use super::record::ConfigRecord;
use super::submission::Submission;
use super::Change;
use super::{StateDir, StateError, StoredSweep, View};
use crate::fsio::{self, read_json, write_json};

/// The hash as stored → the hash now, of every config whose differ.
pub type Aliases = BTreeMap<ConfigHash, ConfigHash>;

/// Adds `stored → cfg.hash()` when they differ.
fn note(out: &mut Aliases, stored: &str, cfg: &RunConfig) {
    let now = cfg.hash();
    if *now != *stored {
        out.insert(ConfigHash::from(stored), now);
    }
}

/// `sweep.json` as stored, read loosely (whatever version wrote it): its
/// configs' stored hashes and configs.
fn sweep_configs(sweep: &Value) -> Vec<(&str, RunConfig)> {
    let configs = sweep.pointer("/sweep/configs").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
    configs
        .iter()
        .filter_map(|c| {
            let hash = c.get("hash")?.as_str()?;
            Some((hash, serde_json::from_value(c.get("config")?.clone()).ok()?))
        })
        .collect()
}

/// The hashes to move, from `sweep.json` and every submission's manifest.
pub(super) fn aliases(view: &View) -> Result<Aliases, StateError> {
    let mut out = Aliases::new();
    if let Ok(Some(sweep)) = read_json::<Value>(&view.file(super::files::SWEEP)) {
        for (stored, cfg) in sweep_configs(&sweep) {
            note(&mut out, stored, &cfg);
        }
    }
    for s in view.submissions()? {
        let path = view.file(&format!("{}/{}/manifest.json", super::files::SUBMISSIONS, s.id));
        let Ok(Some(m)) = read_json::<Manifest>(&path) else { continue };
        for (stored, cfg) in s.tasks.iter().zip(&m.configs) {
            note(&mut out, stored, cfg);
        }
    }
    Ok(out)
}

/// Moves the records of `aliases` to their hash now (merged with a record
/// already there, attempts kept once); returns the hashes of the records
/// it changed. What [`Change::Rehash`] does to the records.
pub(super) fn move_records(records: &mut BTreeMap<ConfigHash, ConfigRecord>, aliases: &Aliases) -> Vec<ConfigHash> {
    let mut changed = Vec::new();
    for (old, new) in aliases {
        let Some(mut moved) = records.remove(old) else { continue };
        for a in &mut moved.attempts {
            if a.run_dir == super::RunDirKey::Hash && a.run_hash.is_none() {
                a.run_hash = Some(old.clone());
            }
        }
        moved.hash.clone_from(new);
        match records.get_mut(new) {
            None => {
                records.insert(new.clone(), moved);
            }
            Some(kept) => kept.merge(moved),
        }
        changed.push(new.clone());
    }
    changed.sort();
    changed.dedup();
    changed
}

impl ConfigRecord {
    /// The hashes its attempts' run directories are named by where that is
    /// not its own: attempts made before one model had one hash (their
    /// measurements are recorded under those).
    pub fn former_hashes(&self) -> impl Iterator<Item = &str> {
        self.attempts.iter().filter_map(|a| a.run_hash.as_deref())
    }

    /// Takes `other`'s attempts (one per submission task), and its result
    /// when its latest attempt is the later one.
    fn merge(&mut self, other: ConfigRecord) {
        let latest = |r: &ConfigRecord| r.latest().map(|a| a.intended_at);
        let theirs_later = latest(&other) > latest(self);
        for a in other.attempts {
            if !self.attempts.iter().any(|b| b.submission == a.submission && b.task_id == a.task_id) {
                self.attempts.push(a);
            }
        }
        self.attempts.sort_by(|a, b| a.intended_at.total_cmp(&b.intended_at));
        if theirs_later {
            self.result = other.result;
        }
    }
}

impl StoredSweep {
    /// Each config keyed by its hash now (a `sweep.json` written before one
    /// model had one hash, read as it is keyed after [`StateDir::rehash`]),
    /// and the hashes that moved.
    pub fn rehashed(mut self) -> (StoredSweep, Aliases) {
        let mut aliases = Aliases::new();
        for c in &mut self.sweep.configs {
            let now = c.config.hash();
            if now != c.hash {
                aliases.insert(std::mem::replace(&mut c.hash, now), c.hash.clone());
            }
        }
        (self, aliases)
    }
}

impl Submission {
    /// Its task list with `aliases` applied; whether anything changed.
    pub(super) fn rehash(&mut self, aliases: &Aliases) -> bool {
        let mut changed = false;
        for t in &mut self.tasks {
            if let Some(new) = aliases.get(t) {
                t.clone_from(new);
                changed = true;
            }
        }
        changed
    }
}

impl StateDir {
    /// Moves the configs stored under the hash of another notation (see the
    /// module): records first (a journal line), then the submissions, then
    /// `sweep.json`, each step safe to do again.
    pub(super) fn rehash(&mut self) -> Result<(), StateError> {
        let aliases = aliases(self.view())?;
        if aliases.is_empty() {
            return Ok(());
        }
        tracing::info!(
            "{}: {} config(s) keyed by the hash of another notation, moved",
            self.experiment(),
            aliases.len()
        );
        self.apply(Change::Rehash { aliases: aliases.clone() })?;
        for old in aliases.keys() {
            if !self.records().contains_key(old) {
                match std::fs::remove_file(self.record_path(old)) {
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                        return Err(fsio::io(&self.record_path(old))(e).into())
                    }
                    _ => {}
                }
            }
        }
        for mut s in self.load_submissions()? {
            if s.rehash(&aliases) {
                write_json(&self.submission_dir(&s.id).join(super::files::SUBMISSION), &s)?;
            }
        }
        let path = self.view().file(super::files::SWEEP);
        if let Ok(Some(mut sweep)) = read_json::<Value>(&path) {
            let configs = sweep.pointer_mut("/sweep/configs").and_then(Value::as_array_mut);
            let moved = configs.into_iter().flatten().filter_map(|c| {
                let new = aliases.get(c.get("hash")?.as_str()?)?;
                c["hash"] = Value::String(new.to_string());
                Some(())
            });
            if moved.count() > 0 {
                write_json(&path, &sweep)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::Attempt;

    fn record(hash: &str, submission: &str, at: f64) -> ConfigRecord {
        ConfigRecord::new(hash, "3L_small").with_attempt(Attempt::intended(submission, 0, at))
    }

    #[test]
    fn moved_records_keep_reading_their_runs_where_they_were_written() {
        let mut records = BTreeMap::from([("old1".into(), record("old1", "s001", 1.0))]);
        let aliases = Aliases::from([("old1".into(), "new".into())]);
        assert_eq!(move_records(&mut records, &aliases), ["new"]);
        let r = &records["new"];
        assert_eq!(r.hash(), "new");
        assert_eq!(r.events_rel(&r.attempts()[0]).as_deref(), Some("runs/old1/events.jsonl"));
        // Again: nothing left to move.
        assert!(move_records(&mut records, &aliases).is_empty());
    }

    #[test]
    fn two_notations_of_one_model_become_one_record() {
        let mut records = BTreeMap::from([
            ("old1".into(), record("old1", "s001", 1.0)),
            ("old2".into(), record("old2", "s002", 2.0)),
            ("new".into(), record("new", "s001", 1.0).with_attempt(Attempt::intended("s003", 0, 3.0))),
        ]);
        let aliases = Aliases::from([("old1".into(), "new".into()), ("old2".into(), "new".into())]);
        assert_eq!(move_records(&mut records, &aliases), ["new"]);
        assert_eq!(records.len(), 1);
        let r = &records["new"];
        let subs: Vec<(&str, Option<String>)> =
            r.attempts().iter().map(|a| (a.submission.as_str(), r.events_rel(a))).collect();
        let rel = |h: &str| Some(format!("runs/{h}/events.jsonl"));
        assert_eq!(subs, [("s001", rel("new")), ("s002", rel("old2")), ("s003", rel("new"))], "each attempt once");
        let mut s = Submission::new(
            "s002".into(),
            super::super::ArrayJob {
                job_name: "j".into(),
                comment: "c".into(),
                array: "0-1".into(),
                configs: vec!["old2".into(), "kept".into()],
                configs_per_task: 1,
            },
            "/x".into(),
        );
        assert!(s.rehash(&aliases));
        assert_eq!(s.tasks, ["new", "kept"]);
        assert!(!s.rehash(&aliases));
    }
}
