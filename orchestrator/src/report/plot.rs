//! The report's plots, each written as SVG and PNG: predicted against measured
//! peak (y = x and the memory limit drawn in), peak against tokens (or voxels)
//! per variant on log axes, and the precheck's verdict map per family
//! ([`super::verdict_map`]).
//!
//! A measured OOM has no peak: it needed more than it had, so its mark sits at
//! the limit that applied (the worker's `memory_limit` on a CPU test run, else
//! the GPU's capacity), with that limit drawn as a line.

use facts::model::Family;
use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::element::DashedPathElement;
use plotters::prelude::*;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::verdict_map::VerdictMap;
use super::{Report, Status};
use crate::plot::axis::{LogAxis, Unit};
use crate::plot::{perr, save, Figure, PlotError, PALETTE};

/// Writes every plot that has data into `dir`; returns the files written.
pub fn write_all(report: &Report, dir: &Path) -> Result<Vec<PathBuf>, PlotError> {
    let mut out = Vec::new();
    let pvm = PredVsMeasured::new(report);
    if !pvm.points.is_empty() {
        out.extend(save(&pvm, &dir.join("predicted_vs_measured"))?);
    }
    for transformers in [true, false] {
        let f = PeakVsSize::new(report, transformers);
        if f.series.values().map(Vec::len).sum::<usize>() >= 2 {
            let stem = if transformers { "peak_vs_tokens" } else { "peak_vs_voxels" };
            out.extend(save(&f, &dir.join(stem))?);
        }
    }
    for family in Family::ALL {
        let m = VerdictMap::new(report, family);
        if m.len() >= 2 {
            out.extend(save(&m, &dir.join(format!("verdict_map_{}", family.name())))?);
        }
    }
    Ok(out)
}

/// Width of the peak-vs-size chart; its legend is to the right.
const CHART_W: u32 = 830;

fn family_color(f: Family) -> RGBColor {
    match f {
        Family::Unet => PALETTE[0],
        Family::Dit => PALETTE[1],
        Family::Hdit => PALETTE[2],
        Family::Uvit => PALETTE[4],
        Family::Mamba => PALETTE[3],
    }
}

const CAPACITY: RGBColor = RGBColor(200, 30, 30);
const LIMIT: RGBColor = RGBColor(120, 60, 170);

