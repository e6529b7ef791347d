//! `orchestrator explain`: the predicted peak of one config split into its
//! terms, the phase that sets it, and the three biggest hotspots in words.

use facts::RunConfig;
use serde::Serialize;

use super::{mode_peak_gib, AdvisorError};
use crate::precheck::{gib, PeakPhase, Prediction, Predictor, Term, TermKind, TermPhase, GIB};
use crate::sweep::{Capacity, CapacityOf};
use crate::util::table::{millions, render_table};

/// One line of the breakdown (a precheck term, in GiB and share of its phase).
#[derive(Debug, Clone, Serialize)]
pub struct Line {
    pub name: &'static str,
    pub level: Option<u8>,
    pub kind: TermKind,
    /// Resident in both phases (weights, data, overhead) or in this one only.
    pub phase: TermPhase,
    pub gib: f64,
    /// Share of the phase total (0..1).
    pub share: f64,
}

/// Where the memory goes in one phase.
#[derive(Debug, Clone, Serialize)]
pub struct PhaseBreakdown {
    pub phase: PeakPhase,
    pub total_gib: f64,
    /// Largest first.
    pub lines: Vec<Line>,
}

/// The explanation of one config's predicted peak.
#[derive(Debug, Clone, Serialize)]
pub struct Explanation {
    pub config: String,
    pub summary: String,
    pub input: String,
    pub params: u64,
    pub gpu: String,
    /// What the peak is judged against: the GPU's memory, or this machine's
    /// (a `local` run) or the worker's `memory_limit`.
    pub capacity: Capacity,
    pub peak_gib: f64,
    pub peak_phase: PeakPhase,
    pub train_peak_gib: f64,
    /// The training run phase by phase (`train_peak_gib` is its peak).
    pub training: crate::precheck::training::TrainPrediction,
    /// Whether the config is judged as a training run (`mode: train`): then
    /// the phases are shown in full.
    pub mode: facts::Mode,
    /// ± this fraction (the family's cross-validated p90 error, widened away from the data).
    pub rel_uncertainty: f64,
    /// Why the band is wider than the family's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub band_reason: Option<String>,
    /// The phase that sets the peak, term by term.
    pub peak: PhaseBreakdown,
    /// The other phase, for the stacked-bar comparison.
    pub other: PhaseBreakdown,
    /// Sums of the peak phase by block type (convs+norms, attention scores, skips, ...).
    pub by_kind: Vec<(String, f64)>,
    /// Sums of the peak phase's per-level terms by level.
    pub by_level: Vec<(u8, f64)>,
    /// "attention scores at level 2: 8.1 GiB, 41%".
    pub hotspots: Vec<String>,
}

/// A GiB table cell: two decimals, more below 0.1 GiB (never `0.00`).
fn cell(g: f64) -> String {
    if g >= 0.1 || g == 0.0 {
        format!("{g:.2}")
    } else {
        crate::precheck::memory(g).trim_end_matches('G').to_string()
    }
}

fn phase_terms(pred: &Prediction, phase: PeakPhase) -> impl Iterator<Item = &Term> {
    pred.terms.iter().filter(move |t| {
        matches!(
            (t.phase, phase),
            (TermPhase::Both, _) | (TermPhase::FwdBwd, PeakPhase::FwdBwd) | (TermPhase::Step, PeakPhase::Step)
        )
    })
}

fn breakdown(pred: &Prediction, phase: PeakPhase) -> PhaseBreakdown {
    let total: f64 = phase_terms(pred, phase).map(|t| t.bytes).sum();
    let mut lines: Vec<Line> = phase_terms(pred, phase)
        .filter(|t| t.bytes > 0.0)
        .map(|t| Line {
            name: t.name,
            level: t.level,
            kind: t.kind,
            phase: t.phase,
            gib: t.bytes / GIB,
            share: t.bytes / total.max(1.0),
        })
        .collect();
    lines.sort_by(|a, b| b.gib.total_cmp(&a.gib));
    PhaseBreakdown { phase, total_gib: total / GIB, lines }
}

/// A term in words: `attention scores at level 2`, `resblocks (norms, convs) at level 0`.
pub fn describe(name: &str, level: Option<u8>) -> String {
    match level {
        Some(l) => format!("{name} at level {l}"),
        None => name.to_string(),
    }
}

