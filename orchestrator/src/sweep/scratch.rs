//! What neighbouring combinations share, kept by one core for its run of
//! them: the document of every axis but the last few, and each model block
//! typed once. Neighbours differ mostly in the last axis's value, so a
//! combination's document is the kept one with only the keys the last axes
//! (and the command line's per-config overrides) set put back and set anew,
//! not the whole file copied and every value set again.

use facts::model::ModelSpec;
use serde_yaml::Value;
use std::collections::HashMap;

use super::axes::{Axes, Choice};
use crate::experiment::locate::{KeyPath, Seg};
use crate::experiment::{model_from_value, LoadError};

/// Sets a combination's values (`choices`, then the command line's
/// per-config overrides when `cli`) into a document, as expansion does.
pub(super) type Apply<'x> = dyn Fn(&mut Value, &[&Choice], bool) -> Result<(), LoadError> + 'x;

/// Where a combination's axes split into the kept prefix and the rest, and
/// the top-level keys the rest may set.
pub(super) struct Split {
    /// Axes before this index make up the prefix.
    at: usize,
    /// Top-level keys the axes from `at` on, or the command line's per-config
    /// overrides, set: all that can differ from the prefix's document.
    keys: Vec<Value>,
}

impl Split {
    /// The fewest last axes that still give a run of at least two
    /// combinations one prefix; `cli` are the command line's per-config keys.
    pub fn of(axes: &Axes, cli: &[&KeyPath]) -> Split {
        let all = axes.in_product_order();
        let (mut at, mut run) = (all.len(), 1);
        while at > 0 && run < 2 {
            at -= 1;
            run *= all[at].len();
        }
        let sets = all[at..].iter().flat_map(|a| a.iter()).flat_map(|c| c.sets.iter().map(|(k, _, _)| k));
        let mut keys: Vec<Value> = Vec::new();
        for k in sets.chain(cli.iter().copied()) {
            if let Some(Seg::Key(top)) = k.0.first() {
                let top = Value::String(top.clone());
                if !keys.contains(&top) {
                    keys.push(top);
                }
            }
        }
        Split { at, keys }
    }
}

/// One core's documents and typed model blocks.
pub(super) struct Scratch<'a> {
    pub docs: Docs<'a>,
    pub models: Models,
}

impl<'a> Scratch<'a> {
    pub fn new(base: &'a Value, split: &'a Split) -> Self {
        Scratch { docs: Docs { base, split, prefix: None, doc: Value::Null }, models: Models::default() }
    }
}

/// Each combination's document, built from the one before.
pub(super) struct Docs<'a> {
    base: &'a Value,
    split: &'a Split,
    /// The prefix's choices and its document (nothing of the rest, nor the
    /// command line's overrides), while a combination had it.
    prefix: Option<(Vec<&'a Choice>, Value)>,
    /// The last combination's document.
    doc: Value,
}

/// Each model block typed once, by the choices that set model keys (the
/// rest of its document is the base's and the command line's, the same for all).
#[derive(Default)]
pub(super) struct Models(HashMap<Vec<*const Choice>, Result<ModelSpec, (KeyPath, String)>>);

impl<'a> Docs<'a> {
    /// The document of `combo`: the file with the combination's values and
    /// the command line's per-config overrides set, exactly as setting them
    /// all into a copy of `base` gives it (keys in the same order).
    pub fn doc(&mut self, combo: &[&'a Choice], apply: &Apply) -> Result<&Value, LoadError> {
        let (prefix, rest) = combo.split_at(self.split.at.min(combo.len()));
        let kept = self
            .prefix
            .as_ref()
            .filter(|(p, _)| p.len() == prefix.len() && p.iter().zip(prefix).all(|(a, b)| std::ptr::eq(*a, *b)));
        match kept {
            Some((_, doc)) if restore(&mut self.doc, doc, &self.split.keys) => {}
            Some((_, doc)) => self.doc = doc.clone(),
            None => {
                self.prefix = None;
                let mut doc = self.base.clone();
                apply(&mut doc, prefix, false)?;
                self.doc = doc.clone();
                self.prefix = Some((prefix.to_vec(), doc));
            }
        }
        apply(&mut self.doc, rest, true)?;
        Ok(&self.doc)
    }
}

impl Models {
    /// `model_from_value` of `doc`'s model block, once for each set of choices that set it.
    pub fn get(&mut self, combo: &[&Choice], doc: &Value) -> Result<ModelSpec, (KeyPath, String)> {
        let sets_model =
            |c: &&&Choice| c.sets.iter().any(|(k, _, _)| matches!(k.0.first(), Some(Seg::Key(t)) if t == "model"));
        let key: Vec<*const Choice> = combo.iter().filter(sets_model).map(|c| std::ptr::from_ref(*c)).collect();
        self.0.entry(key).or_insert_with(|| model_from_value(&doc["model"])).clone()
    }
}

/// Puts `keys` of `doc` back as `prefix` has them (removing those it lacks);
/// false where `doc` is not a mapping or lacks a key `prefix` has, which no
/// setting of values leads to (the caller then copies the whole prefix).
fn restore(doc: &mut Value, prefix: &Value, keys: &[Value]) -> bool {
    let (Value::Mapping(doc), Value::Mapping(prefix)) = (doc, prefix) else { return false };
    for k in keys {
        match (doc.get_mut(k), prefix.get(k)) {
            (Some(slot), Some(v)) => slot.clone_from(v),
            (None, Some(_)) => return false,
            // Added by the rest, after the prefix's keys: taken out again.
            (_, None) => {
                doc.shift_remove(k);
            }
        }
    }
    true
}
