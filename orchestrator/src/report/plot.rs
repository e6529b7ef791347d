//! The report's plots, each written as SVG and PNG: predicted against measured
//! peak (y = x and the GPU capacity drawn in), peak against tokens (or voxels)
//! per variant, and the precheck's fits / risky / oom map over two sweep axes.
//!
//! The font setup is the advisor's (`advisor::plot::ensure_font`: pure-Rust
//! `ab_glyph`, no fontconfig); [`save`] is the shared SVG + PNG writer any
//! figure can use (the advisor's `explain --plot` could move onto it).

use plotters::coord::Shift;
use plotters::element::DashedPathElement;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use spec::model::Family;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::markdown::fmt_gib;
use super::{Report, ReportError, Row, Status};
use crate::advisor::plot::{ensure_font, PALETTE};

/// Something drawable on any plotters backend at a fixed size.
pub trait Figure {
    fn size(&self) -> (u32, u32);
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), String>;
}

fn perr<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

/// Writes `fig` to `<stem>.svg` and `<stem>.png`; returns both paths.
pub fn save(fig: &impl Figure, stem: &Path) -> Result<Vec<PathBuf>, ReportError> {
    ensure_font().map_err(|e| ReportError::Plot(e.to_string()))?;
    let (w, h) = fig.size();
    let svg = stem.with_extension("svg");
    {
        let root = SVGBackend::new(&svg, (w, h)).into_drawing_area();
        fig.draw(&root).map_err(|e| ReportError::Plot(format!("{}: {e}", svg.display())))?;
        root.present().map_err(|e| ReportError::Plot(format!("{}: {e}", svg.display())))?;
    }
    let png = stem.with_extension("png");
    let mut buf = vec![0u8; (w * h * 3) as usize];
    {
        let root = BitMapBackend::with_buffer(&mut buf, (w, h)).into_drawing_area();
        fig.draw(&root).map_err(|e| ReportError::Plot(format!("{}: {e}", png.display())))?;
        root.present().map_err(|e| ReportError::Plot(format!("{}: {e}", png.display())))?;
    }
    write_png(&png, w, h, &buf)?;
    Ok(vec![svg, png])
}

/// An RGB buffer as a PNG file (the `png` crate directly; no `image` dependency).
pub fn write_png(path: &Path, w: u32, h: u32, rgb: &[u8]) -> Result<(), ReportError> {
    let err = |e: &dyn std::fmt::Display| ReportError::Plot(format!("{}: {e}", path.display()));
    let file = std::fs::File::create(path).map_err(|e| err(&e))?;
    let mut enc = png::Encoder::new(std::io::BufWriter::new(file), w, h);
    enc.set_color(png::ColorType::Rgb);
    enc.set_depth(png::BitDepth::Eight);
    enc.set_compression(png::Compression::Best);
    let mut wr = enc.write_header().map_err(|e| err(&e))?;
    wr.write_image_data(rgb).map_err(|e| err(&e))?;
    wr.finish().map_err(|e| err(&e))
}

/// Writes every plot that has data into `dir`; returns the files written.
pub fn write_all(report: &Report, dir: &Path) -> Result<Vec<PathBuf>, ReportError> {
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
    for family in [Family::Unet, Family::Dit, Family::Hdit, Family::Uvit] {
        let m = VerdictMap::new(report, family);
        if m.cells.len() >= 2 {
            out.extend(save(&m, &dir.join(format!("verdict_map_{}", family.name())))?);
        }
    }
    Ok(out)
}

fn family_color(f: Family) -> RGBColor {
    match f {
        Family::Unet => PALETTE[0],
        Family::Dit => PALETTE[1],
        Family::Hdit => PALETTE[2],
        Family::Uvit => PALETTE[4],
    }
}

const CAPACITY: RGBColor = RGBColor(200, 30, 30);

/// Predicted against measured peak, one point per measured config; measured
/// OOMs sit at the capacity (they needed more) as crosses.
pub struct PredVsMeasured {
    title: String,
    /// (family, measured or capacity, predicted, oom).
    points: Vec<(Family, f64, f64, bool)>,
    capacity: f64,
}