/// `GPU capacity 39.4 GiB` or `worker memory limit 512M`: what a limit line is.
/// A linear tick: `0`, `0.5`, `1`, `2.5`, `20` (as many decimals as the step has).
fn tick_label(v: f64) -> String {
    let s = format!("{v:.2}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// `host`: the capacity is this machine's memory (a `local` run), not a GPU's.
fn limit_label(limit: f64, capacity: f64, host: bool) -> String {
    if limit < capacity {
        format!("worker memory limit {}", crate::plot::axis::label(limit, Unit::Gib))
    } else if host {
        format!("this machine's memory {limit:.1} GiB")
    } else {
        format!("GPU capacity {limit:.1} GiB")
    }
}

/// The limits measured OOMs ran into, ascending, each once.
fn oom_limits<'a>(limits: impl Iterator<Item = &'a f64>) -> Vec<f64> {
    let mut v: Vec<f64> = limits.copied().collect();
    v.sort_by(f64::total_cmp);
    v.dedup_by(|a, b| (*a - *b).abs() < 1e-9);
    v
}

/// One measured config: measured peak (or the limit it ran out at) and prediction.
#[derive(Debug, Clone, Copy)]
struct Point {
    family: Family,
    measured: f64,
    predicted: f64,
    oom: bool,
}

/// Predicted against measured peak, one point per measured config.
pub struct PredVsMeasured {
    title: String,
    points: Vec<Point>,
    capacity: f64,
    host: bool,
}

impl PredVsMeasured {
    pub fn new(report: &Report) -> Self {
        let mut points = Vec::new();
        for r in &report.rows {
            let Some(predicted) = r.predicted_gib else { continue };
            match (r.status, r.peak_gib) {
                (Status::Ok | Status::OverBudget, Some(m)) => {
                    points.push(Point { family: r.family, measured: m, predicted, oom: false })
                }
                (Status::Oom, _) => {
                    points.push(Point { family: r.family, measured: r.limit_gib, predicted, oom: true })
                }
                _ => {}
            }
        }
        let s = report.summary();
        let err = s.median_abs_error_pct.map(|m| format!(", median |error| {m:.1}%")).unwrap_or_default();
        PredVsMeasured {
            title: format!("Predicted vs measured peak ({} configs{err})", points.len()),
            points,
            capacity: report.capacity_gib,
            host: report.host_memory,
        }
    }
    /// Configs plotted (measured, with a prediction).
    pub fn len(&self) -> usize {
        self.points.len()
    }
    pub fn is_empty(&self) -> bool {
        self.points.is_empty()
    }
    /// The title as drawn over a chart whose data reach `top` GiB, in lines
    /// that fit the canvas (20 px margins).
    fn title_lines(&self, top: f64) -> Vec<String> {
        let mut caption = self.title.clone();
        if !self.lines(top).iter().any(|l| (l - self.capacity).abs() < 1e-9) {
            caption.push_str(&format!(" (capacity {:.1} GiB off the chart)", self.capacity));
        }
        crate::plot::wrap(&caption, crate::plot::TITLE_SIZE, f64::from(self.size().0) - 40.0)
    }

    /// The axes' descriptions, in the unit of a chart up to `max` GiB.
    fn axis_descs(&self, max: f64) -> (String, String) {
        let unit = if max <= 1.0 { "MiB" } else { "GiB" };
        (format!("measured peak ({unit})"), format!("predicted peak ({unit})"))
    }

    /// The OOM limits drawn as lines, and whether the GPU's capacity is one of them.
    fn lines(&self, top: f64) -> Vec<f64> {
        let mut lines = oom_limits(self.points.iter().filter(|p| p.oom).map(|p| &p.measured));
        // The capacity as well where it does not squash the data into a corner.
        if self.capacity <= top * 1.6 && !lines.iter().any(|l| (l - self.capacity).abs() < 1e-9) {
            lines.push(self.capacity);
        }
        lines
    }
}

impl Figure for PredVsMeasured {
    fn size(&self) -> (u32, u32) {
        (900, 800)
    }
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), PlotError> {
        root.fill(&WHITE).map_err(perr)?;
        // The axes fit what ran (both coordinates) and the limits OOMs hit;
        // predictions for measured OOMs can be far above (thousands of GiB for
        // attention at full resolution) and are drawn clipped at the top edge.
        let ran = self.points.iter().filter(|p| !p.oom);
        let top = ran.flat_map(|p| [p.measured, p.predicted]).fold(0.0, f64::max);
        let oom_x = self.points.iter().filter(|p| p.oom).map(|p| p.measured).fold(0.0, f64::max);
        let top = top.max(oom_x).max(1e-6);
        let lines = self.lines(top);
        let (max, ticks) = crate::plot::axis::linear_gib(lines.iter().copied().fold(top, f64::max) * 1.05);
        // Below a GiB the chart is drawn in MiB, so its ticks are round MiB.
        let (k, unit) = if max <= 1.0 { (1024.0, "MiB") } else { (1.0, "GiB") };
        // Labels at the axis's round steps, written with their decimals (0.5 GiB
        // steps read 0.5, 1, 1.5: never rounded to 0, 0, 1, 2).
        let labels = ticks.len();
        let clipped = self.points.iter().filter(|p| p.predicted > max).count();
        let area = crate::plot::draw_title(root, &self.title_lines(top))?;
        let (x_desc, y_desc) = self.axis_descs(max);
        let mut chart = ChartBuilder::on(&area)
            .margin(20)
            .x_label_area_size(50)
            .y_label_area_size(70)
            .build_cartesian_2d(0f64..max * k, 0f64..max * k)
            .map_err(perr)?;
        let gib = |v: &f64| tick_label(*v);
        chart
            .configure_mesh()
            .x_labels(labels)
            .y_labels(labels)
            .x_desc(x_desc)
            .y_desc(y_desc)
            .x_label_formatter(&gib)
            .y_label_formatter(&gib)
            .label_style(("sans-serif", 15))
            .draw()
            .map_err(perr)?;
        chart
            .draw_series(std::iter::once(DashedPathElement::new(
                vec![(0.0, 0.0), (max * k, max * k)],
                6,
                4,
                BLACK.stroke_width(1),
            )))
            .map_err(perr)?
            .label("y = x")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK));
        for &limit in &lines {
            let color = if limit < self.capacity { LIMIT } else { CAPACITY };
            let c = limit * k;
            chart
                .draw_series(std::iter::once(PathElement::new(vec![(0.0, c), (max * k, c)], color.stroke_width(2))))
                .map_err(perr)?
                .label(limit_label(limit, self.capacity, self.host))
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
            chart
                .draw_series(std::iter::once(PathElement::new(vec![(c, 0.0), (c, max * k)], color.stroke_width(2))))
                .map_err(perr)?;
        }
        self.draw_points(&mut chart, k, max)?;
        if clipped > 0 {
            let what = if clipped == 1 { "prediction" } else { "predictions" };
            let note = format!("{clipped} {what} above {} {unit} drawn at the top edge", gib(&(max * k)));
            chart
                .draw_series(std::iter::once(Text::new(note, (max * k * 0.45, max * k * 0.06), ("sans-serif", 14))))
                .map_err(perr)?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .label_font(("sans-serif", 14))
            .draw()
            .map_err(perr)?;
        Ok(())
    }
}

