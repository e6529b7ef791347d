//! `orchestrator submit | status | resume | cancel | render | install`: arguments and output.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::hint::Hint;
use crate::slurm::RetryPolicy;
use crate::submit::*;
use crate::sweep::Sweep;
use anyhow::{Context, Result};
use clap::{Args, Subcommand};

#[derive(Args, Debug, Clone)]
pub struct Common {
    /// Local state root; each experiment gets `<dir>/<experiment>/`.
    #[arg(long, default_value = "state", global = true)]
    pub state_dir: PathBuf,
    /// Clusters file (default: the one the sweep was submitted with, then
    /// $SWEEP_CLUSTERS, then ./clusters.yaml).
    #[arg(long, global = true)]
    pub clusters: Option<PathBuf>,
    /// Cluster to use instead of the experiment's `cluster:` (default `local`).
    #[arg(long, global = true)]
    pub cluster: Option<String>,
    /// Template directory searched before ./templates and the built-ins.
    #[arg(long, global = true)]
    pub templates: Option<PathBuf>,
    /// Seconds a job that ended without a visible result is read again before
    /// it counts as killed (shared filesystems show the last lines late).
    #[arg(long, global = true, default_value_t = 120.0)]
    pub result_grace: f64,
}

#[derive(Args, Debug, Clone)]
pub struct Selection {
    /// Also submit configs the precheck calls `risky` (near capacity or over budget).
    #[arg(long)]
    pub include_risky: bool,
    /// Also submit configs predicted `oom` (never `invalid` ones).
    #[arg(long)]
    pub force: bool,
}

#[derive(Args, Debug, Clone)]
pub struct Retry {
    /// Resubmit configs whose job FAILED too.
    #[arg(long)]
    pub retry_failed: bool,
    /// Do not resubmit configs that hit the time limit.
    #[arg(long)]
    pub no_retry_timeout: bool,
    /// Do not resubmit configs cancelled by `scancel` or an admin.
    #[arg(long)]
    pub no_retry_cancelled: bool,
    /// Resubmit configs that `orchestrator cancel` stopped (not by default).
    #[arg(long)]
    pub retry_cancelled: bool,
    /// Do not resubmit configs whose worker was killed before writing a result (SIGKILL, host OOM killer).
    #[arg(long)]
    pub no_retry_killed: bool,
    /// Attempts per config, the first included.
    #[arg(long, default_value_t = 3)]
    pub max_attempts: u32,
}

/// `submit --active`: measure only what the precheck is unsure of, in rounds.
#[derive(Args, Debug, Clone)]
pub struct ActiveArgs {
    /// Active profiling: rounds of the configs whose measurement is worth most;
    /// the rest predicted (run again to resume a stopped loop).
    #[arg(long)]
    pub active: bool,
    /// Largest band an unmeasured config may keep (`5%` or `0.05`).
    #[arg(long, default_value = crate::active::DEFAULT_TARGET_ERROR, value_parser = crate::active::parse_share, requires = "active")]
    pub target_error: f64,
    /// Runs at most, all rounds together.
    #[arg(long, requires = "active")]
    pub max_runs: Option<usize>,
    /// Configs per round at most (default: a tenth of the sweep, at least 2).
    #[arg(long, requires = "active")]
    pub round_size: Option<usize>,
    /// Seconds between polls while a round runs.
    #[arg(long, default_value_t = 2.0, requires = "active")]
    pub poll_interval: f64,
    /// The final answers as JSON.
    #[arg(long, requires = "active")]
    pub json: bool,
}

