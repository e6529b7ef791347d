//! `exclude:` rules: the combinations of the sweep's axes that are dropped.
//!
//! ```yaml
//! exclude:
//!   - {model.variant: XL, model.patch: 2}         # every config with these values
//!   - {input.spatial: lat8x, name: 4L_tiny}       # a grid label, a named config
//!   - lat8x                                       # a config's name or any label
//! ```
//! A rule drops a combination when every part of it matches: a `key: value`
//! pair when the config's value at the key is that value, or, where the value
//! is a label of that key's grid values and not one of its values, when the
//! combination was made with that label's choice; `name: N` when it was made
//! with the named config `N`; a bare string when it was made with any choice
//! of that label (a named config or a grid or zip value). A label matches only
//! while its choice's values still hold: a command-line override that replaced
//! one made it describe nothing, as it drops it from the name.

use serde_yaml::Value;

use super::choice::{sweep_key, AxesView, Choice};
use crate::experiment::locate::KeyPath;
use crate::experiment::{overrides_get, show, LoadError, Source};

/// One `exclude:` rule; `at` is where the file has it.
#[derive(Debug, Clone)]
pub(crate) struct Exclusion {
    pub at: KeyPath,
    pub parts: Vec<Part>,
}

/// One condition of a rule.
#[derive(Debug, Clone)]
pub(crate) enum Part {
    /// The config's value at the key is this value.
    Value(KeyPath, Value),
    /// The combination was made with a choice of this label.
    Label { label: String, of: Scope },
}

/// Which choices a [`Part::Label`] may name.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Scope {
    /// A named config (`name: N`).
    Config,
    /// A value of the grid axis of this key (`input.spatial: lat8x`).
    Key(KeyPath),
    /// Any choice (a bare string).
    Any,
}

impl Exclusion {
    /// Whether the rule drops the combination `combo`, whose document (after
    /// every override) is `doc`; `axes` tells named configs apart.
    pub fn drops(&self, axes: &AxesView, combo: &[&Choice], doc: &Value) -> bool {
        self.parts.iter().all(|p| match p {
            Part::Value(k, v) => overrides_get(doc, k) == Some(v),
            Part::Label { label, of } => {
                combo.iter().any(|c| c.label.as_deref() == Some(label) && in_scope(axes, c, of) && c.holds_in(doc))
            }
        })
    }

    /// Every key the rule's match depends on: its pairs' keys and the keys
    /// its labels' choices set.
    pub fn keys(&self, axes: &AxesView) -> Vec<KeyPath> {
        let mut out = Vec::new();
        for p in &self.parts {
            match p {
                Part::Value(k, _) => out.push(k.clone()),
                Part::Label { label, of } => {
                    let named = axes.all_choices().filter(|c| c.label.as_deref() == Some(label));
                    for c in named.filter(|c| in_scope(axes, c, of)) {
                        out.extend(c.sets.iter().map(|(k, _, _)| k.clone()));
                    }
                }
            }
        }
        out
    }

    /// The `(key, value)` pairs of the rule (its labels left out).
    pub fn values(&self) -> impl Iterator<Item = (&KeyPath, &Value)> {
        self.parts.iter().filter_map(|p| match p {
            Part::Value(k, v) => Some((k, v)),
            Part::Label { .. } => None,
        })
    }
}

fn in_scope(axes: &AxesView, c: &Choice, of: &Scope) -> bool {
    match of {
        Scope::Any => true,
        Scope::Config => axes.is_named_config(c),
        Scope::Key(k) => axes.is_grid_choice(c) && c.sets.iter().any(|(key, _, _)| key == k),
    }
}

/// The `exclude:` block, read once every axis is known (a rule may name their labels).
pub(crate) fn parse(src: &Source, v: &Value, here: &KeyPath, axes: &AxesView) -> Result<Vec<Exclusion>, LoadError> {
    let err = |p: &KeyPath, m: String| src.error_in_file(p, m);
    let list = v.as_sequence().ok_or_else(|| {
        err(here, "expected a list of rules: {dotted.key: value} mappings, or config names and grid labels".into())
    })?;
    let mut rules = Vec::new();
    for (i, item) in list.iter().enumerate() {
        let at = here.clone().index(i);
        let parts = match item {
            Value::String(s) => vec![any_label(src, axes, s, &at)?],
            Value::Mapping(m) => {
                let mut parts = Vec::new();
                for (k, v) in m {
                    parts.push(pair(src, axes, k, v, &at)?);
                }
                parts
            }
            other => {
                return Err(err(
                    &at,
                    format!(
                        "expected a mapping of dotted keys to values, or a config's name or a grid label; got {}",
                        show(other)
                    ),
                ))
            }
        };
        rules.push(Exclusion { at, parts });
    }
    Ok(rules)
}

/// A bare string: a label some choice has, or an error listing those there are.
fn any_label(src: &Source, axes: &AxesView, s: &str, at: &KeyPath) -> Result<Part, LoadError> {
    if axes.all_choices().any(|c| c.label.as_deref() == Some(s)) {
        return Ok(Part::Label { label: s.to_string(), of: Scope::Any });
    }
    let labels: Vec<&str> = axes.all_choices().filter_map(|c| c.label.as_deref()).collect();
    Err(src.error_in_file(
        at,
        format!("`{s}` is neither the name of a config nor a label of a grid or zip value ({})", listed(&labels)),
    ))
}

/// One `key: value` of a mapping rule: `name: N`, a grid label, or a value.
fn pair(src: &Source, axes: &AxesView, k: &Value, v: &Value, at: &KeyPath) -> Result<Part, LoadError> {
    if k.as_str() == Some("name") {
        let names: Vec<&str> = axes.named_configs().filter_map(|c| c.label.as_deref()).collect();
        return match v.as_str() {
            Some(n) if names.contains(&n) => Ok(Part::Label { label: n.to_string(), of: Scope::Config }),
            _ => Err(src.error_in_file(
                &at.clone().key("name"),
                format!("{} is not the name of a config under `configs:` ({})", show(v), listed(&names)),
            )),
        };
    }
    let (_, kp) = sweep_key(src, k, at)?;
    if let Value::String(s) = v {
        let axis: Vec<&Choice> = axes.grid_choices_of(&kp).collect();
        let is_value = axis.iter().any(|c| c.sets.iter().any(|(_, value, _)| value == v));
        if !is_value && axis.iter().any(|c| c.label.as_deref() == Some(s.as_str())) {
            return Ok(Part::Label { label: s.clone(), of: Scope::Key(kp) });
        }
    }
    Ok(Part::Value(kp, v.clone()))
}

/// `names: a, b, c` (the first few, and how many more).
fn listed(labels: &[&str]) -> String {
    const SHOWN: usize = 8;
    if labels.is_empty() {
        return "the sweep has none".into();
    }
    let mut s = labels.iter().take(SHOWN).copied().collect::<Vec<_>>().join(", ");
    if labels.len() > SHOWN {
        s.push_str(&format!(" and {} more", labels.len() - SHOWN));
    }
    format!("there are: {s}")
}
