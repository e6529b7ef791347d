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

use serde_yaml::{Mapping, Value};
use spec::run::ConfigHash;
use spec::{Invalid, RunConfig};
use std::collections::HashSet;
use std::path::{Path, PathBuf};

use crate::experiment::locate::{KeyPath, Seg};
use crate::experiment::{
    model_from_value, show, typed, Experiment, LoadError, Origin, Override, RawExperiment, Source,
    PER_CONFIG_KEYS,
};

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
}

impl Sweep {
    pub fn get(&self, name: &str) -> Option<&SweepConfig> {
        self.configs.iter().find(|c| c.name == name)
    }

    /// The precheck for this experiment's runtime, at its configs' precision
    /// (coefficients fall back across precisions: the walk counts element sizes).
    pub fn predictor(&self) -> Result<crate::precheck::Predictor, crate::precheck::PrecheckError> {
        let precision = self.configs.first().map(|c| c.config.precision).unwrap_or(spec::Precision::Bf16Amp);
        crate::precheck::Predictor::builtin(&self.experiment.runtime, precision)
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

/// One axis value: an optional label and the overrides it applies.
#[derive(Clone)]
struct Choice {
    label: Option<String>,
    sets: Vec<(KeyPath, Value, Origin)>,
}

fn expand(src: Source, overrides: &[String]) -> Result<Sweep, LoadError> {
    let cli: Vec<Override> = overrides.iter().map(|s| s.parse()).collect::<Result<_, _>>()?;
    let mut base = src.doc.clone();
    for o in &cli {
        crate::experiment::overrides_set(&mut base, &o.key, o.value.clone())
            .map_err(|message| LoadError::Override { arg: o.arg.clone(), message })?;
    }
    let cli_origins: Vec<(KeyPath, Origin)> =
        cli.iter().map(|o| (o.key.clone(), Origin::Cli(o.arg.clone()))).collect();

    // The whole file once, for errors outside the per-config fields.
    let raw: RawExperiment = typed(base.clone()).map_err(|(p, m)| {
        let origin = cli_origins.iter().find(|(k, _)| p.starts_with(k));
        src.error_at(&p, origin, m)
    })?;
    let experiment = raw.experiment();
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

    let mut configs = Vec::new();
    let mut seen_hashes = HashSet::new();
    let mut seen_names = HashSet::new();
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
        if !seen_hashes.insert(hash.clone()) {
            tracing::warn!(config = %hash, "sweep produces the same config twice; keeping the first");
            continue;
        }
        let mut name = axes.name(&combo, &doc, &experiment.name);
        if !seen_names.insert(name.clone()) {
            name = format!("{name}-{}", &hash.0[..6]);
            seen_names.insert(name.clone());
        }
        config.name = name.clone();
        let invalid = spec::validate::validate(&config);
        configs.push(SweepConfig { name, hash, config, invalid });
    }
    Ok(Sweep { experiment, source: src.file.clone(), configs })
}

/// The parsed `sweep:` block.
#[derive(Default)]
struct Axes {
    name_template: Option<String>,
    /// Named configs (each one choice), or empty for the base alone.
    configs: Vec<Choice>,
    /// One list of choices per grid key.
    grid: Vec<Vec<Choice>>,
    /// Lockstep choices (already zipped).
    zip: Vec<Choice>,
    exclude: Vec<Vec<(KeyPath, Value)>>,
}

impl Axes {
    fn parse(src: &Source, v: &Value, at: &KeyPath) -> Result<Self, LoadError> {
        let err = |p: &KeyPath, m: String| src.error_in_file(p, m);
        let Some(map) = v.as_mapping() else {
            return Err(err(at, "expected a mapping with configs, grid, zip, exclude or name".into()));
        };
        let mut axes = Axes::default();
        for (k, v) in map {
            let key = k.as_str().unwrap_or_default();
            let here = at.clone().key(key);
            match key {
                "name" => {
                    let s = v.as_str().ok_or_else(|| err(&here, "expected a string such as \"{model.variant}_p{model.patch}\"".into()))?;
                    axes.name_template = Some(s.to_string());
                }
                "configs" => {
                    let list = v.as_sequence().ok_or_else(|| err(&here, "expected a list of named configs".into()))?;
                    for (i, item) in list.iter().enumerate() {
                        axes.configs.push(named_config(src, item, &here.clone().index(i))?);
                    }
                }
                "grid" => {
                    let m = v.as_mapping().ok_or_else(|| err(&here, "expected a mapping of dotted keys to value lists".into()))?;
                    for (k, values) in m {
                        let (key, kp) = sweep_key(src, k, &here)?;
                        axes.grid.push(axis_choices(src, &key, values, &kp)?);
                    }
                }
                "zip" => {
                    let m = v.as_mapping().ok_or_else(|| err(&here, "expected a mapping of dotted keys to equal-length lists".into()))?;
                    let mut columns: Vec<(KeyPath, Vec<Choice>)> = Vec::new();
                    for (k, values) in m {
                        let (key, kp) = sweep_key(src, k, &here)?;
                        columns.push((kp.clone(), axis_choices(src, &key, values, &kp)?));
                    }
                    if let Some((first_at, first)) = columns.first() {
                        for (kp, col) in &columns {
                            if col.len() != first.len() {
                                return Err(err(kp, format!("zip lists must have equal length: {} has {}, {} has {}", kp, col.len(), first_at, first.len())));
                            }
                        }
                        for i in 0..first.len() {
                            let mut choice = Choice { label: None, sets: Vec::new() };
                            let mut labels = Vec::new();
                            for (_, col) in &columns {
                                labels.extend(col[i].label.clone());
                                choice.sets.extend(col[i].sets.iter().cloned());
                            }
                            choice.label = Some(labels.join("_"));
                            axes.zip.push(choice);
                        }
                    }
                }
                "exclude" => {
                    let list = v.as_sequence().ok_or_else(|| err(&here, "expected a list of {dotted.key: value} mappings".into()))?;
                    for (i, item) in list.iter().enumerate() {
                        let m = item.as_mapping().ok_or_else(|| err(&here.clone().index(i), "expected a mapping of dotted keys to values".into()))?;
                        let mut rule = Vec::new();
                        for (k, v) in m {
                            let (_, kp) = sweep_key(src, k, &here.clone().index(i))?;
                            rule.push((kp, v.clone()));
                        }
                        axes.exclude.push(rule);
                    }
                }
                other => return Err(err(&here, format!("unknown sweep key `{other}`, expected one of `name`, `configs`, `grid`, `zip`, `exclude`"))),
            }
        }
        Ok(axes)
    }