#[derive(Subcommand, Debug)]
pub enum ClusterCommand {
    /// Submit a sweep: one job array (split below MaxArraySize) of every config not yet submitted.
    Submit {
        /// Experiment YAML.
        file: PathBuf,
        /// `key.path=value` overrides applied to every config.
        overrides: Vec<String>,
        #[command(flatten)]
        select: Selection,
        #[command(flatten)]
        common: Common,
        #[command(flatten)]
        active: ActiveArgs,
    },
    /// Show every config's SLURM state (one squeue + one sacct per poll) and results.
    Status {
        /// Experiment name (its state) or experiment file.
        experiment: String,
        /// Poll until every config has ended (interval grows while nothing changes).
        #[arg(long)]
        watch: bool,
        /// Shortest interval between polls with --watch, seconds.
        #[arg(long, default_value_t = 5.0)]
        interval: f64,
        /// Longest interval between polls with --watch, seconds.
        #[arg(long, default_value_t = 60.0)]
        max_interval: f64,
        /// One JSON object per config instead of the table.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        common: Common,
    },
    /// Settle interrupted submissions with SLURM, then submit what never ran or ended retryably.
    Resume {
        /// Experiment name (its stored sweep) or experiment file (re-read, with overrides).
        experiment: String,
        /// `key.path=value` overrides applied to every config (with the experiment file only).
        overrides: Vec<String>,
        #[command(flatten)]
        select: Selection,
        #[command(flatten)]
        retry: Retry,
        /// After an active sweep, submit the configs it answered by a
        /// prediction too (by default they are not run: the runs it saved).
        #[arg(long)]
        all: bool,
        #[command(flatten)]
        common: Common,
    },
    /// Cancel every queued or running job of the experiment.
    Cancel {
        /// Experiment name or file.
        experiment: String,
        #[command(flatten)]
        common: Common,
    },
    /// Upload the worker binary to a SLURM cluster's `<work_dir>/bin/worker` (skipped when identical).
    #[command(mut_arg("cluster", |a| a.help("The cluster to install on, one of the clusters file's (required: no default)")))]
    Install {
        /// The worker binary (default: `worker` beside this orchestrator executable).
        #[arg(long)]
        worker: Option<PathBuf>,
        /// Then submit a job (the cluster's `defaults:` resources) that warms the
        /// kernel cache of the node it lands on: `worker warm`, a short run of
        /// each model family's kernels, into `<work_dir>/cache/<host>`.
        #[arg(long)]
        warm: bool,
        /// The backend the worker must have (refused before the upload without it; none named:
        /// a GPU backend, where the cluster's `defaults:` ask for a GPU); with --warm, the
        /// warm-up job's backend (default: the worker's first GPU backend).
        #[arg(long, value_parser = worker_backend)]
        backend: Option<crate::experiment::WorkerBackend>,
        #[command(flatten)]
        common: Common,
    },
    /// Print the sbatch scripts `submit` would send, without submitting (kept in state/<exp>/render/).
    Render {
        /// Experiment YAML.
        file: PathBuf,
        /// `key.path=value` overrides applied to every config.
        overrides: Vec<String>,
        #[command(flatten)]
        select: Selection,
        #[command(flatten)]
        common: Common,
    },
}

fn options(common: &Common, select: Option<&Selection>, retry: Option<&Retry>) -> Options {
    let mut o = Options {
        state_root: common.state_dir.clone(),
        clusters_file: common.clusters.clone(),
        cluster: common.cluster.clone(),
        result_grace: Duration::from_secs_f64(common.result_grace.max(0.0)),
        ..Options::default()
    };
    if let Some(t) = &common.templates {
        o.template_dirs.insert(0, t.clone());
    }
    if let Some(s) = select {
        o.include_risky = s.include_risky;
        o.force = s.force;
    }
    if let Some(r) = retry {
        o.retry = RetryPolicy {
            timeout: !r.no_retry_timeout,
            cancelled: !r.no_retry_cancelled,
            cancelled_by_cancel: r.retry_cancelled,
            failed: r.retry_failed,
            killed: !r.no_retry_killed,
            max_attempts: r.max_attempts.max(1),
        };
    }
    o
}

/// An experiment given by file (loaded) or by name (its stored sweep).
fn experiment_of(arg: &str, overrides: &[String], opts: &Options) -> Result<Sweep> {
    let p = Path::new(arg);
    if p.is_file() {
        return Ok(crate::sweep::load(p, overrides)?);
    }
    if !overrides.is_empty() {
        anyhow::bail!("overrides need the experiment file, not the name `{arg}`");
    }
    Ok(stored_sweep(&opts.state_root, arg)?.sweep)
}

