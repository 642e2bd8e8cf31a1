//! `bunkai trace pages`: the memory-access distribution as a picture.
//!
//! The paper (§2.3, §3) reads its page tables as a working set: how many
//! pages each component touches and how often. This tool shows the same
//! data over time: x is time (the instruction index over all processes,
//! in trace order, bucketed into pixel columns), y is every page touched,
//! in address order, grouped into one band per component (labelled), in
//! two panels, instruction fetches above and data references below; the
//! colour of a cell is the logarithm of the references that fell into it.
//!
//! One layout is drawn on two canvases: SVG (rectangles and text, written
//! as text) and PNG (the same raster, with an 8x8 bitmap font for the
//! labels). Pages and components come from `report::analyze`, so the
//! picture and the tables always agree.

use crate::decode::{Item, Trace};
use crate::report::{analyze, Analysis, Kind, PAGE_SHIFT};
use anyhow::Result;
use rustc_hash::FxHashMap;
use std::fmt::Write as _;
use std::io::Write;
use std::ops::ControlFlow;
use std::path::Path;

/// The picture formats.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Format {
    Svg,
    Png,
}

impl Format {
    /// By the file's extension.
    pub fn of(path: &Path) -> Result<Format> {
        match path.extension().and_then(|e| e.to_str()).map(|e| e.to_ascii_lowercase()).as_deref() {
            Some("svg") => Ok(Format::Svg),
            Some("png") => Ok(Format::Png),
            _ => anyhow::bail!("{}: unknown picture format (name the output .svg or .png)", path.display()),
        }
    }
}

const MIN_W: u32 = 320;
const MIN_H: u32 = 240;
const MAX_SIDE: u32 = 4_000;
const TOP: u32 = 32;
const BOTTOM: u32 = 46;
const PANEL_TITLE: u32 = 16;
const PANEL_GAP: u32 = 10;
const RIGHT: u32 = 96;
const CHAR_W: u32 = 8;
const MIN_BAND: u32 = 10;

/// One component's rows in a panel.
#[derive(Debug, Clone)]
pub struct Band {
    /// The component.
    pub name: String,
    /// Pages (rows) in the band.
    pub pages: usize,
    /// Pixel rows.
    pub y0: u32,
    pub h: u32,
    /// First bucket (row of `Panel::cells`) and how many.
    pub b0: usize,
    pub nb: usize,
}

/// Code or data.
#[derive(Debug, Clone)]
pub struct Panel {
    pub title: String,
    pub y0: u32,
    pub h: u32,
    pub bands: Vec<Band>,
    pub pages: usize,
    /// buckets x columns reference counts.
    pub cells: Vec<u64>,
    pub max: u64,
}

/// The laid-out picture.
#[derive(Debug, Clone)]
pub struct Picture {
    pub width: u32,
    pub height: u32,
    pub title: String,
    pub x0: u32,
    pub cols: u32,
    pub total_instructions: u64,
    pub panels: Vec<Panel>,
}

/// Where the rows of one panel are: per stream, per component, page ->
/// bucket.
type RowMap = Vec<Vec<FxHashMap<u64, u32>>>;

