//! The precheck's local overlay as the store keeps it: every experiment's
//! `measurements.jsonl` read here, the overlay fitted on them by the precheck
//! ([`Overlay::fit`]) and kept in `<state>/calibration.json` until one of
//! those files changes.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use facts::record::MeasurementRecord;

use super::{io, StateError};
use crate::precheck::overlay::Overlay;
use crate::precheck::Calibration;

/// The overlay's file in the state root.
pub const OVERLAY: &str = "calibration.json";

/// Where the overlay of `state_root` is kept.
pub fn overlay_path(state_root: &Path) -> PathBuf {
    state_root.join(OVERLAY)
}

/// The overlay of `state_root`, refitted first when a measurement file
/// changed since it was kept. An empty state gives an empty overlay and
/// writes nothing; a read-only one gets the fit, only not kept.
pub fn overlay(state_root: &Path) -> Result<Overlay, StateError> {
    let sources = measurement_files(state_root)?;
    let path = overlay_path(state_root);
    if let Ok(text) = std::fs::read_to_string(&path) {
        match serde_json::from_str::<Overlay>(&text) {
            Ok(o) if o.fitted_on(&sources) => return Ok(o),
            Ok(_) => {}
            Err(e) => tracing::warn!("{}: {e}; refitting it", path.display()),
        }
    }
    if sources.is_empty() {
        return Ok(Overlay::default());
    }
    let mut records = Vec::new();
    for file in sources.keys() {
        records.extend(measurements(Path::new(file))?);
    }
    let overlay = Overlay::fit(&records, &Calibration::builtin()).on(sources);
    let json = serde_json::to_vec_pretty(&overlay).expect("an overlay serialises");
    if let Err(e) = crate::fsio::write_atomic(&path, &json) {
        tracing::warn!("cannot keep the calibration overlay: {e}");
    }
    Ok(overlay)
}

/// [`overlay`] with where it is kept, or `None` (said) when it cannot be
/// read: the shipped calibration answers then.
pub fn local_overlay(state_root: &Path) -> Option<(Overlay, PathBuf)> {
    match overlay(state_root) {
        Ok(o) => Some((o, overlay_path(state_root))),
        Err(e) => {
            tracing::warn!("calibration overlay: {e}; using the shipped calibration");
            None
        }
    }
}

/// Every experiment's measurement file under `state_root`, with its size.
fn measurement_files(state_root: &Path) -> Result<BTreeMap<String, u64>, StateError> {
    let mut out = BTreeMap::new();
    let entries = match std::fs::read_dir(state_root) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(io(state_root)(e)),
    };
    for entry in entries {
        let entry = entry.map_err(io(state_root))?;
        let path = entry.path().join(super::files::MEASUREMENTS);
        match std::fs::metadata(&path) {
            Ok(m) if m.is_file() => {
                out.insert(path.display().to_string(), m.len());
            }
            _ => {}
        }
    }
    Ok(out)
}

/// The records of one measurement file; a torn last line (a run being
/// appended) is left for the next refresh.
fn measurements(path: &Path) -> Result<Vec<MeasurementRecord>, StateError> {
    let text = std::fs::read_to_string(path).map_err(io(path))?;
    facts::jsonl::values(&text).map_err(|(line, source)| StateError::Line { path: path.into(), line, source })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The demo sweep measured by this project's worker on CPU (recorded output).
    const FREE: &str = include_str!("../precheck/testdata/demo-cpu.jsonl");

    fn state_with(experiment: &str, text: &str) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join(experiment)).unwrap();
        std::fs::write(dir.path().join(experiment).join("measurements.jsonl"), text).unwrap();
        dir
    }

    #[test]
    fn the_overlay_is_kept_and_refitted_only_when_a_measurement_file_changes() {
        let lines: Vec<&str> = FREE.lines().collect();
        let state = state_with("demo", &(lines[..4].join("\n") + "\n"));
        let first = overlay(state.path()).unwrap();
        assert_eq!(first.entries["burn-flex/fp32@cpu"].measured, 4);
        let kept = std::fs::read_to_string(overlay_path(state.path())).unwrap();
        let kept_overlay = serde_json::from_str::<Overlay>(&kept).unwrap();
        assert_eq!(kept_overlay.entries["burn-flex/fp32@cpu"].measured, first.entries["burn-flex/fp32@cpu"].measured);
        assert_eq!(kept_overlay.sources, first.sources);
        // Unchanged files: the kept overlay is read back as it is.
        assert_eq!(overlay(state.path()).unwrap(), kept_overlay);
        // A sweep appends: refitted.
        std::fs::write(state.path().join("demo/measurements.jsonl"), FREE).unwrap();
        assert_eq!(overlay(state.path()).unwrap().entries["burn-flex/fp32@cpu"].measured, 6);
    }

    #[test]
    fn an_empty_state_writes_nothing() {
        let empty = tempfile::tempdir().unwrap();
        assert_eq!(overlay(empty.path()).unwrap(), Overlay::default());
        assert!(!overlay_path(empty.path()).exists());
    }

    #[test]
    fn a_bad_record_names_its_file_and_line() {
        let state = state_with("demo", &format!("{}{{\"id\": 3}}\n", FREE));
        let e = overlay(state.path()).unwrap_err().to_string();
        assert!(e.contains("demo/measurements.jsonl:7: "), "{e}");
        assert!(local_overlay(state.path()).is_none(), "unreadable: the shipped calibration answers");
    }
}