/// `submit --active` of `file` with `overrides`; `hint`: the flags its printed commands carry.
fn run_active(
    sweep: &Sweep,
    opts: &Options,
    a: &ActiveArgs,
    (file, overrides): (&Path, &[String]),
    hint: &Hint,
) -> Result<()> {
    let settings = crate::active::Settings {
        runtime: sweep.experiment.runtime.clone(),
        target_error: a.target_error,
        max_runs: a.max_runs,
        round_size: a.round_size,
    };
    let every = Duration::from_secs_f64(a.poll_interval.max(0.1));
    let watch = Watch { min: every, max: every.mul_f64(5.0), max_polls: None };
    let (name, leave) = (sweep.experiment.name.clone(), hint.clone());
    let ended = block_on(async {
        let interrupt = Interrupt::listen(move |n| match n {
            1 => eprintln!("Ctrl-C: no new round; the step in flight finishes (Ctrl-C again leaves at once)"),
            _ => super::interrupt::leave_at_once(&name, &leave),
        });
        active::run_until(sweep, opts, &settings, watch, interrupt.as_ref(), &mut |line| println!("{line}")).await
    })?
    .context("submit --active")?;
    let r = match ended {
        active::Ended::Done(r) => r,
        active::Ended::Interrupted(stopped) => {
            let flags = loop_flags(a);
            let words = (file, overrides, flags.as_slice());
            println!("{}", super::interrupt::stopped_text(&stopped, words, hint));
            std::process::exit(130);
        }
    };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&r).context("serialising the answers")?);
    } else {
        print!("{r}");
        if r.savings.cancelled > 0 {
            let again = hint.command(&format!("resume {} --retry-cancelled", r.experiment));
            println!("`{again}` runs {} again", if r.savings.cancelled == 1 { "it" } else { "them" });
        }
    }
    Ok(())
}

/// The flags of `submit --active` that shape its loop, where not the defaults
/// (a printed `submit --active` carries them to go on with the same loop).
fn loop_flags(a: &ActiveArgs) -> Vec<String> {
    let mut out = Vec::new();
    if crate::active::parse_share(crate::active::DEFAULT_TARGET_ERROR).ok() != Some(a.target_error) {
        out.extend(["--target-error".to_string(), a.target_error.to_string()]);
    }
    if let Some(n) = a.max_runs {
        out.extend(["--max-runs".to_string(), n.to_string()]);
    }
    if let Some(n) = a.round_size {
        out.extend(["--round-size".to_string(), n.to_string()]);
    }
    out
}

/// What `submit` and `resume` did; `again`: the `resume` that runs what
/// `cancel` stopped (`orchestrator resume NAME --retry-cancelled` and the flags that reach the sweep).
fn print_submit(r: &SubmitReport, again: &str) {
    if let Some(c) = &r.cluster {
        println!("cluster: {c}");
    }
    for (name, why) in &r.skipped {
        println!("skip   {name}: {why}");
    }
    match r.cancelled_by_cancel.len() {
        0 => {}
        1 => println!("1 config was cancelled by `cancel`; `{again}` runs it again"),
        n => println!("{n} configs were cancelled by `cancel`; `{again}` runs them again"),
    }
    let cluster = if r.slurm { "SLURM" } else { "the cluster" };
    for s in &r.adopted {
        println!("settled interrupted submission {s}: {cluster} had it (adopted its job id)");
    }
    for s in &r.abandoned {
        println!(
            "settled interrupted submission {s}: {cluster} never got it (it lists no job of its name, twice, \
             and no task of it wrote a run; its configs are free again)"
        );
    }
    for (s, found) in &r.ran_anyway {
        println!(
            "unresolved submission {s}: {cluster} lists no job of its name, but {found}; its configs stay \
             reserved, so nothing is submitted twice"
        );
    }
    for s in r.unresolved.iter().filter(|s| !r.ran_anyway.iter().any(|(id, _)| id == *s)) {
        println!(
            "unresolved submission {s}: {cluster} has not answered by its job name yet; its configs stay reserved"
        );
    }
    let per_task = match r.configs_per_task {
        k if k > 1 => format!(", {k} per task,"),
        _ => String::new(),
    };
    let arrays = match r.arrays.len() {
        0 => format!(": nothing left to send ({} skipped)", r.skipped.len()),
        n => format!(
            "{per_task} in {n} job array(s) [{}]",
            r.arrays.iter().map(|j| j.as_str()).collect::<Vec<_>>().join(", ")
        ),
    };
    println!(
        "submitted {} configs{arrays}; {} cluster commands, {} file transfers, {:.1} s",
        r.submitted.len(),
        r.counters.commands,
        r.counters.file_ops,
        r.wall_s
    );
}

