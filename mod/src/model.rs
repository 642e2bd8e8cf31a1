//! DKM's load-time model (§4): each stage's time is a linear function of the
//! module's data amount x (in 4 KB units), y = a·x + b, fitted by least
//! squares; the total is predicted from the same x.

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
pub struct Fit {
    /// µs per 4 KB of data.
    pub slope: f64,
    /// µs.
    pub intercept: f64,
    pub r2: f64,
}

impl Fit {
    pub fn at(&self, x: f64) -> f64 {
        self.slope * x + self.intercept
    }
}

/// Least squares over (x, y) points, weighted by 1/y² so that the fit
/// minimises relative error: a 1 KB module predicted 50% off matters as
/// much as a 4 MB one (ordinary least squares would sacrifice the small
/// ones to the large). R² is the usual, unweighted one.
pub fn fit(points: &[(f64, f64)]) -> Result<Fit> {
    if points.len() < 2 {
        bail!("a fit needs at least two points");
    }
    let w: Vec<f64> = points.iter().map(|p| 1.0 / p.1.abs().max(1e-9).powi(2)).collect();
    let sw: f64 = w.iter().sum();
    let mx = points.iter().zip(&w).map(|(p, w)| w * p.0).sum::<f64>() / sw;
    let my_w = points.iter().zip(&w).map(|(p, w)| w * p.1).sum::<f64>() / sw;
    let sxx: f64 = points.iter().zip(&w).map(|(p, w)| w * (p.0 - mx).powi(2)).sum();
    let sxy: f64 = points.iter().zip(&w).map(|(p, w)| w * (p.0 - mx) * (p.1 - my_w)).sum();
    if sxx == 0.0 {
        bail!("all modules have the same size: nothing to fit");
    }
    let slope = sxy / sxx;
    let intercept = my_w - slope * mx;
    let my = points.iter().map(|p| p.1).sum::<f64>() / points.len() as f64;
    let ss_tot: f64 = points.iter().map(|p| (p.1 - my).powi(2)).sum();
    let ss_res: f64 = points.iter().map(|p| (p.1 - (slope * p.0 + intercept)).powi(2)).sum();
    let r2 = if ss_tot == 0.0 { 1.0 } else { 1.0 - ss_res / ss_tot };
    Ok(Fit { slope, intercept, r2 })
}

/// The calibrated model of this machine.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Model {
    pub format: String,
    pub machine: String,
    pub prelink: Fit,
    pub alloc: Fit,
    pub link: Fit,
    pub load: Fit,
    pub register: Fit,
    pub total: Fit,
    pub points: usize,
}

pub const FORMAT: &str = "bunkai-mod-model/1";

pub fn default_path() -> PathBuf {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from("/tmp"));
    base.join("bunkai/mod-model.json")
}

impl Model {
    pub fn read(path: &Path) -> Result<Model> {
        let t = std::fs::read_to_string(path)
            .with_context(|| format!("no load-time model at {} (run bunkai mod calibrate first)", path.display()))?;
        let m: Model = serde_json::from_str(&t)
            .map_err(|e| anyhow::anyhow!("{} is not a bunkai mod model: {e} (run bunkai mod calibrate)", path.display()))?;
        if m.format != FORMAT {
            bail!("{} has format {:?} (run bunkai mod calibrate)", path.display(), m.format);
        }
        Ok(m)
    }

    /// Predicted load time in µs for a module with `payload` bytes.
    pub fn predict(&self, payload: u64) -> f64 {
        self.total.at(payload as f64 / 4096.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fits_a_line() {
        let f = fit(&[(1.0, 3.0), (2.0, 5.0), (3.0, 7.0)]).unwrap();
        assert!((f.slope - 2.0).abs() < 1e-9 && (f.intercept - 1.0).abs() < 1e-9 && (f.r2 - 1.0).abs() < 1e-9);
        assert!(fit(&[(1.0, 1.0)]).is_err());
        assert!(fit(&[(1.0, 1.0), (1.0, 2.0)]).is_err());
    }
}
