//! Expansion proper: every combination of the axes becomes a typed, named,
//! validated config; identical ones are planned once.
//!
//! Per config only what varies is built (the document with the combination's
//! values, from the one its neighbour left: `scratch.rs`; its typed run
//! config, hash, name and the shape rules it breaks), on every core; where a
//! value came from is worked out only for an error.

use facts::run::ConfigHash;
use facts::RunConfig;
use serde_yaml::Value;
use std::collections::{HashMap, HashSet};

use super::axes::{self, Axes, Choice};
use super::scratch::{Scratch, Split};
use super::{Sweep, SweepConfig};
use crate::experiment::locate::{KeyPath, Seg};
use crate::experiment::{
    model_from_value, overrides_set, typed, typed_ref, Experiment, LoadError, Origin, Override, RawConfig,
    RawExperiment, Source, PER_CONFIG_KEYS,
};

pub(super) fn expand(src: Source, overrides: &[String]) -> Result<Sweep, LoadError> {
    let cli: Vec<Override> = overrides.iter().map(|s| s.parse()).collect::<Result<_, _>>()?;
    let mut base = src.doc.clone();
    for o in &cli {
        overrides_set(&mut base, &o.key, o.value.clone())
            .map_err(|message| LoadError::Override { arg: o.arg.clone(), message })?;
    }
    let cli_origins: Vec<(KeyPath, Origin)> = cli.iter().map(|o| (o.key.clone(), Origin::Cli(o.arg.clone()))).collect();
    let (experiment, sweep) = experiment(&src, &base, &cli_origins)?;
    let sweep_path = KeyPath::default().key("sweep");
    let axes = match &sweep {
        Some(v) => Axes::parse(&src, v, &sweep_path)?,
        None => Axes::default(),
    };
    if let Value::Mapping(m) = &mut base {
        m.remove("sweep");
    }
    // Command-line overrides of per-config keys win over sweep values.
    let per_config: Vec<&Override> = cli
        .iter()
        .filter(|o| PER_CONFIG_KEYS.iter().any(|k| o.key.0.first() == Some(&Seg::Key(k.to_string()))))
        .collect();
    let split = Split::of(&axes, &per_config.iter().map(|o| &o.key).collect::<Vec<_>>());
    let x = Expander { src: &src, base: &base, per_config, cli_origins, axes: &axes, experiment: &experiment };
    // Each combination on its own (a run of neighbours on each core), then in
    // order: the first error in the file's order, twins and names decided as they come.
    let flat: Vec<&Choice> = axes.combinations().flatten().collect();
    let combos: Vec<&[&Choice]> = match axes.in_product_order().len() {
        0 => vec![&[]],
        width => flat.chunks(width).collect(),
    };
    let runs = crate::util::par::chunks(&combos, |run| {
        let mut scratch = Scratch::new(x.base, &split);
        run.iter().map(|c| x.config(&mut scratch, c)).collect::<Vec<_>>()
    });
    let ones: Vec<Result<Combination, LoadError>> = runs.into_iter().flatten().collect();
    let mut rule_used = vec![false; axes.exclusions().len()];
    let out = Configs::decide(&x, &combos, ones, &mut rule_used)?;
    for (rule, _) in axes.exclusions().iter().zip(&rule_used).filter(|(_, used)| !**used) {
        // A value the command line replaced is no mistake in the file: said, not refused.
        let keys = rule.keys(&axes.view());
        match keys.iter().find(|k| x.cli_origins.iter().any(|(o, _)| k.starts_with(o) || o.starts_with(k))) {
            Some(k) => {
                tracing::warn!("an exclude rule names `{k}`, which the command line sets: it drops nothing now")
            }
            None => return Err(unused_exclusion(&src, rule, &base, &combos)),
        }
    }
    if !out.collapsed.is_empty() {
        tracing::warn!("{}", super::collapse_summary(out.configs.len() + out.collapsed.len(), &out.collapsed, &cli));
    }
    Ok(Sweep {
        experiment,
        source: src.file.clone(),
        configs: out.configs,
        collapsed: out.collapsed,
        host_memory_gib: None,
    })
}

