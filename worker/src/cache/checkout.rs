//! This process's copy of the node's CubeCL database.
//!
//! CubeCL opens its database with Turso's experimental multi-process WAL, and
//! that does not hold: worker processes of one host writing one database at
//! once corrupted it (CI, three lavapipe runs at a time: Turso panicked in its
//! b-tree, "page must be loaded in add_dirty()", and every later run on that
//! file failed). So no process opens the node's file. Each runs CubeCL on a
//! copy in `proc/<pid>-<nanos>/`; a run that stored new kernels or tuning
//! results merges its copy back: CubeCL's bundle export writes both files'
//! entries, each key once, into a new file that is renamed over the node's,
//! one process of the node at a time (`merge.lock`). The node's file is only
//! ever replaced whole, so taking a copy needs no lock. A copy whose process
//! is gone (nobody holds its `lock`) is removed by the next process that takes
//! one.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

use super::with_suffix;

/// The database's file name in a CubeCL environment directory (its default
/// environment's).
pub const DB: &str = "default.db";

/// The files a database may have beside it: a WAL, SQLite's and Turso's
/// shared-memory indexes. The node's file is written standalone and never
/// opened, so it has none; one left there by hand would be replayed into the
/// new file, so a merge removes them.
const SIDECARS: [&str; 3] = ["-wal", "-shm", "-tshm"];

/// A copy of the node's database that this process runs CubeCL on.
#[derive(Debug)]
pub struct Checkout {
    /// The node's database's directory.
    node: PathBuf,
    /// This process's directory: its copy, its CubeCL configuration, its lock.
    dir: PathBuf,
    /// Held for as long as this process lives: a lock nobody holds marks a
    /// copy to remove.
    _alive: File,
}

/// What [`Checkout::merge_back`] did to the node's database.
#[derive(Debug, PartialEq, Eq)]
pub enum Merged {
    /// It now holds its entries and this process's.
    Merged,
    /// It could not be read: it was moved aside to the path given, and this
    /// process's entries are the node's database now.
    ReplacedUnreadable(PathBuf),
}

#[derive(Debug, thiserror::Error)]
pub enum MergeError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("exporting this run's kernels: {0}")]
    Export(String),
}

