//! The stacked-bar plot of `explain --plot`: one bar per phase (forward/backward,
//! optimizer step), stacked by the terms of the breakdown, with the GPU capacity.
//!
//! SVG and PNG share the drawing code. plotters lays text out with a real font
//! even for SVG, and its `ttf` feature would link fontconfig (a system library
//! the build machines may lack), so the orchestrator uses the pure-Rust
//! `ab_glyph` renderer and loads a TrueType font at run time: `$ORCHESTRATOR_FONT`,
//! else what `fc-match sans-serif` names, else common system paths.

use plotters::coord::Shift;
use plotters::prelude::*;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use super::explain::{describe, Explanation, PhaseBreakdown};
use super::AdvisorError;
use crate::precheck::TermPhase;

const WIDTH: u32 = 1200;
/// Width of the chart; the legend takes the rest on the right.
const CHART_WIDTH: u32 = 700;
const HEIGHT: u32 = 700;
/// Terms drawn individually per bar; the rest are stacked as "other".
const MAX_SEGMENTS: usize = 10;

pub(crate) const PALETTE: [RGBColor; 20] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
    RGBColor(127, 127, 127),
    RGBColor(174, 199, 232),
    RGBColor(255, 187, 120),
    RGBColor(152, 223, 138),
    RGBColor(255, 152, 150),
    RGBColor(197, 176, 213),
    RGBColor(196, 156, 148),
    RGBColor(247, 182, 210),
    RGBColor(219, 219, 141),
    RGBColor(158, 218, 229),
    RGBColor(199, 199, 199),
];

/// Font files tried when neither `$ORCHESTRATOR_FONT` nor fontconfig name one.
const FONT_PATHS: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/liberation-sans/LiberationSans-Regular.ttf",
    "/usr/share/fonts/noto/NotoSans-Regular.ttf",
    "/usr/share/fonts/truetype/noto/NotoSans-Regular.ttf",
    "/System/Library/Fonts/Supplemental/Arial.ttf",
    "/Library/Fonts/Arial.ttf",
];

fn font_candidates() -> Vec<PathBuf> {
    let mut v = Vec::new();
    if let Some(p) = std::env::var_os("ORCHESTRATOR_FONT") {
        v.push(PathBuf::from(p));
    }
    if let Ok(out) = std::process::Command::new("fc-match").args(["--format=%{file}", "sans-serif"]).output() {
        if out.status.success() {
            let s = String::from_utf8_lossy(&out.stdout).trim().to_string();
            if !s.is_empty() {
                v.push(PathBuf::from(s));
            }
        }
    }
    v.extend(FONT_PATHS.iter().map(PathBuf::from));
    v
}

/// Register a sans-serif font with plotters once per process.
pub(crate) fn ensure_font() -> Result<(), AdvisorError> {
    static FONT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let r = FONT.get_or_init(|| {
        for p in font_candidates() {
            let Ok(bytes) = std::fs::read(&p) else { continue };
            // plotters keeps the font for the whole process: leaking once is the intent.
            let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
            if plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).is_ok() {
                return Ok(p);
            }
        }
        Err("no TrueType font found for the plot's text: set ORCHESTRATOR_FONT to a .ttf file".to_string())
    });
    r.as_ref().map(|_| ()).map_err(|e| AdvisorError::Plot(e.clone()))
}

/// Draw the explanation to `path` (`.svg` or `.png`).
pub fn plot(e: &Explanation, path: &Path) -> Result<(), AdvisorError> {
    ensure_font()?;
    let ext = path.extension().and_then(|s| s.to_str()).map(|s| s.to_ascii_lowercase());
    match ext.as_deref() {
        Some("svg") => {
            let root = SVGBackend::new(path, (WIDTH, HEIGHT)).into_drawing_area();
            draw(e, &root)?;
            root.present().map_err(|err| AdvisorError::Plot(format!("{}: {err}", path.display())))
        }
        Some("png") => {
            let mut buf = vec![0u8; (WIDTH * HEIGHT * 3) as usize];
            {
                let root = BitMapBackend::with_buffer(&mut buf, (WIDTH, HEIGHT)).into_drawing_area();
                draw(e, &root)?;
                root.present().map_err(|err| AdvisorError::Plot(err.to_string()))?;
            }
            write_png(path, &buf)
        }
        _ => Err(AdvisorError::BadArgument {
            what: "--plot",
            value: path.display().to_string(),
            why: "the file must end in .svg or .png".into(),
        }),
    }
}

fn write_png(path: &Path, rgb: &[u8]) -> Result<(), AdvisorError> {
    let err = |e: &dyn std::fmt::Display| AdvisorError::Plot(format!("{}: {e}", path.display()));
    let file = std::fs::File::create(path).map_err(|e| err(&e))?;
    let mut enc = png::Encoder::new(std::io::BufWriter::new(file), WIDTH, HEIGHT);
    enc.set_color(png::ColorType::Rgb);
    enc.set_depth(png::BitDepth::Eight);
    let mut w = enc.write_header().map_err(|e| err(&e))?;
    w.write_image_data(rgb).map_err(|e| err(&e))?;
    w.finish().map_err(|e| err(&e))
}