/// The experiment-level settings, checked once for the whole file, and its `sweep:` block.
fn experiment(
    src: &Source,
    base: &Value,
    cli_origins: &[(KeyPath, Origin)],
) -> Result<(Experiment, Option<Value>), LoadError> {
    let raw: RawExperiment = typed(base.clone()).map_err(|(p, m)| {
        let origin = cli_origins.iter().find(|(k, _)| p.starts_with(k));
        src.error_at(&p, origin, m)
    })?;
    base_model_keys(src, base, cli_origins)?;
    let experiment = raw.experiment();
    if let Some(b) = experiment.budget_gb.filter(|b| !(*b > 0.0 && b.is_finite())) {
        let p = KeyPath::default().key("budget_gb");
        let origin = cli_origins.iter().find(|(k, _)| p.starts_with(k));
        return Err(src.error_at(&p, origin, format!("{b} GiB: a budget must be a positive number of GiB (e.g. 60)")));
    }
    if let Some(problem) = experiment.command.as_ref().and_then(|c| c.problem()) {
        return Err(src.error_in_file(&KeyPath::default().key("command"), problem));
    }
    if experiment.command.is_some() && experiment.worker.configs_per_task > 1 {
        let p = KeyPath::default().key("worker").key("configs_per_task");
        return Err(src.error_in_file(&p, "a `command:` sweep runs one config a job task: use 1".into()));
    }
    // Any precision will do: a shipped runtime has coefficients for at least one.
    if let Err(e) = crate::precheck::Predictor::builtin(&experiment.runtime, facts::Precision::Bf16Amp) {
        return Err(src.error_in_file(&KeyPath::default().key("runtime"), e.to_string()));
    }
    Ok((experiment, raw.sweep))
}

/// The base `model:` block's keys: one that no model family has is an error
/// at its line, even where every config gives a `model:` block of its own
/// and so never reads it (a key no config can use is still a typo). A key of
/// another family is not: a config may switch `family` and use it; nor is a
/// value left to the sweep.
fn base_model_keys(src: &Source, base: &Value, cli_origins: &[(KeyPath, Origin)]) -> Result<(), LoadError> {
    let Some(Value::Mapping(model)) = base.get("model") else { return Ok(()) };
    let unknown_to_every_family = |key: &Value, value: &Value| {
        use facts::model::Family;
        Family::ALL.iter().all(|f| {
            let mut one = serde_yaml::Mapping::new();
            one.insert("family".into(), serde_yaml::to_value(f).expect("a family is a YAML string"));
            one.insert(key.clone(), value.clone());
            matches!(model_from_value(&Value::Mapping(one)), Err((_, m)) if m.starts_with("unknown field"))
        })
    };
    let Some((key, _)) = model.iter().find(|(k, v)| k.as_str() != Some("family") && unknown_to_every_family(k, v))
    else {
        return Ok(());
    };
    let name = key.as_str().map_or_else(|| crate::experiment::show(key), str::to_string);
    let path = KeyPath::default().key("model").key(name.clone());
    // The base's own family's message lists the keys it has.
    let message = match model_from_value(&Value::Mapping(model.clone())) {
        Err((_, m)) if m.starts_with(&format!("unknown field `{name}`")) => m,
        _ => format!("unknown field `{name}`: no model family (unet, dit, hdit, uvit) has it"),
    };
    let origin = cli_origins.iter().find(|(k, _)| path.starts_with(k));
    Err(src.error_at(&path, origin, message))
}

/// What every combination is expanded against.
struct Expander<'a> {
    src: &'a Source,
    /// The file's document with the command-line overrides, without `sweep`.
    base: &'a Value,
    /// The command-line overrides of per-config keys (applied after the sweep's values).
    per_config: Vec<&'a Override>,
    cli_origins: Vec<(KeyPath, Origin)>,
    axes: &'a Axes,
    experiment: &'a Experiment,
}

/// What one combination of the sweep's axes gives.
enum Combination {
    Config(Box<Expanded>),
    /// Dropped by `exclude:` rule `rule`.
    Excluded {
        rule: usize,
    },
}