impl PredVsMeasured {
    pub fn new(report: &Report) -> Self {
        let mut points = Vec::new();
        for r in &report.rows {
            let Some(p) = r.predicted_gib else { continue };
            match (r.status, r.peak_gib) {
                (Status::Ok | Status::OverBudget, Some(m)) => points.push((r.family, m, p, false)),
                (Status::Oom, _) => points.push((r.family, r.capacity_gib, p, true)),
                _ => {}
            }
        }
        let s = report.summary();
        let err = s.median_abs_error_pct.map(|m| format!(", median |error| {m:.1}%")).unwrap_or_default();
        PredVsMeasured {
            title: format!("Predicted vs measured peak ({} configs{err})", points.len()),
            points,
            capacity: report.capacity_gib,
        }
    }
    /// Configs plotted (measured, with a prediction).
    pub fn len(&self) -> usize {
        self.points.len()
    }
    pub fn is_empty(&self) -> bool {
        self.points.is_empty()
    }
}

impl Figure for PredVsMeasured {
    fn size(&self) -> (u32, u32) {
        (900, 800)
    }
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), String> {
        root.fill(&WHITE).map_err(perr)?;
        // The axes fit what ran (both coordinates) and the capacity; predictions
        // for measured OOMs can be far above it (thousands of GiB for attention
        // at full resolution) and are drawn clipped at the top edge.
        let top = self.points.iter().filter(|p| !p.3).flat_map(|p| [p.1, p.2]).fold(0.0, f64::max).max(1e-6);
        let any_oom = self.points.iter().any(|p| p.3);
        // The capacity only where it does not squash the data into a corner.
        let show_capacity = any_oom || self.capacity <= top * 1.6;
        let max = if show_capacity { top.max(self.capacity) * 1.1 } else { top * 1.1 };
        let clipped = self.points.iter().filter(|p| p.2 > max).count();
        let mut caption = self.title.clone();
        if !show_capacity {
            caption.push_str(&format!(" (capacity {:.1} GiB off the chart)", self.capacity));
        }
        let mut chart = ChartBuilder::on(root)
            .caption(caption, ("sans-serif", 20))
            .margin(20)
            .x_label_area_size(50)
            .y_label_area_size(70)
            .build_cartesian_2d(0f64..max, 0f64..max)
            .map_err(perr)?;
        chart
            .configure_mesh()
            .x_desc("measured peak (GiB)")
            .y_desc("predicted peak (GiB)")
            .label_style(("sans-serif", 15))
            .draw()
            .map_err(perr)?;
        chart
            .draw_series(std::iter::once(DashedPathElement::new(vec![(0.0, 0.0), (max, max)], 6, 4, BLACK.stroke_width(1))))
            .map_err(perr)?
            .label("y = x")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK));
        if show_capacity {
            let c = self.capacity;
            chart
                .draw_series(std::iter::once(PathElement::new(vec![(0.0, c), (max, c)], CAPACITY.stroke_width(2))))
                .map_err(perr)?
                .label(format!("GPU capacity {c:.1} GiB"))
                .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], CAPACITY.stroke_width(2)));
            chart
                .draw_series(std::iter::once(PathElement::new(vec![(c, 0.0), (c, max)], CAPACITY.stroke_width(2))))
                .map_err(perr)?;
        }
        for f in [Family::Unet, Family::Dit, Family::Hdit, Family::Uvit] {
            let color = family_color(f);
            let ran: Vec<(f64, f64)> = self.points.iter().filter(|p| p.0 == f && !p.3).map(|p| (p.1, p.2)).collect();
            let oom: Vec<(f64, f64)> = self.points.iter().filter(|p| p.0 == f && p.3).map(|p| (p.1, p.2.min(max * 0.985))).collect();
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
                    .label(format!("{}, measured OOM: at capacity ({})", super::family_title(f), oom.len()))
                    .legend(move |(x, y)| Cross::new((x + 10, y), 6, color.stroke_width(2)));
            }
        }
        if clipped > 0 {
            let note = format!("{clipped} predictions above {max:.0} GiB drawn at the top edge");
            chart
                .draw_series(std::iter::once(Text::new(note, (max * 0.45, max * 0.06), ("sans-serif", 14))))
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

/// (size, measured or capacity, predicted, measured OOM).
type SizePoint = (f64, Option<f64>, Option<f64>, bool);

/// Peak against tokens (transformers) or input voxels (UNets), one colour per
/// variant: measured filled, predicted hollow, measured OOMs as crosses at the capacity.
pub struct PeakVsSize {
    transformers: bool,
    /// group → points.
    series: BTreeMap<String, Vec<SizePoint>>,
    capacity: f64,
}

impl PeakVsSize {
    pub fn new(report: &Report, transformers: bool) -> Self {
        let mut series: BTreeMap<String, Vec<_>> = BTreeMap::new();
        for r in report.rows.iter().filter(|r| r.is_transformer() == transformers) {
            let size = if transformers { r.tokens.map(|t| t as f64) } else { Some(r.voxels as f64) };
            let Some(size) = size.filter(|s| *s > 0.0) else { continue };
            let oom = r.status == Status::Oom;
            let measured = if oom { Some(r.capacity_gib) } else { r.peak_gib };
            if measured.is_none() && r.predicted_gib.is_none() {
                continue;
            }
            series.entry(r.group.clone()).or_default().push((size, measured, r.predicted_gib, oom));
        }
        PeakVsSize { transformers, series, capacity: report.capacity_gib }
    }
}

impl Figure for PeakVsSize {
    fn size(&self) -> (u32, u32) {
        (1100, 750)
    }
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), String> {
        root.fill(&WHITE).map_err(perr)?;
        let pts = self.series.values().flatten();
        let xs: Vec<f64> = pts.clone().map(|p| p.0).collect();
        let ys: Vec<f64> = pts.flat_map(|p| [p.1, p.2]).flatten().filter(|y| *y > 0.0).collect();
        let (x0, x1) = (xs.iter().copied().fold(f64::MAX, f64::min), xs.iter().copied().fold(0.0, f64::max));
        let (y0, y1) = (ys.iter().copied().fold(f64::MAX, f64::min), ys.iter().copied().fold(0.0, f64::max));
        let show_capacity = self.capacity <= y1 * 1.6;
        let y1 = if show_capacity { y1.max(self.capacity) } else { y1 };
        let what = if self.transformers { "tokens" } else { "input voxels" };
        let (chart_area, legend_area) = root.split_horizontally(830);
        let mut chart = ChartBuilder::on(&chart_area)
            .caption(format!("Peak memory vs {what} per variant"), ("sans-serif", 20))
            .margin(20)
            .x_label_area_size(50)
            .y_label_area_size(70)
            .build_cartesian_2d((x0 / 1.5..x1 * 1.5).log_scale(), (y0 / 1.5..y1 * 1.5).log_scale())
            .map_err(perr)?;
        chart
            .configure_mesh()
            .x_desc(format!("{what} (log)"))
            .y_desc("peak (GiB, log)")
            .x_label_formatter(&|x| short(*x))
            .y_label_formatter(&|y| fmt_gib(*y))
            .label_style(("sans-serif", 14))
            .draw()
            .map_err(perr)?;
        if show_capacity {
            let c = self.capacity;
            chart
                .draw_series(std::iter::once(PathElement::new(vec![(x0 / 1.5, c), (x1 * 1.5, c)], CAPACITY.stroke_width(2))))
                .map_err(perr)?;
        }
        let mut legend: Vec<(String, RGBColor)> = Vec::new();
        for (i, (group, pts)) in self.series.iter().enumerate() {
            let color = PALETTE[i % PALETTE.len()];
            legend.push((group.clone(), color));
            chart
                .draw_series(pts.iter().filter(|p| !p.3).filter_map(|p| Some(Circle::new((p.0, p.1?), 5, color.filled()))))
                .map_err(perr)?;
            chart
                .draw_series(pts.iter().filter(|p| p.3).filter_map(|p| Some(Cross::new((p.0, p.1?), 6, color.stroke_width(2)))))
                .map_err(perr)?;
            chart
                .draw_series(pts.iter().filter_map(|p| Some(Circle::new((p.0, p.2?), 7, color.stroke_width(1)))))
                .map_err(perr)?;
        }
        // Legend on the right: one line per variant, then what the marks mean.
        let font = ("sans-serif", 14);
        let mut y = 40;
        for (label, color) in &legend {
            legend_area.draw(&Circle::new((18, y + 7), 5, color.filled())).map_err(perr)?;
            legend_area.draw(&Text::new(label.clone(), (32, y), font)).map_err(perr)?;
            y += 22;
        }
        y += 14;
        legend_area.draw(&Circle::new((18, y + 7), 5, BLACK.filled())).map_err(perr)?;
        legend_area.draw(&Text::new("measured", (32, y), font)).map_err(perr)?;
        y += 22;
        legend_area.draw(&Circle::new((18, y + 7), 7, BLACK.stroke_width(1))).map_err(perr)?;
        legend_area.draw(&Text::new("predicted", (32, y), font)).map_err(perr)?;
        y += 22;
        legend_area.draw(&Cross::new((18, y + 7), 6, BLACK.stroke_width(2))).map_err(perr)?;
        legend_area.draw(&Text::new("measured OOM (at capacity)", (32, y), font)).map_err(perr)?;
        if show_capacity {
            y += 22;
            legend_area.draw(&PathElement::new(vec![(8, y + 7), (28, y + 7)], CAPACITY.stroke_width(2))).map_err(perr)?;
            legend_area.draw(&Text::new(format!("capacity {:.1} GiB", self.capacity), (32, y), font)).map_err(perr)?;
        }
        Ok(())
    }
}