impl Picture {
    /// Analyses the trace (two passes: counts, then cells) and lays out a
    /// `width` x `height` picture.
    pub fn build(trace: &Trace, width: u32, height: u32) -> Result<Picture> {
        if !(MIN_W..=MAX_SIDE).contains(&width) || !(MIN_H..=MAX_SIDE).contains(&height) {
            anyhow::bail!(
                "picture size {width}x{height} is out of range (give --width {MIN_W}..{MAX_SIDE} and --height {MIN_H}..{MAX_SIDE})"
            );
        }
        let a = analyze(trace)?;
        let order = component_order(&a);
        let label_chars = order.iter().map(|&c| a.comps.list[c].name.len() + 8).max().unwrap_or(10).clamp(12, 28);
        let x0 = label_chars as u32 * CHAR_W + 12;
        let cols = width.saturating_sub(x0 + RIGHT).max(16);
        let ns = trace.streams.len();
        let nc = a.comps.list.len();

        // Rows: the (address space, page) keys of each component, in
        // address order.
        let mut panels = Vec::new();
        let mut rows_of: Vec<RowMap> = Vec::new();
        let mut keys_of: Vec<Vec<Vec<(u64, usize)>>> = Vec::new();
        for data in [false, true] {
            let mut per_comp = Vec::new();
            for &c in &order {
                let mut keys: Vec<(u64, usize)> = Vec::new();
                for (s, sc) in a.streams.iter().enumerate() {
                    let m = if data { &sc.data[c] } else { &sc.code[c] };
                    keys.extend(m.keys().map(|&p| (p, s)));
                }
                keys.sort_unstable();
                per_comp.push(keys);
            }
            keys_of.push(per_comp);
        }
        let weights: Vec<f64> = keys_of
            .iter()
            .map(|p| p.iter().map(|k| k.len()).sum::<usize>() as f64)
            .map(|n| n.sqrt().max(1.0))
            .collect();
        let avail = height.saturating_sub(TOP + BOTTOM + 2 * PANEL_TITLE + PANEL_GAP).max(40);
        let h_code = ((avail as f64 * weights[0] / (weights[0] + weights[1])).round() as u32).clamp(20, avail - 20);
        let mut y = TOP;
        for (i, (title, h)) in
            [("instruction pages (code fetches)", h_code), ("data pages (loads, stores, modifies)", avail - h_code)]
                .into_iter()
                .enumerate()
        {
            let y0 = y + PANEL_TITLE;
            let (bands, rows) = layout_bands(&a, &order, &keys_of[i], y0, h, ns, nc);
            let nb: usize = bands.iter().map(|b| b.nb).sum();
            let pages = bands.iter().map(|b| b.pages).sum();
            panels.push(Panel { title: title.into(), y0, h, bands, pages, cells: vec![0; nb * cols as usize], max: 0 });
            rows_of.push(rows);
            y = y0 + h + PANEL_GAP;
        }

        fill_cells(trace, &a, &rows_of, &mut panels, cols)?;
        for p in &mut panels {
            p.max = p.cells.iter().copied().max().unwrap_or(0);
        }
        Ok(Picture {
            width,
            height,
            title: format!(
                "memory access distribution: {} ({} instructions)",
                trace.file.path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(),
                bunkai_common::fmt::commas(a.instructions)
            ),
            x0,
            cols,
            total_instructions: a.instructions,
            panels,
        })
    }

    /// Writes the picture via a temporary file and a rename.
    pub fn write(&self, out: &Path, format: Format) -> Result<()> {
        bunkai_common::files::write_atomic_with(out, |w| match format {
            Format::Svg => {
                w.write_all(self.svg().as_bytes())?;
                Ok(())
            }
            Format::Png => self.png(w),
        })
    }

    /// The picture as SVG text.
    pub fn svg(&self) -> String {
        let mut c = Svg { out: String::new() };
        let _ = writeln!(
            c.out,
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" viewBox=\"0 0 {w} {h}\" shape-rendering=\"crispEdges\" font-family=\"monospace\" font-size=\"11\">",
            w = self.width,
            h = self.height
        );
        self.draw(&mut c);
        c.out.push_str("</svg>\n");
        c.out
    }

    /// Writes the picture as PNG.
    pub fn png(&self, w: &mut dyn Write) -> Result<()> {
        let mut r = Raster { w: self.width, h: self.height, px: vec![255; (self.width * self.height * 3) as usize] };
        self.draw(&mut r);
        let mut enc = png::Encoder::new(w, self.width, self.height);
        enc.set_color(png::ColorType::Rgb);
        enc.set_depth(png::BitDepth::Eight);
        let mut wr = enc.write_header()?;
        wr.write_image_data(&r.px)?;
        wr.finish()?;
        Ok(())
    }

