//! What every figure of the orchestrator shares: the font, the SVG + PNG
//! writer, the colours, and log axes whose ticks cover the data.
//!
//! plotters lays text out with a real font even for SVG, and its `ttf` feature
//! would link fontconfig (a system library the build machines may lack), so the
//! orchestrator uses the pure-Rust `ab_glyph` renderer and loads a TrueType font
//! at run time: `$ORCHESTRATOR_FONT`, else what `fc-match sans-serif` names,
//! else common system paths. Bitmap text is drawn by [`text::GlyphText`]
//! (plotters' own ab_glyph drawing drops each glyph's side bearing).

pub mod axis;
pub mod text;

use plotters::coord::Shift;
use plotters::prelude::*;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// Why a figure could not be written. The message is one line.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct PlotError(pub String);

/// Something drawable on any plotters backend at a fixed size.
pub trait Figure {
    fn size(&self) -> (u32, u32);
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), String>;
}

/// plotters' errors as text (they are generic over the backend).
pub fn perr<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

pub const PALETTE: [RGBColor; 20] = [
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

/// The font every figure uses, registered with plotters as `sans-serif` once per process.
pub fn font() -> Result<&'static ab_glyph::FontRef<'static>, PlotError> {
    static FONT: OnceLock<Result<ab_glyph::FontRef<'static>, String>> = OnceLock::new();
    let r = FONT.get_or_init(|| {
        for p in font_candidates() {
            let Ok(bytes) = std::fs::read(&p) else { continue };
            // plotters keeps the font for the whole process: leaking once is the intent.
            let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
            let Ok(font) = ab_glyph::FontRef::try_from_slice(bytes) else { continue };
            if plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).is_ok() {
                return Ok(font);
            }
        }
        Err("no TrueType font found for the plot's text: set ORCHESTRATOR_FONT to a .ttf file".to_string())
    });
    r.as_ref().map_err(|e| PlotError(e.clone()))
}

/// Writes `fig` to `<stem>.svg` and `<stem>.png`; returns both paths.
pub fn save(fig: &impl Figure, stem: &Path) -> Result<Vec<PathBuf>, PlotError> {
    let svg = stem.with_extension("svg");
    let png = stem.with_extension("png");
    save_svg(fig, &svg)?;
    save_png(fig, &png)?;
    Ok(vec![svg, png])
}

/// Writes `fig` as SVG to `path`.
pub fn save_svg(fig: &impl Figure, path: &Path) -> Result<(), PlotError> {
    font()?;
    let err = |e: String| PlotError(format!("{}: {e}", path.display()));
    let root = SVGBackend::new(path, fig.size()).into_drawing_area();
    fig.draw(&root).map_err(err)?;
    root.present().map_err(|e| err(e.to_string()))
}

/// Writes `fig` as PNG to `path` (text drawn by [`text::GlyphText`]).
pub fn save_png(fig: &impl Figure, path: &Path) -> Result<(), PlotError> {
    let font = font()?;
    let err = |e: String| PlotError(format!("{}: {e}", path.display()));
    let (w, h) = fig.size();
    let mut buf = vec![0u8; (w * h * 3) as usize];
    {
        let backend = text::GlyphText::new(BitMapBackend::with_buffer(&mut buf, (w, h)), font);
        let root = backend.into_drawing_area();
        fig.draw(&root).map_err(err)?;
        root.present().map_err(|e| err(e.to_string()))?;
    }
    write_png(path, w, h, &buf)
}

/// An RGB buffer as a PNG file (the `png` crate directly; no `image` dependency).
pub fn write_png(path: &Path, w: u32, h: u32, rgb: &[u8]) -> Result<(), PlotError> {
    let err = |e: &dyn std::fmt::Display| PlotError(format!("{}: {e}", path.display()));
    let file = std::fs::File::create(path).map_err(|e| err(&e))?;
    let mut enc = png::Encoder::new(std::io::BufWriter::new(file), w, h);
    enc.set_color(png::ColorType::Rgb);
    enc.set_depth(png::BitDepth::Eight);
    enc.set_compression(png::Compression::Best);
    let mut wr = enc.write_header().map_err(|e| err(&e))?;
    wr.write_image_data(rgb).map_err(|e| err(&e))?;
    wr.finish().map_err(|e| err(&e))
}