    /// Every combination of named config x grid values x zip row.
    fn combinations(&self) -> Vec<Vec<Choice>> {
        let mut out: Vec<Vec<Choice>> = vec![Vec::new()];
        let mut product = |choices: &[Choice]| {
            if choices.is_empty() {
                return;
            }
            out = out
                .iter()
                .flat_map(|prefix| choices.iter().map(move |c| {
                    let mut v = prefix.clone();
                    v.push(c.clone());
                    v
                }))
                .collect();
        };
        product(&self.configs);
        for axis in &self.grid {
            product(axis);
        }
        product(&self.zip);
        out
    }

    fn excluded(&self, doc: &Value) -> bool {
        self.exclude.iter().any(|rule| {
            rule.iter().all(|(k, v)| crate::experiment::overrides_get(doc, k).is_some_and(|x| x == v))
        })
    }

    /// The template filled in, or the labels joined, or the experiment's name.
    fn name(&self, combo: &[Choice], doc: &Value, experiment: &str) -> String {
        let raw = match &self.name_template {
            Some(t) => fill_template(t, doc),
            None => {
                let labels: Vec<&str> = combo.iter().filter_map(|c| c.label.as_deref()).filter(|l| !l.is_empty()).collect();
                if labels.is_empty() { experiment.to_string() } else { labels.join("_") }
            }
        };
        sanitize(&raw)
    }
}

fn named_config(src: &Source, item: &Value, at: &KeyPath) -> Result<Choice, LoadError> {
    let m = item.as_mapping().ok_or_else(|| src.error_in_file(at, "expected a mapping with `name` and dotted keys".into()))?;
    let name = m
        .get("name")
        .and_then(Value::as_str)
        .ok_or_else(|| src.error_in_file(at, "named config needs `name: <string>`".into()))?;
    let mut sets = Vec::new();
    for (k, v) in m {
        if k.as_str() == Some("name") {
            continue;
        }
        let (_, kp) = sweep_key(src, k, at)?;
        let key_at = at.clone().key(k.as_str().unwrap_or_default());
        sets.push((kp, v.clone(), Origin::File(key_at)));
    }
    Ok(Choice { label: Some(name.to_string()), sets })
}

/// A sweep key: a dotted path into a per-config field.
fn sweep_key(src: &Source, k: &Value, at: &KeyPath) -> Result<(String, KeyPath), LoadError> {
    let key = k.as_str().ok_or_else(|| src.error_in_file(at, format!("sweep key {} must be a string", show(k))))?;
    let kp = KeyPath::from_dotted(key);
    let first = key.split('.').next().unwrap_or_default();
    if !PER_CONFIG_KEYS.contains(&first) {
        return Err(src.error_in_file(
            &at.clone().key(key),
            format!("`{key}` cannot vary per config (one job array shares it); sweepable: {}", PER_CONFIG_KEYS.join(", ")),
        ));
    }
    Ok((key.to_string(), kp))
}

/// The values of one axis: a list, or a mapping of label → value.
fn axis_choices(src: &Source, key: &str, values: &Value, kp: &KeyPath) -> Result<Vec<Choice>, LoadError> {
    let at = |sweep_at: KeyPath| Origin::File(sweep_at);
    let base = src_axis_path(src, key);
    match values {
        Value::Sequence(list) => Ok(list
            .iter()
            .enumerate()
            .map(|(i, v)| Choice {
                label: Some(auto_label(key, v)),
                sets: vec![(kp.clone(), v.clone(), at(base.clone().index(i)))],
            })
            .collect()),
        Value::Mapping(m) => Ok(m
            .iter()
            .map(|(label, v)| {
                let label = label.as_str().map(str::to_string).unwrap_or_else(|| show(label));
                Choice { label: Some(label.clone()), sets: vec![(kp.clone(), v.clone(), at(base.clone().key(label)))] }
            })
            .collect()),
        _ => Err(src.error_in_file(&base, format!("expected a list of values (or label: value mapping) for `{key}`"))),
    }
}

/// Where a grid/zip axis sits in the file (found by key, under `sweep.grid` or `sweep.zip`).
fn src_axis_path(src: &Source, key: &str) -> KeyPath {
    let grid = KeyPath::default().key("sweep").key("grid").key(key);
    if src.loc.find(&grid) != src.loc.find(&KeyPath::default().key("sweep").key("grid")) {
        grid
    } else {
        KeyPath::default().key("sweep").key("zip").key(key)
    }
}

/// `patch2`, `S`, `32-64-128`, `no-grad_ckpt`: short, readable, filesystem-safe.
fn auto_label(key: &str, v: &Value) -> String {
    let last = key.rsplit('.').next().unwrap_or(key);
    match v {
        Value::Number(n) => format!("{last}{n}"),
        Value::Bool(true) => last.to_string(),
        Value::Bool(false) => format!("no-{last}"),
        _ => render(key, v),
    }
}

/// A value as it appears in names: lists joined by `-`, spatial shapes as HxWxD.
fn render(key: &str, v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        Value::Bool(b) => b.to_string(),
        Value::Sequence(items) if key.ends_with("spatial") && items.len() == 3 => {
            format!("{}x{}x{}", show(&items[1]), show(&items[2]), show(&items[0]))
        }
        Value::Sequence(items) => items.iter().map(|x| render("", x)).collect::<Vec<_>>().join("-"),
        Value::Mapping(m) if key.ends_with("spatial") => {
            let g = |k: &str| m.get(k).map(show).unwrap_or_default();
            format!("{}x{}x{}", g("h"), g("w"), g("d"))
        }
        other => show(other),
    }
}

