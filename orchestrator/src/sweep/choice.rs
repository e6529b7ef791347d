//! One value of a sweep axis (a named config, a grid value, a zip row), the
//! keys a sweep may set, and the axes as `exclude:` rules read them.

use serde_yaml::Value;

use crate::experiment::locate::KeyPath;
use crate::experiment::{show, LoadError, Origin, Source, PER_CONFIG_KEYS};

/// One axis value: an optional label and the overrides it applies.
#[derive(Clone)]
pub(crate) struct Choice {
    pub label: Option<String>,
    pub sets: Vec<(KeyPath, Value, Origin)>,
}

impl Choice {
    /// Whether every value this choice sets is still `doc`'s (no later
    /// override replaced one): only then does its label describe the config.
    pub fn holds_in(&self, doc: &Value) -> bool {
        self.sets.iter().all(|(k, v, _)| crate::experiment::overrides_get(doc, k) == Some(v))
    }
}

/// A sweep key: a dotted path into a per-config field.
pub(super) fn sweep_key(src: &Source, k: &Value, at: &KeyPath) -> Result<(String, KeyPath), LoadError> {
    let key = k.as_str().ok_or_else(|| src.error_in_file(at, format!("sweep key {} must be a string", show(k))))?;
    let kp = KeyPath::from_dotted(key);
    let first = key.split('.').next().unwrap_or_default();
    if !PER_CONFIG_KEYS.contains(&first) {
        return Err(src.error_in_file(
            &at.clone().key(key),
            format!(
                "`{key}` cannot vary per config (one job array shares it); sweepable: {}",
                PER_CONFIG_KEYS.join(", ")
            ),
        ));
    }
    Ok((key.to_string(), kp))
}

/// The axes of a sweep, borrowed: named configs, grid values, zip rows.
#[derive(Clone, Copy)]
pub(crate) struct AxesView<'a> {
    pub configs: &'a [Choice],
    pub grid: &'a [Vec<Choice>],
    pub zip: &'a [Choice],
}

impl<'a> AxesView<'a> {
    /// Every choice of every axis: named configs, grid values, zip rows.
    pub fn all_choices(&self) -> impl Iterator<Item = &'a Choice> + 'a {
        let (configs, grid, zip) = (self.configs, self.grid, self.zip);
        configs.iter().chain(grid.iter().flatten()).chain(zip)
    }

    pub fn named_configs(&self) -> impl Iterator<Item = &'a Choice> + 'a {
        let configs = self.configs;
        configs.iter()
    }

    pub fn is_named_config(&self, c: &Choice) -> bool {
        self.configs.iter().any(|x| std::ptr::eq(x, c))
    }

    pub fn is_grid_choice(&self, c: &Choice) -> bool {
        self.grid.iter().flatten().any(|x| std::ptr::eq(x, c))
    }

    /// The choices of the grid axis of `key` (none where no grid axis sets it).
    pub fn grid_choices_of<'k>(&self, key: &'k KeyPath) -> impl Iterator<Item = &'a Choice> + 'k
    where
        'a: 'k,
    {
        let grid = self.grid;
        grid.iter().filter(move |axis| axis.iter().any(|c| c.sets.iter().any(|(k, _, _)| k == key))).flatten()
    }
}
