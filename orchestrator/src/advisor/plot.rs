//! The stacked-bar plot of `explain --plot`: one bar per phase (forward/backward,
//! optimizer step), stacked by the terms of the breakdown, with its total above
//! it, the GPU capacity and the memory budget as lines.

use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use std::path::Path;

use super::explain::{describe, Explanation, PhaseBreakdown};
use super::AdvisorError;
use crate::plot::{perr, Figure, PlotError, PALETTE};
use crate::precheck::{memory, TermPhase};

/// Width of the chart; the legend takes the rest on the right.
const CHART_WIDTH: u32 = 700;
/// Terms drawn individually per bar; the rest are stacked as "other".
const MAX_SEGMENTS: usize = 10;
const BUDGET: RGBColor = RGBColor(230, 140, 0);

/// The explanation as a figure, with the budget it is judged against.
pub struct Breakdown<'a> {
    pub explanation: &'a Explanation,
    /// GiB; the experiment's `budget_gb`, or the group's policy.
    pub budget_gib: f64,
    /// Whether the budget is the experiment's own.
    pub budget_set: bool,
}

/// Draw the explanation to `path` (`.svg` or `.png`).
pub fn plot(e: &Explanation, budget_gb: Option<f64>, path: &Path) -> Result<(), AdvisorError> {
    let fig = Breakdown {
        explanation: e,
        budget_gib: budget_gb.unwrap_or(crate::precheck::GROUP_BUDGET_GB),
        budget_set: budget_gb.is_some(),
    };
    let ext = path.extension().and_then(|s| s.to_str()).map(|s| s.to_ascii_lowercase());
    let written = match ext.as_deref() {
        Some("svg") => crate::plot::save_svg(&fig, path),
        Some("png") => crate::plot::save_png(&fig, path),
        _ => {
            return Err(AdvisorError::BadArgument {
                what: "--plot",
                value: path.display().to_string(),
                why: "the file must end in .svg or .png".into(),
            })
        }
    };
    written.map_err(|e| AdvisorError::Plot(e.to_string()))
}

impl Figure for Breakdown<'_> {
    fn size(&self) -> (u32, u32) {
        (1200, 700)
    }
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), PlotError> {
        draw(self, root)
    }
}

/// The stacked segments of one bar, bottom first: the terms resident in both
/// phases (weights, data, overhead: the same base under both bars), then this
/// phase's largest terms, then the rest as "other terms".
fn segments(b: &PhaseBreakdown) -> Vec<(String, f64)> {
    let both = b.lines.iter().filter(|l| l.phase == TermPhase::Both);
    let own = b.lines.iter().filter(|l| l.phase != TermPhase::Both);
    let ordered: Vec<_> = both.chain(own).collect();
    let mut v: Vec<(String, f64)> =
        ordered.iter().take(MAX_SEGMENTS).map(|l| (describe(l.name, l.level), l.gib)).collect();
    let rest: f64 = ordered.iter().skip(MAX_SEGMENTS).map(|l| l.gib).sum();
    if rest > 0.0 {
        v.push(("other terms".into(), rest));
    }
    v
}

/// The stacked bars, each with its total above; the colours they used, by label.
fn draw_bars<DB: DrawingBackend>(
    chart: &mut ChartContext<'_, DB, Cartesian2d<RangedCoordf64, RangedCoordf64>>,
    bars: &[(&str, Vec<(String, f64)>)],
    ymax: f64,
) -> Result<Vec<(String, RGBColor)>, PlotError> {
    let mut legend: Vec<(String, RGBColor)> = Vec::new();
    let above = TextStyle::from(("sans-serif", 16).into_font()).pos(Pos::new(HPos::Center, VPos::Bottom));
    for (i, (_, segs)) in bars.iter().enumerate() {
        let x0 = i as f64 + 0.2;
        let x1 = i as f64 + 0.8;
        let mut y = 0.0;
        for (label, gib) in segs {
            let ci = match legend.iter().position(|(l, _)| l == label) {
                Some(p) => p,
                None => {
                    legend.push((label.clone(), PALETTE[legend.len() % PALETTE.len()]));
                    legend.len() - 1
                }
            };
            let color = legend[ci].1;
            chart
                .draw_series(std::iter::once(Rectangle::new([(x0, y), (x1, y + gib)], color.filled())))
                .map_err(perr)?;
            y += gib;
        }
        // The total centred above its bar, clear of the top segment.
        let label = Text::new(memory(y), (i as f64 + 0.5, y + ymax * 0.012), above.clone());
        chart.draw_series(std::iter::once(label)).map_err(perr)?;
    }
    Ok(legend)
}

/// The legend, bottom-up stacking order listed top-down, with each term's
/// size; where it ends (the next line's top).
fn draw_legend<DB: DrawingBackend>(
    right: &DrawingArea<DB, Shift>,
    e: &Explanation,
    legend: &[(String, RGBColor)],
) -> Result<i32, PlotError> {
    let gib_of = |label: &str| {
        e.peak
            .lines
            .iter()
            .chain(&e.other.lines)
            .find(|l| describe(l.name, l.level) == label)
            .map(|l| format!(" ({})", memory(l.gib)))
            .unwrap_or_default()
    };
    let mut y = 30;
    for (label, color) in legend {
        right.draw(&Rectangle::new([(10, y), (24, y + 14)], color.filled())).map_err(perr)?;
        right.draw(&Text::new(format!("{label}{}", gib_of(label)), (32, y), ("sans-serif", 15))).map_err(perr)?;
        y += 24;
    }
    Ok(y)
}

