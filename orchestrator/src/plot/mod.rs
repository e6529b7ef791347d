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
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), PlotError>;
}

/// plotters' errors as a [`PlotError`] (they are generic over the backend).
pub fn perr<E: std::fmt::Display>(e: E) -> PlotError {
    PlotError(e.to_string())
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

/// The size in pixels of a figure's title.
pub const TITLE_SIZE: u32 = 20;
/// From one title line's top to the next.
pub const TITLE_LINE: u32 = 26;

/// How wide one line of `text` is at `size` px, as the PNG lays it out (the
/// font's advances and kerning); without a font, a generous estimate.
pub fn text_width(size: u32, text: &str) -> f64 {
    match font() {
        Ok(f) => f64::from(text::layout(f, f64::from(size), text).width),
        Err(_) => 0.65 * f64::from(size) * text.chars().count() as f64,
    }
}

/// `text` broken at spaces into lines at most `width` px wide at `size` (a
/// single word wider than that stands on a line of its own).
pub fn wrap(text: &str, size: u32, width: f64) -> Vec<String> {
    let mut lines = Vec::new();
    let mut line = String::new();
    for word in text.split(' ') {
        let longer = if line.is_empty() { word.to_string() } else { format!("{line} {word}") };
        if !line.is_empty() && text_width(size, &longer) > width {
            lines.push(std::mem::replace(&mut line, word.to_string()));
        } else {
            line = longer;
        }
    }
    lines.push(line);
    lines
}

/// Draws `lines` centred as the title at the top of `area` (20 px from its
/// top edge); returns the area below them.
pub fn draw_title<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    lines: &[String],
) -> Result<DrawingArea<DB, Shift>, PlotError> {
    use plotters::style::text_anchor::{HPos, Pos, VPos};
    let height = 20 + lines.len() as u32 * TITLE_LINE;
    let (title, rest) = area.split_vertically(height);
    let x = title.dim_in_pixel().0 as i32 / 2;
    let style = TextStyle::from(("sans-serif", TITLE_SIZE).into_font()).pos(Pos::new(HPos::Center, VPos::Top));
    for (i, line) in lines.iter().enumerate() {
        let y = 20 + (i as u32 * TITLE_LINE) as i32;
        title.draw(&Text::new(line.clone(), (x, y), style.clone())).map_err(perr)?;
    }
    Ok(rest)
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
    let err = |e: &dyn std::fmt::Display| PlotError(format!("{}: {e}", path.display()));
    let root = SVGBackend::new(path, fig.size()).into_drawing_area();
    fig.draw(&root).map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))
}

/// Writes `fig` as PNG to `path` (text drawn by [`text::GlyphText`]).
pub fn save_png(fig: &impl Figure, path: &Path) -> Result<(), PlotError> {
    let font = font()?;
    let err = |e: &dyn std::fmt::Display| PlotError(format!("{}: {e}", path.display()));
    let (w, h) = fig.size();
    let mut buf = vec![0u8; (w * h * 3) as usize];
    {
        let backend = text::GlyphText::new(BitMapBackend::with_buffer(&mut buf, (w, h)), font);
        let root = backend.into_drawing_area();
        fig.draw(&root).map_err(|e| err(&e))?;
        root.present().map_err(|e| err(&e))?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wrapped_lines_fit_and_keep_every_word() {
        let text = "UNet: precheck verdict (predicted peak) and what was measured; columns: input C x H x W x D";
        let lines = wrap(text, TITLE_SIZE, 400.0);
        assert!(lines.len() >= 2, "{lines:?}");
        assert!(lines.iter().all(|l| text_width(TITLE_SIZE, l) <= 400.0), "{lines:?}");
        assert_eq!(lines.join(" "), text);
        assert_eq!(wrap("short", TITLE_SIZE, 400.0), ["short"]);
    }
}