/// The stacked segments of one bar, bottom first: the terms resident in both
/// phases (weights, data, overhead: the same base under both bars), then this
/// phase's largest terms, then the rest as "other terms".
fn segments(b: &PhaseBreakdown) -> Vec<(String, f64)> {
    let both = b.lines.iter().filter(|l| l.phase == TermPhase::Both);
    let own = b.lines.iter().filter(|l| l.phase != TermPhase::Both);
    let ordered: Vec<_> = both.chain(own).collect();
    let mut v: Vec<(String, f64)> = ordered.iter().take(MAX_SEGMENTS).map(|l| (describe(l.name, l.level), l.gib)).collect();
    let rest: f64 = ordered.iter().skip(MAX_SEGMENTS).map(|l| l.gib).sum();
    if rest > 0.0 {
        v.push(("other terms".into(), rest));
    }
    v
}

fn draw<DB: DrawingBackend>(e: &Explanation, root: &DrawingArea<DB, Shift>) -> Result<(), AdvisorError> {
    let perr = |err: &dyn std::fmt::Display| AdvisorError::Plot(err.to_string());
    root.fill(&WHITE).map_err(|x| perr(&x))?;
    let (fwd, step) = match e.peak_phase {
        crate::precheck::PeakPhase::FwdBwd => (&e.peak, &e.other),
        crate::precheck::PeakPhase::Step => (&e.other, &e.peak),
    };
    let bars = [("forward/backward", segments(fwd)), ("optimizer step", segments(step))];
    let top = fwd.total_gib.max(step.total_gib);
    let show_capacity = e.capacity_gib <= top * 1.6;
    let ymax = if show_capacity { top.max(e.capacity_gib) * 1.08 } else { top * 1.15 };
    let title = format!("{}: predicted peak {:.1} GiB ({})", e.config, e.peak_gib, e.peak_phase.name());
    let root = root.titled(&title, ("sans-serif", 22)).map_err(|x| perr(&x))?;
    let (left, right) = root.split_horizontally(CHART_WIDTH);
    let mut chart = ChartBuilder::on(&left)
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..2f64, 0f64..ymax)
        .map_err(|x| perr(&x))?;
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
        .map_err(|x| perr(&x))?;
    // One colour per label across both bars; the legend lists each term once.
    let mut legend: Vec<(String, RGBColor)> = Vec::new();
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
                .map_err(|x| perr(&x))?;
            y += gib;
        }
        chart
            .draw_series(std::iter::once(Text::new(format!("{y:.1} GiB"), (x0 + 0.18, y + ymax * 0.01), ("sans-serif", 16))))
            .map_err(|x| perr(&x))?;
    }
    if show_capacity {
        let cap = e.capacity_gib;
        chart
            .draw_series(std::iter::once(PathElement::new(vec![(0.0, cap), (2.0, cap)], RED.stroke_width(2))))
            .map_err(|x| perr(&x))?;
        legend.push((format!("{} capacity {:.1} GiB", e.gpu, cap), RED));
    }
    // The legend, bottom-up stacking order listed top-down, with each term's size.
    let gib_of = |label: &str| {
        e.peak.lines.iter().chain(&e.other.lines).find(|l| describe(l.name, l.level) == label).map(|l| format!(" ({:.1} GiB)", l.gib)).unwrap_or_default()
    };
    for (i, (label, color)) in legend.iter().enumerate() {
        let y = 30 + 24 * i as i32;
        right.draw(&Rectangle::new([(10, y), (24, y + 14)], color.filled())).map_err(|x| perr(&x))?;
        right
            .draw(&Text::new(format!("{label}{}", gib_of(label)), (32, y), ("sans-serif", 15)))
            .map_err(|x| perr(&x))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::precheck::Predictor;

    #[test]
    fn writes_svg_and_png_or_says_why_not() {
        let cfg: spec::RunConfig = serde_json::from_value(serde_json::json!({
            "experiment": "t", "name": "3L",
            "model": {"family": "unet", "channels": [64, 128, 256], "attention_levels": [false, true, true], "num_head_channels": 64},
            "input": {"channels": 8, "spatial": [20, 32, 32]}, "out_channels": 4, "batch": 1,
            "precision": "bf16-amp", "grad_ckpt": false, "gpu": "A100-SXM4-80GB"
        }))
        .unwrap();
        let e = crate::advisor::explain::explain(&Predictor::pytorch(), &cfg).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let bad = plot(&e, &dir.path().join("x.pdf"));
        assert!(matches!(bad, Err(AdvisorError::BadArgument { .. }) | Err(AdvisorError::Plot(_))));
        if let Err(AdvisorError::Plot(why)) = ensure_font() {
            // A machine without any TrueType font: the error must say how to fix it.
            assert!(why.contains("ORCHESTRATOR_FONT"));
            return;
        }
        let svg = dir.path().join("x.svg");
        plot(&e, &svg).unwrap();
        let text = std::fs::read_to_string(&svg).unwrap();
        assert!(text.contains("<svg") && text.contains("attention scores at level 1"));
        let png = dir.path().join("x.png");
        plot(&e, &png).unwrap();
        let bytes = std::fs::read(&png).unwrap();
        assert_eq!(&bytes[1..4], b"PNG");
    }
}
