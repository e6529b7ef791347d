//! File I/O every stage shares, a leaf module (it imports nothing of the
//! crate): atomic writes, JSON files, append-only JSONL with one rule for a
//! torn last line, and the clock every timestamp in the state comes from.

use serde::{de::DeserializeOwned, Serialize};
use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

#[derive(Debug, thiserror::Error)]
pub enum FsError {
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{}: not valid state JSON: {source}", path.display())]
    Json { path: PathBuf, source: serde_json::Error },
}

/// Maps an I/O error to [`FsError::Io`] naming `path`.
pub fn io(path: &Path) -> impl FnOnce(std::io::Error) -> FsError + '_ {
    move |source| FsError::Io { path: path.to_path_buf(), source }
}

/// Seconds since the Unix epoch (what every timestamp in the state is).
pub fn now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

/// `YYYY-MM-DDTHH:MM:SS` (UTC) for Unix seconds; SLURM's time syntax.
pub fn utc_timestamp(secs: f64) -> String {
    let secs = secs.max(0.0) as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Howard Hinnant's civil-from-days (the `time` crate would need its
    // `formatting` feature and a fallible conversion for these 10 lines).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + if m <= 2 { 1 } else { 0 };
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}", rem / 3600, rem % 3600 / 60, rem % 60)
}

/// Writes `bytes` to `path` so that readers see the old or the new file, never
/// a torn one, even across a power cut: temp file, fsync, rename, fsync dir.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), FsError> {
    write_file(path, bytes, 0o644, true)
}

/// [`write_atomic`] with the file's mode set on the temp file, before the
/// rename (an executable is never visible without its `x` bits).
pub fn write_atomic_mode(path: &Path, bytes: &[u8], mode: u32) -> Result<(), FsError> {
    write_file(path, bytes, mode, true)
}

/// Temp file and rename without fsync: readers never see a torn file, but a
/// power cut may lose it. For files derived from durable ones (records are
/// repaired from `submission.json`) and for rendered copies.
pub fn write_replace(path: &Path, bytes: &[u8]) -> Result<(), FsError> {
    write_file(path, bytes, 0o644, false)
}

fn write_file(path: &Path, bytes: &[u8], mode: u32, durable: bool) -> Result<(), FsError> {
    use std::os::unix::fs::PermissionsExt;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    fs::create_dir_all(dir).map_err(io(dir))?;
    // tempfile names the temp file uniquely (two writers of one path never
    // share it) and removes it if anything below fails.
    let mut tmp = tempfile::Builder::new().prefix(".").suffix(".tmp").tempfile_in(dir).map_err(io(dir))?;
    tmp.write_all(bytes).map_err(io(tmp.path()))?;
    tmp.as_file().set_permissions(fs::Permissions::from_mode(mode)).map_err(io(path))?;
    if durable {
        tmp.as_file().sync_all().map_err(io(path))?;
    }
    tmp.persist(path).map_err(|e| FsError::Io { path: path.to_path_buf(), source: e.error })?;
    if durable {
        // Directories can be opened read-only and fsynced on Unix; that makes the rename durable.
        fs::File::open(dir).and_then(|d| d.sync_all()).map_err(io(dir))?;
    }
    Ok(())
}

/// Pretty JSON and a newline, written with [`write_atomic`].
pub fn write_json<T: Serialize>(path: &Path, value: &T) -> Result<(), FsError> {
    write_atomic(path, &pretty(path, value)?)
}

/// Pretty JSON and a newline, written with [`write_replace`].
pub fn replace_json<T: Serialize>(path: &Path, value: &T) -> Result<(), FsError> {
    write_replace(path, &pretty(path, value)?)
}

fn pretty<T: Serialize>(path: &Path, value: &T) -> Result<Vec<u8>, FsError> {
    let mut bytes = serde_json::to_vec_pretty(value).map_err(|source| FsError::Json { path: path.into(), source })?;
    bytes.push(b'\n');
    Ok(bytes)
}

/// The JSON file at `path`; `None` when there is no such file.
pub fn read_json<T: DeserializeOwned>(path: &Path) -> Result<Option<T>, FsError> {
    match fs::read(path) {
        Ok(b) => serde_json::from_slice(&b).map(Some).map_err(|source| FsError::Json { path: path.into(), source }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(FsError::Io { path: path.into(), source: e }),
    }
}

/// Appends `value` as one JSON line to `path` (created with its parents).
/// Not fsynced: append-only logs are for reading back, never the record a
/// crash must keep.
pub fn append_jsonl<T: Serialize>(path: &Path, value: &T) -> Result<(), FsError> {
    let mut line = serde_json::to_vec(value).map_err(|source| FsError::Json { path: path.into(), source })?;
    line.push(b'\n');
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        fs::create_dir_all(dir).map_err(io(dir))?;
    }
    let mut f = OpenOptions::new().create(true).append(true).open(path).map_err(io(path))?;
    f.write_all(&line).map_err(io(path))
}

/// Whether `name` is safe as one path component of the state directory:
/// 1–100 ASCII letters, digits, `_`, `-`, `.`, and not `.` or `..`.
pub fn safe_component(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 100
        && name != "."
        && name != ".."
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomic_write_replaces_whole_file() {
        let d = tempfile::tempdir().expect("tempdir");
        let p = d.path().join("a/b.json");
        write_json(&p, &serde_json::json!({"x": 1})).expect("write");
        write_json(&p, &serde_json::json!({"x": 2})).expect("rewrite");
        let v: serde_json::Value = read_json(&p).expect("read").expect("exists");
        assert_eq!(v["x"], 2);
        let names: Vec<_> = fs::read_dir(p.parent().expect("dir"))
            .expect("ls")
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["b.json"], "no temp files left");
    }

    #[test]
    fn a_mode_is_set_before_the_file_appears() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().expect("tempdir");
        let p = d.path().join("x.sh");
        write_atomic_mode(&p, b"#!/bin/sh\n", 0o755).expect("write");
        assert_eq!(fs::metadata(&p).expect("stat").permissions().mode() & 0o777, 0o755);
        write_replace(&p, b"plain").expect("replace");
        assert_eq!(fs::metadata(&p).expect("stat").permissions().mode() & 0o777, 0o644);
    }

    #[test]
    fn utc_timestamps() {
        assert_eq!(utc_timestamp(0.0), "1970-01-01T00:00:00");
        assert_eq!(utc_timestamp(951_782_400.0), "2000-02-29T00:00:00");
        assert_eq!(utc_timestamp(1_767_225_599.0), "2025-12-31T23:59:59");
    }
}