pub fn run(cmd: ClusterCommand) -> Result<()> {
    match cmd {
        ClusterCommand::Submit { file, overrides, select, common, active } if active.active => {
            let sweep = crate::sweep::load(&file, &overrides)?;
            let opts = options(&common, Some(&select), None).remembering_clusters(&sweep.experiment.name)?;
            run_active(&sweep, &opts, &active, (&file, &overrides), &hint(&common))?;
        }
        ClusterCommand::Submit { file, overrides, select, common, .. } => {
            let sweep = crate::sweep::load(&file, &overrides)?;
            let opts = options(&common, Some(&select), None).remembering_clusters(&sweep.experiment.name)?;
            let spin = crate::progress::spinner(&format!(
                "submitting {} ({} configs)",
                sweep.experiment.name,
                sweep.configs.len()
            ));
            let r = block_on(submit(&sweep, &opts, false))?.context("submit");
            spin.finish_and_clear();
            let r = r?;
            print_submit(&r, &retry_cancelled(&sweep, &common));
        }
        ClusterCommand::Resume { experiment, overrides, select, retry, all, common } => {
            let opts = Options { all, ..options(&common, Some(&select), Some(&retry)) };
            let sweep = experiment_of(&experiment, &overrides, &opts)?;
            let opts = opts.remembering_clusters(&sweep.experiment.name)?;
            if all {
                say_all(&sweep, &opts)?;
            }
            let r = block_on(submit(&sweep, &opts, true))?.context("resume")?;
            print_submit(&r, &retry_cancelled(&sweep, &common));
        }
        ClusterCommand::Status { experiment, watch, interval, max_interval, json, common } => {
            let every = watch.then_some((interval, max_interval));
            run_status(&experiment, every, json, &common)?;
        }
        ClusterCommand::Cancel { experiment, common } => {
            let opts = options(&common, None, None);
            let name = experiment_of(&experiment, &[], &opts)?.experiment.name;
            let opts = opts.remembering_clusters(&name)?;
            let done = block_on(cancel(&name, &opts))?.context("cancel")?;
            print!("{}", cancelled_text(&name, &done));
        }
        ClusterCommand::Install { worker, warm, backend, common } => {
            let opts = options(&common, None, None);
            let Some(cluster) = common.cluster.as_deref() else {
                anyhow::bail!("install needs --cluster NAME (a cluster of the clusters file)");
            };
            let worker = match worker.or_else(crate::submit::install::default_worker) {
                Some(w) => w,
                None => anyhow::bail!("cannot locate this executable's directory; pass --worker PATH"),
            };
            let installed = crate::submit::install::install(&opts, cluster, &worker, backend, warm);
            let done = block_on(installed)?.context("install")?;
            print_installed(cluster, &done);
        }
        ClusterCommand::Render { file, overrides, select, common } => {
            let opts = options(&common, Some(&select), None);
            let sweep = crate::sweep::load(&file, &overrides)?;
            let rendered = block_on(render(&sweep, &opts))?.context("render")?;
            for (path, text) in &rendered.scripts {
                println!("# ---- {} ----", path.display());
                print!("{text}");
            }
            // On stderr: stdout is the scripts.
            eprint!("{}", render_summary(&rendered));
            if let Some(time) = &rendered.time {
                eprintln!("{time}");
                if let Some(w) = time.warning() {
                    tracing::warn!("{w}");
                }
            }
        }
    }
    Ok(())
}

