//! `bunkai trace pages`: the memory-access distribution as an SVG or PNG
//! picture (pages.rs).

use crate::decode::Trace;
use crate::pages::{Format, Picture};
use anyhow::Result;
use std::path::PathBuf;
use std::process::ExitCode;

/// Draw the memory-access distribution: pages touched over time, per component
#[derive(clap::Args, Debug)]
#[command(long_about = "Draw which pages the traced processes touched when: x is time \
(instructions executed), y the touched pages in address order, one band per component \
(program, each library), instruction fetches in the upper panel and data references in the \
lower; colour is the logarithm of the references per cell. Writes SVG or PNG, by the \
output's extension.")]
pub struct PagesArgs {
    /// Trace file written by `bunkai trace record`
    pub file: PathBuf,
    /// Output picture: .svg or .png
    #[arg(short = 'o', long = "output", value_name = "OUT.svg|OUT.png")]
    pub output: PathBuf,
    /// Picture width in pixels
    #[arg(long, default_value_t = 1200, value_name = "W")]
    pub width: u32,
    /// Picture height in pixels
    #[arg(long, default_value_t = 800, value_name = "H")]
    pub height: u32,
    /// Also print what the picture shows as one JSON object on stdout:
    /// per panel (code, data) its pages, per component its pages, the
    /// most references in one cell
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: PagesArgs) -> Result<ExitCode> {
    let format = Format::of(&a.output)?;
    let mut trace = Trace::load(&a.file)?;
    trace.progress = !a.json && bunkai_common::progress::on_terminal();
    let pic = Picture::build(&trace, a.width, a.height)?;
    pic.write(&a.output, format)?;
    if a.json {
        let panels: Vec<serde_json::Value> = pic
            .panels
            .iter()
            .map(|p| {
                serde_json::json!({
                    "title": p.title,
                    "pages": p.pages,
                    "max_references_per_cell": p.max,
                    "components": p.bands.iter().map(|b| serde_json::json!({"name": b.name, "pages": b.pages})).collect::<Vec<_>>(),
                })
            })
            .collect();
        println!(
            "{}",
            serde_json::json!({
                "output": a.output,
                "width": a.width,
                "height": a.height,
                "instructions": pic.total_instructions,
                "panels": panels,
            })
        );
    }
    eprintln!(
        "bunkai trace pages: wrote {} ({}x{}, {} code and {} data pages)",
        a.output.display(),
        a.width,
        a.height,
        pic.panels.first().map_or(0, |p| p.pages),
        pic.panels.get(1).map_or(0, |p| p.pages)
    );
    Ok(ExitCode::SUCCESS)
}
