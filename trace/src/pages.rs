//! `bunkai trace pages`: the memory-access distribution as a picture.
//!
//! The paper (§2.3, §3) reads its page tables as a working set: how many
//! pages each component touches and how often. This tool shows the same
//! data over time: x is time (the instruction index over all processes,
//! in trace order, bucketed into columns), y is every page touched, in
//! address order, grouped into one band per component (labelled with its
//! pages), in two panels, instruction fetches above and data references
//! below; the colour of a cell is the logarithm of the references that
//! fell into it, read on the colour scale beside each panel.
//!
//! Drawn with plotters: its SVG backend for .svg, its bitmap backend into
//! an RGB buffer (encoded with `png`) for .png, one drawing for both, with
//! round ticks on the time axis and the scale, and titled axes. The heat
//! map is drawn as cells, never a mark per reference: a PNG cell is one
//! pixel column by one bucket of pages; an SVG merges 4x4 of them and a
//! run of equal colour along a row is one rectangle, so that the SVG of a
//! request stays in the tens of kilobytes (one rectangle per pixel run
//! made 2 MB). Pages and components come from `report::analyze`, so the
//! picture and the tables always agree.

use crate::decode::{Item, Trace};
use crate::report::{analyze, Analysis, Kind, PAGE_SHIFT};
use anyhow::Result;
use bunkai_common::plot::{self, FAMILY};
use plotters::coord::combinators::IntoLogRange;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use plotters::style::{FontDesc, FontFamily, FontStyle};
use rustc_hash::FxHashMap;
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
/// The title and the line under it.
const TOP: u32 = 44;
/// A panel's title, above its plot.
const PANEL_TITLE: u32 = 20;
/// The tick labels under each panel's plot.
const TICKS: u32 = 22;
/// The time axis' title under the lower panel.
const X_DESC: u32 = 22;
const PANEL_GAP: u32 = 6;
const BOTTOM: u32 = 4;
/// The colour scales and their labels, right of the plots.
const RIGHT: u32 = 124;
/// The rotated title of the pages axis, left of the band labels.
const Y_DESC: u32 = 24;
/// Blank at the picture's left and right edges.
const EDGE: u32 = 8;
const MIN_BAND: u32 = 10;
/// Pixels a side of an SVG cell (4x4 PNG cells).
const SVG_CELL: u32 = 4;
/// Text sizes (pixels).
const LABEL: f64 = 11.0;
const AXIS_TITLE: f64 = 12.0;

/// One component's rows in a panel.
#[derive(Debug, Clone)]
pub struct Band {
    /// The component.
    pub name: String,
    /// Pages (rows) in the band.
    pub pages: usize,
    /// Its label on the pages axis: the name (shortened to fit) and pages.
    pub label: String,
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
    /// The plot's top pixel row and height.
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
    /// The plots' left pixel column and width (one cell column a pixel).
    pub x0: u32,
    pub cols: u32,
    pub total_instructions: u64,
    pub panels: Vec<Panel>,
}

/// Where the rows of one panel are: per stream, per component, page ->
/// bucket.
type RowMap = Vec<Vec<FxHashMap<u64, u32>>>;

/// The width of a label in pixels, as plotters lays it out.
fn text_width(s: &str, size: f64) -> u32 {
    plot::font();
    FontDesc::new(FontFamily::Name(FAMILY), size, FontStyle::Normal).box_size(s).map_or(s.len() as u32 * 7, |(w, _)| w)
}