/// "H100-80GB capacity 79.2 GiB", "this machine's memory 23.5 GiB".
fn capacity_label(e: &Explanation) -> String {
    match e.capacity.of {
        crate::sweep::CapacityOf::Gpu(g) => format!("{g} {}", e.capacity.label()),
        _ => e.capacity.label(),
    }
}

fn draw<DB: DrawingBackend>(fig: &Breakdown, root: &DrawingArea<DB, Shift>) -> Result<(), PlotError> {
    let e = fig.explanation;
    root.fill(&WHITE).map_err(perr)?;
    let (fwd, step) = match e.peak_phase {
        crate::precheck::PeakPhase::FwdBwd => (&e.peak, &e.other),
        crate::precheck::PeakPhase::Step => (&e.other, &e.peak),
    };
    let bars = [("forward/backward", segments(fwd)), ("optimizer step", segments(step))];
    let top = fwd.total_gib.max(step.total_gib);
    // A limit is drawn where it does not squash the bars into the bottom.
    let show_capacity = e.capacity.gib <= top * 1.6;
    let show_budget = fig.budget_gib <= top * 1.6 && fig.budget_gib < e.capacity.gib;
    let mut ymax = top;
    if show_capacity {
        ymax = ymax.max(e.capacity.gib);
    }
    if show_budget {
        ymax = ymax.max(fig.budget_gib);
    }
    // Room above the tallest bar for its total.
    let ymax = ymax * 1.12;
    let title = format!("{}: predicted peak {} ({})", e.config, crate::precheck::gib(e.peak_gib), e.peak_phase.name());
    let root = root.titled(&title, ("sans-serif", 22)).map_err(perr)?;
    let (left, right) = root.split_horizontally(CHART_WIDTH);
    let mut chart = ChartBuilder::on(&left)
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..2f64, 0f64..ymax)
        .map_err(perr)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(5)
        .x_label_formatter(&|x| {
            if (x - 0.5).abs() < 1e-6 {
                "forward/backward".to_string()
            } else if (x - 1.5).abs() < 1e-6 {
                "optimizer step".to_string()
            } else {
                String::new()
            }
        })
        .y_desc("GiB")
        .label_style(("sans-serif", 16))
        .draw()
        .map_err(perr)?;
    // One colour per label across both bars; the legend lists each term once.
    let mut legend = draw_bars(&mut chart, &bars, ymax)?;
    if show_capacity {
        let cap = e.capacity.gib;
        chart
            .draw_series(std::iter::once(PathElement::new(vec![(0.0, cap), (2.0, cap)], RED.stroke_width(2))))
            .map_err(perr)?;
        legend.push((capacity_label(e), RED));
    }
    let whose = if fig.budget_set { "budget" } else { "group's budget" };
    if show_budget {
        let b = fig.budget_gib;
        let line = plotters::element::DashedPathElement::new(vec![(0.0, b), (2.0, b)], 8, 5, BUDGET.stroke_width(2));
        chart.draw_series(std::iter::once(line)).map_err(perr)?;
        legend.push((format!("{whose} {b:.0} GiB"), BUDGET));
    }
    let y = draw_legend(&right, e, &legend)?;
    // Limits too far above the bars to draw are still named.
    let mut off = Vec::new();
    if !show_capacity {
        off.push(capacity_label(e));
    }
    if !show_budget && fig.budget_gib < e.capacity.gib {
        off.push(format!("{whose} {:.0} GiB", fig.budget_gib));
    }
    if !off.is_empty() {
        let note = format!("above the chart: {}", off.join(", "));
        right.draw(&Text::new(note, (10, y + 10), ("sans-serif", 15))).map_err(perr)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::precheck::Predictor;

    #[test]
    fn writes_svg_and_png_or_says_why_not() {
        let cfg: facts::RunConfig = serde_json::from_value(serde_json::json!({
            "experiment": "t", "name": "3L",
            "model": {"family": "unet", "channels": [64, 128, 256], "attention_levels": [false, true, true], "num_head_channels": 64},
            "input": {"channels": 8, "spatial": [20, 32, 32]}, "out_channels": 4, "batch": 1,
            "precision": "bf16-amp", "grad_ckpt": false, "gpu": "A100-SXM4-80GB"
        }))
        .unwrap();
        let e = crate::advisor::explain::explain(&Predictor::pytorch(), &cfg, crate::sweep::Capacity::of_gpu(cfg.gpu))
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let bad = plot(&e, None, &dir.path().join("x.pdf"));
        assert!(matches!(bad, Err(AdvisorError::BadArgument { .. })));
        if let Err(why) = crate::plot::font() {
            // A machine without any TrueType font: the error must say how to fix it.
            assert!(why.to_string().contains("ORCHESTRATOR_FONT"));
            return;
        }
        let svg = dir.path().join("x.svg");
        plot(&e, Some(e.peak_gib * 1.2), &svg).unwrap();
        let text = std::fs::read_to_string(&svg).unwrap();
        assert!(text.contains("<svg") && text.contains("attention scores at level 1"));
        assert!(text.contains(&format!("budget {:.0} GiB", e.peak_gib * 1.2)), "the budget line is named");
        let png = dir.path().join("x.png");
        plot(&e, None, &png).unwrap();
        let bytes = std::fs::read(&png).unwrap();
        assert_eq!(&bytes[1..4], b"PNG");
    }
}
