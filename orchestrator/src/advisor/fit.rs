//! `orchestrator fit`: which configs are predicted to fit a GPU and budget,
//! ranked by parameters per input shape, with the Pareto front of parameters
//! vs predicted peak and the best viable config per variant — the table the
//! group writes after a whole profiling run, before any job is submitted.
//!
//! Candidates are the experiment's sweep, or with a [`SearchSpace`] the
//! family's knobs within bounds around the sweep's base configs.

use facts::model::Family;
use facts::{Gpu, Mode, ModelSpec, PerLevel, RunConfig, Variant};
use serde::Serialize;
use std::collections::HashSet;

use super::{input_label, mode_peak_gib, params_of, AdvisorError};
use crate::precheck::Predictor;
use crate::sweep::{Capacity, CapacityOf, Sweep};
use crate::util::table::{millions, render_table};

/// What "fits" means.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct FitOptions {
    pub gpu: Gpu,
    /// What a config's peak is judged against: the GPU's memory, or this
    /// machine's (a `local` run) or the worker's `memory_limit`.
    pub capacity: Capacity,
    /// The policy budget (the group's 60 GB); `None`: the GPU's capacity alone.
    pub budget_gb: Option<f64>,
    pub mode: Mode,
}

impl FitOptions {
    /// The predicted peak a config may have: the smaller of budget and capacity.
    pub fn limit_gib(&self) -> f64 {
        let cap = self.capacity.gib;
        self.budget_gb.map_or(cap, |b| b.min(cap))
    }
}

/// One config judged against the limit.
#[derive(Debug, Clone, Serialize)]
pub struct Candidate {
    pub name: String,
    pub variant: String,
    pub summary: String,
    pub params: u64,
    pub peak_gib: f64,
    /// Predicted at or under the limit.
    pub fits: bool,
    /// Fits, but the precheck's verdict is `risky` (the capacity or the
    /// budget within its band, or the allocator's fragmentation margin).
    pub risky: bool,
    /// Why the verdict is `risky`, in words.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub risk: Option<String>,
    /// A measurement record of the same config that ran out of memory (where it is).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recorded_oom: Option<String>,
    #[serde(skip)]
    pub config: RunConfig,
}

impl Candidate {
    /// Fits, and neither `risky` nor recorded `oom`: what may be advised as best.
    pub fn viable(&self) -> bool {
        self.fits && !self.risky && self.recorded_oom.is_none()
    }

    /// Why a config that fits is not advised (`risky: ...`, `recorded oom: ...`), if it is not.
    pub fn not_viable_because(&self) -> Option<String> {
        let mut why = Vec::new();
        if let Some(r) = &self.recorded_oom {
            why.push(format!("recorded oom ({r})"));
        }
        if self.risky {
            why.push(format!("risky ({})", self.risk.as_deref().unwrap_or("near the limit")));
        }
        (!why.is_empty()).then(|| why.join("; "))
    }
}

/// The answer for one input shape.
#[derive(Debug, Clone, Serialize)]
pub struct Group {
    pub input: String,
    pub considered: usize,
    pub invalid: usize,
    /// Fitting configs, most parameters first.
    pub fitting: Vec<Candidate>,
    /// Names of the fitting configs on the Pareto front (no other fitting config
    /// has more parameters at a lower or equal peak), lowest peak first.
    pub pareto: Vec<String>,
    /// The largest viable config per variant (UNet: level count;
    /// transformers: variant): fits, not `risky`, not recorded `oom`.
    pub best_per_variant: Vec<Candidate>,
    /// Fitting configs larger than their variant's best that are not
    /// viable ([`Candidate::not_viable_because`]), largest first.
    pub passed_over: Vec<Candidate>,
    /// The smallest config that does not fit, to show how far off the next step is.
    pub smallest_misfit: Option<Candidate>,
}

