//! The `sweep:` block parsed into axes: named configs, grid, zip and
//! exclusions, each value remembering where in the file it was written.

use serde_yaml::Value;

pub(crate) use super::choice::Choice;
use super::choice::{sweep_key, AxesView};
use super::exclude::Exclusion;
use super::name::{auto_label, describe, sanitize_char, Template};
use crate::experiment::locate::KeyPath;
use crate::experiment::{show, LoadError, Origin, Source};

/// The name of one combination: labels joined by `_`, or `fallback` when no
/// choice has one. A label stays only while every value its choice sets is
/// still the config's value in `doc` (the combination's document after the
/// command line's overrides; `None`: as the file writes it). An override that
/// replaced one with another value drops the label, and the choice's values
/// that still hold label it instead; one that set a value to what the choice
/// already had renames nothing.
pub(crate) fn from_labels(combo: &[&Choice], doc: Option<&Value>, fallback: &str) -> String {
    let holds = |k: &KeyPath, v: &Value| doc.is_none_or(|d| crate::experiment::overrides_get(d, k) == Some(v));
    // The labels joined by `_` and sanitized, written as they come.
    let (mut name, mut any) = (String::new(), false);
    let mut push = |label: &str| {
        if std::mem::replace(&mut any, true) {
            name.push('_');
        }
        if label.chars().all(|c| sanitize_char(c) == c) {
            name.push_str(label);
        } else {
            name.extend(label.chars().map(sanitize_char));
        }
    };
    for c in combo {
        let Some(label) = c.label.as_deref().filter(|l| !l.is_empty()) else { continue };
        if c.sets.iter().all(|(k, v, _)| holds(k, v)) {
            push(label);
            continue;
        }
        for (k, v, _) in c.sets.iter().filter(|(k, v, _)| holds(k, v)) {
            push(&describe(&k.to_string(), v));
        }
    }
    if any {
        name
    } else {
        fallback.to_string()
    }
}

/// The parsed `sweep:` block.
#[derive(Default)]
pub(crate) struct Axes {
    pub name_template: Option<Template>,
    /// Named configs (each one choice), or empty for the base alone.
    configs: Vec<Choice>,
    /// One list of choices per grid key.
    grid: Vec<Vec<Choice>>,
    /// Lockstep choices (already zipped).
    zip: Vec<Choice>,
    exclude: Vec<Exclusion>,
}

impl Axes {
    pub fn parse(src: &Source, v: &Value, at: &KeyPath) -> Result<Self, LoadError> {
        let err = |p: &KeyPath, m: String| src.error_in_file(p, m);
        let Some(map) = v.as_mapping() else {
            return Err(err(at, "expected a mapping with configs, grid, zip, exclude or name".into()));
        };
        let mut axes = Axes::default();
        let mut exclude = None;
        for (k, v) in map {
            let key = k.as_str().unwrap_or_default();
            let here = at.clone().key(key);
            match key {
                "name" => {
                    let s = v.as_str().ok_or_else(|| {
                        err(&here, "expected a string such as \"{model.variant}_p{model.patch}\"".into())
                    })?;
                    axes.name_template = Some(Template::parse(s).map_err(|m| err(&here, m))?);
                }
                "configs" => {
                    let list = v.as_sequence().ok_or_else(|| err(&here, "expected a list of named configs".into()))?;
                    if list.is_empty() {
                        return Err(err(
                            &here,
                            "empty list: give at least one named config, or leave `configs` out to run the base config"
                                .into(),
                        ));
                    }
                    for (i, item) in list.iter().enumerate() {
                        axes.configs.push(named_config(src, item, &here.clone().index(i))?);
                    }
                }
                "grid" => {
                    let m = v
                        .as_mapping()
                        .ok_or_else(|| err(&here, "expected a mapping of dotted keys to value lists".into()))?;
                    for (k, values) in m {
                        let (key, kp) = sweep_key(src, k, &here)?;
                        axes.grid.push(axis_choices(src, &key, values, &kp)?);
                    }
                }
                "zip" => axes.zip = zip_rows(src, v, &here)?,
                // Read last: a rule may name the labels of any axis.
                "exclude" => exclude = Some((v, here)),
                other => {
                    return Err(err(
                        &here,
                        format!(
                            "unknown sweep key `{other}`, expected one of `name`, `configs`, `grid`, `zip`, `exclude`"
                        ),
                    ))
                }
            }
        }
        if let Some((v, here)) = exclude {
            axes.exclude = super::exclude::parse(src, v, &here, &axes.view())?;
        }
        Ok(axes)
    }

