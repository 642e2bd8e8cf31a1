//! `bunkai mod predict`: predict a module's load time from its size (needs bunkai mod calibrate).

use crate::{model, server};
use anyhow::Result;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct PredictArgs {
    /// Model file (default: ~/.cache/bunkai/mod-model.json)
    #[arg(long, value_name = "FILE")]
    pub model: Option<PathBuf>,
    /// Print the prediction as one JSON object on stdout
    #[arg(long)]
    pub json: bool,
    /// A relocatable object (clang or gcc -c) declaring BUNKAI_MODULE
    #[arg(value_name = "MODULE.o")]
    pub module: PathBuf,
}

pub fn run(a: PredictArgs) -> Result<ExitCode> {
    let PredictArgs { model: path, json, module } = a;
    let m = model::Model::read(&path.unwrap_or_else(model::default_path))?;
    let i = server::file_info(&module)?;
    let us = m.predict(i.payload);
    if json {
        println!("{}", serde_json::json!({"module": i.meta.name, "payload": i.payload, "predicted_us": us}));
    } else {
        println!("{}: {} B code+data -> predicted load time {:.0} us", i.meta.name, i.payload, us);
    }
    Ok(ExitCode::SUCCESS)
}
