//! CubeCL's side of the kernel cache: its configuration, pointed at this
//! process's copy of the node's database ([`super::checkout`]), set before
//! any device exists; and, after the run, the merge of what the run stored
//! through CubeCL's own bundle export.

use std::path::{Path, PathBuf};

use cubecl_runtime::config::{CubeClRuntimeConfig, RuntimeConfig};

use super::checkout::{Checkout, Merged};
use super::KernelCache;

/// This process's copy, and how many entries it held when the run began.
#[derive(Debug)]
pub(super) struct RunCopy {
    checkout: Checkout,
    entries_at_start: u64,
}

impl RunCopy {
    /// Copy the node's database and hand CubeCL a configuration that keeps
    /// its environment in the copy, compiled kernels cached.
    pub(super) fn take(cache: &KernelCache) -> Result<RunCopy, String> {
        let checkout = Checkout::take(&cache.cubecl_dir(), &cache.procs_dir()).map_err(|e| {
            format!("cannot copy the node's kernel database under {}: {e}", cache.procs_dir().display())
        })?;
        let toml = checkout.toml();
        let loaded = CubeClRuntimeConfig::from_file_path(&toml)
            .map(|config| CubeClRuntimeConfig::try_set(config.override_from_env()))
            .map_err(|e| e.to_string());
        match loaded {
            Ok(true) => Ok(RunCopy { checkout, entries_at_start: entries() }),
            Ok(false) => {
                checkout.discard();
                Err("CubeCL's configuration was already loaded; its kernels are not cached".into())
            }
            Err(e) => {
                checkout.discard();
                Err(format!("CubeCL cannot read {}: {e}", toml.display()))
            }
        }
    }

    /// After the run: merge what it stored into the node's database, or
    /// drop the copy when it stored nothing. Problems are warnings.
    pub(super) fn finish(self) {
        let stored = entries().saturating_sub(self.entries_at_start);
        if stored == 0 {
            return self.checkout.discard();
        }
        let node = self.checkout.node_db();
        match self.checkout.merge_back(export) {
            Ok(Merged::Merged) => {
                eprintln!("worker: kernel cache: {stored} new entries merged into {}", node.display())
            }
            Ok(Merged::ReplacedUnreadable(aside)) => eprintln!(
                "worker: warning: the kernel database {} could not be read; it is now {} and this run's entries replace it",
                node.display(),
                aside.display()
            ),
            Err(e) => eprintln!("worker: warning: this run's kernels were not merged into {}: {e}", node.display()),
        }
    }
}

/// The entries of the active environment (this process's copy).
fn entries() -> u64 {
    cubecl_environment::environment::namespaces().iter().map(|n| n.entries).sum()
}

/// CubeCL's export: one standalone database at `out` holding every entry of
/// `sources`, each key once, the first source's where two hold it.
fn export(sources: &[PathBuf], out: &Path) -> Result<(), String> {
    use cubecl_environment::bundle::{export, ExportOptions};
    let options = ExportOptions { name: "worker kernel cache".into(), ..Default::default() };
    export(sources, out, &options).map(|_| ()).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use cubecl_runtime::config::cache::CacheConfig;

    /// CubeCL itself reads the configuration a copy is taken with: kernel
    /// caching on, its environment in the copy's directory.
    #[test]
    fn cubecl_reads_the_written_configuration() {
        let root = tempfile::tempdir().unwrap();
        let c = Checkout::take(&root.path().join("cubecl"), &root.path().join("proc")).unwrap();
        let config = CubeClRuntimeConfig::from_file_path(c.toml()).unwrap();
        assert!(config.compilation.cache);
        assert!(matches!(config.environment.path, CacheConfig::Directory(ref d) if d == c.dir()));
    }
}