/// Explain `cfg`'s predicted peak.
pub fn explain(predictor: &Predictor, cfg: &RunConfig, capacity: Capacity) -> Result<Explanation, AdvisorError> {
    let pred = predictor.predict(cfg)?;
    Ok(from_prediction(cfg, &pred, capacity))
}

/// The explanation of an existing prediction (with its terms).
pub fn from_prediction(cfg: &RunConfig, pred: &Prediction, capacity: Capacity) -> Explanation {
    let other_phase = match pred.peak_phase {
        PeakPhase::FwdBwd => PeakPhase::Step,
        PeakPhase::Step => PeakPhase::FwdBwd,
    };
    let peak = breakdown(pred, pred.peak_phase);
    let mut by_kind: Vec<(String, f64)> = Vec::new();
    let mut by_level: Vec<(u8, f64)> = Vec::new();
    for l in &peak.lines {
        // Activations are split by block type (their term name); other kinds by kind.
        let key = if l.kind == TermKind::Activations { l.name.to_string() } else { l.kind.name().to_string() };
        match by_kind.iter_mut().find(|(k, _)| *k == key) {
            Some((_, g)) => *g += l.gib,
            None => by_kind.push((key, l.gib)),
        }
        if let Some(lv) = l.level {
            match by_level.iter_mut().find(|(k, _)| *k == lv) {
                Some((_, g)) => *g += l.gib,
                None => by_level.push((lv, l.gib)),
            }
        }
    }
    by_kind.sort_by(|a, b| b.1.total_cmp(&a.1));
    by_level.sort_by_key(|(l, _)| *l);
    let total = pred.peak_bytes.max(1.0);
    let hotspots = pred
        .hotspots(3)
        .iter()
        .map(|t| format!("{}: {}, {:.0}%", describe(t.name, t.level), gib(t.bytes / GIB), 100.0 * t.bytes / total))
        .collect();
    Explanation {
        config: cfg.name.clone(),
        summary: cfg.model.summary(),
        input: super::input_label(cfg),
        params: pred.params,
        gpu: cfg.gpu.name().to_string(),
        capacity,
        peak_gib: pred.peak_bytes / GIB,
        peak_phase: pred.peak_phase,
        train_peak_gib: mode_peak_gib(pred, facts::Mode::Train),
        training: pred.train.clone(),
        mode: cfg.mode,
        rel_uncertainty: pred.rel_uncertainty,
        band_reason: pred.distance.as_ref().map(|d| d.to_string()),
        peak,
        other: breakdown(pred, other_phase),
        by_kind,
        by_level,
        hotspots,
    }
}

/// "on A100-40GB (39.4 GiB)", "on this machine's CPU (23.5 GiB of memory)".
fn where_judged(e: &Explanation) -> String {
    match e.capacity.of {
        CapacityOf::Gpu(g) => format!("on {g} ({})", gib(e.capacity.gib)),
        CapacityOf::ThisMachine => format!("on this machine's CPU ({} of memory)", gib(e.capacity.gib)),
        CapacityOf::WorkerLimit => format!("on {} held to the worker's memory_limit ({})", e.gpu, gib(e.capacity.gib)),
    }
}

fn phase_words(p: PeakPhase) -> &'static str {
    match p {
        PeakPhase::FwdBwd => "forward/backward (activations held for backward)",
        PeakPhase::Step => "the optimizer step (weights, gradients, AdamW moments)",
    }
}

