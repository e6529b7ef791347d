//! Sweep expansion: one experiment file → the list of configs it names.
//!
//! ```yaml
//! sweep:
//!   name: "{model.variant}_p{model.patch}"   # optional name template
//!   configs:                                  # named configs, each a set of overrides
//!     - {name: 4L_large, model.channels: [256, 512, 1024, 2048]}
//!   grid:                                     # cartesian product, last key fastest
//!     model.patch: [2, 4, 8]
//!     input.spatial: {lat4x: [40, 64, 64], lat8x: [20, 32, 32]}   # labelled values
//!   zip:                                      # advanced in lockstep
//!     model.variant: [S, B]
//!     model.heads: [6, 12]
//!   exclude:
//!     - {model.variant: XL, model.patch: 2}
//! ```
//! Configs = (named configs, or the base alone) x grid x zip, less exclusions.
//! Command-line overrides apply to the base and win over every sweep value.

mod axes;
mod name;

use serde_yaml::{Mapping, Value};
use spec::run::ConfigHash;
use spec::{Invalid, RunConfig};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::experiment::locate::{KeyPath, Seg};
use crate::experiment::{
    model_from_value, typed, Experiment, LoadError, Origin, Override, RawExperiment, Source, PER_CONFIG_KEYS,
};
use axes::Axes;

/// One expanded config: its name, content hash, the run, and why it cannot run.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SweepConfig {
    pub name: String,
    pub hash: ConfigHash,
    pub config: RunConfig,
    /// Shape rules it breaks; empty when valid. Never dropped: shown as `invalid`.
    pub invalid: Vec<Invalid>,
}

impl SweepConfig {
    pub fn is_valid(&self) -> bool {
        self.invalid.is_empty()
    }
    /// `valid`, or `invalid: <first reason>` (more reasons counted).
    pub fn status(&self) -> String {
        match self.invalid.as_slice() {
            [] => "valid".into(),
            [one] => format!("invalid: {one}"),
            [first, rest @ ..] => format!("invalid: {first} (+{} more)", rest.len()),
        }
    }
}

/// An expanded experiment.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Sweep {
    pub experiment: Experiment,
    /// The file it came from.
    pub source: PathBuf,
    pub configs: Vec<SweepConfig>,
    /// Configs the expansion produced twice (mostly after command-line
    /// overrides): (its name as the file writes it, the name of the kept twin).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub collapsed: Vec<(String, String)>,
}

impl Sweep {
    pub fn get(&self, name: &str) -> Option<&SweepConfig> {
        self.configs.iter().find(|c| c.name == name)
    }

    /// The precheck for this experiment's runtime, at its configs' precision
    /// (coefficients fall back across precisions: the walk counts element sizes).
    pub fn predictor(&self) -> Result<crate::precheck::Predictor, crate::precheck::PrecheckError> {
        self.predictor_in(None).map(|(p, _)| p)
    }

    /// The precheck as `plan`, `submit` and `fit` use it: the local
    /// calibration overlay of `state_root` where it has enough runs of this
    /// runtime on this GPU, else the shipped calibration; and which it was.
    pub fn predictor_in(
        &self,
        state_root: Option<&Path>,
    ) -> Result<(crate::precheck::Predictor, crate::precheck::overlay::Source), crate::precheck::PrecheckError> {
        let precision = self.configs.first().map(|c| c.config.precision).unwrap_or(spec::Precision::Bf16Amp);
        crate::precheck::overlay::predictor(state_root, &self.experiment.runtime, precision, self.experiment.gpu)
    }
}

/// Read `path`, apply command-line `overrides` (`key.path=value`) and expand.
pub fn load(path: &Path, overrides: &[String]) -> Result<Sweep, LoadError> {
    let src = Source::read(path)?;
    expand(src, overrides)
}

/// As [`load`], from text already in memory (`file` names it in errors).
pub fn parse(file: &Path, text: &str, overrides: &[String]) -> Result<Sweep, LoadError> {
    expand(Source::parse(file, text)?, overrides)
}