/// An `exclude:` rule that dropped nothing is a mistake (a misspelt key, a
/// value no axis has): said with its place in the file, never ignored.
fn unused_exclusion(src: &Source, rule: &super::exclude::Exclusion, base: &Value, combos: &[&[&Choice]]) -> LoadError {
    let set_somewhere = |k: &KeyPath| {
        crate::experiment::overrides_get(base, k).is_some()
            || combos.iter().flat_map(|c| c.iter()).any(|c| c.sets.iter().any(|(key, _, _)| key == k))
    };
    let message = match rule.values().find(|(k, _)| !set_somewhere(k)) {
        Some((k, _)) => format!("this exclude rule names `{k}`, which no config has: it matches nothing"),
        None => "this exclude rule matches no config of the sweep (no combination has all of its values)".into(),
    };
    src.error_in_file(&rule.at, message)
}

/// One combination, typed: its run config (named), hash, name as it comes,
/// and the shape rules it breaks.
struct Expanded {
    config: RunConfig,
    hash: ConfigHash,
    name: String,
    invalid: Vec<facts::Invalid>,
}

impl Expander<'_> {
    /// Sets `choices`' values into `doc`, then (`cli`) the command line's per-config overrides.
    fn apply(&self, doc: &mut Value, choices: &[&Choice], cli: bool) -> Result<(), LoadError> {
        for choice in choices {
            for (key, value, origin) in &choice.sets {
                overrides_set(doc, key, value.clone())
                    .map_err(|m| self.src.error_at(key, Some(&(key.clone(), origin.clone())), m))?;
            }
        }
        for o in self.per_config.iter().filter(|_| cli) {
            overrides_set(doc, &o.key, o.value.clone())
                .map_err(|message| LoadError::Override { arg: o.arg.clone(), message })?;
        }
        Ok(())
    }

    /// The config of one combination, or the `exclude:` rule that drops it;
    /// `scratch` is what its neighbours before it left.
    fn config<'c>(&self, scratch: &mut Scratch<'c>, combo: &[&'c Choice]) -> Result<Combination, LoadError> {
        let src = self.src;
        let doc = scratch.docs.doc(combo, &|d, c, cli| self.apply(d, c, cli))?;
        if let Some(rule) = self.axes.excluded_by(combo, doc) {
            return Ok(Combination::Excluded { rule });
        }
        let blame = |p: &KeyPath, m: String| src.error_at(p, self.origin(combo, p).as_ref(), m);
        let filled = self.axes.name_template.as_ref().map(|t| t.fill(doc));
        let raw: RawConfig = typed_ref(doc).map_err(|(p, m)| blame(&p, m))?;
        let model = scratch.models.get(combo, doc).map_err(|(p, m)| {
            let mut full = KeyPath::default().key("model");
            full.0.extend(p.0);
            blame(&full, m)
        })?;
        let mut config = RunConfig {
            experiment: self.experiment.name.clone(),
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
            training: raw.training,
        };
        let name = match filled {
            None => axes::from_labels(combo, Some(doc), &self.experiment.name),
            Some(Ok(name)) => name,
            Some(Err(key)) => {
                let family = config.model.family();
                return Err(src.error_in_file(
                    &KeyPath::default().key("sweep").key("name"),
                    format!(
                        "the name template uses `{{{key}}}`, which config {} (a {family}) does not set; use keys every config sets",
                        axes::from_labels(combo, None, &self.experiment.name)
                    ),
                ));
            }
        };
        config.name = name.clone();
        let invalid = facts::validate::validate(&config);
        Ok(Combination::Config(Box::new(Expanded { hash: config.hash(), config, name, invalid })))
    }

    /// Where the value at `path` of `combo`'s document came from: the most
    /// recent override covering it (the command line's, then the sweep's).
    fn origin(&self, combo: &[&Choice], path: &KeyPath) -> Option<(KeyPath, Origin)> {
        let sets = combo.iter().flat_map(|c| c.sets.iter().map(|(k, _, o)| (k, o)));
        let cli = self.cli_origins.iter().map(|(k, o)| (k, o));
        let all: Vec<(&KeyPath, &Origin)> = sets.chain(cli).collect();
        all.into_iter().rev().find(|(k, _)| path.starts_with(k)).map(|(k, o)| (k.clone(), o.clone()))
    }

    /// The name the file gives a combination (before the command line's overrides).
    fn as_written(&self, combo: &[&Choice], name: &str) -> String {
        match &self.axes.name_template {
            // The template on the file's own values, before the overrides.
            Some(t) => {
                let mut file_doc = self.src.doc.clone();
                for (key, value, _) in combo.iter().flat_map(|c| &c.sets) {
                    let _ = overrides_set(&mut file_doc, key, value.clone());
                }
                t.fill(&file_doc).unwrap_or_else(|_| name.to_string())
            }
            None => axes::from_labels(combo, None, &self.experiment.name),
        }
    }
}

