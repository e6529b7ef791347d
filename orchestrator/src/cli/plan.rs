//! `orchestrator plan`.

use anyhow::{Context, Result};

use super::{where_it_runs, ExperimentArgs};
use crate::cluster::ClustersFile;

/// `plan`: the table (or JSON rows), then the calibration, the cluster
/// `submit` would use and why, what the verdicts were judged against, and the
/// time limit a task needs.
pub fn run(exp: &ExperimentArgs, json: bool, cluster: Option<&str>) -> Result<()> {
    let (sweep, cluster) = where_it_runs(exp, cluster)?;
    let (predictor, source) = exp.predictor(&sweep)?;
    if json {
        crate::plan::write_json(&sweep, &predictor, &mut std::io::stdout().lock())
            .context("writing the plan's rows")?;
    } else {
        let rows = crate::plan::rows(&sweep, &predictor);
        print!("{}", crate::plan::table(&sweep, &rows));
        println!("calibration: {source}");
        println!("cluster: {cluster}");
        if let Some(host) = sweep.host_memory_gib {
            println!(
                "capacity: {host:.1} GiB, this machine's memory (the worker runs on its CPU), not the {}'s {:.1} GiB",
                sweep.experiment.gpu,
                sweep.experiment.gpu.capacity_gib()
            );
        }
        let (clusters, label) = ClustersFile::load_or_default(None)?;
        if let Err(e) = clusters.get(&cluster.name, &label) {
            println!("note: {e}: `submit` will refuse it");
        } else if cluster.check(&sweep).is_err() {
            println!(
                "note: planned for {}, so `submit` will not run it on this CPU: name its cluster \
                 (`cluster:` or --cluster NAME), or pass --cluster local",
                sweep.experiment.gpu
            );
        }
        if sweep.experiment.command.is_some() {
            // The profiling worker's timings say nothing of the user's command.
            println!(
                "time: the command's own; slurm.time as set ({})",
                sweep.experiment.slurm.time.as_deref().unwrap_or("the partition's default")
            );
        } else {
            let runs = crate::state::View::new(&exp.state_dir, &sweep.experiment.name)?.every_events_file();
            let time = crate::walltime::for_sweep(&sweep, &runs, sweep.experiment.slurm.time.as_deref());
            println!("{time}");
            if let Some(w) = time.warning() {
                tracing::warn!("{w}");
            }
        }
    }
    Ok(())
}