impl PredVsMeasured {
    /// Each family's configs: those that ran as dots, measured OOMs as
    /// crosses at the limit they hit (predictions above the chart at its top edge).
    fn draw_points<DB: DrawingBackend>(
        &self,
        chart: &mut ChartContext<'_, DB, Cartesian2d<RangedCoordf64, RangedCoordf64>>,
        k: f64,
        max: f64,
    ) -> Result<(), PlotError> {
        for f in Family::ALL {
            let color = family_color(f);
            let ran: Vec<(f64, f64)> = self
                .points
                .iter()
                .filter(|p| p.family == f && !p.oom)
                .map(|p| (p.measured * k, p.predicted * k))
                .collect();
            let oom: Vec<(f64, f64)> = self
                .points
                .iter()
                .filter(|p| p.family == f && p.oom)
                .map(|p| (p.measured * k, p.predicted.min(max * 0.985) * k))
                .collect();
            if !ran.is_empty() {
                chart
                    .draw_series(ran.iter().map(|&(x, y)| Circle::new((x, y), 5, color.filled())))
                    .map_err(perr)?
                    .label(format!("{}, ran ({})", super::family_title(f), ran.len()))
                    .legend(move |(x, y)| Circle::new((x + 10, y), 5, color.filled()));
            }
            if !oom.is_empty() {
                chart
                    .draw_series(oom.iter().map(|&(x, y)| Cross::new((x, y), 6, color.stroke_width(2))))
                    .map_err(perr)?
                    .label(format!("{}, measured OOM: at its limit ({})", super::family_title(f), oom.len()))
                    .legend(move |(x, y)| Cross::new((x + 10, y), 6, color.stroke_width(2)));
            }
        }
        Ok(())
    }
}

/// (size, measured or the limit it ran out at, predicted, measured OOM).
type SizePoint = (f64, Option<f64>, Option<f64>, bool);

/// Peak against tokens (transformers) or input voxels (UNets), one colour per
/// variant: measured filled, predicted hollow, measured OOMs as crosses at their limit.
pub struct PeakVsSize {
    transformers: bool,
    /// group → points.
    series: BTreeMap<String, Vec<SizePoint>>,
    capacity: f64,
    host: bool,
}

