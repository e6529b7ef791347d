//! Every page's pointers lead somewhere. A relative Markdown link names a file
//! beside the page (`[..](docs/gpu.md)` from README, `[..](gpu.md)` from
//! docs/); a link to a section (`[..](docs/clusters.md#transports)`) and a
//! pointer in words (`README, "Planning a sweep"`, `docs/gpu.md, "The GPU
//! check"`) name a file that exists and a section it has (a heading, or a
//! paragraph's bold lead: `**How far a verdict can be trusted.**`; a
//! heading's dated suffix, `(2026-11-26)`, may be left out).

use std::path::{Path, PathBuf};

/// Every Markdown page of the repository outside `target/`.
fn pages(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("dir").map(|e| e.expect("entry").path()) {
        let name = entry.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        if entry.is_dir() && !name.starts_with('.') && !name.starts_with("target") {
            pages(&entry, out);
        } else if name.ends_with(".md") {
            out.push(entry);
        }
    }
}

/// GitHub's anchor of a heading: lower case, punctuation dropped, spaces to `-`.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The sections of a page: its headings and its paragraphs' bold leads.
fn sections(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in text.lines() {
        if let Some(h) = line.strip_prefix('#') {
            out.push(h.trim_start_matches('#').trim().to_string());
        }
        if let Some(lead) = line.strip_prefix("**").and_then(|l| l.split("**").next()) {
            out.push(lead.trim_end_matches('.').to_string());
        }
    }
    out
}

/// The file a pointer names, from the page `from` (README alone: the main one).
fn resolve(root: &Path, from: &Path, name: &str) -> Option<PathBuf> {
    let name = name.trim_matches('`');
    if name == "README" {
        return Some(root.join("README.md"));
    }
    [root.join(name), from.parent().expect("a page's folder").join(name)].into_iter().find(|p| p.is_file())
}

#[test]
fn every_pointer_to_a_section_names_one_that_exists() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace root").to_path_buf();
    let mut all = Vec::new();
    pages(&root, &mut all);
    assert!(all.len() >= 8, "{all:?}");
    let (mut checked, mut links) = (0, 0);
    let mut broken = Vec::new();
    for page in &all {
        let text = std::fs::read_to_string(page).expect("page").replace('\n', " ");
        let shown = page.strip_prefix(&root).unwrap_or(page).display().to_string();
        // [text](file#anchor), and [text](file): the file beside the page
        for (at, _) in text.match_indices("](") {
            let target = text[at + 2..].split(')').next().unwrap_or_default();
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let file = target.split('#').next().unwrap_or_default();
            if !file.is_empty() {
                links += 1;
                if !page.parent().expect("a page's folder").join(file).exists() {
                    broken.push(format!("{shown}: ]({target}): no such file beside the page"));
                }
            }
            let Some((file, anchor)) = target.split_once('#') else { continue };
            checked += 1;
            let file = if file.is_empty() { Some(page.clone()) } else { resolve(&root, page, file) };
            match file.map(|f| std::fs::read_to_string(f).unwrap_or_default()) {
                Some(t) if sections(&t).iter().any(|s| slug(s) == anchor) => {}
                _ => broken.push(format!("{shown}: ]({target})")),
            }
        }
        // FILE, "Section"
        for (at, _) in text.match_indices(", \"") {
            let before = text[..at].rsplit([' ', '(', '[']).next().unwrap_or_default();
            if !(before.trim_matches('`') == "README" || before.trim_matches('`').ends_with(".md")) {
                continue;
            }
            let section = text[at + 3..].split('"').next().unwrap_or_default();
            checked += 1;
            let found = resolve(&root, page, before)
                .map(|f| std::fs::read_to_string(f).unwrap_or_default())
                .is_some_and(|t| sections(&t).iter().any(|s| s == section || s.starts_with(&format!("{section} ("))));
            if !found {
                broken.push(format!("{shown}: {before}, \"{section}\""));
            }
        }
    }
    assert!(checked >= 8, "only {checked} pointers found: the scan is broken");
    assert!(links >= 20, "only {links} links to files found: the scan is broken");
    assert!(broken.is_empty(), "pointers to sections that do not exist:\n{}", broken.join("\n"));
}