fn fill_template(t: &str, doc: &Value) -> String {
    let mut out = String::new();
    let mut rest = t;
    while let Some(start) = rest.find('{') {
        out.push_str(&rest[..start]);
        let Some(end) = rest[start..].find('}') else { break };
        let key = &rest[start + 1..start + end];
        let v = crate::experiment::overrides_get(doc, &KeyPath::from_dotted(key));
        out.push_str(&v.map(|v| render(key, v)).unwrap_or_else(|| "none".into()));
        rest = &rest[start + end + 1..];
    }
    out.push_str(rest);
    out
}

/// Names become folder names in the state directory.
fn sanitize(s: &str) -> String {
    s.chars().map(|c| if c.is_ascii_alphanumeric() || "._-".contains(c) { c } else { '_' }).collect()
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
mod tests {
    use super::*;

    const BASE: &str = "\
name: t
gpu: A100-SXM4-80GB
input:
  channels: 8
  spatial: [40, 64, 64]
output_channels: 4
model:
  family: unet
  channels: [32, 64, 128, 256]
  attention_levels: [false, false, true, true]
  num_head_channels: 32
";

    fn plan(text: &str, overrides: &[&str]) -> Result<Sweep, String> {
        let o: Vec<String> = overrides.iter().map(|s| s.to_string()).collect();
        parse(Path::new("exp.yaml"), text, &o).map_err(|e| e.to_string())
    }

    #[test]
    fn base_without_sweep_is_one_config_named_after_the_experiment() {
        let s = plan(BASE, &[]).unwrap();
        assert_eq!(s.configs.len(), 1);
        assert_eq!(s.configs[0].name, "t");
        assert!(s.configs[0].is_valid());
    }

    #[test]
    fn typo_in_a_model_key_names_file_line_column_and_key() {
        let text = BASE.replace("  channels: [32", "  chanels: [32");
        let e = plan(&text, &[]).unwrap_err();
        assert!(e.starts_with("exp.yaml:9:3: model.chanels: unknown field `chanels`"), "{e}");
    }

    #[test]
    fn typo_at_top_level() {
        let e = plan(&format!("{BASE}batchsize: 2\n"), &[]).unwrap_err();
        assert!(e.starts_with("exp.yaml:12:1: batchsize: unknown field `batchsize`"), "{e}");
    }

    #[test]
    fn string_where_a_list_belongs() {
        let text = BASE.replace("[false, false, true, true]", "yes");
        let e = plan(&text, &[]).unwrap_err();
        assert!(e.starts_with("exp.yaml:10:3: model.attention_levels: invalid type: string \"yes\", expected a sequence"), "{e}");
    }

    #[test]
    fn negative_width_points_at_the_list_item() {
        let text = BASE.replace("[32, 64, 128, 256]", "[32, -64, 128, 256]");
        let e = plan(&text, &[]).unwrap_err();
        assert!(e.starts_with("exp.yaml:9:18: model.channels[1]: invalid value: integer `-64`"), "{e}");
    }

    #[test]
    fn missing_model_field() {
        let text = BASE.replace("  num_head_channels: 32\n", "");
        let e = plan(&text, &[]).unwrap_err();
        assert!(e.starts_with("exp.yaml:7:1: model: missing field `num_head_channels`"), "{e}");
    }

    #[test]
    fn unknown_gpu_is_named() {
        let e = plan(&BASE.replace("A100-SXM4-80GB", "A100-80"), &[]).unwrap_err();
        assert!(e.starts_with("exp.yaml:2:1: gpu: unknown variant `A100-80`"), "{e}");
    }

    #[test]
    fn syntax_error_has_a_position() {
        let e = plan("name: [unclosed\n", &[]).unwrap_err();
        assert!(e.starts_with("exp.yaml:"), "{e}");
        assert!(e.contains("(syntax)"), "{e}");
    }

    #[test]
    fn bad_value_in_a_grid_points_at_the_grid_entry() {
        let text = format!("{BASE}sweep:\n  grid:\n    model.channels:\n      - [32, 64, 128, 256]\n      - [32, x, 128, 256]\n");
        let e = plan(&text, &[]).unwrap_err();
        assert!(e.starts_with("exp.yaml:16:14: sweep.grid.\"model.channels\"[1][1]: invalid type: string \"x\""), "{e}");
    }

    #[test]
    fn bad_override_names_the_argument() {
        let e = plan(BASE, &["model.num_res_blocks=many"]).unwrap_err();
        assert!(e.starts_with("command-line override `model.num_res_blocks=many`: model.num_res_blocks:"), "{e}");
    }

    #[test]
    fn overrides_apply_and_win_over_the_sweep() {
        let text = format!("{BASE}sweep:\n  grid:\n    model.num_res_blocks: [1, 2]\n");
        let s = plan(&text, &["model.channels=[64, 128, 256, 512]", "batch=2"]).unwrap();
        assert_eq!(s.configs.len(), 2);
        for c in &s.configs {
            let spec::ModelSpec::Unet(u) = &c.config.model else { panic!() };
            assert_eq!(u.channels, vec![64, 128, 256, 512]);
            assert_eq!(c.config.batch, 2);
        }
        let s = plan(&text, &["model.num_res_blocks=3"]).unwrap();
        // Both grid points collapse to the same config: kept once.
        assert_eq!(s.configs.len(), 1);
    }

    #[test]
    fn grid_zip_configs_and_exclude_compose() {
        let text = "\
name: d
gpu: A100-SXM4-80GB
input: {channels: 1, spatial: [40, 64, 64]}
output_channels: 1
model: {family: dit, variant: S, patch: 2}
sweep:
  grid:
    model.variant: [S, B, L, XL]
    model.patch: [2, 4, 8]
  exclude:
    - {model.variant: XL, model.patch: 2}
";
        let s = plan(text, &[]).unwrap();
        assert_eq!(s.configs.len(), 11);
        assert_eq!(s.configs[0].name, "S_patch2");
        assert!(s.get("XL_patch2").is_none());

        let zipped = text.replace("  exclude:\n    - {model.variant: XL, model.patch: 2}\n", "")
            .replace("  grid:\n    model.variant: [S, B, L, XL]\n    model.patch: [2, 4, 8]\n",
                     "  name: \"{model.variant}-{input.spatial}-p{model.patch}\"\n  zip:\n    model.variant: [S, B]\n    model.patch: [2, 4]\n");
        let s = plan(&zipped, &[]).unwrap();
        let names: Vec<&str> = s.configs.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["S-64x64x40-p2", "B-64x64x40-p4"]);
    }

    #[test]
    fn named_configs_keep_their_names_and_invalid_ones_are_kept_with_reasons() {
        let text = format!(
            "{BASE}sweep:\n  configs:\n    - {{name: 4L_tiny, model.num_res_blocks: 1}}\n  grid:\n    input.spatial: {{lat4x: [40, 64, 64], lat8x: [20, 32, 32]}}\n"
        );
        let s = plan(&text, &[]).unwrap();
        let names: Vec<&str> = s.configs.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["4L_tiny_lat4x", "4L_tiny_lat8x"]);
        assert!(s.configs[0].is_valid());
        assert!(s.configs[1].status().contains("divisible by 2^3 = 8"), "{}", s.configs[1].status());
        assert_ne!(s.configs[0].hash, s.configs[1].hash);
    }

    #[test]
    fn worker_block_parses_sizes_and_names_the_bad_key() {
        let s = plan(&format!("{BASE}worker: {{backend: flex, memory_limit: 512MiB}}\n"), &[]).unwrap();
        assert_eq!(s.experiment.worker.memory_limit, Some(512 << 20));
        assert_eq!(s.experiment.worker.args(), ["--backend", "flex", "--memory-limit", "536870912"]);
        let s = plan(&format!("{BASE}worker:\n  memory_limit: 2000000\n"), &[]).unwrap();
        assert_eq!(s.experiment.worker.memory_limit, Some(2_000_000));
        assert_eq!(plan(BASE, &[]).unwrap().experiment.worker.args(), Vec::<String>::new());
        for (bad, want) in [
            ("worker: {memory_limit: 2 lots}", "worker.memory_limit: invalid size \"2 lots\""),
            ("worker: {memory_limit: 0}", "worker.memory_limit: a memory limit of 0 bytes"),
            ("worker: {backend: cuda}", "worker.backend: unknown variant `cuda`"),
            ("worker: {memry_limit: 1G}", "worker.memry_limit: unknown field `memry_limit`"),
        ] {
            let e = plan(&format!("{BASE}{bad}\n"), &[]).unwrap_err();
            assert!(e.starts_with("exp.yaml:12:") && e.contains(want), "{bad}: {e}");
        }
        for (text, bytes) in [("1.5GiB", 3 << 29), ("64G", 64 << 30), ("1GB", 1_000_000_000), ("100 kib", 102_400)] {
            assert_eq!(crate::experiment::size::parse(text), Ok(bytes), "{text}");
        }
    }

    #[test]
    fn experiment_level_keys_cannot_be_swept() {
        let text = format!("{BASE}sweep:\n  grid:\n    slurm.time: [\"1:00:00\"]\n");
        let e = plan(&text, &[]).unwrap_err();
        assert!(e.contains("`slurm.time` cannot vary per config"), "{e}");
    }

    #[test]
    fn hashes_ignore_names() {
        let a = plan(BASE, &[]).unwrap();
        let b = plan(&BASE.replace("name: t", "name: other"), &[]).unwrap();
        assert_eq!(a.configs[0].hash, b.configs[0].hash);
    }
}