    /// The axes in product order: named configs, each grid key, the zip; empty ones left out.
    pub(super) fn in_product_order(&self) -> Vec<&[Choice]> {
        let all = std::iter::once(self.configs.as_slice()).chain(self.grid.iter().map(Vec::as_slice));
        all.chain(std::iter::once(self.zip.as_slice())).filter(|a| !a.is_empty()).collect()
    }

    /// Every combination of named config x grid values x zip row, one choice
    /// per axis, the last axis fastest (an
    /// odometer over the axes: no list of all combinations is built).
    pub fn combinations(&self) -> impl Iterator<Item = Vec<&Choice>> + '_ {
        let axes = self.in_product_order();
        let mut at = vec![0usize; axes.len()];
        let mut done = false;
        std::iter::from_fn(move || {
            if done {
                return None;
            }
            let combo: Vec<&Choice> = axes.iter().zip(&at).map(|(a, &i)| &a[i]).collect();
            // Advance: the last axis fastest; done once the first wraps.
            done = true;
            for k in (0..axes.len()).rev() {
                at[k] += 1;
                if at[k] < axes[k].len() {
                    done = false;
                    break;
                }
                at[k] = 0;
            }
            Some(combo)
        })
    }

    /// The first `exclude:` rule that drops combination `combo`, whose
    /// document (after every override) is `doc`, by index.
    pub fn excluded_by(&self, combo: &[&Choice], doc: &Value) -> Option<usize> {
        self.exclude.iter().position(|rule| rule.drops(&self.view(), combo, doc))
    }

    pub fn exclusions(&self) -> &[Exclusion] {
        &self.exclude
    }

    /// The axes as `exclude:` rules read them.
    pub fn view(&self) -> AxesView<'_> {
        AxesView { configs: &self.configs, grid: &self.grid, zip: &self.zip }
    }
}

/// The `zip:` block: equal-length lists advanced in lockstep, one choice per
/// row (its label the columns' labels joined by `_`).
fn zip_rows(src: &Source, v: &Value, here: &KeyPath) -> Result<Vec<Choice>, LoadError> {
    let err = |p: &KeyPath, m: String| src.error_in_file(p, m);
    let mut rows = Vec::new();
    let m =
        v.as_mapping().ok_or_else(|| err(here, "expected a mapping of dotted keys to equal-length lists".into()))?;
    let mut columns: Vec<(KeyPath, Vec<Choice>)> = Vec::new();
    for (k, values) in m {
        let (key, kp) = sweep_key(src, k, here)?;
        columns.push((here.clone().key(key.as_str()), axis_choices(src, &key, values, &kp)?));
    }
    if let Some((first_at, first)) = columns.first() {
        for (kp, col) in &columns {
            if col.len() != first.len() {
                return Err(err(
                    kp,
                    format!(
                        "zip lists must have equal length: {} has {}, {} has {}",
                        kp,
                        col.len(),
                        first_at,
                        first.len()
                    ),
                ));
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
            rows.push(choice);
        }
    }
    Ok(rows)
}

fn named_config(src: &Source, item: &Value, at: &KeyPath) -> Result<Choice, LoadError> {
    let m = item
        .as_mapping()
        .ok_or_else(|| src.error_in_file(at, "expected a mapping with `name` and dotted keys".into()))?;
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

/// The values of one axis: a list, or a mapping of label → value.
fn axis_choices(src: &Source, key: &str, values: &Value, kp: &KeyPath) -> Result<Vec<Choice>, LoadError> {
    let at = |sweep_at: KeyPath| Origin::File(sweep_at);
    let base = src_axis_path(src, key);
    let empty = match values {
        Value::Sequence(l) => l.is_empty(),
        Value::Mapping(m) => m.is_empty(),
        _ => false,
    };
    if empty {
        return Err(src.error_in_file(
            &base,
            format!("empty list: `{key}` needs at least one value (an axis without values would make no configs)"),
        ));
    }
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
