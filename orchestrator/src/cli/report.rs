//! `orchestrator report`: the command line.

use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};

use crate::precheck::Predictor;

#[derive(clap::Args, Debug, Clone)]
pub struct ReportArgs {
    /// Experiment name (its state) or experiment file.
    #[arg(required_unless_present = "records")]
    pub experiment: Option<String>,
    /// Report on measurement JSONL file(s) instead (format: data/README.md).
    #[arg(long, num_args = 1.., conflicts_with = "experiment")]
    pub records: Vec<PathBuf>,
    /// Print the report as JSON on stdout (the files are written too).
    #[arg(long)]
    pub json: bool,
    /// Directory for report.md, report.json and the plots
    /// (default: <state-dir>/<experiment>/report, or <state-dir>/records-report).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Local state root.
    #[arg(long, default_value = "state")]
    pub state_dir: PathBuf,
    /// The tables to write instead of the experiment's `report_layout`:
    /// project, or the layout of a group script it follows (latent-unet,
    /// s2d-unet, dit, hdit-uvit), which is also printed.
    #[arg(long, conflicts_with = "records")]
    pub layout: Option<crate::report::ReportLayout>,
}

/// The experiment's name: the argument itself, or the `name:` of the file it names.
fn experiment_name(arg: &str) -> Result<String> {
    let p = Path::new(arg);
    if p.is_file() {
        return Ok(crate::sweep::load(p, &[])?.experiment.name);
    }
    Ok(arg.to_string())
}

pub fn run(args: &ReportArgs) -> Result<()> {
    let (report, out) = if !args.records.is_empty() {
        let records = crate::report::read_records_files(&args.records)?;
        // Predict for the runtime the records were measured on, where one is calibrated.
        let predictor = records
            .first()
            .and_then(|r| Predictor::builtin(&r.framework, r.precision).ok())
            .unwrap_or_else(Predictor::pytorch);
        let source = args.records.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ");
        let out = args.out.clone().unwrap_or_else(|| args.state_dir.join("records-report"));
        (crate::report::from_records(&records, source, &predictor), out)
    } else {
        let Some(arg) = &args.experiment else { bail!("give an experiment (name or file) or --records FILE") };
        let name = experiment_name(arg)?;
        let out = match &args.out {
            Some(out) => out.clone(),
            None => crate::state::View::new(&args.state_dir, &name)?.report_dir(),
        };
        let mut report = crate::report::from_state(&args.state_dir, &name, None)?;
        report.layout = args.layout.unwrap_or(report.layout);
        (report, out)
    };
    let (md, plots) = crate::report::write(&report, &out)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&crate::report::json(&report))?);
        eprintln!("wrote {}", md.display());
    } else {
        // A group's layout is its tables, printed as its script printed them.
        if !report.layout.is_project() {
            let text = std::fs::read_to_string(&md).with_context(|| format!("reading {}", md.display()))?;
            print!("{text}");
        }
        // What to open first, then where the rest is (not a list of every file).
        println!("report: {} (open it; report.json beside it)", md.display());
        let mut names: Vec<String> =
            plots.iter().filter_map(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned())).collect();
        names.dedup();
        if !names.is_empty() {
            println!("plots, SVG and PNG, in {}/: {}", out.display(), names.join(", "));
        }
    }
    Ok(())
}
