//! The CLI edge of `explain` and `fit`: argument structs (flattened into the
//! binary's subcommands next to its `ExperimentArgs`) and printing.

use anyhow::{Context, Result};
use clap::Args;
use facts::{Gpu, Mode, Variant};
use serde::Serialize;
use std::path::PathBuf;

use crate::advisor::explain::{self, Explanation};
use crate::advisor::fit::{self, FitOptions, SearchSpace};
use crate::advisor::levers::{self, Lever};
use crate::advisor::scale::{self, NewInput, Scaling};
use crate::precheck::Predictor;
use crate::sweep::Sweep;
use crate::transport::replay::Records;

/// Options of `orchestrator explain`.
#[derive(Args, Debug, Clone)]
pub struct ExplainArgs {
    /// The config to explain (default: the first valid one).
    #[arg(long)]
    pub config: Option<String>,
    /// One JSON object (breakdown, levers, scaling) instead of the tables.
    #[arg(long)]
    pub json: bool,
    /// Write a stacked-bar plot of the breakdown (.svg or .png).
    #[arg(long, value_name = "FILE")]
    pub plot: Option<PathBuf>,
    /// Predict every config with H and W multiplied by this factor (D kept, as exp11 → exp11_1).
    #[arg(long, value_name = "F", conflicts_with = "input", value_parser = whole_factor)]
    pub scale_input: Option<u32>,
    /// Predict every config at this input shape instead (D,H,W).
    #[arg(long, value_name = "D,H,W")]
    pub input: Option<String>,
    /// Skip the levers table.
    #[arg(long)]
    pub no_levers: bool,
}

/// Options of `orchestrator fit`.
#[derive(Args, Debug, Clone)]
pub struct FitArgs {
    /// The GPU to fit on (default: the experiment's `gpu`).
    #[arg(long, value_parser = gpu_names())]
    pub gpu: Option<Gpu>,
    /// Policy budget in GiB (default: the experiment's budget_gb, else the GPU's capacity).
    #[arg(long, value_name = "GB")]
    pub budget: Option<f64>,
    /// `profile` (one forward/backward/step, the reports' peak) or `train` (AdamW + EMA resident).
    #[arg(long, default_value = "profile", value_parser = parse_mode)]
    pub mode: Mode,
    /// Search the family's knobs around the sweep's base configs instead of the sweep itself.
    #[arg(long)]
    pub search: bool,
    /// With --search: UNet widths times 2^k for k in LO..HI.
    #[arg(long, default_value = "-2..4", value_name = "LO..HI", allow_hyphen_values = true)]
    pub width_pow2: String,
    /// With --search: UNet res blocks per level, LO..HI.
    #[arg(long, default_value = "1..3", value_name = "LO..HI")]
    pub res_blocks: String,
    /// With --search: attention at the deepest 0..=N levels.
    #[arg(long, default_value_t = 2, value_name = "N")]
    pub max_attention_levels: usize,
    /// With --search: transformer variants (default: all of the family's).
    #[arg(long, value_delimiter = ',', value_parser = parse_variant)]
    pub variants: Vec<Variant>,
    /// With --search: transformer patch sizes.
    #[arg(long, value_delimiter = ',', default_value = "2,4,8")]
    pub patches: Vec<u32>,
    /// Rows of the ranked table per input shape.
    #[arg(long, default_value_t = 15)]
    pub top: usize,
    /// Measurement records: a config they record as `oom` is never advised
    /// (default: the group's data/vram-measurements.jsonl, where it is).
    #[arg(long, value_name = "JSONL")]
    pub records: Option<PathBuf>,
    /// The report as one JSON object.
    #[arg(long)]
    pub json: bool,
}

fn parse_mode(s: &str) -> Result<Mode, String> {
    match s {
        "profile" => Ok(Mode::Profile),
        "train" => Ok(Mode::Train),
        _ => Err(format!("`{s}`: expected profile or train")),
    }
}

fn parse_variant(s: &str) -> Result<Variant, String> {
    serde_json::from_value(serde_json::Value::String(s.to_string()))
        .map_err(|_| format!("`{s}`: expected S, S-Deep, M, B, L or XL"))
}

fn parse_range<T: std::str::FromStr>(what: &str, s: &str) -> Result<(T, T)> {
    let (a, b) = s.split_once("..").with_context(|| format!("{what} `{s}`: expected LO..HI"))?;
    let p = |x: &str| x.trim().trim_start_matches('=').parse::<T>().ok();
    match (p(a), p(b)) {
        (Some(lo), Some(hi)) => Ok((lo, hi)),
        _ => anyhow::bail!("{what} `{s}`: expected LO..HI with integers"),
    }
}

#[derive(Serialize)]
struct ExplainJson<'a> {
    #[serde(flatten)]
    explanation: &'a Explanation,
    levers: &'a [Lever],
    #[serde(skip_serializing_if = "Option::is_none")]
    scaling: Option<&'a [Scaling]>,
}