impl Group {
    pub fn largest(&self) -> Option<&Candidate> {
        self.fitting.first()
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct FitReport {
    pub experiment: String,
    pub options: FitOptions,
    pub limit_gib: f64,
    pub searched: bool,
    pub groups: Vec<Group>,
}

/// Bounds of `--search`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SearchSpace {
    /// UNet widths are the base widths times 2^k for k in this range.
    pub width_pow2: (i32, i32),
    /// UNet res blocks per level (uniform), inclusive range.
    pub res_blocks: (u32, u32),
    /// Attention at the deepest `a` levels for a in 0..=this (the middle block always attends).
    pub max_attention_levels: usize,
    /// Transformer variants (empty: every variant of the family).
    pub variants: Vec<Variant>,
    pub patches: Vec<u32>,
}

impl Default for SearchSpace {
    fn default() -> Self {
        SearchSpace {
            width_pow2: (-2, 4),
            res_blocks: (1, 3),
            max_attention_levels: 2,
            variants: Vec::new(),
            patches: vec![2, 4, 8],
        }
    }
}

/// Whether `family` has a variant `v` (MambaDiff's table sets widths and heads only).
fn has_variant(family: Family, v: Variant) -> bool {
    match family {
        Family::Mamba => v.mamba_sizes().is_some(),
        f => v.dims(f).is_some(),
    }
}

fn variant_key(cfg: &RunConfig) -> String {
    match &cfg.model {
        ModelSpec::Unet(u) => format!("unet {}L", u.levels()),
        m => {
            let v = match m {
                ModelSpec::Dit(x) => x.variant,
                ModelSpec::Hdit(x) => x.variant,
                ModelSpec::Uvit(x) => x.variant,
                ModelSpec::Mamba(x) => x.variant,
                ModelSpec::Unet(_) => None,
            };
            format!("{} {}", m.family(), v.map(|v| v.name().to_string()).unwrap_or_else(|| "custom".into()))
        }
    }
}

/// Where a config's measurement ran out of memory (`file:line`), if a record says so.
pub type RecordedOom<'a> = &'a dyn Fn(&RunConfig) -> Option<String>;

/// Judge named configs against the options and group them by input shape.
pub fn fit(
    predictor: &Predictor,
    experiment: &str,
    configs: &[(String, RunConfig)],
    opts: FitOptions,
    searched: bool,
) -> Result<FitReport, AdvisorError> {
    fit_with_records(predictor, experiment, configs, opts, searched, &|_| None)
}

/// [`fit`], each config looked up in measurement records (`recorded_oom`):
/// one recorded `oom` is never advised as best.
pub fn fit_with_records(
    predictor: &Predictor,
    experiment: &str,
    configs: &[(String, RunConfig)],
    opts: FitOptions,
    searched: bool,
    recorded_oom: RecordedOom,
) -> Result<FitReport, AdvisorError> {
    let limit = opts.limit_gib();
    let mut groups: Vec<(String, Vec<Candidate>, usize, usize)> = Vec::new();
    for (name, cfg) in configs {
        let mut cfg = cfg.clone();
        cfg.gpu = opts.gpu;
        cfg.mode = opts.mode;
        let key = input_label(&cfg);
        let gi = match groups.iter().position(|g| g.0 == key) {
            Some(i) => i,
            None => {
                groups.push((key, Vec::new(), 0, 0));
                groups.len() - 1
            }
        };
        groups[gi].2 += 1;
        if !facts::validate::validate(&cfg).is_empty() {
            groups[gi].3 += 1;
            continue;
        }
        let Some(params) = params_of(&cfg) else {
            groups[gi].3 += 1;
            continue;
        };
        let pred = predictor.predict_peak(&cfg)?;
        let peak = mode_peak_gib(&pred, opts.mode);
        // The precheck's verdict, on the capacity and the budget as `plan` judges them.
        let risk = match predictor.verdict_against(&cfg, &pred, opts.budget_gb, opts.capacity.gib) {
            crate::precheck::Verdict::Risky { reason, .. } if peak <= limit => Some(reason.words().to_string()),
            _ => None,
        };
        // A record measured the profiling peak: its OOM holds for training too.
        let profiled = RunConfig { mode: Mode::Profile, ..cfg.clone() };
        groups[gi].1.push(Candidate {
            name: name.clone(),
            variant: variant_key(&cfg),
            summary: cfg.model.summary(),
            params,
            peak_gib: peak,
            fits: peak <= limit,
            risky: risk.is_some(),
            risk,
            recorded_oom: recorded_oom(&profiled),
            config: cfg,
        });
    }
    let groups = groups
        .into_iter()
        .map(|(input, cands, considered, invalid)| {
            let mut fitting: Vec<Candidate> = cands.iter().filter(|c| c.fits).cloned().collect();
            fitting.sort_by(|a, b| b.params.cmp(&a.params).then(a.peak_gib.total_cmp(&b.peak_gib)));
            let pareto = pareto_front(&fitting);
            let (best_per_variant, passed_over) = best_of_each_variant(&fitting);
            let smallest_misfit = cands.iter().filter(|c| !c.fits).min_by_key(|c| c.params).cloned();
            Group { input, considered, invalid, fitting, pareto, best_per_variant, passed_over, smallest_misfit }
        })
        .collect();
    Ok(FitReport { experiment: experiment.to_string(), options: opts, limit_gib: limit, searched, groups })
}

/// Of `fitting` (largest first), the largest viable config per variant, and
/// the fitting configs passed over for it (larger, but `risky` or recorded `oom`).
fn best_of_each_variant(fitting: &[Candidate]) -> (Vec<Candidate>, Vec<Candidate>) {
    let (mut best, mut passed_over): (Vec<Candidate>, Vec<Candidate>) = (Vec::new(), Vec::new());
    for c in fitting {
        if best.iter().any(|b| b.variant == c.variant) {
            continue;
        }
        match c.viable() {
            true => best.push(c.clone()),
            false => passed_over.push(c.clone()),
        }
    }
    (best, passed_over)
}

/// Names of the configs no other config beats on both parameters (more) and peak (lower or equal).
fn pareto_front(cands: &[Candidate]) -> Vec<String> {
    let mut by_peak: Vec<&Candidate> = cands.iter().collect();
    by_peak.sort_by(|a, b| a.peak_gib.total_cmp(&b.peak_gib).then(b.params.cmp(&a.params)));
    let mut best = 0u64;
    let mut out = Vec::new();
    for c in by_peak {
        if c.params > best {
            best = c.params;
            out.push(c.name.clone());
        }
    }
    out
}

/// The sweep's own configs.
pub fn sweep_configs(sweep: &Sweep) -> Vec<(String, RunConfig)> {
    sweep.configs.iter().map(|c| (c.name.clone(), c.config.clone())).collect()
}

/// Configs of the search space around the sweep's bases: one base per input
/// shape, family and UNet level count (the first such config of the sweep).
pub fn search_configs(sweep: &Sweep, space: &SearchSpace) -> Vec<(String, RunConfig)> {
    let mut bases: Vec<&RunConfig> = Vec::new();
    let mut seen_base = HashSet::new();
    for c in &sweep.configs {
        let levels = match &c.config.model {
            ModelSpec::Unet(u) => u.levels(),
            _ => 0,
        };
        if seen_base.insert((c.config.input, c.config.model.family(), levels)) {
            bases.push(&c.config);
        }
    }
    let mut out = Vec::new();
    let mut seen = HashSet::new();
    for base in bases {
        let label = {
            let s = base.input.spatial;
            format!("{}x{}x{}", s.h, s.w, s.d)
        };
        for (name, cfg) in around(base, space) {
            if seen.insert(cfg.hash()) {
                let name = format!("{name}@{label}");
                let mut cfg = cfg;
                cfg.name = name.clone();
                out.push((name, cfg));
            }
        }
    }
    out
}

fn around(base: &RunConfig, space: &SearchSpace) -> Vec<(String, RunConfig)> {
    let mut out = Vec::new();
    match &base.model {
        ModelSpec::Unet(u) => {
            let levels = u.levels();
            for k in space.width_pow2.0..=space.width_pow2.1 {
                let widths: Vec<u32> = u
                    .channels
                    .iter()
                    .map(|&c| if k >= 0 { c.saturating_mul(1 << k.min(16)) } else { c >> (-k).min(16) })
                    .collect();
                if widths.contains(&0) {
                    continue;
                }
                for r in space.res_blocks.0..=space.res_blocks.1 {
                    for a in 0..=space.max_attention_levels.min(levels) {
                        let mut m = u.clone();
                        m.channels = widths.clone();
                        m.num_res_blocks = PerLevel::All(r);
                        m.attention_levels = (0..levels).map(|l| l + a >= levels).collect();
                        let attn: String = (0..levels).filter(|l| l + a >= levels).map(|l| l.to_string()).collect();
                        let ws: Vec<String> = widths.iter().map(|w| w.to_string()).collect();
                        let name = format!(
                            "{levels}L_{}_r{r}_{}",
                            ws.join("-"),
                            if attn.is_empty() { "no-attn".to_string() } else { format!("attn-L{attn}") }
                        );
                        let mut c = base.clone();
                        c.model = ModelSpec::Unet(m);
                        out.push((name, c));
                    }
                }
            }
        }
        m => {
            let family = m.family();
            let variants: Vec<Variant> = if space.variants.is_empty() {
                [Variant::S, Variant::SDeep, Variant::M, Variant::B, Variant::L, Variant::XL]
                    .into_iter()
                    .filter(|&v| has_variant(family, v))
                    .collect()
            } else {
                space.variants.iter().copied().filter(|&v| has_variant(family, v)).collect()
            };
            for v in variants {
                for &p in &space.patches {
                    let mut c = base.clone();
                    match &mut c.model {
                        ModelSpec::Dit(x) => {
                            (x.variant, x.hidden, x.heads, x.depth, x.patch) = (Some(v), None, None, None, p);
                        }
                        ModelSpec::Uvit(x) => {
                            (x.variant, x.hidden, x.heads, x.depth, x.patch) = (Some(v), None, None, None, p);
                        }
                        ModelSpec::Hdit(x) => {
                            (x.variant, x.hidden, x.heads, x.patch) = (Some(v), None, None, p);
                        }
                        ModelSpec::Mamba(x) => {
                            (x.variant, x.embed_dim, x.stage_dims, x.num_heads, x.patch_size) =
                                (Some(v), None, None, None, p);
                        }
                        ModelSpec::Unet(_) => {}
                    }
                    let prefix = match family {
                        Family::Dit => "DiT",
                        Family::Uvit => "UViT",
                        Family::Hdit => "HDiT",
                        Family::Unet => "UNet",
                        Family::Mamba => "MambaDiff",
                    };
                    out.push((format!("{prefix}-{}_p{p}", v.name()), c));
                }
            }
        }
    }
    out
}

/// The report as text: per input shape the best config per variant, then every
/// fitting config ranked by parameters with the Pareto front marked.
pub fn render(r: &FitReport, top: usize) -> String {
    let o = &r.options;
    let mut out = format!(
        "{}: {} on {} — limit {:.1} GiB ({}{}), {} peak\n",
        r.experiment,
        if r.searched { "searched configs" } else { "sweep configs" },
        match o.capacity.of {
            CapacityOf::ThisMachine => "this machine's CPU".to_string(),
            _ => o.gpu.to_string(),
        },
        r.limit_gib,
        o.budget_gb.map(|b| format!("budget {b:.1} GiB, ")).unwrap_or_default(),
        o.capacity.label(),
        match o.mode {
            Mode::Profile => "profiling",
            Mode::Train => "training (AdamW + EMA)",
        },
    );
    for g in &r.groups {
        out.push_str(&format!(
            "\n== input {}: {} configs, {} fit, {} invalid, {} over the limit\n",
            g.input,
            g.considered,
            g.fitting.len(),
            g.invalid,
            g.considered - g.invalid - g.fitting.len()
        ));
        match g.largest() {
            Some(c) => out.push_str(&format!(
                "largest fitting: {} ({}, {} predicted, {} headroom{})\n",
                c.name,
                millions(c.params),
                crate::precheck::gib(c.peak_gib),
                crate::precheck::gib(r.limit_gib - c.peak_gib),
                c.not_viable_because().map(|why| format!(", {why}")).unwrap_or_default()
            )),
            None => out.push_str("nothing fits\n"),
        }
        if let Some(m) = &g.smallest_misfit {
            out.push_str(&format!(
                "smallest config over the limit: {} ({}, {})\n",
                m.name,
                millions(m.params),
                crate::precheck::gib(m.peak_gib)
            ));
        }
        if g.fitting.is_empty() {
            continue;
        }
        out.push_str(&tables(r, g, top));
    }
    out
}

/// A group's tables: the best viable config per variant, and the fitting
/// configs by parameters (the first `top`).
fn tables(r: &FitReport, g: &Group, top: usize) -> String {
    let mut out = String::new();
    out.push_str("\nbest viable config per variant:\n");
    let mut cells = vec![vec![
        "Variant".to_string(),
        "Config".into(),
        "Dims".into(),
        "Params".into(),
        "Peak".into(),
        "Headroom".into(),
    ]];
    for c in &g.best_per_variant {
        cells.push(vec![
            c.variant.clone(),
            c.name.clone(),
            c.summary.clone(),
            millions(c.params),
            crate::precheck::memory(c.peak_gib),
            crate::precheck::memory(r.limit_gib - c.peak_gib),
        ]);
    }
    out.push_str(&render_table(&cells));
    if !g.passed_over.is_empty() {
        out.push_str("not advised, though predicted under the limit:\n");
        for c in &g.passed_over {
            let why = c.not_viable_because().unwrap_or_default();
            out.push_str(&format!("  {} ({}, {}): {why}\n", c.name, c.variant, crate::precheck::memory(c.peak_gib)));
        }
    }
    out.push_str(&format!(
        "\nfitting configs by parameters (* = Pareto front of parameters vs peak){}:\n",
        if g.fitting.len() > top { format!(", top {top} of {}", g.fitting.len()) } else { String::new() }
    ));
    let mut cells =
        vec![vec!["#".to_string(), "Config".into(), "Dims".into(), "Params".into(), "Peak".into(), "Pareto".into()]];
    for (i, c) in g.fitting.iter().take(top).enumerate() {
        cells.push(vec![
            (i + 1).to_string(),
            c.name.clone(),
            c.summary.clone(),
            millions(c.params),
            format!("{}{}", crate::precheck::memory(c.peak_gib), mark(c)),
            if g.pareto.contains(&c.name) { "*".into() } else { String::new() },
        ]);
    }
    out.push_str(&render_table(&cells));
    out
}

/// ` (risky)`, ` (recorded oom)`, ` (recorded oom, risky)` or nothing.
fn mark(c: &Candidate) -> String {
    let marks: Vec<&str> = [(c.recorded_oom.is_some(), "recorded oom"), (c.risky, "risky")]
        .into_iter()
        .filter_map(|(on, m)| on.then_some(m))
        .collect();
    if marks.is_empty() {
        String::new()
    } else {
        format!(" ({})", marks.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cand(name: &str, params: u64, peak: f64) -> Candidate {
        let cfg: RunConfig = serde_json::from_value(serde_json::json!({
            "experiment": "t", "name": name,
            "model": {"family": "dit", "variant": "S", "patch": 2},
            "input": {"channels": 1, "spatial": [8, 8, 8]}, "out_channels": 1, "batch": 1,
            "precision": "bf16-amp", "grad_ckpt": false, "gpu": "A100-SXM4-80GB"
        }))
        .unwrap();
        Candidate {
            name: name.into(),
            variant: "v".into(),
            summary: String::new(),
            params,
            peak_gib: peak,
            fits: true,
            risky: false,
            risk: None,
            recorded_oom: None,
            config: cfg,
        }
    }

    #[test]
    fn pareto_drops_dominated() {
        let c = [cand("a", 10, 5.0), cand("b", 20, 4.0), cand("c", 30, 9.0), cand("d", 25, 9.5)];
        assert_eq!(pareto_front(&c), vec!["b", "c"]);
    }

    #[test]
    fn limit_is_the_smaller_of_budget_and_capacity() {
        let o = FitOptions {
            gpu: Gpu::A100Sxm80,
            capacity: Capacity::of_gpu(Gpu::A100Sxm80),
            budget_gb: Some(60.0),
            mode: Mode::Profile,
        };
        assert_eq!(o.limit_gib(), 60.0);
        let o = FitOptions { budget_gb: Some(100.0), ..o };
        assert_eq!(o.limit_gib(), Gpu::A100Sxm80.capacity_gib());
    }
}
