//! Pictures: what trace's and flow's plotters charts share.
//!
//! plotters lays text out with ab_glyph from a font it is given: DejaVu
//! Sans (Debian's fonts-dejavu-core), embedded at build time, so that a
//! picture is laid out the same on every machine and nothing is looked up
//! (no fontconfig) when bunkai runs. The font is registered by the first
//! picture a command draws, never at start-up.

use plotters::style::FontStyle;

/// The family every label is drawn in; SVG text names it, and viewers
/// use their own sans-serif.
pub const FAMILY: &str = "sans-serif";

static DEJAVU_SANS: &[u8] = include_bytes!("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf");

/// Registers the embedded font (once); call before drawing.
pub fn font() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let ok = plotters::style::register_font(FAMILY, FontStyle::Normal, DEJAVU_SANS).is_ok();
        assert!(ok, "the embedded DejaVu Sans does not parse");
    });
}

/// A plotters error as one line.
pub fn err<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow::anyhow!("drawing the picture: {e:?}")
}

/// A tick value for people: 0, 250, 2k, 2.5k, 1.2M, 3G (plotters puts ticks
/// on round values, so one decimal is enough).
pub fn si(v: f64) -> String {
    let a = v.abs();
    let (x, unit) = match a {
        a if a >= 1e9 => (v / 1e9, "G"),
        a if a >= 1e6 => (v / 1e6, "M"),
        a if a >= 1e3 => (v / 1e3, "k"),
        _ => (v, ""),
    };
    let s = if (x - x.round()).abs() < 1e-9 { format!("{}", x.round()) } else { format!("{x:.1}") };
    let s = if s.contains('.') { s.trim_end_matches('0').trim_end_matches('.').to_string() } else { s };
    format!("{s}{unit}")
}

/// A number of microseconds for a tick: 0, 0.25, 12, 1,500.
pub fn us(v: f64) -> String {
    if v == 0.0 {
        "0".into()
    } else if v.abs() >= 1000.0 {
        crate::fmt::commas(v.round() as u64)
    } else if v.abs() >= 10.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.3}").trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_read_as_round_numbers() {
        assert_eq!(si(0.0), "0");
        assert_eq!(si(250.0), "250");
        assert_eq!(si(2_000.0), "2k");
        assert_eq!(si(2_500.0), "2.5k");
        assert_eq!(si(25_000.0), "25k");
        assert_eq!(si(1_200_000.0), "1.2M");
        assert_eq!(si(3e9), "3G");
        assert_eq!(us(0.25), "0.25");
        assert_eq!(us(12.0), "12");
        assert_eq!(us(1500.0), "1,500");
    }

    #[test]
    fn the_font_registers_and_measures_text() {
        font();
        font();
        let f = plotters::style::FontDesc::new(plotters::style::FontFamily::Name(FAMILY), 12.0, FontStyle::Normal);
        let (w, h) = f.box_size("libc.so.6").unwrap();
        assert!(w > 30 && w < 90 && h > 5, "{w}x{h}");
    }
}