/// `orchestrator explain`.
pub fn run_explain(sweep: &Sweep, args: &ExplainArgs, predictor: &Predictor) -> Result<()> {
    let chosen = crate::advisor::pick(sweep, args.config.as_deref())?;
    let cfg = &chosen.config;
    let e = explain::explain(predictor, cfg, sweep.capacity(cfg.gpu))?;
    let lv = if args.no_levers { Vec::new() } else { levers::levers(predictor, cfg)? };
    let to = match (args.scale_input, &args.input) {
        (Some(0), _) => anyhow::bail!("--scale-input must be at least 1"),
        (Some(f), _) => Some(NewInput::ScaleHw(f)),
        (None, Some(s)) => Some(s.parse::<NewInput>()?),
        (None, None) => None,
    };
    // Scaling is per config: the one asked for, or every valid config of the sweep.
    let scalings = match to {
        Some(to) => {
            let targets: Vec<&crate::sweep::SweepConfig> = match &args.config {
                Some(_) => vec![chosen],
                None => sweep.configs.iter().filter(|c| c.is_valid()).collect(),
            };
            Some(
                targets
                    .iter()
                    .map(|c| scale::scaling(predictor, &c.config, to, sweep.capacity(c.config.gpu).gib))
                    .collect::<Result<Vec<_>, _>>()?,
            )
        }
        None => None,
    };
    if let Some(path) = &args.plot {
        crate::advisor::plot::plot(&e, sweep.experiment.budget_gb, path)?;
        eprintln!("wrote {}", path.display());
    }
    if args.json {
        let j = ExplainJson { explanation: &e, levers: &lv, scaling: scalings.as_deref() };
        println!("{}", serde_json::to_string_pretty(&j).context("serialising the explanation")?);
        return Ok(());
    }
    print!("{}", explain::render(&e));
    if !lv.is_empty() {
        println!("\nlevers (single changes, biggest saving first; invalid changes left out):");
        print!("{}", levers::render(&lv));
    }
    if let (Some(rows), Some(to)) = (&scalings, to) {
        println!();
        print!("{}", scale::render(rows, to));
    }
    Ok(())
}

/// `orchestrator fit`.
pub fn run_fit(sweep: &Sweep, args: &FitArgs, predictor: &Predictor) -> Result<()> {
    let gpu: Gpu = args.gpu.unwrap_or(sweep.experiment.gpu);
    if let Some(b) = args.budget {
        anyhow::ensure!(b > 0.0 && b.is_finite(), "--budget {b}: expected a positive number of GiB");
    }
    // The sweep's own limits on its own GPU; another GPU (--gpu) has its whole memory.
    let capacity = match args.gpu {
        Some(g) => crate::sweep::Capacity::of_gpu(g),
        None => sweep.capacity(gpu),
    };
    let opts = FitOptions { gpu, capacity, budget_gb: args.budget.or(sweep.experiment.budget_gb), mode: args.mode };
    let configs = if args.search {
        let space = SearchSpace {
            width_pow2: parse_range("--width-pow2", &args.width_pow2)?,
            res_blocks: parse_range("--res-blocks", &args.res_blocks)?,
            max_attention_levels: args.max_attention_levels,
            variants: args.variants.clone(),
            patches: args.patches.clone(),
        };
        anyhow::ensure!(space.res_blocks.0 >= 1, "--res-blocks: at least 1 res block per level");
        fit::search_configs(sweep, &space)
    } else {
        fit::sweep_configs(sweep)
    };
    let records = match &args.records {
        Some(path) => Some(Records::load(path)?),
        None => crate::cluster::ClusterConfig::replay()
            .records
            .filter(|p| p.is_file())
            .map(|p| Records::load(&p))
            .transpose()?,
    };
    let recorded_oom = |cfg: &facts::RunConfig| {
        let r = records.as_ref()?;
        let found = r.find(cfg).ok().filter(|f| f.record.status == facts::record::MeasuredStatus::Oom)?;
        Some(format!("{}:{}", r.source, found.line))
    };
    let name = &sweep.experiment.name;
    let report = fit::fit_with_records(predictor, name, &configs, opts, args.search, &recorded_oom)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report).context("serialising the fit report")?);
    } else {
        print!("{}", fit::render(&report, args.top));
    }
    Ok(())
}

/// `--gpu`: a catalog name, offered by completion (never a file name).
fn gpu_names() -> impl clap::builder::TypedValueParser<Value = Gpu> {
    use clap::builder::TypedValueParser;
    clap::builder::PossibleValuesParser::new(Gpu::ALL.map(|g| g.name()))
        .try_map(|name| name.parse::<Gpu>().map_err(|e| e.to_string()))
}

/// `--scale-input`: a whole factor, said in words when it is not one (not
/// clap's "invalid digit found in string").
fn whole_factor(text: &str) -> Result<u32, String> {
    text.trim().parse::<u32>().map_err(|_| {
        format!("`{text}` is not a whole factor: H and W are multiplied by a whole number (2 turns 64x64 into 128x128); for another shape give --input D,H,W")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_and_variants_parse() {
        assert_eq!(parse_range::<i32>("x", "-3..3").unwrap(), (-3, 3));
        assert_eq!(parse_range::<u32>("x", "1..=3").unwrap(), (1, 3));
        assert!(parse_range::<u32>("x", "1-3").is_err());
        assert_eq!(parse_variant("S-Deep").unwrap(), Variant::SDeep);
        assert!(parse_variant("XXL").is_err());
        assert!(parse_mode("train").is_ok() && parse_mode("fast").is_err());
    }
}