    fn draw(&self, c: &mut dyn Canvas) {
        let ink = [30, 30, 30];
        let grey = [150, 150, 150];
        let x1 = self.x0 + self.cols;
        c.rect(0, 0, self.width, self.height, [255, 255, 255]);
        c.text(8, 8, &self.title, ink, Anchor::Start);
        c.text(8, 18, "y: pages by address, a band per component; colour: log(refs per cell)", grey, Anchor::Start);
        for p in &self.panels {
            c.text(self.x0, p.y0 - PANEL_TITLE + 4, &p.title, ink, Anchor::Start);
            c.rect(self.x0 - 1, p.y0 - 1, self.cols + 2, p.h + 2, [200, 200, 200]);
            for (i, b) in p.bands.iter().enumerate() {
                let bg = if i % 2 == 0 { [255, 255, 255] } else { [242, 242, 246] };
                c.rect(self.x0, b.y0, self.cols, b.h, bg);
                if b.h >= 9 {
                    let suffix = format!(" ({})", b.pages);
                    let room = (self.x0.saturating_sub(12) / CHAR_W) as usize;
                    let room = room.saturating_sub(suffix.len()).max(4);
                    let name = if b.name.chars().count() > room {
                        b.name.chars().take(room - 1).collect::<String>() + "~"
                    } else {
                        b.name.clone()
                    };
                    let label = name + &suffix;
                    c.text(self.x0 - 6, b.y0 + (b.h - 8) / 2, &label, ink, Anchor::End);
                }
                // Cells, a run of equal colour at a time.
                for k in 0..b.nb {
                    let y0 = b.y0 + (k as u64 * b.h as u64 / b.nb as u64) as u32;
                    let y1 = b.y0 + ((k as u64 + 1) * b.h as u64 / b.nb as u64) as u32;
                    if y1 <= y0 {
                        continue;
                    }
                    let row = &p.cells[(b.b0 + k) * self.cols as usize..][..self.cols as usize];
                    let mut x = 0usize;
                    while x < row.len() {
                        let lv = level(row[x], p.max);
                        let mut e = x + 1;
                        while e < row.len() && level(row[e], p.max) == lv {
                            e += 1;
                        }
                        if let Some(lv) = lv {
                            c.rect(self.x0 + x as u32, y0, (e - x) as u32, y1 - y0, colour(lv));
                        }
                        x = e;
                    }
                }
            }
            if p.bands.is_empty() {
                c.text(self.x0 + 8, p.y0 + p.h / 2 - 4, "no pages recorded", grey, Anchor::Start);
            }
            for b in p.bands.iter().skip(1) {
                c.rect(self.x0 - 4, b.y0, self.cols + 4, 1, [170, 170, 170]);
            }
            self.legend(c, p, x1 + 14);
        }
        // Time axis.
        let axis_y = self.panels.last().map_or(TOP, |p| p.y0 + p.h) + 3;
        c.rect(self.x0, axis_y, self.cols, 1, ink);
        for i in 0..=4u64 {
            let x = self.x0 + (i * (self.cols as u64 - 1) / 4) as u32;
            c.rect(x, axis_y, 1, 5, ink);
            let t = self.total_instructions * i / 4;
            let anchor = match i {
                0 => Anchor::Start,
                4 => Anchor::End,
                _ => Anchor::Middle,
            };
            c.text(x, axis_y + 8, &human(t), ink, anchor);
        }
        c.text(
            self.x0 + self.cols / 2,
            axis_y + 24,
            "time: instructions executed (all processes, in trace order)",
            ink,
            Anchor::Middle,
        );
    }

    fn legend(&self, c: &mut dyn Canvas, p: &Panel, x: u32) {
        let h = p.h.clamp(20, 120);
        let steps = h.max(1);
        for i in 0..steps {
            let t = 1.0 - i as f64 / (steps - 1).max(1) as f64;
            c.rect(x, p.y0 + i, 12, 1, colour(t));
        }
        let ink = [30, 30, 30];
        c.text(x + 16, p.y0, &human(p.max.max(1)), ink, Anchor::Start);
        if p.max > 1 {
            c.text(x + 16, p.y0 + h - 8, "1", ink, Anchor::Start);
        }
        if h >= 40 {
            c.text(x, p.y0 + h + 4, "refs/cell", ink, Anchor::Start);
            c.text(x, p.y0 + h + 14, "(log)", ink, Anchor::Start);
        }
    }
}

/// Components with instructions, as the report orders them.
fn component_order(a: &Analysis) -> Vec<usize> {
    let instr = |c: usize| a.streams.iter().map(|s| s.instructions_by[c]).sum::<u64>();
    let mut v: Vec<(bool, std::cmp::Reverse<u64>, usize)> = (0..a.comps.list.len())
        .map(|c| (a.comps.list[c].kind != Kind::Program, std::cmp::Reverse(instr(c)), c))
        .filter(|&(_, std::cmp::Reverse(n), _)| n > 0)
        .collect();
    v.sort_by(|x, y| (x.0, x.1, &a.comps.list[x.2].name).cmp(&(y.0, y.1, &a.comps.list[y.2].name)));
    v.into_iter().map(|x| x.2).collect()
}