/// `40k`, `2.6M`: axis labels for counts.
fn short(x: f64) -> String {
    if x >= 1e6 {
        format!("{:.1}M", x / 1e6)
    } else if x >= 1e3 {
        format!("{:.0}k", x / 1e3)
    } else {
        format!("{x:.0}")
    }
}

/// The precheck's verdict over two sweep axes of one family: rows are variants
/// (UNets: configs), columns patch (and resolution where there are several);
/// each cell also says what the measurement found.
pub struct VerdictMap {
    family: Family,
    rows: Vec<String>,
    cols: Vec<String>,
    /// (row, col) → (verdict, measured text).
    cells: BTreeMap<(usize, usize), (String, String)>,
}

fn push_unique(v: &mut Vec<String>, s: String) -> usize {
    match v.iter().position(|x| *x == s) {
        Some(i) => i,
        None => {
            v.push(s);
            v.len() - 1
        }
    }
}

fn measured_text(r: &Row) -> String {
    match r.status {
        Status::Ok => r.peak_gib.map(|p| format!("OK {}", fmt_gib(p))).unwrap_or_else(|| "OK".into()),
        Status::OverBudget => r.peak_gib.map(|p| format!(">budget {}", fmt_gib(p))).unwrap_or_default(),
        Status::Oom => "OOM".into(),
        Status::Failed => "failed".into(),
        Status::Cancelled => "cancelled".into(),
        Status::Pending | Status::Running => "queued".into(),
        Status::Invalid => "invalid".into(),
        Status::SkippedOom | Status::SkippedRisky | Status::NotSubmitted => "not run".into(),
    }
}