fn expand(src: Source, overrides: &[String]) -> Result<Sweep, LoadError> {
    let cli: Vec<Override> = overrides.iter().map(|s| s.parse()).collect::<Result<_, _>>()?;
    let mut base = src.doc.clone();
    for o in &cli {
        crate::experiment::overrides_set(&mut base, &o.key, o.value.clone())
            .map_err(|message| LoadError::Override { arg: o.arg.clone(), message })?;
    }
    let cli_origins: Vec<(KeyPath, Origin)> = cli.iter().map(|o| (o.key.clone(), Origin::Cli(o.arg.clone()))).collect();

    // The whole file once, for errors outside the per-config fields.
    let raw: RawExperiment = typed(base.clone()).map_err(|(p, m)| {
        let origin = cli_origins.iter().find(|(k, _)| p.starts_with(k));
        src.error_at(&p, origin, m)
    })?;
    let experiment = raw.experiment();
    if let Some(b) = experiment.budget_gb.filter(|b| !(*b > 0.0 && b.is_finite())) {
        let p = KeyPath::default().key("budget_gb");
        let origin = cli_origins.iter().find(|(k, _)| p.starts_with(k));
        return Err(src.error_at(&p, origin, format!("{b} GiB: a budget must be a positive number of GiB (e.g. 60)")));
    }
    // Any precision will do: a shipped runtime has coefficients for at least one.
    if let Err(e) = crate::precheck::Predictor::builtin(&experiment.runtime, spec::Precision::Bf16Amp) {
        return Err(src.error_in_file(&KeyPath::default().key("runtime"), e.to_string()));
    }
    let sweep_path = KeyPath::default().key("sweep");
    let axes = match &raw.sweep {
        Some(v) => Axes::parse(&src, v, &sweep_path)?,
        None => Axes::default(),
    };
    if let Value::Mapping(m) = &mut base {
        m.remove("sweep");
    }

    let mut configs: Vec<SweepConfig> = Vec::new();
    let mut collapsed = Vec::new();
    // hash → index into `configs`; names already given.
    let mut by_hash: HashMap<ConfigHash, usize> = HashMap::new();
    let mut seen_names = std::collections::HashSet::new();
    let template_at = KeyPath::default().key("sweep").key("name");
    for combo in axes.combinations() {
        let mut doc = base.clone();
        let mut origins: Vec<(KeyPath, Origin)> = Vec::new();
        for choice in &combo {
            for (key, value, origin) in &choice.sets {
                crate::experiment::overrides_set(&mut doc, key, value.clone())
                    .map_err(|m| src.error_at(key, Some(&(key.clone(), origin.clone())), m))?;
                origins.push((key.clone(), origin.clone()));
            }
        }
        // Command-line overrides win over sweep values.
        for o in &cli {
            if PER_CONFIG_KEYS.iter().any(|k| o.key.0.first() == Some(&Seg::Key(k.to_string()))) {
                crate::experiment::overrides_set(&mut doc, &o.key, o.value.clone())
                    .map_err(|message| LoadError::Override { arg: o.arg.clone(), message })?;
            }
        }
        origins.extend(cli_origins.iter().cloned());
        if axes.excluded(&doc) {
            continue;
        }
        let blame = |p: &KeyPath, m: String| {
            // The most recent override covering the path is where the value came from.
            let origin = origins.iter().rev().find(|(k, _)| p.starts_with(k));
            src.error_at(p, origin, m)
        };
        let raw: RawExperiment = typed(doc.clone()).map_err(|(p, m)| blame(&p, m))?;
        let model_path = KeyPath::default().key("model");
        let model = model_from_value(&raw.model).map_err(|(p, m)| {
            let mut full = model_path.clone();
            full.0.extend(p.0);
            blame(&full, m)
        })?;
        let mut config = RunConfig {
            experiment: experiment.name.clone(),
            name: String::new(),
            model,
            input: raw.input,
            out_channels: raw.output_channels,
            batch: raw.batch,
            precision: raw.precision,
            grad_ckpt: raw.grad_ckpt,
            mode: raw.mode,
            steps: raw.steps,
            gpu: raw.gpu,
        };
        let hash = config.hash();
        let mut name = match &axes.name_template {
            Some(t) => t.fill(&doc).map_err(|key| {
                let family = config.model.family();
                src.error_in_file(
                    &template_at,
                    format!(
                        "the name template uses `{{{key}}}`, which config {} (a {family}) does not set; use keys every config sets",
                        axes::from_labels(&combo, &[], &experiment.name)
                    ),
                )
            })?,
            None => axes::from_labels(&combo, &cli, &experiment.name),
        };
        if let Some(&kept) = by_hash.get(&hash) {
            // The name the file gives it, so the reader recognises it.
            let as_written = match &axes.name_template {
                // The template on the file's own values, before the overrides.
                Some(t) => {
                    let mut file_doc = src.doc.clone();
                    for (key, value, _) in combo.iter().flat_map(|c| &c.sets) {
                        let _ = crate::experiment::overrides_set(&mut file_doc, key, value.clone());
                    }
                    t.fill(&file_doc).unwrap_or(name)
                }
                None => axes::from_labels(&combo, &[], &experiment.name),
            };
            collapsed.push((as_written, configs[kept].name.clone()));
            continue;
        }
        by_hash.insert(hash.clone(), configs.len());
        if !seen_names.insert(name.clone()) {
            name = format!("{name}-{}", &hash.0[..6]);
            seen_names.insert(name.clone());
        }
        config.name = name.clone();
        let invalid = spec::validate::validate(&config);
        configs.push(SweepConfig { name, hash, config, invalid });
    }
    if !collapsed.is_empty() {
        tracing::warn!("{}", collapse_summary(configs.len() + collapsed.len(), &collapsed, &cli));
    }
    Ok(Sweep { experiment, source: src.file.clone(), configs, collapsed })
}

/// One warning for every config that turned out identical to an earlier one.
fn collapse_summary(total: usize, collapsed: &[(String, String)], cli: &[Override]) -> String {
    const SHOWN: usize = 4;
    let cause = if cli.is_empty() {
        "the sweep produces".to_string()
    } else {
        let args: Vec<&str> = cli.iter().map(|o| o.arg.as_str()).collect();
        format!("with {} the sweep produces", args.join(" "))
    };
    let mut pairs: Vec<String> = collapsed.iter().take(SHOWN).map(|(gone, kept)| format!("{gone} → {kept}")).collect();
    if collapsed.len() > SHOWN {
        pairs.push(format!("and {} more", collapsed.len() - SHOWN));
    }
    format!(
        "{cause} {} identical configs: kept {} of {total} ({})",
        collapsed.len(),
        total - collapsed.len(),
        pairs.join(", ")
    )
}

/// Build a mapping value from pairs (for tests and callers composing docs).
pub fn mapping(pairs: &[(&str, Value)]) -> Value {
    let mut m = Mapping::new();
    for (k, v) in pairs {
        m.insert(Value::from(*k), v.clone());
    }
    Value::Mapping(m)
}

#[cfg(test)]
mod tests;