/// Band heights (at least MIN_BAND where there is room, the rest in
/// proportion to the pages) and the page -> bucket maps.
#[allow(clippy::too_many_arguments)]
fn layout_bands(
    a: &Analysis,
    order: &[usize],
    keys: &[Vec<(u64, usize)>],
    y0: u32,
    h: u32,
    ns: usize,
    nc: usize,
) -> (Vec<Band>, RowMap) {
    let mut rows: RowMap = (0..ns).map(|_| vec![FxHashMap::default(); nc]).collect();
    let used: Vec<(usize, &Vec<(u64, usize)>)> =
        order.iter().zip(keys).filter(|(_, k)| !k.is_empty()).map(|(&c, k)| (c, k)).collect();
    let mut bands = Vec::new();
    if used.is_empty() {
        return (bands, rows);
    }
    let n = used.len() as u32;
    let min = MIN_BAND.min(h / n).max(1);
    let spare = h.saturating_sub(min * n) as f64;
    let total: f64 = used.iter().map(|(_, k)| k.len() as f64).sum();
    let (mut y, mut b0, mut acc) = (y0, 0usize, 0.0f64);
    for (i, (c, k)) in used.iter().enumerate() {
        acc += k.len() as f64;
        // Cumulative rounding keeps the bands filling the panel exactly.
        let end = if i + 1 == used.len() { y0 + h } else { y0 + min * (i as u32 + 1) + (spare * acc / total) as u32 };
        let bh = end.saturating_sub(y).max(1);
        let nb = k.len().min(bh as usize).max(1);
        for (r, &(page, s)) in k.iter().enumerate() {
            rows[s][*c].insert(page, (b0 + r * nb / k.len()) as u32);
        }
        let name = a.comps.list[*c].name.clone();
        bands.push(Band { name, pages: k.len(), y0: y, h: bh, b0, nb });
        y += bh;
        b0 += nb;
    }
    (bands, rows)
}

/// (bucket, instructions) of one segment's code.
type SegCells = Vec<(u32, u32)>;

/// Second pass: adds every instruction and reference to its cell.
fn fill_cells(trace: &Trace, a: &Analysis, rows: &[RowMap], panels: &mut [Panel], cols: u32) -> Result<()> {
    let total = a.instructions.max(1);
    let cols64 = cols as u64;
    // Per stream, per segment: (bucket, instructions) of its code, made on
    // first execution.
    let mut code: Vec<Vec<Option<SegCells>>> = trace.streams.iter().map(|s| vec![None; s.segs.len()]).collect();
    let all: Vec<usize> = (0..trace.streams.len()).collect();
    let (code_panel, data_panel) = panels.split_at_mut(1);
    let (code_panel, data_panel) = (&mut code_panel[0], &mut data_panel[0]);
    let mut last = (usize::MAX, u32::MAX, u64::MAX, None::<u32>);
    trace.visit(&all, |pos, item| {
        let Item::Exec { seg, seg_pos, addrs } = item else { return ControlFlow::Continue(()) };
        let s = pos.stream;
        let col = ((pos.global as u128 * cols64 as u128 / total as u128) as u64).min(cols64 - 1) as usize;
        let cells = code[s][seg_pos].get_or_insert_with(|| {
            let mut v: Vec<(u32, u32)> = Vec::new();
            for (insn, &c) in seg.insns.iter().zip(&a.comps.insn[s][seg_pos]) {
                if let Some(&b) = rows[0][s][c as usize].get(&(insn.addr >> PAGE_SHIFT)) {
                    match v.last_mut() {
                        Some((lb, n)) if *lb == b => *n += 1,
                        _ => v.push((b, 1)),
                    }
                }
            }
            v
        });
        for &(b, n) in cells.iter() {
            if let Some(x) = code_panel.cells.get_mut(b as usize * cols as usize + col) {
                *x += n as u64;
            }
        }
        for (&addr, &c) in addrs.iter().zip(&a.comps.acc[s][seg_pos]) {
            let page = addr >> PAGE_SHIFT;
            let b = if (s, c, page) == (last.0, last.1, last.2) {
                last.3
            } else {
                let b = rows[1][s][c as usize].get(&page).copied();
                last = (s, c, page, b);
                b
            };
            if let Some(x) = b.and_then(|b| data_panel.cells.get_mut(b as usize * cols as usize + col)) {
                *x += 1;
            }
        }
        ControlFlow::Continue(())
    })?;
    Ok(())
}

/// The colour level of a count: log(count) / log(max), None for 0,
/// quantised to 64 steps.
fn level(n: u64, max: u64) -> Option<u8> {
    if n == 0 {
        return None;
    }
    if max <= 1 {
        return Some(63);
    }
    let t = (n as f64).ln() / (max as f64).ln();
    Some((t.clamp(0.0, 1.0) * 63.0).round() as u8)
}