impl VerdictMap {
    pub fn new(report: &Report, family: Family) -> Self {
        let rows_of: Vec<&Row> = report.rows.iter().filter(|r| r.family == family).collect();
        let many_res = rows_of.iter().map(|r| (&r.resolution, r.in_channels)).collect::<std::collections::BTreeSet<_>>().len() > 1;
        let mut rows = Vec::new();
        let mut cols = Vec::new();
        let mut cells = BTreeMap::new();
        for r in rows_of {
            let row = match (&r.level_depths, family) {
                (_, Family::Unet) => r.name.clone(),
                (Some(d), _) => format!("{} {d:?}", r.group),
                (None, _) => r.group.clone(),
            };
            let col = match (family, r.patch) {
                (Family::Unet, _) | (_, None) => format!("{} x{}", r.resolution, r.in_channels),
                (_, Some(p)) if many_res => format!("p{p} {}", r.resolution),
                (_, Some(p)) => format!("patch {p}"),
            };
            let key = (push_unique(&mut rows, row), push_unique(&mut cols, col));
            // Repeated configs (the same run in two tables): the first stands.
            cells.entry(key).or_insert_with(|| {
                let pred = r.predicted_gib.map(|p| format!(" ({})", fmt_gib(p))).unwrap_or_default();
                (format!("{}{pred}", r.verdict), measured_text(r))
            });
        }
        // Columns in a natural order: by patch, then resolution as written.
        let mut order: Vec<usize> = (0..cols.len()).collect();
        order.sort_by(|&a, &b| natural_key(&cols[a]).cmp(&natural_key(&cols[b])));
        let remap: BTreeMap<usize, usize> = order.iter().enumerate().map(|(new, &old)| (old, new)).collect();
        let cols = order.iter().map(|&i| cols[i].clone()).collect();
        let cells = cells.into_iter().map(|((r, c), v)| ((r, remap[&c]), v)).collect();
        VerdictMap { family, rows, cols, cells }
    }

    fn cell_w(&self) -> u32 {
        if self.cols.len() > 8 {
            112
        } else {
            150
        }
    }
}

