//! What the Vulkan loader finds on this node, for the message of a device
//! setup that found no adapter: the loader library, and the driver manifests
//! (ICD JSON files) it reads, named by `VK_DRIVER_FILES`, `VK_ICD_FILENAMES`
//! (the older name) and `VK_ADD_DRIVER_FILES`, or found in the standard
//! directories. A run records the result, not the loader's own complaints on
//! stderr, so the result says which of these is missing or broken.

use std::path::Path;

use crate::backend::Backend;

/// The variables that name driver manifests, in the loader's order.
const DRIVER_VARS: [&str; 3] = ["VK_DRIVER_FILES", "VK_ICD_FILENAMES", "VK_ADD_DRIVER_FILES"];

/// Where the loader looks for manifests when no variable names them.
const STANDARD_DIRS: [&str; 4] =
    ["/etc/vulkan/icd.d", "/usr/local/share/vulkan/icd.d", "/usr/share/vulkan/icd.d", "/etc/xdg/vulkan/icd.d"];

/// A failed device setup's cause as a result message: for the backends that
/// run through the Vulkan loader, a cause about the adapter is named so
/// ("no Vulkan adapter: …") with what the loader was given; others as given.
pub fn name_setup_failure(backend: Backend, cause: String) -> String {
    let api = match backend.name() {
        "vulkan" => "Vulkan",
        "wgpu" => "wgpu (Vulkan)",
        _ => return cause,
    };
    if !cause.to_ascii_lowercase().contains("adapter") {
        return cause;
    }
    format!("no {api} adapter: {cause}; {}", diagnose())
}

/// The loader and its driver manifests, in words: the first problem found
/// in each, or what was found.
pub fn diagnose() -> String {
    if !loader_loads() {
        return "the Vulkan loader (libvulkan.so.1) cannot be loaded: install it (Debian: libvulkan1)".into();
    }
    let named: Vec<(&str, String)> =
        DRIVER_VARS.iter().filter_map(|v| std::env::var(v).ok().map(|value| (*v, value))).collect();
    if named.is_empty() {
        let found: Vec<String> = STANDARD_DIRS.iter().flat_map(|d| manifests_in(Path::new(d))).collect();
        return match found.as_slice() {
            [] => format!(
                "no Vulkan driver manifest (ICD JSON) in {}: install the driver's Vulkan ICD or name it with \
                 VK_DRIVER_FILES",
                STANDARD_DIRS.join(", ")
            ),
            _ => format!("the loader's driver manifests: {}", found.join(", ")),
        };
    }
    let said: Vec<String> = named
        .iter()
        .map(|(var, value)| {
            let problems: Vec<String> =
                value.split(':').filter(|p| !p.is_empty()).filter_map(|p| manifest_problem(Path::new(p))).collect();
            match problems.as_slice() {
                [] => format!("{var}={value}"),
                _ => format!("{var}={value}: {}", problems.join("; ")),
            }
        })
        .collect();
    said.join("; ")
}

/// Whether this process can load the Vulkan loader, as wgpu does (by name).
fn loader_loads() -> bool {
    // SAFETY: dlopen with a NUL-terminated name; the handle is closed at once
    // (the library stays loaded while wgpu holds its own handle).
    unsafe {
        let handle = libc::dlopen(c"libvulkan.so.1".as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL);
        if handle.is_null() {
            return false;
        }
        libc::dlclose(handle);
    }
    true
}

/// The `.json` files of a directory, as paths.
fn manifests_in(dir: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut out: Vec<String> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .map(|p| p.display().to_string())
        .collect();
    out.sort();
    out
}

/// What is wrong with a path a variable names as a driver manifest, if
/// anything: missing, unreadable, not a manifest, or naming a driver library
/// that is not there. A directory is read as the loader reads one.
fn manifest_problem(path: &Path) -> Option<String> {
    let shown = path.display();
    if path.is_dir() {
        return manifests_in(path).is_empty().then(|| format!("{shown} holds no .json manifest"));
    }
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Some(format!("{shown} does not exist")),
        Err(e) => return Some(format!("{shown} cannot be read: {e}")),
    };
    let json: serde_json::Value = match serde_json::from_str(&text) {
        Ok(v) => v,
        Err(e) => return Some(format!("{shown} is not a driver manifest (not JSON: {e})")),
    };
    let Some(library) = json.pointer("/ICD/library_path").and_then(|l| l.as_str()) else {
        return Some(format!("{shown} is not a driver manifest (no ICD.library_path)"));
    };
    // A bare name is looked up by the dynamic linker; a path is relative to the manifest.
    if !library.contains('/') {
        return None;
    }
    let lib = path.parent().unwrap_or(Path::new("/")).join(library);
    (!lib.exists()).then(|| format!("{shown} names the driver library {}, which does not exist", lib.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each way a named manifest can be wrong is said with its path.
    #[test]
    fn a_named_manifest_s_problem_is_said_with_its_path() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.json");
        assert_eq!(manifest_problem(&missing), Some(format!("{} does not exist", missing.display())));
        let garbage = dir.path().join("garbage.json");
        std::fs::write(&garbage, "not json").unwrap();
        let said = manifest_problem(&garbage).unwrap();
        assert!(said.starts_with(&format!("{} is not a driver manifest (not JSON", garbage.display())), "{said}");
        let other = dir.path().join("other.json");
        std::fs::write(&other, r#"{"file_format_version": "1.0.0"}"#).unwrap();
        assert!(manifest_problem(&other).unwrap().ends_with("(no ICD.library_path)"));
        let no_lib = dir.path().join("no_lib.json");
        std::fs::write(&no_lib, r#"{"ICD": {"library_path": "./libvulkan_gone.so"}}"#).unwrap();
        let said = manifest_problem(&no_lib).unwrap();
        assert!(said.contains("names the driver library") && said.contains("libvulkan_gone.so"), "{said}");
        let by_name = dir.path().join("by_name.json");
        std::fs::write(&by_name, r#"{"ICD": {"library_path": "libvulkan_lvp.so"}}"#).unwrap();
        assert_eq!(manifest_problem(&by_name), None, "a bare name is the dynamic linker's to find");
        assert_eq!(manifest_problem(dir.path()), None, "a directory of manifests");
        let empty = tempfile::tempdir().unwrap();
        assert!(manifest_problem(empty.path()).unwrap().ends_with("holds no .json manifest"));
    }

    /// The CPU backend's failures are not the loader's: their text stays as it is.
    #[cfg(feature = "flex")]
    #[test]
    fn only_the_vulkan_backends_name_the_adapter() {
        let cause = "No possible adapter available for backend".to_string();
        assert_eq!(name_setup_failure(Backend::Flex, cause.clone()), cause);
    }
}
