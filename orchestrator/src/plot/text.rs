//! Bitmap text with each glyph where the font puts it.
//!
//! plotters 0.3.7 draws `ab_glyph` text by placing every outline at the pen
//! position, ignoring the outline's left side bearing, so glyphs with a wide
//! bearing crowd the previous one and a space after `T` all but vanishes
//! (`DiTh64` for `DiT h64`). [`GlyphText`] wraps a backend and lays text out
//! itself (advance widths, kerning, bearings); everything else passes through.

use ab_glyph::{point, Font, FontRef, Glyph, PxScale, ScaleFont};
use plotters_backend::text_anchor::{HPos, VPos};
use plotters_backend::{BackendColor, BackendCoord, BackendStyle, BackendTextStyle, DrawingBackend, DrawingErrorKind};

/// A backend whose text is laid out by [`layout`].
pub struct GlyphText<'f, B> {
    inner: B,
    font: &'f FontRef<'static>,
}

impl<'f, B> GlyphText<'f, B> {
    pub fn new(inner: B, font: &'f FontRef<'static>) -> Self {
        GlyphText { inner, font }
    }
}

/// One line of text, positioned with its top-left corner at (0, 0).
pub struct Layout {
    pub glyphs: Vec<Glyph>,
    pub width: f32,
    pub height: f32,
}

/// Lay `text` out at `size` pixels (plotters' meaning of a font size: the
/// height from descender to ascender): pen advances, kerning, baseline at the ascent.
pub fn layout(font: &FontRef<'static>, size: f64, text: &str) -> Layout {
    let scale = PxScale::from(size as f32);
    let f = font.as_scaled(scale);
    let mut caret = 0.0f32;
    let mut prev = None;
    let mut glyphs = Vec::with_capacity(text.len());
    for c in text.chars().filter(|c| !c.is_control()) {
        let id = f.glyph_id(c);
        if let Some(p) = prev {
            caret += f.kern(p, id);
        }
        glyphs.push(id.with_scale_and_position(scale, point(caret, f.ascent())));
        caret += f.h_advance(id);
        prev = Some(id);
    }
    Layout { glyphs, width: caret, height: f.ascent() - f.descent() }
}

