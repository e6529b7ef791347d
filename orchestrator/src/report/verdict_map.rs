//! The precheck's verdict over two sweep axes of one family, as a coloured
//! grid: rows are variants (UNets: configs), columns patch and resolution.

use facts::model::Family;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use std::collections::BTreeMap;

use super::markdown::fmt_gib;
use super::{Report, Row, Status};
use crate::plot::{perr, wrap, Figure, PlotError, TITLE_LINE, TITLE_SIZE};
use crate::precheck::VerdictKind;

/// The precheck's verdict over two sweep axes of one family: rows are variants
/// (UNets: configs), columns patch (and resolution where there are several);
/// each cell also says what the measurement found.
pub struct VerdictMap {
    family: Family,
    rows: Vec<String>,
    cols: Vec<String>,
    /// (row, col) → (verdict, its text with the predicted peak, measured text).
    cells: BTreeMap<(usize, usize), (VerdictKind, String, String)>,
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
        Status::Predicted => "not run: predicted".into(),
    }
}

impl VerdictMap {
    pub fn new(report: &Report, family: Family) -> Self {
        let rows_of: Vec<&Row> = report.rows.iter().filter(|r| r.family == family).collect();
        let many_res =
            rows_of.iter().map(|r| (&r.resolution, r.in_channels)).collect::<std::collections::BTreeSet<_>>().len() > 1;
        let mut rows = Vec::new();
        let mut cols = Vec::new();
        let mut cells = BTreeMap::new();
        let col_of = |r: &Row| match (family, r.patch) {
            (Family::Unet, _) | (_, None) => format!("{}x{}", r.in_channels, r.resolution),
            (_, Some(p)) if many_res => format!("p{p} {}", r.resolution),
            (_, Some(p)) => format!("patch {p}"),
        };
        // UNet rows are configs: named without the part that names their
        // column (`4L_tiny_lat4x`, `4L_tiny_lat8x`: one row `4L_tiny`).
        let suffixes = column_suffixes(&rows_of, &col_of);
        for r in rows_of {
            let col = col_of(r);
            let row = match (&r.level_depths, family) {
                (_, Family::Unet) => {
                    let suffix = suffixes.get(&col).map_or("", String::as_str);
                    r.name.strip_suffix(suffix).filter(|s| !s.is_empty()).unwrap_or(&r.name).to_string()
                }
                (Some(d), _) => format!("{} {d:?}", r.group),
                (None, _) => r.group.clone(),
            };
            let key = (push_unique(&mut rows, row), push_unique(&mut cols, col));
            // Repeated configs (the same run in two tables): the first stands.
            cells.entry(key).or_insert_with(|| {
                let pred = r.predicted_gib.map(|p| format!(" ({})", fmt_gib(p))).unwrap_or_default();
                (r.verdict, format!("{}{pred}", r.verdict), measured_text(r))
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

    /// Cells with a config in them.
    pub fn len(&self) -> usize {
        self.cells.len()
    }

    /// Where the grid starts: right of the longest row label.
    fn left(&self) -> u32 {
        let longest = self.rows.iter().map(|r| r.chars().count() as u32).max().unwrap_or(0);
        LEFT.max(30 + longest * LABEL_CHAR_W)
    }

    /// The title as drawn, from x = 20: broken into lines that fit the
    /// canvas with as much margin on the right (UNets: what the columns are
    /// on a line of its own).
    fn title_lines(&self) -> Vec<String> {
        let width = f64::from(self.grid_width()) - 40.0;
        let mut lines = wrap(
            &format!("{}: precheck verdict (predicted peak) and what was measured", super::family_title(self.family)),
            TITLE_SIZE,
            width,
        );
        if self.family == Family::Unet {
            lines.extend(wrap("columns: input C x H x W x D", TITLE_SIZE, width));
        }
        lines
    }

    /// The canvas width the grid needs (and at least 760 px).
    fn grid_width(&self) -> u32 {
        (self.left() + self.cols.len() as u32 * self.cell_w() + 30).max(760)
    }

    /// Where the grid starts: below the title's lines and the column labels.
    fn top(&self) -> u32 {
        TOP + (self.title_lines().len() as u32 - 1) * TITLE_LINE
    }

    fn cell_w(&self) -> u32 {
        if self.cols.len() > 8 {
            112
        } else {
            150
        }
    }
}

/// Per column of two or more configs: the ending all their names share from
/// a `_` or `-` on (`_lat4x`), which names the column, not the config.
fn column_suffixes(rows: &[&Row], col_of: &dyn Fn(&Row) -> String) -> BTreeMap<String, String> {
    let mut names: BTreeMap<String, Vec<&str>> = BTreeMap::new();
    for r in rows {
        names.entry(col_of(r)).or_default().push(&r.name);
    }
    names
        .into_iter()
        .filter(|(_, n)| n.len() > 1)
        .filter_map(|(col, n)| {
            let first = n[0];
            // The first separator from the left whose ending every name has: the longest.
            let cut = first
                .char_indices()
                .filter(|(_, c)| matches!(c, '_' | '-'))
                .map(|(i, _)| &first[i..])
                .find(|end| n.iter().all(|m| m.len() > end.len() && m.ends_with(end)))?;
            Some((col, cut.to_string()))
        })
        .collect()
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

/// The row labels' column at least; wider for long labels.
const LEFT: u32 = 230;
/// Width of one character of the 14 px row labels, generously (DejaVu Sans
/// averages about 8 px), so no label is cut at the left edge.
const LABEL_CHAR_W: u32 = 9;
const TOP: u32 = 90;
const CELL_H: u32 = 46;

fn verdict_color(v: VerdictKind) -> RGBColor {
    match v {
        VerdictKind::Fits => RGBColor(161, 217, 155),
        VerdictKind::Risky => RGBColor(253, 208, 120),
        VerdictKind::Oom => RGBColor(239, 138, 128),
        VerdictKind::Invalid => RGBColor(210, 210, 210),
    }
}

impl Figure for VerdictMap {
    fn size(&self) -> (u32, u32) {
        (self.grid_width(), self.top() + self.rows.len() as u32 * CELL_H + 80)
    }
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), PlotError> {
        root.fill(&WHITE).map_err(perr)?;
        let cw = self.cell_w() as i32;
        let ch = CELL_H as i32;
        let (left, top) = (self.left() as i32, self.top() as i32);
        for (i, line) in self.title_lines().into_iter().enumerate() {
            let y = 20 + (i as u32 * TITLE_LINE) as i32;
            root.draw(&Text::new(line, (20, y), ("sans-serif", TITLE_SIZE))).map_err(perr)?;
        }
        let center =
            |size: u32| TextStyle::from(("sans-serif", size).into_font()).pos(Pos::new(HPos::Center, VPos::Center));
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
                    Some((kind, verdict, measured)) => {
                        root.draw(&Rectangle::new(rect, verdict_color(*kind).filled())).map_err(perr)?;
                        root.draw(&Text::new(verdict.clone(), (x + cw / 2, y + ch / 2 - 9), center(12)))
                            .map_err(perr)?;
                        root.draw(&Text::new(measured.clone(), (x + cw / 2, y + ch / 2 + 9), center(12)))
                            .map_err(perr)?;
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
        for (label, v) in [
            ("fits", Some(VerdictKind::Fits)),
            ("risky", Some(VerdictKind::Risky)),
            ("predicted OOM", Some(VerdictKind::Oom)),
            ("invalid", Some(VerdictKind::Invalid)),
            ("not in sweep", None),
        ] {
            let color = v.map_or(RGBColor(245, 245, 245), verdict_color);
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

    /// `experiments/<name>.yaml` and a report of its configs, each `fits`.
    fn report_of_experiment(name: &str) -> (crate::sweep::Sweep, Report) {
        let file = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../experiments/{name}.yaml"));
        let sweep = crate::sweep::load(&file, &[]).unwrap_or_else(|e| panic!("{name} loads: {e}"));
        let rows: Vec<Row> = sweep
            .configs
            .iter()
            .map(|c| super::super::base_row(&c.config, c.hash.to_string(), String::new(), VerdictKind::Fits))
            .collect();
        (sweep, super::super::tests::report_of(rows))
    }

    /// exp9: the 3-level configs on two latents, the 4-level ones on the 4x
    /// latent alone, named `<config>_lat4x` / `_lat8x`.
    #[test]
    fn a_sweeps_configs_are_rows_without_the_part_that_names_their_column() {
        let (sweep, report) = report_of_experiment("exp9");
        let map = VerdictMap::new(&report, Family::Unet);
        assert_eq!(map.cols, ["8x32x32x20", "8x64x64x40"]);
        assert!(map.rows.iter().all(|r| !r.ends_with("_lat4x") && !r.ends_with("_lat8x")), "{:?}", map.rows);
        assert!(map.rows.contains(&"4L_tiny".to_string()), "{:?}", map.rows);
        // Every config has its cell; the six 4-level models (4L_maisi is
        // 4L_small) have none on the 8x latent.
        assert_eq!(map.len(), sweep.configs.len());
        assert_eq!(map.rows.len() * map.cols.len(), sweep.configs.len() + 6);
        // Wide enough for the longest label (no label cut at the left edge).
        let longest = map.rows.iter().map(|r| r.len() as u32).max().unwrap();
        assert!(map.left() >= longest * LABEL_CHAR_W);
    }

    /// The demo's two UNets: one input, so one column, and the narrowest canvas.
    #[test]
    fn the_title_fits_the_canvas() {
        let (_, report) = report_of_experiment("demo");
        for family in [Family::Unet, Family::Dit] {
            let map = VerdictMap::new(&report, family);
            let (w, _) = map.size();
            let lines = map.title_lines();
            assert!(lines.concat().contains("precheck verdict"), "{lines:?}");
            for line in &lines {
                // Drawn from x = 20, with as much margin on the right.
                let width = crate::plot::text_width(TITLE_SIZE, line);
                assert!(20.0 + width <= f64::from(w) - 20.0, "{family:?}: {line:?} is {width} px, canvas {w} px");
            }
        }
    }

    #[test]
    fn columns_sort_naturally() {
        let mut v = vec!["p8 64x64x40", "p2 128x128x80", "p2 64x64x40", "p4 64x64x40"];
        v.sort_by_key(|s| natural_key(s));
        assert_eq!(v, ["p2 64x64x40", "p2 128x128x80", "p4 64x64x40", "p8 64x64x40"]);
    }
}