impl Checkout {
    /// Copy `node/default.db` (if there is one) into a new directory of this
    /// process under `procs`, after removing the copies of processes that are
    /// gone.
    pub fn take(node: &Path, procs: &Path) -> io::Result<Checkout> {
        std::fs::create_dir_all(procs)?;
        remove_abandoned(procs);
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        let name = format!("{}-{nanos}", std::process::id());
        // Made under a dot name and renamed once its lock is held, so no
        // other process sees it with a lock free to take.
        let making = procs.join(format!(".{name}"));
        std::fs::create_dir(&making)?;
        let alive = File::create(making.join("lock"))?;
        // Where the filesystem has no locks this fails, and a killed run's
        // copy cannot be told from a live one: it stays until removed by hand.
        let _ = alive.try_lock();
        let dir = procs.join(name);
        std::fs::rename(&making, &dir)?;
        let checkout = Checkout { node: node.to_path_buf(), dir, _alive: alive };
        std::fs::write(checkout.toml(), config(&checkout.dir))?;
        // A file another process renames over the node's meanwhile is
        // copied whole either way: the copy reads the file it opened.
        match std::fs::copy(checkout.node_db(), checkout.db()) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(checkout),
        }
    }

    /// This process's directory: CubeCL's environment root for this run.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// CubeCL's configuration for this run: its environment in [`Self::dir`].
    pub fn toml(&self) -> PathBuf {
        self.dir.join("cubecl.toml")
    }

    /// This process's copy of the database.
    pub fn db(&self) -> PathBuf {
        self.dir.join(DB)
    }

    /// The node's database.
    pub fn node_db(&self) -> PathBuf {
        self.node.join(DB)
    }

    /// Merge this process's copy into the node's database, then remove the
    /// copy. `export(sources, out)` writes at `out` one database that stands
    /// alone (no sidecar files) with every entry of `sources`, each key once,
    /// the first source's value where two hold a key. A node's database that
    /// cannot be read is moved aside and this copy takes its place.
    pub fn merge_back(self, export: impl Fn(&[PathBuf], &Path) -> Result<(), String>) -> Result<Merged, MergeError> {
        let io_err = |path: &Path| {
            let path = path.to_path_buf();
            move |source| MergeError::Io { path, source }
        };
        let lock_path = self.node.join("merge.lock");
        let lock = File::create(&lock_path).map_err(io_err(&lock_path))?;
        // Where the filesystem has no locks, merges of one node may race:
        // the later rename wins and the other's new entries are compiled
        // again another time. The file is whole either way.
        let _ = lock.lock(); // held until `lock` is dropped, at the end
        let node_db = self.node_db();
        let out = self.node.join(format!("{DB}.{}.new", std::process::id()));
        let mut merged = Merged::Merged;
        let mut sources = vec![self.db()];
        if node_db.is_file() {
            sources.push(node_db.clone());
        }
        if let Err(e) = export(&sources, &out) {
            if sources.len() == 1 {
                return Err(MergeError::Export(e));
            }
            export(&sources[..1], &out).map_err(MergeError::Export)?;
            let aside = with_suffix(&node_db, &format!(".unreadable-{}", std::process::id()));
            std::fs::rename(&node_db, &aside).map_err(io_err(&node_db))?;
            merged = Merged::ReplacedUnreadable(aside);
        }
        for suffix in SIDECARS {
            match std::fs::remove_file(with_suffix(&node_db, suffix)) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(io_err(&node_db)(e)),
                _ => {}
            }
        }
        std::fs::rename(&out, &node_db).map_err(io_err(&node_db))?;
        self.discard();
        Ok(merged)
    }

    /// Remove this process's copy (nothing in it is new to the node).
    pub fn discard(self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// CubeCL's configuration: its environment (autotune results, compiled
/// kernels: SPIR-V on Vulkan, PTX on CUDA; WGSL is never stored) in `dir`,
/// kernel compilation caching on.
fn config(dir: &Path) -> String {
    format!(
        "# Written by the worker for this run's copy of the kernel cache.\n\
         [compilation]\ncache = true\n\n[environment.path]\ndirectory = {}\n",
        toml_string(&dir.display().to_string())
    )
}

/// A TOML basic string: quotes, backslashes and control characters escaped.
fn toml_string(s: &str) -> String {
    let mut out = String::from('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Remove the copies under `procs` whose process is gone: their `lock` can
/// be taken. A copy being made (a dot name) is left alone.
fn remove_abandoned(procs: &Path) {
    let Ok(entries) = std::fs::read_dir(procs) else { return };
    for entry in entries.flatten().filter(|e| !e.file_name().to_string_lossy().starts_with('.')) {
        let dir = entry.path();
        let Ok(lock) = File::options().write(true).open(dir.join("lock")) else { continue };
        if lock.try_lock().is_ok() {
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stand-in for CubeCL's export in these tests of the file protocol:
    /// the sources' lines, each once, first source first. The real export is
    /// exercised on the Vulkan device (`tests/vulkan_cpu.rs`).
    fn union(sources: &[PathBuf], out: &Path) -> Result<(), String> {
        let mut lines: Vec<String> = Vec::new();
        for s in sources {
            let text = std::fs::read_to_string(s).map_err(|e| e.to_string())?;
            if text.starts_with("garbage") {
                return Err(format!("{} is not a database", s.display()));
            }
            for l in text.lines() {
                if !lines.iter().any(|x| x == l) {
                    lines.push(l.to_string());
                }
            }
        }
        std::fs::write(out, lines.join("\n") + "\n").map_err(|e| e.to_string())
    }

    fn node(root: &Path) -> (PathBuf, PathBuf) {
        let node = root.join("cubecl");
        std::fs::create_dir_all(&node).unwrap();
        (node, root.join("proc"))
    }

    #[test]
    fn a_copy_comes_with_cubecls_configuration() {
        let root = tempfile::tempdir().unwrap();
        let (node, procs) = node(root.path());
        let c = Checkout::take(&node, &procs).unwrap();
        let toml = std::fs::read_to_string(c.toml()).unwrap();
        assert!(toml.contains("[compilation]\ncache = true\n"), "{toml}");
        assert!(toml.contains(&format!("directory = \"{}\"", c.dir().display())), "{toml}");
    }

    #[test]
    fn paths_are_quoted_for_toml() {
        assert_eq!(toml_string(r#"/a "b"\c"#), r#""/a \"b\"\\c""#);
        assert_eq!(toml_string("x\ny"), "\"x\\u000Ay\"");
    }

    #[test]
    fn two_copies_merge_into_the_union() {
        let root = tempfile::tempdir().unwrap();
        let (node, procs) = node(root.path());
        std::fs::write(node.join(DB), "a\n").unwrap();
        let one = Checkout::take(&node, &procs).unwrap();
        let two = Checkout::take(&node, &procs).unwrap();
        assert_ne!(one.dir(), two.dir());
        assert_eq!(std::fs::read_to_string(one.db()).unwrap(), "a\n", "a copy of the node's file");
        std::fs::write(one.db(), "a\nb\n").unwrap();
        std::fs::write(two.db(), "a\nc\n").unwrap();
        let (one_dir, two_dir) = (one.dir().to_path_buf(), two.dir().to_path_buf());
        assert_eq!(one.merge_back(union).unwrap(), Merged::Merged);
        assert_eq!(two.merge_back(union).unwrap(), Merged::Merged);
        assert_eq!(std::fs::read_to_string(node.join(DB)).unwrap(), "a\nc\nb\n", "neither run's entries lost");
        assert!(!one_dir.exists() && !two_dir.exists(), "copies removed once merged");
        let names: Vec<_> = std::fs::read_dir(&node).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names.len(), 2, "the database and the merge lock, no staging file left: {names:?}");
    }

    /// The first run of a node: no database yet, the copy becomes it.
    #[test]
    fn a_first_run_makes_the_node_database() {
        let root = tempfile::tempdir().unwrap();
        let (node, procs) = node(root.path());
        let c = Checkout::take(&node, &procs).unwrap();
        assert!(!c.db().exists());
        std::fs::write(c.db(), "k\n").unwrap();
        c.merge_back(union).unwrap();
        assert_eq!(std::fs::read_to_string(node.join(DB)).unwrap(), "k\n");
    }

    /// A WAL beside the node's file is not copied, and gone once the
    /// node's file is replaced (it would be replayed into the new one).
    #[test]
    fn sidecars_are_not_copied_and_are_removed() {
        let root = tempfile::tempdir().unwrap();
        let (node, procs) = node(root.path());
        std::fs::write(node.join(DB), "a\n").unwrap();
        std::fs::write(node.join("default.db-wal"), "frames").unwrap();
        std::fs::write(node.join("default.db-tshm"), "index").unwrap();
        let c = Checkout::take(&node, &procs).unwrap();
        assert!(!c.dir().join("default.db-wal").exists() && !c.dir().join("default.db-tshm").exists());
        c.merge_back(union).unwrap();
        assert!(!node.join("default.db-wal").exists() && !node.join("default.db-tshm").exists());
    }

    #[test]
    fn an_unreadable_node_database_is_moved_aside_and_replaced() {
        let root = tempfile::tempdir().unwrap();
        let (node, procs) = node(root.path());
        let c = Checkout::take(&node, &procs).unwrap();
        std::fs::write(c.db(), "mine\n").unwrap();
        std::fs::write(node.join(DB), "garbage pages").unwrap();
        let Merged::ReplacedUnreadable(aside) = c.merge_back(union).unwrap() else { panic!() };
        assert_eq!(std::fs::read_to_string(aside).unwrap(), "garbage pages", "kept aside, not deleted");
        assert_eq!(std::fs::read_to_string(node.join(DB)).unwrap(), "mine\n");
    }

    /// A process killed mid-run leaves its copy; the next process removes
    /// it, and never a live process's.
    #[test]
    fn copies_of_processes_that_are_gone_are_removed() {
        let root = tempfile::tempdir().unwrap();
        let (node, procs) = node(root.path());
        let live = Checkout::take(&node, &procs).unwrap();
        let dead = procs.join("12345-1");
        std::fs::create_dir_all(&dead).unwrap();
        std::fs::write(dead.join("lock"), b"").unwrap();
        std::fs::write(dead.join(DB), b"left by a killed run").unwrap();
        let making = procs.join(".12346-1");
        std::fs::create_dir_all(&making).unwrap();
        std::fs::write(making.join("lock"), b"").unwrap();
        let next = Checkout::take(&node, &procs).unwrap();
        assert!(!dead.exists(), "the killed run's copy is removed");
        assert!(live.dir().exists() && making.exists(), "a live copy and one being made are kept");
        next.discard();
        live.discard();
    }
}