/// The explanation as text: header, term table, sums by block type and level, hotspots.
pub fn render(e: &Explanation) -> String {
    let mut out = String::new();
    out.push_str(&format!("{}: {}  input {}  {} params\n", e.config, e.summary, e.input, millions(e.params)));
    out.push_str(&format!(
        "predicted peak {} ({}){} {}, set by {}; the other phase peaks at {}; {}\n\n",
        gib(e.peak_gib),
        crate::precheck::interval(e.peak_gib, e.rel_uncertainty),
        e.band_reason.as_ref().map(|r| format!(" ({r})")).unwrap_or_default(),
        where_judged(e),
        phase_words(e.peak_phase),
        gib(e.other.total_gib),
        super::train_phases::headline(&e.training),
    ));
    let mut cells = vec![vec!["Term".to_string(), "Level".into(), "Kind".into(), "GiB".into(), "Share".into()]];
    for l in &e.peak.lines {
        cells.push(vec![
            l.name.to_string(),
            l.level.map(|v| v.to_string()).unwrap_or_else(|| "-".into()),
            l.kind.name().to_string(),
            cell(l.gib),
            format!("{:.1}%", 100.0 * l.share),
        ]);
    }
    cells.push(vec!["total".into(), String::new(), String::new(), cell(e.peak.total_gib), "100%".into()]);
    out.push_str(&render_table(&cells));
    let pct = |g: f64| 100.0 * g / e.peak_gib.max(1e-9);
    let kinds: Vec<String> = e.by_kind.iter().map(|(k, g)| format!("{k} {} ({:.0}%)", gib(*g), pct(*g))).collect();
    out.push_str(&format!("\nby block type: {}\n", kinds.join(", ")));
    if !e.by_level.is_empty() {
        let levels: Vec<String> = e.by_level.iter().map(|(l, g)| format!("L{l} {}", gib(*g))).collect();
        out.push_str(&format!("by level (per-level terms only): {}\n", levels.join(", ")));
    }
    out.push_str("hotspots:\n");
    for (i, h) in e.hotspots.iter().enumerate() {
        out.push_str(&format!("  {}. {h}\n", i + 1));
    }
    if e.mode == facts::Mode::Train {
        out.push_str(&super::train_phases::render(&e.training));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use facts::{Gpu, Input, ModelSpec, PerLevel, Precision, Spatial, UnetSpec};

    fn s2d(attn: [bool; 5]) -> RunConfig {
        RunConfig {
            experiment: "t".into(),
            name: "t".into(),
            model: ModelSpec::Unet(UnetSpec {
                channels: vec![32, 64, 256, 512, 1024],
                attention_levels: attn.to_vec(),
                num_res_blocks: PerLevel::All(2),
                num_head_channels: PerLevel::All(32),
                norm_num_groups: 16,
            }),
            input: Input { channels: 16, spatial: Spatial::new(80, 64, 64) },
            out_channels: 8,
            batch: 1,
            precision: Precision::Bf16Amp,
            grad_ckpt: false,
            mode: facts::Mode::Profile,
            steps: 1,
            gpu: Gpu::H100_80,
            training: None,
        }
    }

    fn cap() -> Capacity {
        Capacity::of_gpu(Gpu::H100_80)
    }

    #[test]
    fn phase_terms_add_up_to_the_peak() {
        let e = explain(&Predictor::pytorch(), &s2d([false, false, true, true, true]), cap()).unwrap();
        assert!((e.peak.total_gib - e.peak_gib).abs() < 1e-6 * e.peak_gib, "{} vs {}", e.peak.total_gib, e.peak_gib);
        assert!(e.other.total_gib <= e.peak_gib + 1e-9);
        let shares: f64 = e.peak.lines.iter().map(|l| l.share).sum();
        assert!((shares - 1.0).abs() < 1e-6);
    }

    #[test]
    fn attention_at_level_2_is_the_named_hotspot() {
        let e = explain(&Predictor::pytorch(), &s2d([false, false, true, true, true]), cap()).unwrap();
        assert!(e.hotspots[0].starts_with("attention scores at level 2:"), "{:?}", e.hotspots);
        assert!(e.hotspots[0].contains("GiB") && e.hotspots[0].ends_with('%'));
        assert_eq!(e.hotspots.len(), 3);
        let text = render(&e);
        assert!(text.contains("set by forward/backward"), "{text}");
        assert!(text.contains(" on H100-80GB-HBM3 (79.2 GiB), set by"), "{text}");
    }

    #[test]
    fn the_memory_judged_against_is_named() {
        let cfg = s2d([false, false, false, false, false]);
        let here = Capacity { gib: 23.5, of: CapacityOf::ThisMachine };
        let text = render(&explain(&Predictor::pytorch(), &cfg, here).unwrap());
        assert!(text.contains(" on this machine's CPU (23.5 GiB of memory), set by"), "{text}");
        let limited = Capacity { gib: 0.02, of: CapacityOf::WorkerLimit };
        let text = render(&explain(&Predictor::pytorch(), &cfg, limited).unwrap());
        assert!(text.contains(" on H100-80GB-HBM3 held to the worker's memory_limit (0.020 GiB), set by"), "{text}");
    }
}
