//! The group's transformer tables, one per variant: the DiT script's
//! `| Resolution | Patch | Tokens | Params | Peak VRAM | Status |`
//! (docs/profiling_results.md@0ee6133:37-115), the HDiT/U-ViT script's
//! `| Patch | Tokens | Params | Peak VRAM | Status |` for U-ViT (:746-752)
//! and `| Patch | level_depths | Tok L0 | Tok BN | Params | Peak VRAM | Status |`
//! for HDiT (:799-804). Rows in the sweep's order.

use std::fmt::Write as _;

use super::{grouped, outcome, params, table, Outcome};
use crate::report::markdown::thousands;
use crate::report::{Report, Row};

/// What the scripts count free memory against: `--gpu-gb`, 80 by default
/// (profile_dit_memory.py@3140d97:320, profile_hdit_uvit_memory.py@ff513e0:443).
const SCRIPT_GPU_GB: f64 = 80.0;

/// The DiT script's tables, one per variant.
pub(super) fn dit(out: &mut String, report: &Report) {
    for (group, rows) in grouped(&report.rows, |r| r.group.clone()) {
        let _ = writeln!(out, "## {group}\n");
        let cells: Vec<Vec<String>> = rows.iter().map(|r| dit_cells(r, report.budget_gib)).collect();
        table(out, &["Resolution", "Patch", "Tokens", "Params", "Peak VRAM", "Status"], &cells);
    }
}

/// One DiT row: tokens with thousands separators, parameters to 0.1M, the
/// peak as `0.7 GB` (profile_dit_memory.py@3140d97:271, :277); `OK`, and
/// where the peak passed the budget the free memory the script printed
/// beside it, as the report keeps it there (docs/profiling_results.md@0ee6133:90,
/// the script's :270); out of memory `---` and `OOM`, with the parameters of
/// the model built (:201-207, report :106).
fn dit_cells(r: &Row, budget_gib: f64) -> Vec<String> {
    let patch = r.patch.map(|p| p.to_string()).unwrap_or_else(|| "-".into());
    let tokens = r.tokens.map(thousands).unwrap_or_else(|| "-".into());
    let mut c = vec![r.resolution.clone(), patch, tokens];
    match outcome(r, budget_gib) {
        Outcome::Ran { peak, over_budget } => {
            let status = match over_budget {
                true => format!("OK ({:.1}GB free)", SCRIPT_GPU_GB - peak),
                false => "OK".into(),
            };
            c.extend([params(r), format!("{peak:.1} GB"), status]);
        }
        Outcome::Oom => c.extend([params(r), "---".into(), "OOM".into()]),
        Outcome::Other(status) => c.extend(["-".into(), "-".into(), status]),
    }
    c
}

/// The HDiT/U-ViT script's tables, one per architecture and variant.
pub(super) fn hdit_uvit(out: &mut String, report: &Report) {
    for (group, rows) in grouped(&report.rows, |r| r.group.clone()) {
        let _ = writeln!(out, "## {group}\n");
        let hdit = rows.iter().any(|r| r.level_depths.is_some());
        let cells: Vec<Vec<String>> = rows.iter().map(|r| hdit_uvit_cells(r, hdit, report.budget_gib)).collect();
        let header: &[&str] = match hdit {
            true => &["Patch", "level_depths", "Tok L0", "Tok BN", "Params", "Peak VRAM", "Status"],
            false => &["Patch", "Tokens", "Params", "Peak VRAM", "Status"],
        };
        table(out, header, &cells);
    }
}

/// One HDiT or U-ViT row: token counts as `1.3M`, `164K`, `320`
/// (profile_hdit_uvit_memory.py@ff513e0:357-362), depths as `[1,2,6,2,1]`, the
/// peak as `43.4 GB` and `OK (36.6 GB free)` against the script's 80 GB
/// (:386-393, report :804); out of memory `-` and `OOM`, with the parameters
/// of the model built (report :751).
fn hdit_uvit_cells(r: &Row, hdit: bool, budget_gib: f64) -> Vec<String> {
    let tok = |n: Option<u64>| n.map(short_tokens).unwrap_or_else(|| "-".into());
    let mut c = vec![r.patch.map(|p| p.to_string()).unwrap_or_else(|| "-".into())];
    if hdit {
        let depths = r.level_depths.as_ref().map(|d| format!("{d:?}").replace(' ', "")).unwrap_or_else(|| "-".into());
        c.extend([depths, tok(r.tokens), tok(r.bottleneck_tokens)]);
    } else {
        c.push(tok(r.tokens));
    }
    match outcome(r, budget_gib) {
        Outcome::Ran { peak, .. } => {
            c.extend([params(r), format!("{peak:.1} GB"), format!("OK ({:.1} GB free)", SCRIPT_GPU_GB - peak)])
        }
        Outcome::Oom => c.extend([params(r), "-".into(), "OOM".into()]),
        Outcome::Other(status) => c.extend(["-".into(), "-".into(), status]),
    }
    c
}

/// `10.5M`, `164K`, `3K`, `320`: the script's token counts
/// (profile_hdit_uvit_memory.py@ff513e0:357-362).
pub(super) fn short_tokens(n: u64) -> String {
    match n {
        1_000_000.. => format!("{:.1}M", n as f64 / 1e6),
        1_000.. => format!("{:.0}K", n as f64 / 1e3),
        _ => n.to_string(),
    }
}
