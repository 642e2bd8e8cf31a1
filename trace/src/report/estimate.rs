//! §4: CPU models, and what TLB misses and segment-register reloads would
//! cost, from page and syscall counts.

use super::*;

// ---------------------------------------------------------------------------
// CPU models

/// A CPU for the §4 estimate (trace/cpu/*.json).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CpuModel {
    pub name: String,
    pub frequency_hz: f64,
    pub tlb_miss_cycles_min: f64,
    pub tlb_miss_cycles_max: f64,
    /// Cycles per syscall and per address-space switch.
    pub switch_cycles: f64,
    /// Cycles per instruction, when the cycles are not given.
    pub cpi: f64,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub source: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub note: String,
}

pub const PENTIUM_JSON: &str = include_str!("../../cpu/pentium.json");
pub const MODERN_JSON: &str = include_str!("../../cpu/modern.json");

/// "pentium", "modern", or the path of a JSON file with the same keys.
pub fn cpu_model(spec: &str) -> Result<CpuModel> {
    let fix = "give --cpu pentium, --cpu modern, or a JSON file with the keys name, frequency_hz, \
               tlb_miss_cycles_min, tlb_miss_cycles_max, switch_cycles, cpi";
    let (text, what) = match spec {
        "pentium" => (PENTIUM_JSON.to_string(), "pentium".to_string()),
        "modern" => (MODERN_JSON.to_string(), "modern".to_string()),
        path => (
            std::fs::read_to_string(path).with_context(|| format!("cannot read CPU model {path} ({fix})"))?,
            path.to_string(),
        ),
    };
    let m: CpuModel = serde_json::from_str(&text).map_err(|e| anyhow::anyhow!("CPU model {what}: {e} ({fix})"))?;
    let ok = |v: f64| v.is_finite() && v >= 0.0;
    if !(ok(m.frequency_hz)
        && m.frequency_hz > 0.0
        && ok(m.tlb_miss_cycles_min)
        && ok(m.tlb_miss_cycles_max)
        && ok(m.switch_cycles)
        && ok(m.cpi))
        || m.tlb_miss_cycles_min > m.tlb_miss_cycles_max
    {
        anyhow::bail!("CPU model {what}: values must be non-negative numbers, frequency_hz > 0, min <= max ({fix})");
    }
    Ok(m)
}

/// The §4 estimate.
#[derive(Debug, Clone, Serialize)]
pub struct Estimate {
    pub cpu: CpuModel,
    /// Cycles of the traced work.
    pub cycles: f64,
    pub cycles_source: String,
    pub code_pages: u64,
    pub data_pages: u64,
    /// Code + data pages of the programs and the shared libraries (total),
    /// as the paper sums its Table 2; each costs one TLB miss.
    pub pages: u64,
    pub tlb_cycles_min: f64,
    pub tlb_cycles_max: f64,
    pub tlb_percent_min: f64,
    pub tlb_percent_max: f64,
    pub syscalls: u64,
    pub address_space_switches: u64,
    pub switch_cycles: f64,
    pub switch_percent: f64,
    pub overhead_cycles_min: f64,
    pub overhead_cycles_max: f64,
    pub overhead_percent_min: f64,
    pub overhead_percent_max: f64,
    /// frequency / cycles, if the trace is one request.
    pub requests_per_second_before: f64,
    /// Without the overhead (min and max estimate); null if the overhead
    /// would be all the cycles.
    pub requests_per_second_after_min: Option<f64>,
    pub requests_per_second_after_max: Option<f64>,
}

/// The paper's §4 arithmetic.
pub fn estimate(
    cpu: &CpuModel,
    opts: &ReportOptions,
    instructions: u64,
    code_pages: u64,
    data_pages: u64,
    syscalls: u64,
    switches: u64,
) -> Estimate {
    let (cycles, cycles_source) = match (opts.cycles, opts.seconds) {
        (Some(c), _) => (c as f64, "given (--cycles)".to_string()),
        (None, Some(s)) => (s * cpu.frequency_hz, format!("{s} s x {} Hz (--seconds)", cpu.frequency_hz)),
        (None, None) => (
            instructions as f64 * cpu.cpi,
            format!(
                "estimated: {instructions} user-mode instructions x CPI {} (kernel instructions not included; give --cycles or --seconds)",
                cpu.cpi
            ),
        ),
    };
    let pages = code_pages + data_pages;
    let tlb_min = pages as f64 * cpu.tlb_miss_cycles_min;
    let tlb_max = pages as f64 * cpu.tlb_miss_cycles_max;
    let sw = (syscalls + switches) as f64 * cpu.switch_cycles;
    let rps = |c: f64| if c > 0.0 { Some(cpu.frequency_hz / c) } else { None };
    Estimate {
        cpu: cpu.clone(),
        cycles,
        cycles_source,
        code_pages,
        data_pages,
        pages,
        tlb_cycles_min: tlb_min,
        tlb_cycles_max: tlb_max,
        tlb_percent_min: pct(tlb_min, cycles),
        tlb_percent_max: pct(tlb_max, cycles),
        syscalls,
        address_space_switches: switches,
        switch_cycles: sw,
        switch_percent: pct(sw, cycles),
        overhead_cycles_min: tlb_min + sw,
        overhead_cycles_max: tlb_max + sw,
        overhead_percent_min: pct(tlb_min + sw, cycles),
        overhead_percent_max: pct(tlb_max + sw, cycles),
        requests_per_second_before: rps(cycles).unwrap_or(0.0),
        requests_per_second_after_min: rps(cycles - tlb_min - sw),
        requests_per_second_after_max: rps(cycles - tlb_max - sw),
    }
}