/// What `cancel` did, in lines: the arrays cancelled now, and those an
/// earlier `cancel` already asked for (nothing new) that SLURM still lists.
fn cancelled_text(name: &str, done: &crate::submit::cancel::Cancelled) -> String {
    let list = |ids: &[crate::slurm::JobId]| ids.iter().map(|j| j.as_str()).collect::<Vec<_>>().join(" ");
    let mut s = match (done.new.is_empty(), done.again.is_empty()) {
        (true, true) => format!("nothing to cancel: no job array of {name} is queued or running\n"),
        (false, _) => format!("cancelled {} job array(s): {}\n", done.new.len(), list(&done.new)),
        (true, false) => "nothing new to cancel: ".to_string(),
    };
    if !done.again.is_empty() {
        s += &format!("already cancelled, not yet reported ended by SLURM (asked again): {}\n", list(&done.again));
    }
    for (config, at) in &done.chains {
        s += &format!("stopped {config} at {at}; its checkpoint stays in its run directory\n");
    }
    s
}

/// What `render` left out: the configs `submit` would not send now, and why
/// (the scripts hold only those it would).
fn render_summary(r: &crate::submit::Rendered) -> String {
    if r.skipped.is_empty() {
        return String::new();
    }
    let mut s = match r.scripts.is_empty() {
        true => format!("nothing to render: `submit` would send none of the {} configs now:\n", r.skipped.len()),
        false => {
            format!("rendered only what `submit` would send now; not the {} configs it would not:\n", r.skipped.len())
        }
    };
    for (name, why) in &r.skipped {
        s += &format!("  {name}: {why}\n");
    }
    s
}

/// `status`: the table (or JSON lines) once, or on every poll with `every`
/// (the shortest and longest interval, seconds).
fn run_status(experiment: &str, every: Option<(f64, f64)>, json: bool, common: &Common) -> Result<()> {
    let opts = options(common, None, None);
    let sweep = experiment_of(experiment, &[], &opts)?;
    let name = sweep.experiment.name.clone();
    let opts = opts.remembering_clusters(&name)?;
    let hint = hint(common);
    if Path::new(experiment).is_file() && stored_sweep(&opts.state_root, &name).is_err() {
        // A file never submitted: every config, not submitted, nothing to
        // poll; each verdict judged where `submit` would run it, as `plan` does.
        let (judged, _) = where_it_runs(&sweep, opts.cluster.as_deref(), None, opts.clusters_file.as_deref())?;
        let r = view::unsubmitted(&judged, &opts.state_root);
        if json {
            for row in &r.rows {
                println!("{}", serde_json::to_string(row).unwrap_or_default());
            }
        } else {
            print!("{}", r.table());
            println!("experiment `{name}` has not been submitted (no state under {})", opts.state_root.display());
        }
        return Ok(());
    }
    let watch = every.is_some();
    let w = every.map(|(interval, max_interval)| Watch {
        min: Duration::from_secs_f64(interval.max(0.1)),
        max: Duration::from_secs_f64(max_interval.max(interval).max(0.1)),
        max_polls: None,
    });
    // --watch: a bar in a terminal, only what changed when piped (super::watch).
    let mut printer = super::watch::Printer::new(json, watch.then(crate::progress::watch_bar));
    let (root, exp, report_hint) = (opts.state_root.clone(), name.clone(), hint.state_only());
    let mut show = move |r: &StatusReport| {
        let active = crate::state::View::new(&root, &exp).ok().and_then(|v| v.active().ok().flatten());
        let predicted = active.as_ref().map(crate::active::ActiveReport::predictions).unwrap_or_default();
        let progress = crate::progress::read(&root, &exp, &predicted).ok();
        if watch {
            printer.show(r, progress.as_ref());
        } else if json {
            for row in &r.rows {
                println!("{}", serde_json::to_string(row).unwrap_or_default());
            }
        } else {
            print!("{}", r.table());
            if let Some(p) = progress {
                println!("{}", p.line());
            }
            if let Some(a) = &active {
                let submitted = r.rows.iter().filter(|row| row.state != "-").map(|row| row.name.clone()).collect();
                let report = report_hint.command(&format!("report {}", a.experiment));
                println!("{}", a.status_line(&submitted, &report));
            }
        }
    };
    let (leave, leave_hint) = (name.clone(), hint.clone());
    let r = block_on(async {
        let interrupt = w.and_then(|_| {
            Interrupt::listen(move |n| {
                if n > 1 {
                    super::interrupt::leave_at_once(&leave, &leave_hint)
                }
            })
        });
        status_until(&name, &opts, w, interrupt.as_ref(), &mut show).await
    })?
    .context("status")?;
    if !watch {
        show(&r);
    }
    if r.interrupted {
        eprintln!(
            "stopped watching; the sweep goes on (`{}` follows it again, `{}` stops it)",
            hint.command(&format!("status {name} --watch")),
            hint.command(&format!("cancel {name}"))
        );
        std::process::exit(130);
    }
    Ok(())
}

