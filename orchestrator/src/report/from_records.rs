//! A report from plain measurement records (`data/*.jsonl`): every record a
//! row, with the prediction for the run it describes.

use std::collections::BTreeSet;
use std::path::PathBuf;

use facts::record::{MeasuredStatus, MeasurementRecord};

use super::{base_row, Environment, Report, ReportError, Status};
use crate::collect;
use crate::precheck::Predictor;

/// Reads measurement JSONL files (format: data/README.md).
pub fn read_records_files(paths: &[PathBuf]) -> Result<Vec<MeasurementRecord>, ReportError> {
    let mut out = Vec::new();
    for path in paths {
        let text = std::fs::read_to_string(path).map_err(|source| ReportError::Io { path: path.clone(), source })?;
        let recs = facts::record::read_jsonl(&text).map_err(|(line, source)| ReportError::Records {
            path: path.clone(),
            line,
            source,
        })?;
        if recs.is_empty() {
            return Err(ReportError::NoRecords { path: path.clone() });
        }
        out.extend(recs);
    }
    Ok(out)
}

/// The report of plain measurement records: every record a row, sectioned by
/// its source table, each with the prediction for the run it describes.
pub fn from_records(records: &[MeasurementRecord], source: String, predictor: &Predictor) -> Report {
    let mut env = Environment::default();
    let mut rows = Vec::new();
    let mut gpus = BTreeSet::new();
    let mut precisions = BTreeSet::new();
    let budget = collect::BUDGET_GIB;
    for r in records {
        env.devices.insert(r.gpu.clone());
        env.backends.insert(r.framework.clone());
        env.grad_ckpt.insert(r.grad_ckpt);
        precisions.insert(r.precision.to_string());
        let section = r.table.clone().unwrap_or_default();
        let cfg = match r.run_config() {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!("{e}: left out of the report");
                continue;
            }
        };
        gpus.insert(cfg.gpu.to_string());
        let v = predictor.verdict(&cfg, Some(budget));
        let mut row = base_row(&cfg, r.id.clone(), section, v.kind());
        row.name = r.config_name.clone().unwrap_or_else(|| r.id.clone());
        row.params = r.params_m.map(|m| (m * 1e6).round() as u64).or(row.params);
        if r.tokens.is_some() {
            row.tokens = r.tokens;
        }
        row.model_gib = r.model_gb;
        row.fwd_gib = r.fwd_gb;
        row.bwd_gib = r.bwd_gb;
        row.peak_gib = r.peak_gib();
        row.oom_at_gib = r.oom_reported_gb;
        row.status = match r.status {
            MeasuredStatus::Ok => Status::Ok,
            MeasuredStatus::OverBudget => Status::OverBudget,
            MeasuredStatus::Oom => Status::Oom,
        };
        row.detail = r.note.clone();
        row.predicted_gib = v.predicted_gib();
        rows.push(row);
    }
    let capacity = rows.iter().map(|r| r.capacity_gib).fold(0.0, f64::max);
    Report {
        title: "Measured configs against the precheck".into(),
        description: String::new(),
        source,
        gpus,
        capacity_gib: capacity,
        host_memory: false,
        budget_gib: budget,
        budget_set: true,
        precisions,
        predictor: predictor.runtime().to_string(),
        predicted_by: BTreeSet::new(),
        active: None,
        env,
        rows,
        twins: Vec::new(),
        layout: super::ReportLayout::Project,
    }
}