/// The configs: each computation once, names unique.
#[derive(Default)]
struct Configs {
    configs: Vec<SweepConfig>,
    /// (name as written, name of the kept twin) of each config planned already.
    collapsed: Vec<(String, String)>,
}

/// What the file's order makes of one combination that gives a config.
enum Fate {
    /// A config of its own.
    Kept,
    /// The same computation as the config at this index of the kept ones.
    Twin(usize),
    /// Another computation has its name already: the sweep is refused.
    NameTaken,
    /// Excluded, or failed: the combination says so itself.
    NoConfig,
}

impl Configs {
    /// The configs of the combinations `ones` in order, up to the first that
    /// fails; two different computations under one name are refused (a silent
    /// rename would leave the user guessing which is which). Marks the
    /// `exclude:` rules that dropped a combination in `rule_used`.
    fn decide(
        x: &Expander,
        combos: &[&[&Choice]],
        ones: Vec<Result<Combination, LoadError>>,
        rule_used: &mut [bool],
    ) -> Result<Configs, LoadError> {
        let fates = fates(&ones);
        let mut out = Configs::default();
        out.configs.reserve(fates.iter().filter(|f| matches!(f, Fate::Kept)).count());
        for ((combo, one), fate) in combos.iter().zip(ones).zip(fates) {
            let one = match one? {
                Combination::Excluded { rule } => {
                    rule_used[rule] = true;
                    continue;
                }
                Combination::Config(one) => *one,
            };
            match fate {
                // The name the file gives it, so the reader recognises it.
                Fate::Twin(kept) => {
                    out.collapsed.push((x.as_written(combo, &one.name), out.configs[kept].name.clone()))
                }
                Fate::Kept => {
                    let Expanded { config, hash, name, invalid } = one;
                    out.configs.push(SweepConfig { name, hash, config, invalid })
                }
                Fate::NameTaken | Fate::NoConfig => return Err(name_taken(x, &one.name)),
            }
        }
        Ok(out)
    }
}

/// Each combination's fate, in order, up to the first that fails or takes a
/// name already taken.
fn fates(ones: &[Result<Combination, LoadError>]) -> Vec<Fate> {
    let mut fates = Vec::with_capacity(ones.len());
    // Hash → index among the kept configs.
    let mut by_hash: HashMap<&ConfigHash, usize> = HashMap::with_capacity(ones.len());
    let mut names: HashSet<&str> = HashSet::with_capacity(ones.len());
    for one in ones {
        let fate = match one {
            Err(_) | Ok(Combination::Excluded { .. }) => Fate::NoConfig,
            Ok(Combination::Config(one)) => match by_hash.get(&one.hash) {
                Some(&kept) => Fate::Twin(kept),
                None if !names.insert(&one.name) => Fate::NameTaken,
                None => {
                    by_hash.insert(&one.hash, by_hash.len());
                    Fate::Kept
                }
            },
        };
        let stop = one.is_err() || matches!(fate, Fate::NameTaken);
        fates.push(fate);
        if stop {
            break;
        }
    }
    fates
}

fn name_taken(x: &Expander, name: &str) -> LoadError {
    x.src.error_in_file(
        &KeyPath::default().key("sweep"),
        format!(
            "two different configs are both named `{name}`; name them apart (each `name:` under \
             `configs:`, or a `sweep.name` template with the keys that differ)"
        ),
    )
}