/// The flags the commands a command with `common` prints carry ([`Hint`]).
fn hint(common: &Common) -> Hint {
    let c = common;
    Hint::new(&c.state_dir, c.clusters.as_deref(), c.cluster.as_deref(), c.templates.as_deref())
}

/// `orchestrator resume NAME --retry-cancelled`, with the flags that reach the sweep.
fn retry_cancelled(sweep: &Sweep, common: &Common) -> String {
    hint(common).command(&format!("resume {} --retry-cancelled", sweep.experiment.name))
}

/// `resume --all`, before it submits: how many configs the active sweep
/// answered by a prediction it now runs, and in how many GPU jobs.
fn say_all(sweep: &Sweep, opts: &Options) -> Result<()> {
    let n = crate::submit::predictions_it_runs(sweep, opts)?.len();
    if n == 0 && crate::state::View::new(&opts.state_root, &sweep.experiment.name)?.active()?.is_none() {
        return Ok(());
    }
    let per_task = sweep.experiment.worker.configs_per_task.max(1) as usize;
    println!(
        "resume --all: also submitting the {} the active sweep answered by a prediction: {}",
        crate::active::configs(n),
        crate::active::plural(n.div_ceil(per_task), "GPU job", "GPU jobs")
    );
    Ok(())
}

/// `install`'s answer: the upload, then the warm-up job and where its output goes.
fn print_installed(cluster: &str, done: &crate::submit::install::Installed) {
    match &done.upload {
        Some(r) => println!(
            "{} {} ({:.1} MiB, sha256 {}) on {}: {:.1} s",
            if r.uploaded { "installed" } else { "up to date:" },
            r.path,
            r.bytes as f64 / (1u64 << 20) as f64,
            &r.sha256[..12],
            r.cluster,
            r.wall_s
        ),
        None => {
            println!("nothing to install on {cluster} (the `local` transport runs the worker beside the orchestrator)")
        }
    }
    if let Some(w) = &done.warm {
        println!(
            "submitted warm-up job {} ({}): worker warm --backend {} into {}",
            w.job_id, w.job_name, w.backend, w.cache
        );
        println!("its output, one line per config and `warm: N of N configs ok` at the end: {}", w.log);
        if w.on_slurm {
            println!("(sacct -j {} shows when it ended)", w.job_id);
        }
    }
}

/// A backend by its name, for `install --backend`.
fn worker_backend(name: &str) -> std::result::Result<crate::experiment::WorkerBackend, String> {
    use crate::experiment::WorkerBackend::*;
    [Flex, Wgpu, Vulkan, Cuda]
        .into_iter()
        .find(|b| b.name() == name)
        .ok_or_else(|| format!("unknown backend `{name}` (flex, wgpu, vulkan or cuda)"))
}