impl<B: DrawingBackend> DrawingBackend for GlyphText<'_, B> {
    type ErrorType = B::ErrorType;

    fn get_size(&self) -> (u32, u32) {
        self.inner.get_size()
    }
    fn ensure_prepared(&mut self) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.inner.ensure_prepared()
    }
    fn present(&mut self) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.inner.present()
    }
    fn draw_pixel(
        &mut self,
        point: BackendCoord,
        color: BackendColor,
    ) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.inner.draw_pixel(point, color)
    }
    fn draw_line<S: BackendStyle>(
        &mut self,
        from: BackendCoord,
        to: BackendCoord,
        style: &S,
    ) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.inner.draw_line(from, to, style)
    }
    fn draw_rect<S: BackendStyle>(
        &mut self,
        upper_left: BackendCoord,
        bottom_right: BackendCoord,
        style: &S,
        fill: bool,
    ) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.inner.draw_rect(upper_left, bottom_right, style, fill)
    }
    fn draw_path<S: BackendStyle, I: IntoIterator<Item = BackendCoord>>(
        &mut self,
        path: I,
        style: &S,
    ) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.inner.draw_path(path, style)
    }
    fn draw_circle<S: BackendStyle>(
        &mut self,
        center: BackendCoord,
        radius: u32,
        style: &S,
        fill: bool,
    ) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.inner.draw_circle(center, radius, style, fill)
    }
    fn fill_polygon<S: BackendStyle, I: IntoIterator<Item = BackendCoord>>(
        &mut self,
        vert: I,
        style: &S,
    ) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.inner.fill_polygon(vert, style)
    }
    fn blit_bitmap(
        &mut self,
        pos: BackendCoord,
        size: (u32, u32),
        src: &[u8],
    ) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.inner.blit_bitmap(pos, size, src)
    }

    fn estimate_text_size<S: BackendTextStyle>(
        &self,
        text: &str,
        style: &S,
    ) -> Result<(u32, u32), DrawingErrorKind<Self::ErrorType>> {
        let l = layout(self.font, style.size(), text);
        Ok((l.width.ceil() as u32, l.height.ceil() as u32))
    }

    fn draw_text<S: BackendTextStyle>(
        &mut self,
        text: &str,
        style: &S,
        pos: BackendCoord,
    ) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        let color = style.color();
        if color.alpha == 0.0 {
            return Ok(());
        }
        let l = layout(self.font, style.size(), text);
        let (w, h) = (l.width.round() as i32, l.height.round() as i32);
        let dx = match style.anchor().h_pos {
            HPos::Left => 0,
            HPos::Right => -w,
            HPos::Center => -w / 2,
        };
        let dy = match style.anchor().v_pos {
            VPos::Top => 0,
            VPos::Center => -h / 2,
            VPos::Bottom => -h,
        };
        let trans = style.transform();
        let (cw, ch) = self.get_size();
        let mut pixels = Vec::new();
        for g in l.glyphs {
            let Some(outline) = self.font.outline_glyph(g) else { continue };
            let b = outline.px_bounds();
            let (x0, y0) = (b.min.x as i32, b.min.y as i32);
            outline.draw(|x, y, coverage| {
                if coverage > 0.0 {
                    pixels.push((x0 + x as i32, y0 + y as i32, coverage));
                }
            });
        }
        for (x, y, coverage) in pixels {
            let (tx, ty) = trans.transform(x + dx, y + dy);
            let (px, py) = (pos.0 + tx, pos.1 + ty);
            if px >= 0 && py >= 0 && px < cw as i32 && py < ch as i32 {
                let c = BackendColor { alpha: color.alpha * coverage.min(1.0) as f64, rgb: color.rgb };
                self.inner.draw_pixel((px, py), c)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use plotters::style::IntoFont;

    /// Columns of a rendered line that hold ink, as runs: (first, last) column.
    fn ink_runs(text: &str) -> Option<Vec<(u32, u32)>> {
        let font = super::super::font().ok()?;
        let (w, h) = (400u32, 40u32);
        let mut buf = vec![255u8; (w * h * 3) as usize];
        {
            let mut b = GlyphText::new(plotters::prelude::BitMapBackend::with_buffer(&mut buf, (w, h)), font);
            let style = plotters::style::TextStyle::from(("sans-serif", 20).into_font());
            b.draw_text(text, &style, (10, 10)).ok()?;
            b.present().ok()?;
        }
        let inked: Vec<bool> = (0..w).map(|x| (0..h).any(|y| buf[((y * w + x) * 3) as usize] < 160)).collect();
        let mut runs = Vec::new();
        let mut start = None;
        for (x, &on) in inked.iter().enumerate() {
            match (on, start) {
                (true, None) => start = Some(x as u32),
                (false, Some(s)) => {
                    runs.push((s, x as u32 - 1));
                    start = None;
                }
                _ => {}
            }
        }
        Some(runs)
    }

    #[test]
    fn a_space_after_a_capital_t_stays_visible() {
        // Without any TrueType font on the machine there is no text to lay out;
        // `font()` then names ORCHESTRATOR_FONT, which plot tests check.
        let Some(with_space) = ink_runs("T h") else { return };
        let without = ink_runs("Th").expect("same font");
        // `T` and `h` are two separate runs of ink; the space widens the gap
        // between them by about its advance (20 px font: ~6 px).
        assert_eq!(with_space.len(), 2, "{with_space:?}");
        let gap = with_space[1].0 - with_space[0].1;
        let tight = without.get(1).map(|r| r.0 - without[0].1).unwrap_or(0);
        assert!(gap >= tight + 4, "gap with a space {gap} px, without {tight} px");
    }

    #[test]
    fn layout_advances_and_includes_bearings() {
        let Ok(font) = super::super::font() else { return };
        let l = layout(font, 20.0, "ab");
        assert_eq!(l.glyphs.len(), 2);
        assert!(l.glyphs[1].position.x > 5.0 && l.width > l.glyphs[1].position.x);
        assert!((l.height - 20.0).abs() < 1.0, "{}", l.height);
    }
}