impl PeakVsSize {
    pub fn new(report: &Report, transformers: bool) -> Self {
        let mut series: BTreeMap<String, Vec<_>> = BTreeMap::new();
        for r in report.rows.iter().filter(|r| r.is_transformer() == transformers) {
            let size = if transformers { r.tokens.map(|t| t as f64) } else { Some(r.voxels as f64) };
            let Some(size) = size.filter(|s| *s > 0.0) else { continue };
            let oom = r.status == Status::Oom;
            let measured = if oom { Some(r.limit_gib) } else { r.peak_gib };
            if measured.is_none() && r.predicted_gib.is_none() {
                continue;
            }
            series.entry(r.group.clone()).or_default().push((size, measured, r.predicted_gib, oom));
        }
        PeakVsSize { transformers, series, capacity: report.capacity_gib, host: report.host_memory }
    }

    /// What the x and y axes measure, with their units: the tick labels'
    /// `k`/`M` of a count are thousands and millions, `M`/`G` of memory MiB and GiB.
    fn axis_descs(&self) -> (String, String) {
        let what = if self.transformers { "tokens" } else { "input voxels" };
        (format!("{what} (log; k = thousand, M = million)"), "peak memory (log; M = MiB, G = GiB)".into())
    }

    /// The legend's labels (variants, marks, limit lines), as drawn.
    fn legend_labels(&self) -> Vec<String> {
        let marks = ["measured", "predicted", "measured OOM (at its limit)"].map(String::from);
        let limits = self.axes().map(|(_, _, l)| l).unwrap_or_default();
        let limits = limits.into_iter().map(|c| limit_label(c, self.capacity, self.host));
        self.series.keys().cloned().chain(marks).chain(limits).collect()
    }

    /// The x and y axes, and the limit lines drawn.
    fn axes(&self) -> Option<(LogAxis, LogAxis, Vec<f64>)> {
        let pts: Vec<&SizePoint> = self.series.values().flatten().collect();
        let x = LogAxis::new(pts.iter().map(|p| p.0), Unit::Count)?;
        let ys: Vec<f64> = pts.iter().flat_map(|p| [p.1, p.2]).flatten().collect();
        let top = ys.iter().copied().fold(0.0, f64::max);
        let mut lines = oom_limits(pts.iter().filter(|p| p.3).filter_map(|p| p.1.as_ref()));
        if self.capacity <= top * 1.6 && !lines.iter().any(|l| (l - self.capacity).abs() < 1e-9) {
            lines.push(self.capacity);
        }
        let y = LogAxis::new(ys.iter().copied().chain(lines.iter().copied()), Unit::Gib)?;
        Some((x, y, lines))
    }
}