/// Digits compared as numbers: `p2` < `p4` < `p8`, `64x64x40` < `128x128x80`.
fn natural_key(s: &str) -> Vec<(u64, String)> {
    let mut out = Vec::new();
    let mut num = String::new();
    let mut text = String::new();
    for ch in s.chars() {
        if ch.is_ascii_digit() {
            if !text.is_empty() {
                out.push((0, std::mem::take(&mut text)));
            }
            num.push(ch);
        } else {
            if !num.is_empty() {
                out.push((num.parse().unwrap_or(0), String::new()));
                num.clear();
            }
            text.push(ch);
        }
    }
    if !num.is_empty() {
        out.push((num.parse().unwrap_or(0), String::new()));
    }
    if !text.is_empty() {
        out.push((0, text));
    }
    out
}

const LEFT: u32 = 230;
const TOP: u32 = 90;
const CELL_H: u32 = 46;

fn verdict_color(v: &str) -> RGBColor {
    match v.split(' ').next().unwrap_or("") {
        "fits" => RGBColor(161, 217, 155),
        "risky" => RGBColor(253, 208, 120),
        "oom" => RGBColor(239, 138, 128),
        _ => RGBColor(210, 210, 210),
    }
}

impl Figure for VerdictMap {
    fn size(&self) -> (u32, u32) {
        let w = LEFT + self.cols.len() as u32 * self.cell_w() + 30;
        let h = TOP + self.rows.len() as u32 * CELL_H + 80;
        (w.max(760), h)
    }
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), String> {
        root.fill(&WHITE).map_err(perr)?;
        let cw = self.cell_w() as i32;
        let ch = CELL_H as i32;
        let (left, top) = (LEFT as i32, TOP as i32);
        let title = format!(
            "{}: precheck verdict (predicted peak) and what was measured",
            super::family_title(self.family)
        );
        root.draw(&Text::new(title, (20, 20), ("sans-serif", 20))).map_err(perr)?;
        let center = |size: u32| TextStyle::from(("sans-serif", size).into_font()).pos(Pos::new(HPos::Center, VPos::Center));
        let right = TextStyle::from(("sans-serif", 14).into_font()).pos(Pos::new(HPos::Right, VPos::Center));
        for (j, c) in self.cols.iter().enumerate() {
            let x = left + j as i32 * cw + cw / 2;
            root.draw(&Text::new(c.clone(), (x, top - 16), center(13))).map_err(perr)?;
        }
        for (i, r) in self.rows.iter().enumerate() {
            let y = top + i as i32 * ch;
            root.draw(&Text::new(r.clone(), (left - 10, y + ch / 2), right.clone())).map_err(perr)?;
            for j in 0..self.cols.len() {
                let x = left + j as i32 * cw;
                let rect = [(x + 1, y + 1), (x + cw - 1, y + ch - 1)];
                match self.cells.get(&(i, j)) {
                    Some((verdict, measured)) => {
                        root.draw(&Rectangle::new(rect, verdict_color(verdict).filled())).map_err(perr)?;
                        root.draw(&Text::new(verdict.clone(), (x + cw / 2, y + ch / 2 - 9), center(12))).map_err(perr)?;
                        root.draw(&Text::new(measured.clone(), (x + cw / 2, y + ch / 2 + 9), center(12))).map_err(perr)?;
                    }
                    None => {
                        root.draw(&Rectangle::new(rect, RGBColor(245, 245, 245).filled())).map_err(perr)?;
                    }
                }
            }
        }
        // Key.
        let y = top + self.rows.len() as i32 * ch + 30;
        let mut x = 20;
        for (label, v) in [("fits", "fits"), ("risky", "risky"), ("predicted OOM", "oom"), ("invalid", "invalid"), ("not in sweep", "")] {
            let color = if v.is_empty() { RGBColor(245, 245, 245) } else { verdict_color(v) };
            root.draw(&Rectangle::new([(x, y), (x + 18, y + 18)], color.filled())).map_err(perr)?;
            root.draw(&Rectangle::new([(x, y), (x + 18, y + 18)], BLACK.stroke_width(1))).map_err(perr)?;
            root.draw(&Text::new(label, (x + 24, y + 2), ("sans-serif", 14))).map_err(perr)?;
            x += 40 + 8 * label.len() as i32;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_sort_naturally() {
        let mut v = vec!["p8 64x64x40", "p2 128x128x80", "p2 64x64x40", "p4 64x64x40"];
        v.sort_by_key(|s| natural_key(s));
        assert_eq!(v, ["p2 64x64x40", "p2 128x128x80", "p4 64x64x40", "p8 64x64x40"]);
        assert_eq!(short(40960.0), "41k");
        assert_eq!(short(2_621_440.0), "2.6M");
    }
}
