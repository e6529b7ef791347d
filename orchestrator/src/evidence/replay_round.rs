//! One round of an evidence sweep on the replay cluster: the chosen configs as
//! one job array (manifest and script, as `submit` lays them out), submitted,
//! polled until every task ended, and each task's event stream read back into
//! a measurement record by the collect path.

use std::collections::BTreeMap;
use std::path::PathBuf;

use facts::record::MeasurementRecord;
use facts::run::Manifest;
use facts::RunConfig;

use super::EvidenceError;
use crate::collect::{parse_events, to_record};
use crate::transport::replay::ReplayTransport;
use crate::transport::{FileStore, Scheduler};

/// Measures `chosen` (key, config) on `replay`; the records by key (a config
/// the replay had no record for is absent).
pub fn measure(
    replay: &ReplayTransport,
    table: &str,
    round: usize,
    chosen: &[(String, RunConfig)],
) -> Result<BTreeMap<String, MeasurementRecord>, EvidenceError> {
    let root = PathBuf::from(replay.remote_state_root()?);
    let dir = root.join(table).join("submissions").join(format!("round-{round}"));
    let manifest = Manifest {
        experiment: table.to_string(),
        task_offset: 0,
        configs_per_task: 1,
        memory_limit: None,
        configs: chosen.iter().map(|(_, c)| c.clone()).collect(),
    };
    let json = serde_json::to_vec_pretty(&manifest).map_err(|e| EvidenceError::Replay(e.to_string()))?;
    let job_name = format!("evidence-{table}-{round}");
    let script = format!(
        "#!/bin/bash\n#SBATCH --job-name={job_name}\n#SBATCH --array=0-{}\n#SBATCH --output={d}/%a.out\n#SBATCH --chdir={d}\n",
        chosen.len().saturating_sub(1),
        d = dir.display()
    );
    replay.put_file(&dir.join("manifest.json").to_string_lossy(), &json, false)?;
    let script_path = dir.join("job.sbatch").to_string_lossy().into_owned();
    replay.put_file(&script_path, script.as_bytes(), false)?;
    replay.submit(&script_path)?;
    let poll = replay.poll(&[job_name], 0.0)?;
    if poll.tasks.len() != chosen.len() || !poll.tasks.values().all(|o| o.state.is_ended()) {
        return Err(EvidenceError::Replay(format!("round {round} of {table}: not every task ended")));
    }
    let mut out = BTreeMap::new();
    for (key, cfg) in chosen {
        let events = root.join(table).join(cfg.events_rel());
        let bytes = replay.get_file(&events.to_string_lossy())?.unwrap_or_default();
        if let Some(r) = to_record(cfg, &parse_events(&bytes)) {
            out.insert(key.clone(), r);
        }
    }
    Ok(out)
}
