//! The job's kernel cache (`worker run --cache-dir DIR`): CubeCL's compiled
//! kernels and autotune results, and the GPU drivers' shader caches beside
//! them, so a sweep compiles each kernel once per node instead of once per
//! config (docs/gpu.md).
//!
//! `DIR` is one node's (the job script names it by host). Inside it each
//! CubeCL and worker version has its own directory, so a cache written by
//! another version is never opened; a directory whose stamp cannot be read is
//! moved aside with a warning and started afresh. The processes of a node
//! share CubeCL's database only through copies ([`checkout`]): no two of them
//! ever open one file. A cache is never a reason for a run to fail: when `DIR`
//! cannot be prepared the run goes on without it, and a merge that fails
//! leaves the node's database as it was.

#[cfg(any(test, feature = "wgpu", feature = "vulkan", feature = "cuda"))]
pub mod checkout;
#[cfg(any(feature = "wgpu", feature = "vulkan", feature = "cuda"))]
mod cubecl;

use std::path::{Path, PathBuf};

pub use facts::event::CacheState;
use serde::{Deserialize, Serialize};

/// The CubeCL release this worker is built with (Cargo.lock: Burn 0.22's).
pub const CUBECL_VERSION: &str = "0.11.3";

/// How the directory is used. 1: every process opened `cubecl/` itself
/// (such a database may be corrupt, so it is never opened); 2: through
/// [`checkout`] copies.
const LAYOUT: u32 = 2;

/// What a cache directory says about itself (`stamp.json`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Stamp {
    cubecl: String,
    worker: String,
    #[serde(default = "first_layout")]
    layout: u32,
}

fn first_layout() -> u32 {
    1
}

impl Stamp {
    fn ours() -> Stamp {
        Stamp { cubecl: CUBECL_VERSION.into(), worker: env!("CARGO_PKG_VERSION").into(), layout: LAYOUT }
    }

    /// The directory this version's caches live in, under the node's `DIR`
    /// (layout 1's had no suffix).
    fn dir_name(&self) -> String {
        let layout = if self.layout == 1 { String::new() } else { format!("-layout-{}", self.layout) };
        format!("cubecl-{}-worker-{}{layout}", self.cubecl, self.worker)
    }
}

/// How the cache directory was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    /// Nothing there yet: the first run on this node (every kernel compiles).
    Fresh,
    /// This version's cache, reused.
    Reused,
    /// A directory with an unreadable or foreign stamp was moved aside to
    /// `moved_to` and a fresh one started.
    Replaced { reason: String, moved_to: PathBuf },
}

#[derive(Debug, thiserror::Error)]
#[error("cannot prepare the kernel cache at {path}: {source}")]
pub struct CacheError {
    path: PathBuf,
    source: std::io::Error,
}

/// A prepared cache directory of this worker's version.
#[derive(Debug, Clone)]
pub struct KernelCache {
    dir: PathBuf,
}