/// `name (pages)`, the name shortened with an ellipsis to fit `room` pixels.
fn band_label(name: &str, pages: usize, room: u32) -> String {
    let suffix = format!(" ({pages})");
    let mut n: Vec<char> = name.chars().collect();
    let mut label = format!("{name}{suffix}");
    while n.len() > 4 && text_width(&label, LABEL) > room {
        n.pop();
        label = format!("{}…{suffix}", n.iter().collect::<String>());
    }
    label
}

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
        let ns = trace.streams.len();
        let nc = a.comps.list.len();

        // Rows: the (address space, page) keys of each component, in
        // address order.
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
        // The band labels' room: at most a third of the width.
        let room = width / 3;
        let label_w = keys_of
            .iter()
            .flat_map(|p| p.iter().zip(&order).filter(|(k, _)| !k.is_empty()))
            .map(|(k, &c)| text_width(&band_label(&a.comps.list[c].name, k.len(), room), LABEL))
            .max()
            .unwrap_or(40);
        let x0 = EDGE + Y_DESC + label_w + 12;
        let cols = width.saturating_sub(x0 + RIGHT).max(16);

        let weights: Vec<f64> = keys_of
            .iter()
            .map(|p| p.iter().map(|k| k.len()).sum::<usize>() as f64)
            .map(|n| n.sqrt().max(1.0))
            .collect();
        let avail = height.saturating_sub(TOP + 2 * PANEL_TITLE + 2 * TICKS + X_DESC + PANEL_GAP + BOTTOM).max(40);
        let h_code = ((avail as f64 * weights[0] / (weights[0] + weights[1])).round() as u32).clamp(20, avail - 20);
        let mut panels = Vec::new();
        let mut y = TOP;
        for (i, (title, h)) in
            [("instruction pages (code fetches)", h_code), ("data pages (loads, stores, modifies)", avail - h_code)]
                .into_iter()
                .enumerate()
        {
            let y0 = y + PANEL_TITLE;
            let (mut bands, rows) = layout_bands(&a, &order, &keys_of[i], y0, h, ns, nc);
            for b in &mut bands {
                b.label = band_label(&b.name, b.pages, room);
            }
            let nb: usize = bands.iter().map(|b| b.nb).sum();
            let pages = bands.iter().map(|b| b.pages).sum();
            panels.push(Panel { title: title.into(), y0, h, bands, pages, cells: vec![0; nb * cols as usize], max: 0 });
            rows_of.push(rows);
            y = y0 + h + TICKS + PANEL_GAP;
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
        let svg = if format == Format::Svg { Some(self.svg()?) } else { None };
        bunkai_common::files::write_atomic_with(out, |w| match &svg {
            Some(text) => {
                w.write_all(text.as_bytes())?;
                Ok(())
            }
            None => self.png(w),
        })
    }

    /// The picture as SVG text (cells merged 4x4).
    pub fn svg(&self) -> Result<String> {
        let mut out = String::new();
        {
            let root = SVGBackend::with_string(&mut out, (self.width, self.height)).into_drawing_area();
            self.draw(&root, SVG_CELL, 16)?;
            root.present().map_err(plot::err)?;
        }
        Ok(out)
    }

    /// Writes the picture as PNG.
    pub fn png(&self, w: &mut dyn Write) -> Result<()> {
        let mut px = vec![255u8; (self.width * self.height * 3) as usize];
        {
            let root = BitMapBackend::with_buffer(&mut px, (self.width, self.height)).into_drawing_area();
            self.draw(&root, 1, 64)?;
            root.present().map_err(plot::err)?;
        }
        let mut enc = png::Encoder::new(w, self.width, self.height);
        enc.set_color(png::ColorType::Rgb);
        enc.set_depth(png::BitDepth::Eight);
        let mut wr = enc.write_header()?;
        wr.write_image_data(&px)?;
        wr.finish()?;
        Ok(())
    }

    /// Draws the picture, `cell` x `cell` of the cells merged into one and
    /// coloured in `levels` steps.
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>, cell: u32, levels: u32) -> Result<()> {
        plot::font();
        let ink = RGBColor(30, 30, 30);
        let grey = RGBColor(100, 100, 100);
        root.fill(&WHITE).map_err(plot::err)?;
        root.draw_text(&self.title, &TextStyle::from((FAMILY, 16.0).into_font()).color(&ink), (8, 6)).map_err(plot::err)?;
        root.draw_text(
            "one band of pages per component; colour: references per cell, on a log scale",
            &TextStyle::from((FAMILY, LABEL).into_font()).color(&grey),
            (8, 27),
        )
        .map_err(plot::err)?;
        let (left, right) = root.split_horizontally(self.width - RIGHT);
        // room for the rotated axis titles at both edges
        let left = left.margin(0, 0, EDGE, 0);
        let n = self.panels.len();
        for (i, p) in self.panels.iter().enumerate() {
            let xl = TICKS + if i + 1 == n { X_DESC } else { 0 };
            left.draw_text(
                &p.title,
                &TextStyle::from((FAMILY, 13.0).into_font()).color(&ink),
                (self.x0 as i32, (p.y0 - PANEL_TITLE + 3) as i32),
            )
            .map_err(plot::err)?;
            let area = left.clone().shrink((0, p.y0), (self.width - RIGHT - EDGE, p.h + xl));
            let max = self.draw_panel(root, &area, p, xl, i + 1 == n, cell, levels)?;
            let scale = right.clone().shrink((12, p.y0), (RIGHT - 12 - EDGE, p.h.clamp(40, 180)));
            scale_bar(&scale, max, levels)?;
        }
        Ok(())
    }

    /// One panel: bands, cells, axes. Returns the most references in one
    /// (merged) cell, the top of its colour scale.
    #[allow(clippy::too_many_arguments)]
    fn draw_panel<DB: DrawingBackend>(
        &self,
        root: &DrawingArea<DB, Shift>,
        area: &DrawingArea<DB, Shift>,
        p: &Panel,
        xl: u32,
        time_title: bool,
        cell: u32,
        levels: u32,
    ) -> Result<u64> {
        let total = self.total_instructions.max(1) as f64;
        let h = p.h as f64;
        // y is pixel rows from the plot's bottom: a band's top row `off`
        // below the plot's top is at h - off.
        let y_at = |off: u32| h - off as f64;
        let labelled: Vec<(f64, &str)> = p
            .bands
            .iter()
            .filter(|b| b.h >= 9)
            .map(|b| (h - ((b.y0 - p.y0) as f64 + b.h as f64 / 2.0), b.label.as_str()))
            .collect();
        let mut chart = ChartBuilder::on(area)
            .x_label_area_size(xl)
            .y_label_area_size(self.x0 - EDGE)
            .build_cartesian_2d(0f64..total, 0f64..h)
            .map_err(plot::err)?;
        let si = |v: &f64| plot::si(*v);
        let mut mesh = chart.configure_mesh();
        mesh.disable_mesh()
            .x_labels(8)
            .y_labels(0)
            .x_label_formatter(&si)
            .label_style((FAMILY, LABEL))
            .axis_desc_style((FAMILY, AXIS_TITLE))
            .y_desc("pages by address");
        if time_title {
            mesh.x_desc("time: instructions executed (all processes, in trace order)");
        }
        mesh.draw().map_err(plot::err)?;
        // The band labels, each centred on its band (plotters' tick labels
        // go on round values, not on categories).
        let st = TextStyle::from((FAMILY, LABEL).into_font()).pos(Pos::new(HPos::Right, VPos::Center));
        for (y, label) in &labelled {
            let (x, py) = chart.backend_coord(&(0.0, *y));
            root.draw_text(label, &st, (x - 6, py)).map_err(plot::err)?;
        }

        let shade = RGBColor(242, 242, 246);
        chart
            .draw_series(p.bands.iter().enumerate().map(|(i, b)| {
                let bg = if i % 2 == 0 { WHITE } else { shade };
                Rectangle::new([(0.0, y_at(b.y0 - p.y0)), (total, y_at(b.y0 - p.y0 + b.h))], bg.filled())
            }))
            .map_err(plot::err)?;
        // Cells, merged `cell` x `cell`, a run of equal colour at a time.
        let cols = self.cols as usize;
        let out_cols = cols.div_ceil(cell as usize);
        let x_at = |c: usize| (c * cell as usize).min(cols) as f64 * total / cols as f64;
        let mut strips: Vec<(f64, f64, Vec<u64>)> = Vec::new();
        for b in &p.bands {
            let n = (b.h / cell).clamp(1, b.nb as u32) as usize;
            let mut sums = vec![vec![0u64; out_cols]; n];
            for k in 0..b.nb {
                let row = &p.cells[(b.b0 + k) * cols..][..cols];
                let s = &mut sums[k * n / b.nb];
                for (c, &v) in row.iter().enumerate() {
                    s[c / cell as usize] += v;
                }
            }
            for (k, sum) in sums.into_iter().enumerate() {
                let top = b.y0 - p.y0 + (k as u64 * b.h as u64 / n as u64) as u32;
                let bottom = b.y0 - p.y0 + ((k as u64 + 1) * b.h as u64 / n as u64) as u32;
                strips.push((y_at(top), y_at(bottom), sum));
            }
        }
        let max = strips.iter().flat_map(|s| s.2.iter().copied()).max().unwrap_or(0);
        let mut rects = Vec::new();
        for (top, bottom, row) in &strips {
            let mut x = 0usize;
            while x < row.len() {
                let lv = level(row[x], max, levels);
                let mut e = x + 1;
                while e < row.len() && level(row[e], max, levels) == lv {
                    e += 1;
                }
                if let Some(lv) = lv {
                    let c = colour(lv as f64 / (levels - 1) as f64);
                    rects.push(Rectangle::new([(x_at(x), *top), (x_at(e), *bottom)], RGBColor(c[0], c[1], c[2]).filled()));
                }
                x = e;
            }
        }
        chart.draw_series(rects).map_err(plot::err)?;
        let rule = RGBColor(170, 170, 170);
        chart
            .draw_series(p.bands.iter().skip(1).map(|b| {
                let y = y_at(b.y0 - p.y0);
                PathElement::new(vec![(0.0, y), (total, y)], rule)
            }))
            .map_err(plot::err)?;
        if p.bands.is_empty() {
            chart
                .draw_series(std::iter::once(Text::new(
                    "no pages recorded",
                    (total * 0.02, h / 2.0),
                    TextStyle::from((FAMILY, AXIS_TITLE).into_font()).color(&RGBColor(100, 100, 100)),
                )))
                .map_err(plot::err)?;
        }
        Ok(max)
    }
}

