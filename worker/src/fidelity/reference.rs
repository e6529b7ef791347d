//! The worker beside PyTorch's own run of the same configs.

use std::collections::HashMap;

use anyhow::{Context, Result};
use facts::gpu::Gpu;
use facts::model::Family;
use facts::record::MeasurementRecord;
use facts::run::ConfigHash;

use super::table::{percentile, summary_line};
use super::Row;

/// PyTorch's own run of some of the same configs (a GPU check's
/// `pytorch.jsonl`: the project's reference models, `max_memory_allocated`):
/// its peak by the group's record id, matched by config hash.
#[derive(Debug, Clone, Default)]
pub struct Reference {
    /// The GPU it ran on.
    pub device: String,
    pub peaks_gib: HashMap<String, f64>,
    /// Every config PyTorch ran that the group measured, once each.
    pub configs: Vec<Pair>,
}

/// A config both PyTorch's run and the group's measured.
#[derive(Debug, Clone)]
pub struct Pair {
    /// The first of the group's records of the config.
    pub id: String,
    pub family: Family,
    pub group_gib: f64,
    pub torch_gib: f64,
}

impl Reference {
    /// The reference records' peaks, keyed by the id of the group's record
    /// of the same config (hash: everything but names).
    pub fn matching(group: &[MeasurementRecord], reference: &[MeasurementRecord]) -> Result<Reference> {
        let mut by_hash: HashMap<ConfigHash, &MeasurementRecord> = HashMap::new();
        for r in reference.iter().filter(|r| r.status == facts::record::MeasuredStatus::Ok && r.peak_gb.is_some()) {
            by_hash.insert(r.run_config().with_context(|| format!("reference record {}", r.id))?.hash(), r);
        }
        let mut out = Reference::default();
        let mut paired = std::collections::HashSet::new();
        for g in group {
            let Ok(cfg) = g.run_config() else { continue };
            let hash = cfg.hash();
            if let Some(r) = by_hash.get(&hash) {
                let torch_gib = r.peak_gb.unwrap_or_default();
                out.device.clone_from(&r.gpu);
                out.peaks_gib.insert(g.id.clone(), torch_gib);
                if let Some(group_gib) = g.peak_gb.filter(|_| paired.insert(hash)) {
                    out.configs.push(Pair { id: g.id.clone(), family: g.family, group_gib, torch_gib });
                }
            }
        }
        Ok(out)
    }

    /// The rows PyTorch also ran: the group's figure, PyTorch's, the worker's
    /// as PyTorch counts on the reference's card (its allocator's blocks and
    /// the card's cuBLAS workspaces, [`Row::on_card`]), the worker against
    /// PyTorch and PyTorch against the group; then per family the median and
    /// p90 of both absolute errors; then PyTorch against the group on every
    /// config both measured.
    pub fn markdown(&self, rows: &[Row]) -> String {
        // The worker's allocations as PyTorch counts them, with the cuBLAS
        // workspaces PyTorch allocates on the reference's card.
        let card: Option<Gpu> = self.device.parse().ok();
        let figure = |r: &Row| match card {
            Some(gpu) => r.on_card(gpu),
            None => r.counted_gib(),
        };
        let both: Vec<(&Row, f64, f64)> =
            rows.iter().filter_map(|r| Some((r, *self.peaks_gib.get(&r.id)?, figure(r)?))).collect();
        if both.is_empty() {
            return self.every_config();
        }
        let pct = |x: f64| format!("{:+.1}%", 100.0 * x);
        let mut out = format!(
            "\nAgainst PyTorch's own run of the same configs ({}, the project's reference models), {} configs (GiB):\n\n\
             | config | family | group | PyTorch | {} | worker vs PyTorch | PyTorch vs group |\n\
             |---|---|---|---|---|---|---|\n",
            self.device,
            both.len(),
            if card.is_some() { "worker on this card" } else { "worker as PyTorch counts" },
        );
        for (r, torch, counted) in &both {
            out += &format!(
                "| {} | {} | {:.2} | {torch:.3} | {counted:.3} | {} | {} |\n",
                r.id,
                r.family.name(),
                r.measured_gib,
                pct(counted / torch - 1.0),
                pct(torch / r.measured_gib - 1.0)
            );
        }
        out += "\n| family | runs | worker vs PyTorch: median, p90 abs. | PyTorch vs group: median, p90 abs. |\n|---|---|---|---|\n";
        let mut families: Vec<Family> = both.iter().map(|(r, ..)| r.family).collect();
        families.sort_by_key(|f| f.name());
        families.dedup();
        let line = |name: &str, of: Vec<&(&Row, f64, f64)>| {
            let stats = |f: &dyn Fn(&(&Row, f64, f64)) -> f64| {
                let mut v: Vec<f64> = of.iter().map(|x| f(x).abs()).collect();
                v.sort_by(f64::total_cmp);
                format!("{:.1}%, {:.1}%", 100.0 * percentile(&v, 0.5), 100.0 * percentile(&v, 0.9))
            };
            let worker = stats(&|(_, t, c)| c / t - 1.0);
            let torch = stats(&|(r, t, _)| t / r.measured_gib - 1.0);
            format!("| {name} | {} | {worker} | {torch} |\n", of.len())
        };
        for f in &families {
            out += &line(f.name(), both.iter().filter(|(r, ..)| r.family == *f).collect());
        }
        out + &line("all", both.iter().collect()) + &self.every_config()
    }

    /// PyTorch against the group on every config both measured, whether the
    /// worker ran it or not: a row each, then per family the median and p90
    /// of the absolute error and the median signed error.
    fn every_config(&self) -> String {
        if self.configs.is_empty() {
            return String::new();
        }
        let mut out = format!(
            "\nPyTorch's own run ({}) against the group, every config both measured, {} configs (GiB):\n\n\
             | config | family | group | PyTorch | PyTorch vs group |\n|---|---|---|---|---|\n",
            self.device,
            self.configs.len()
        );
        let error = |p: &Pair| p.torch_gib / p.group_gib - 1.0;
        for p in &self.configs {
            out += &format!(
                "| {} | {} | {:.2} | {:.3} | {:+.1}% |\n",
                p.id,
                p.family.name(),
                p.group_gib,
                p.torch_gib,
                100.0 * error(p)
            );
        }
        out += "\n| family | configs | median abs. | p90 abs. | median signed |\n|---|---|---|---|---|\n";
        let line = |name: &str, of: Vec<&Pair>| summary_line(name, of.into_iter().map(error).collect());
        let mut families: Vec<Family> = self.configs.iter().map(|p| p.family).collect();
        families.sort_by_key(|f| f.name());
        families.dedup();
        for f in families {
            out += &line(f.name(), self.configs.iter().filter(|p| p.family == f).collect()).unwrap_or_default();
        }
        out + &line("all", self.configs.iter().collect()).unwrap_or_default()
    }
}