impl KernelCache {
    /// Prepare this version's cache under `root`: create it and its stamp, or
    /// check the stamp that is there.
    pub fn open(root: &Path) -> Result<(KernelCache, Found), CacheError> {
        let ours = Stamp::ours();
        let dir = root.join(ours.dir_name());
        let err = |path: &Path| {
            let path = path.to_path_buf();
            move |source| CacheError { path, source }
        };
        let stamp = dir.join("stamp.json");
        let found = match std::fs::read(&stamp) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Found::Fresh,
            Err(e) => Self::move_aside(&dir, format!("its stamp cannot be read ({e})")).map_err(err(&dir))?,
            Ok(bytes) => match serde_json::from_slice::<Stamp>(&bytes) {
                Ok(s) if s == ours => Found::Reused,
                Ok(s) => {
                    Self::move_aside(&dir, format!("its stamp names another version ({s:?})")).map_err(err(&dir))?
                }
                Err(e) => Self::move_aside(&dir, format!("its stamp is corrupt ({e})")).map_err(err(&dir))?,
            },
        };
        let cache = KernelCache { dir };
        for sub in [cache.cubecl_dir(), cache.procs_dir(), cache.driver_dir(), cache.mesa_dir()] {
            std::fs::create_dir_all(&sub).map_err(err(&sub))?;
        }
        if found != Found::Reused {
            write_atomic(&stamp, &serde_json::to_vec(&ours).expect("a stamp serialises")).map_err(err(&stamp))?;
        }
        Ok((cache, found))
    }

    /// Rename `dir` out of the way (`<dir>.stale-<pid>-<seconds>`): another
    /// process of the node may still have its files open.
    fn move_aside(dir: &Path, reason: String) -> std::io::Result<Found> {
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
        let moved_to = with_suffix(dir, &format!(".stale-{}-{t}", std::process::id()));
        std::fs::rename(dir, &moved_to)?;
        Ok(Found::Replaced { reason, moved_to })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The node's CubeCL database's directory: its kernels and tuning
    /// results, which runs copy and merge into ([`checkout`]).
    pub fn cubecl_dir(&self) -> PathBuf {
        self.dir.join("cubecl")
    }

    /// Where each process keeps its copy of the database while it runs.
    pub fn procs_dir(&self) -> PathBuf {
        self.dir.join("proc")
    }

    /// The NVIDIA driver's shader disk cache.
    pub fn driver_dir(&self) -> PathBuf {
        self.dir.join("nvidia")
    }

    /// Mesa's shader disk cache (RADV, ANV, lavapipe: the pipelines its
    /// drivers compile from CubeCL's SPIR-V).
    pub fn mesa_dir(&self) -> PathBuf {
        self.dir.join("mesa")
    }

    /// The drivers' variables for their shader disk caches: the NVIDIA
    /// driver's in [`Self::driver_dir`], kept however large it grows (the
    /// driver trims to its default size otherwise), and Mesa's in
    /// [`Self::mesa_dir`].
    pub fn driver_env(&self) -> [(&'static str, std::ffi::OsString); 4] {
        [
            ("__GL_SHADER_DISK_CACHE", "1".into()),
            ("__GL_SHADER_DISK_CACHE_PATH", self.driver_dir().into_os_string()),
            ("__GL_SHADER_DISK_CACHE_SKIP_CLEANUP", "1".into()),
            ("MESA_SHADER_CACHE_DIR", self.mesa_dir().into_os_string()),
        ]
    }
}

/// The kernel cache of this process's run ([`use_for_this_process`]).
#[derive(Debug)]
pub struct ProcessCache {
    /// How the run found it, for the `start` event.
    pub state: CacheState,
    #[cfg(any(feature = "wgpu", feature = "vulkan", feature = "cuda"))]
    copy: Option<cubecl::RunCopy>,
}

impl ProcessCache {
    fn without_copy(state: CacheState) -> ProcessCache {
        ProcessCache {
            state,
            #[cfg(any(feature = "wgpu", feature = "vulkan", feature = "cuda"))]
            copy: None,
        }
    }

    /// After the run: merge the kernels and tuning results it stored into the
    /// node's database (see [`checkout`]).
    pub fn finish(self) {
        #[cfg(any(feature = "wgpu", feature = "vulkan", feature = "cuda"))]
        if let Some(copy) = self.copy {
            copy.finish();
        }
    }
}

/// Point this process's caches at `root` (`--cache-dir`): prepare it, keep the
/// drivers' shader caches there, and hand CubeCL a copy of the node's
/// database, before any device exists. Problems are warnings on stderr and the
/// run goes on uncached.
pub fn use_for_this_process(root: &Path) -> ProcessCache {
    let (cache, found) = match KernelCache::open(root) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("worker: warning: {e}; running without a kernel cache");
            return ProcessCache::without_copy(CacheState::Unusable);
        }
    };
    let state = match found {
        Found::Fresh => CacheState::Fresh,
        Found::Reused => CacheState::Reused,
        Found::Replaced { reason, moved_to } => {
            eprintln!(
                "worker: warning: the kernel cache in {} was ignored: {reason}; it is now {} and a fresh one is used",
                cache.dir().display(),
                moved_to.display()
            );
            CacheState::Replaced
        }
    };
    // The driver reads these when the device is created, below: before any
    // other thread of this process exists (main calls this first).
    for (k, v) in cache.driver_env() {
        std::env::set_var(k, v);
    }
    #[cfg(any(feature = "wgpu", feature = "vulkan", feature = "cuda"))]
    return match cubecl::RunCopy::take(&cache) {
        Ok(copy) => ProcessCache { state, copy: Some(copy) },
        Err(e) => {
            eprintln!("worker: warning: {e}; running without a kernel cache");
            ProcessCache::without_copy(CacheState::Unusable)
        }
    };
    #[cfg(not(any(feature = "wgpu", feature = "vulkan", feature = "cuda")))]
    ProcessCache::without_copy(state)
}

/// Write through a temporary file and a rename, so a process of the same node
/// reading it never sees half a file.
fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = with_suffix(path, &format!(".tmp-{}", std::process::id()));
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path)
}