/// Pale yellow (few references) through orange and red to dark purple.
fn colour(level: impl Into<Level>) -> [u8; 3] {
    let t = level.into().0.clamp(0.0, 1.0);
    const STOPS: [(f64, [f64; 3]); 5] = [
        (0.0, [252.0, 224.0, 120.0]),
        (0.3, [253.0, 141.0, 60.0]),
        (0.55, [227.0, 26.0, 28.0]),
        (0.8, [128.0, 0.0, 98.0]),
        (1.0, [40.0, 0.0, 50.0]),
    ];
    for w in STOPS.windows(2) {
        let ((t0, c0), (t1, c1)) = (w[0], w[1]);
        if t <= t1 {
            let f = (t - t0) / (t1 - t0);
            return [0, 1, 2].map(|i| (c0[i] + (c1[i] - c0[i]) * f).round() as u8);
        }
    }
    [40, 0, 50]
}

struct Level(f64);
impl From<u8> for Level {
    fn from(l: u8) -> Self {
        Level(l as f64 / 63.0)
    }
}
impl From<f64> for Level {
    fn from(t: f64) -> Self {
        Level(t)
    }
}

/// 1234567 -> "1.2M".
fn human(n: u64) -> String {
    match n {
        0..=9_999 => n.to_string(),
        10_000..=999_999 => format!("{:.1}k", n as f64 / 1e3),
        1_000_000..=999_999_999 => format!("{:.1}M", n as f64 / 1e6),
        _ => format!("{:.1}G", n as f64 / 1e9),
    }
}

// ---------------------------------------------------------------------------
// Canvases

#[derive(Clone, Copy)]
enum Anchor {
    Start,
    Middle,
    End,
}

trait Canvas {
    fn rect(&mut self, x: u32, y: u32, w: u32, h: u32, rgb: [u8; 3]);
    /// Text whose top edge is at `y`, 8 pixels high.
    fn text(&mut self, x: u32, y: u32, s: &str, rgb: [u8; 3], anchor: Anchor);
}

struct Svg {
    out: String,
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

impl Canvas for Svg {
    fn rect(&mut self, x: u32, y: u32, w: u32, h: u32, c: [u8; 3]) {
        let _ = writeln!(
            self.out,
            "<rect x=\"{x}\" y=\"{y}\" width=\"{w}\" height=\"{h}\" fill=\"#{:02x}{:02x}{:02x}\"/>",
            c[0], c[1], c[2]
        );
    }
    fn text(&mut self, x: u32, y: u32, s: &str, c: [u8; 3], anchor: Anchor) {
        let a = match anchor {
            Anchor::Start => "start",
            Anchor::Middle => "middle",
            Anchor::End => "end",
        };
        let _ = writeln!(
            self.out,
            "<text x=\"{x}\" y=\"{}\" text-anchor=\"{a}\" fill=\"#{:02x}{:02x}{:02x}\">{}</text>",
            y + 8,
            c[0],
            c[1],
            c[2],
            esc(s)
        );
    }
}

struct Raster {
    w: u32,
    h: u32,
    px: Vec<u8>,
}

impl Raster {
    fn put(&mut self, x: u32, y: u32, c: [u8; 3]) {
        if x < self.w && y < self.h {
            let i = ((y * self.w + x) * 3) as usize;
            self.px[i..i + 3].copy_from_slice(&c);
        }
    }
}

impl Canvas for Raster {
    fn rect(&mut self, x: u32, y: u32, w: u32, h: u32, c: [u8; 3]) {
        for yy in y..y.saturating_add(h).min(self.h) {
            for xx in x..x.saturating_add(w).min(self.w) {
                self.put(xx, yy, c);
            }
        }
    }
    fn text(&mut self, x: u32, y: u32, s: &str, c: [u8; 3], anchor: Anchor) {
        let width = s.chars().count() as u32 * CHAR_W;
        let x = match anchor {
            Anchor::Start => x,
            Anchor::Middle => x.saturating_sub(width / 2),
            Anchor::End => x.saturating_sub(width),
        };
        for (i, ch) in s.chars().enumerate() {
            let g = font8x8::legacy::BASIC_LEGACY[if (ch as u32) < 128 { ch as usize } else { b'?' as usize }];
            for (row, bits) in g.iter().enumerate() {
                for col in 0..8 {
                    if bits & (1 << col) != 0 {
                        self.put(x + i as u32 * CHAR_W + col, y + row as u32, c);
                    }
                }
            }
        }
    }
}