impl Figure for PeakVsSize {
    /// The chart, and right of it a legend wide enough for its longest label.
    fn size(&self) -> (u32, u32) {
        let longest = self.legend_labels().iter().map(|l| crate::plot::text_width(14, l)).fold(0.0, f64::max);
        ((CHART_W + 32 + longest.ceil() as u32 + 20).max(1100), 750)
    }
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), PlotError> {
        root.fill(&WHITE).map_err(perr)?;
        let Some((x, y, lines)) = self.axes() else { return Ok(()) };
        let what = if self.transformers { "tokens" } else { "input voxels" };
        let (x_desc, y_desc) = self.axis_descs();
        let (chart_area, legend_area) = root.split_horizontally(CHART_W);
        let mut chart = ChartBuilder::on(&chart_area)
            .caption(format!("Peak memory vs {what} per variant"), ("sans-serif", crate::plot::TITLE_SIZE))
            .margin(20)
            .x_label_area_size(50)
            .y_label_area_size(70)
            .build_cartesian_2d(
                (x.lo..x.hi).log_scale().with_key_points(x.ticks.clone()),
                (y.lo..y.hi).log_scale().with_key_points(y.ticks.clone()),
            )
            .map_err(perr)?;
        chart
            .configure_mesh()
            .x_desc(x_desc)
            .y_desc(y_desc)
            .x_label_formatter(&|v| x.label(*v))
            .y_label_formatter(&|v| y.label(*v))
            .label_style(("sans-serif", 14))
            .draw()
            .map_err(perr)?;
        for &c in &lines {
            let color = if c < self.capacity { LIMIT } else { CAPACITY };
            chart
                .draw_series(std::iter::once(PathElement::new(vec![(x.lo, c), (x.hi, c)], color.stroke_width(2))))
                .map_err(perr)?;
        }
        let mut legend: Vec<(String, RGBColor)> = Vec::new();
        for (i, (group, pts)) in self.series.iter().enumerate() {
            let color = PALETTE[i % PALETTE.len()];
            legend.push((group.clone(), color));
            chart
                .draw_series(
                    pts.iter().filter(|p| !p.3).filter_map(|p| Some(Circle::new((p.0, p.1?), 5, color.filled()))),
                )
                .map_err(perr)?;
            chart
                .draw_series(
                    pts.iter().filter(|p| p.3).filter_map(|p| Some(Cross::new((p.0, p.1?), 6, color.stroke_width(2)))),
                )
                .map_err(perr)?;
            chart
                .draw_series(pts.iter().filter_map(|p| Some(Circle::new((p.0, p.2?), 7, color.stroke_width(1)))))
                .map_err(perr)?;
        }
        // Legend on the right: one line per variant, then what the marks mean.
        let font = ("sans-serif", 14);
        let mut ly = 40;
        for (label, color) in &legend {
            legend_area.draw(&Circle::new((18, ly + 7), 5, color.filled())).map_err(perr)?;
            legend_area.draw(&Text::new(label.clone(), (32, ly), font)).map_err(perr)?;
            ly += 22;
        }
        ly += 14;
        legend_area.draw(&Circle::new((18, ly + 7), 5, BLACK.filled())).map_err(perr)?;
        legend_area.draw(&Text::new("measured", (32, ly), font)).map_err(perr)?;
        ly += 22;
        legend_area.draw(&Circle::new((18, ly + 7), 7, BLACK.stroke_width(1))).map_err(perr)?;
        legend_area.draw(&Text::new("predicted", (32, ly), font)).map_err(perr)?;
        ly += 22;
        legend_area.draw(&Cross::new((18, ly + 7), 6, BLACK.stroke_width(2))).map_err(perr)?;
        legend_area.draw(&Text::new("measured OOM (at its limit)", (32, ly), font)).map_err(perr)?;
        for &c in &lines {
            ly += 22;
            let color = if c < self.capacity { LIMIT } else { CAPACITY };
            legend_area
                .draw(&PathElement::new(vec![(8, ly + 7), (28, ly + 7)], color.stroke_width(2)))
                .map_err(perr)?;
            legend_area.draw(&Text::new(limit_label(c, self.capacity, self.host), (32, ly), font)).map_err(perr)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(name: &str, tokens: u64, peak: Option<f64>, status: Status, limit: f64) -> super::super::Row {
        let cfg: facts::RunConfig = serde_json::from_value(serde_json::json!({
            "experiment": "t", "name": name,
            "model": {"family": "dit", "hidden": 64, "heads": 4, "depth": 2, "patch": 2},
            "input": {"channels": 1, "spatial": [16, 16, 16]}, "out_channels": 1, "batch": 1,
            "precision": "fp32", "grad_ckpt": false, "gpu": "A100-40GB"
        }))
        .expect("config");
        let mut r = super::super::base_row(&cfg, name.into(), String::new(), crate::precheck::VerdictKind::Fits);
        r.tokens = Some(tokens);
        r.peak_gib = peak;
        r.predicted_gib = Some(peak.unwrap_or(3.0));
        r.status = status;
        r.limit_gib = limit;
        r
    }

    #[test]
    fn ooms_sit_at_the_limit_that_applied_and_the_axes_cover_every_point() {
        let limit = 0.5;
        let rows = vec![
            row("a", 64, Some(0.004), Status::Ok, limit),
            row("b", 512, Some(0.042), Status::Ok, limit),
            row("c", 4096, None, Status::Oom, limit),
        ];
        let report = super::super::tests::report_of(rows);
        let f = PeakVsSize::new(&report, true);
        let (x, y, lines) = f.axes().expect("axes");
        assert_eq!(lines, [limit], "the worker's limit is drawn, the 39.4 GiB capacity is not");
        let oom: Vec<&SizePoint> = f.series.values().flatten().filter(|p| p.3).collect();
        assert_eq!(oom[0].1, Some(limit));
        assert!(x.lo <= 64.0 && x.hi >= 4096.0, "{x:?}");
        // Every y (measured, predicted, the limit) between the first and last label.
        assert!(y.lo <= 0.004 && y.hi >= 3.0, "{y:?}");
        assert_eq!(y.ticks.first(), Some(&y.lo));
        let pvm = PredVsMeasured::new(&report);
        assert!(pvm.points.iter().any(|p| p.oom && p.measured == limit));
        assert_eq!(pvm.lines(0.5), [limit]);
        assert_eq!(limit_label(limit, 39.4, false), "worker memory limit 512M");
    }

    /// Every axis says its unit: memory ticks read `20M`, `1G` (MiB, GiB),
    /// count ticks `2k`, `1M` (thousands, millions), and a reader must not
    /// take one M for the other.
    #[test]
    fn every_axis_names_its_unit() {
        let rows = vec![row("a", 64, Some(0.02), Status::Ok, 39.4), row("b", 512, Some(0.05), Status::Ok, 39.4)];
        let report = super::super::tests::report_of(rows);
        let (x, y) = PeakVsSize::new(&report, true).axis_descs();
        assert!(y.contains("MiB") && y.contains("GiB"), "{y}");
        assert!(x.contains("tokens") && x.contains("million"), "{x}");
        let (x, y) = PredVsMeasured::new(&report).axis_descs(1.0 / 1024.0);
        assert!(x.contains("(MiB)") && y.contains("(MiB)"), "{x} {y}");
    }

    /// The demo's report: titles and legend labels within the canvas.
    #[test]
    fn titles_and_legends_fit_the_canvas() {
        let mut rows: Vec<_> = (0..6).map(|i| row(&format!("c{i}"), 64 << i, Some(0.02), Status::Ok, 39.4)).collect();
        for r in &mut rows {
            r.predicted_gib = Some(0.017);
            r.group = "UNet, 3 levels, input 1x16x16x16 (C,H,W,D)".into();
        }
        let report = super::super::tests::report_of(rows);
        let pvm = PredVsMeasured::new(&report);
        let (w, _) = pvm.size();
        for line in pvm.title_lines(0.1) {
            let width = crate::plot::text_width(crate::plot::TITLE_SIZE, &line);
            assert!(width <= f64::from(w) - 40.0, "{line:?} is {width} px, canvas {w} px");
        }
        let f = PeakVsSize::new(&report, true);
        let (w, _) = f.size();
        for label in f.series.keys() {
            let width = crate::plot::text_width(14, label);
            assert!(f64::from(CHART_W) + 32.0 + width <= f64::from(w) - 10.0, "{label:?}: {width} px, canvas {w} px");
        }
    }

    #[test]
    fn one_size_still_gets_an_x_tick_at_it() {
        let rows = vec![row("a", 512, Some(0.04), Status::Ok, 39.4), row("b", 512, Some(0.05), Status::Ok, 39.4)];
        let report = super::super::tests::report_of(rows);
        let (x, y, _) = PeakVsSize::new(&report, true).axes().expect("axes");
        assert!(x.ticks.contains(&512.0), "{x:?}");
        assert!(y.lo <= 0.04 && y.hi >= 0.05 && y.ticks.len() >= 2, "{y:?}");
    }
}