/// `path` with `suffix` appended to its file name.
fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut s = path.as_os_str().to_os_string();
    s.push(suffix);
    PathBuf::from(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fresh_dir_is_created_then_reused() {
        let root = tempfile::tempdir().unwrap();
        let (c, found) = KernelCache::open(root.path()).unwrap();
        assert_eq!(found, Found::Fresh);
        assert!(c.dir().starts_with(root.path()));
        assert!(c.cubecl_dir().is_dir() && c.driver_dir().is_dir() && c.mesa_dir().is_dir());
        let (again, found) = KernelCache::open(root.path()).unwrap();
        assert_eq!(found, Found::Reused);
        assert_eq!(again.dir(), c.dir());
        let env = c.driver_env();
        assert_eq!(env[1].1, c.driver_dir().into_os_string());
        assert_eq!(env[3], ("MESA_SHADER_CACHE_DIR", c.mesa_dir().into_os_string()));
    }

    /// A corrupt stamp: the directory (with whatever kernels it held) is
    /// moved aside, never opened, and a fresh one is used.
    #[test]
    fn a_corrupt_cache_is_moved_aside_with_its_reason() {
        let root = tempfile::tempdir().unwrap();
        let (c, _) = KernelCache::open(root.path()).unwrap();
        std::fs::write(c.dir().join("stamp.json"), b"\x00\xffnot json").unwrap();
        std::fs::write(c.cubecl_dir().join("default.db"), b"garbage pages").unwrap();
        let (again, found) = KernelCache::open(root.path()).unwrap();
        let Found::Replaced { reason, moved_to } = found else { panic!("{found:?}") };
        assert!(reason.contains("corrupt"), "{reason}");
        assert!(moved_to.join("cubecl/default.db").is_file(), "the old files are kept aside, not deleted");
        assert_eq!(again.dir(), c.dir());
        assert!(!again.cubecl_dir().join("default.db").exists(), "the fresh cache holds nothing old");
        assert_eq!(KernelCache::open(root.path()).unwrap().1, Found::Reused);
    }

    /// Another version's cache is another directory: left alone, not opened.
    #[test]
    fn another_versions_cache_is_not_opened() {
        let root = tempfile::tempdir().unwrap();
        let other = Stamp { cubecl: "0.10.0".into(), worker: "0.0.9".into(), layout: LAYOUT };
        let other_dir = root.path().join(other.dir_name());
        std::fs::create_dir_all(&other_dir).unwrap();
        std::fs::write(other_dir.join("stamp.json"), serde_json::to_vec(&other).unwrap()).unwrap();
        let (c, found) = KernelCache::open(root.path()).unwrap();
        assert_eq!(found, Found::Fresh);
        assert_ne!(c.dir(), other_dir);
        assert!(other_dir.join("stamp.json").is_file());
        // A stamp of another version inside ours (a copied cache) is foreign too.
        std::fs::write(c.dir().join("stamp.json"), serde_json::to_vec(&other).unwrap()).unwrap();
        let (_, found) = KernelCache::open(root.path()).unwrap();
        assert!(matches!(found, Found::Replaced { ref reason, .. } if reason.contains("another version")), "{found:?}");
    }

    /// A directory every process opened itself (layout 1, whose database
    /// concurrent runs could corrupt) is not this layout's: never opened.
    #[test]
    fn a_cache_of_the_first_layout_is_not_opened() {
        let root = tempfile::tempdir().unwrap();
        let old = root.path().join(format!("cubecl-{CUBECL_VERSION}-worker-{}", env!("CARGO_PKG_VERSION")));
        std::fs::create_dir_all(old.join("cubecl")).unwrap();
        let stamp = format!(r#"{{"cubecl":"{CUBECL_VERSION}","worker":"{}"}}"#, env!("CARGO_PKG_VERSION"));
        std::fs::write(old.join("stamp.json"), &stamp).unwrap();
        assert_eq!(
            serde_json::from_str::<Stamp>(&stamp).unwrap().dir_name(),
            old.file_name().unwrap().to_str().unwrap()
        );
        let (c, found) = KernelCache::open(root.path()).unwrap();
        assert_eq!(found, Found::Fresh);
        assert!(c.dir().to_string_lossy().ends_with("-layout-2"), "{}", c.dir().display());
    }

    #[test]
    fn an_unwritable_root_is_an_error_not_a_panic() {
        let root = tempfile::tempdir().unwrap();
        let file = root.path().join("a-file");
        std::fs::write(&file, b"x").unwrap();
        let e = KernelCache::open(&file).unwrap_err();
        assert!(e.to_string().contains("cannot prepare the kernel cache"), "{e}");
    }
}