/// A panel's colour scale: the `levels` colours from 1 to `max` references
/// per cell, on a log axis with round ticks.
fn scale_bar<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, max: u64, levels: u32) -> Result<()> {
    let top = max.max(2) as f64;
    let mut c = ChartBuilder::on(area)
        .right_y_label_area_size(area.dim_in_pixel().0.saturating_sub(14))
        .build_cartesian_2d(0f64..1f64, (1f64..top).log_scale())
        .map_err(plot::err)?;
    let si = |v: &f64| plot::si(*v);
    c.configure_mesh()
        .disable_mesh()
        .disable_x_axis()
        .set_all_tick_mark_size(4)
        .y_labels(4)
        .y_label_formatter(&si)
        .label_style((FAMILY, 10.0))
        .axis_desc_style((FAMILY, LABEL))
        .y_desc("references per cell")
        .draw()
        .map_err(plot::err)?;
    c.draw_series((0..levels).map(|i| {
        let (v0, v1) = (top.powf(i as f64 / levels as f64), top.powf((i + 1) as f64 / levels as f64));
        let rgb = colour(i as f64 / (levels - 1) as f64);
        Rectangle::new([(0.0, v0), (1.0, v1)], RGBColor(rgb[0], rgb[1], rgb[2]).filled())
    }))
    .map_err(plot::err)?;
    Ok(())
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
        bands.push(Band { name, pages: k.len(), label: String::new(), y0: y, h: bh, b0, nb });
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
    trace.visit_as("filling the picture's cells", &all, |pos, item| {
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
/// quantised to `levels` steps.
fn level(n: u64, max: u64, levels: u32) -> Option<u32> {
    if n == 0 {
        return None;
    }
    let top = levels - 1;
    if max <= 1 {
        return Some(top);
    }
    let t = (n as f64).ln() / (max as f64).ln();
    Some((t.clamp(0.0, 1.0) * top as f64).round() as u32)
}

/// Pale yellow (few references) through orange and red to dark purple.
fn colour(t: f64) -> [u8; 3] {
    let t = t.clamp(0.0, 1.0);
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
