//! The module graph of `src/`: no import circles, no arrow back up.
//!
//! Every `crate::…` and `super::…` path of every source file (its `use` lines
//! and the paths written inline, `{a, b::{c}}` groups expanded) names the
//! module it lands in. Then:
//!
//! - between files, no circle (a child using its parent's items, or a parent
//!   re-exporting its child's, is how a module is built, not a circle);
//! - between the crate's top-level modules, no circle, and each imports only
//!   modules of its own or an earlier layer of the list in `src/lib.rs`;
//! - and no source file grows past 600 lines (split it by concept first).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

type Module = Vec<String>;

fn sources() -> BTreeMap<Module, String> {
    fn walk(dir: &Path, root: &Path, out: &mut BTreeMap<Module, String>) {
        for e in std::fs::read_dir(dir).expect("src/ lists") {
            let p = e.expect("entry").path();
            if p.is_dir() {
                walk(&p, root, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                let rel = p.strip_prefix(root).expect("under src").with_extension("");
                let mut m: Module = rel.iter().map(|c| c.to_string_lossy().into_owned()).collect();
                if m.last().is_some_and(|l| l == "mod") {
                    m.pop();
                }
                if m == ["lib"] || m == ["main"] {
                    continue;
                }
                out.insert(m, std::fs::read_to_string(&p).expect("reads"));
            }
        }
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut out = BTreeMap::new();
    walk(&root, &root, &mut out);
    out
}

/// The code of a file without comments and without its inline `mod tests`
/// (whose `super` is the file itself, not its parent).
fn code(text: &str) -> String {
    let text = match text.find("#[cfg(test)]\nmod tests {") {
        Some(i) => &text[..i],
        None => text,
    };
    text.lines().map(|l| l.split("//").next().unwrap_or("")).collect::<Vec<_>>().join("\n")
}

/// The paths a `crate::`/`super::` path tree at the start of `s` expands to.
fn paths(s: &str) -> Vec<Vec<String>> {
    fn tree(s: &[u8], i: &mut usize, prefix: Vec<String>, out: &mut Vec<Vec<String>>) {
        let mut path = prefix;
        loop {
            while *i < s.len() && s[*i].is_ascii_whitespace() {
                *i += 1;
            }
            if *i < s.len() && s[*i] == b'{' {
                *i += 1;
                loop {
                    tree(s, i, path.clone(), out);
                    while *i < s.len() && s[*i].is_ascii_whitespace() {
                        *i += 1;
                    }
                    match s.get(*i) {
                        Some(b',') => *i += 1,
                        Some(b'}') => {
                            *i += 1;
                            break;
                        }
                        _ => break,
                    }
                    while *i < s.len() && s[*i].is_ascii_whitespace() {
                        *i += 1;
                    }
                    if s.get(*i) == Some(&b'}') {
                        *i += 1;
                        break;
                    }
                }
                return;
            }
            let start = *i;
            while *i < s.len() && (s[*i].is_ascii_alphanumeric() || s[*i] == b'_') {
                *i += 1;
            }
            if *i == start {
                break;
            }
            path.push(String::from_utf8_lossy(&s[start..*i]).into_owned());
            if s[*i..].starts_with(b"::") {
                *i += 2;
            } else {
                break;
            }
        }
        out.push(path);
    }
    let mut out = Vec::new();
    tree(s.as_bytes(), &mut 0, Vec::new(), &mut out);
    out
}

/// The module each `crate::`/`super::` path of `m`'s code lands in.
fn imports(m: &Module, text: &str, modules: &BTreeSet<Module>) -> BTreeSet<Module> {
    let code = code(text);
    let mut out = BTreeSet::new();
    for (at, _) in code.match_indices("::") {
        // The first segment of a path: `crate` or `super` not preceded by `::` or an identifier.
        let head_start = code[..at].rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).map_or(0, |i| i + 1);
        let head = &code[head_start..at];
        if head != "crate" && head != "super" {
            continue;
        }
        if code[..head_start].ends_with("::") {
            continue;
        }
        let mut base: Module = if head == "crate" { vec![] } else { m[..m.len().saturating_sub(1)].to_vec() };
        let mut rest = &code[at + 2..];
        while let Some(r) = rest.strip_prefix("super::") {
            base.pop();
            rest = r;
        }
        for p in paths(rest) {
            let full: Module = base.iter().cloned().chain(p).collect();
            if let Some(hit) = (1..=full.len()).rev().map(|n| full[..n].to_vec()).find(|c| modules.contains(c)) {
                if hit != *m {
                    out.insert(hit);
                }
            }
        }
    }
    out
}

fn graph() -> BTreeMap<Module, BTreeSet<Module>> {
    let src = sources();
    let modules: BTreeSet<Module> = src.keys().cloned().collect();
    src.iter().map(|(m, text)| (m.clone(), imports(m, text, &modules))).collect()
}

/// Every circle of `edges` (its strongly connected components of more than one node).
fn circles<N: Ord + Clone>(edges: &BTreeMap<N, BTreeSet<N>>) -> Vec<Vec<N>> {
    // Kosaraju: finish order on the graph, then components on the reversed graph.
    let nodes: BTreeSet<N> =
        edges.iter().flat_map(|(a, bs)| std::iter::once(a.clone()).chain(bs.iter().cloned())).collect();
    let mut order = Vec::new();
    let mut seen = BTreeSet::new();
    for n in &nodes {
        if seen.contains(n) {
            continue;
        }
        let mut stack = vec![(n.clone(), false)];
        while let Some((v, done)) = stack.pop() {
            if done {
                order.push(v);
                continue;
            }
            if !seen.insert(v.clone()) {
                continue;
            }
            stack.push((v.clone(), true));
            for w in edges.get(&v).into_iter().flatten() {
                if !seen.contains(w) {
                    stack.push((w.clone(), false));
                }
            }
        }
    }
    let mut reverse: BTreeMap<N, BTreeSet<N>> = BTreeMap::new();
    for (a, bs) in edges {
        for b in bs {
            reverse.entry(b.clone()).or_default().insert(a.clone());
        }
    }
    let mut assigned = BTreeSet::new();
    let mut out = Vec::new();
    for n in order.iter().rev() {
        if assigned.contains(n) {
            continue;
        }
        let mut comp = vec![];
        let mut stack = vec![n.clone()];
        assigned.insert(n.clone());
        while let Some(v) = stack.pop() {
            comp.push(v.clone());
            for w in reverse.get(&v).into_iter().flatten() {
                if assigned.insert(w.clone()) {
                    stack.push(w.clone());
                }
            }
        }
        if comp.len() > 1 {
            comp.sort();
            out.push(comp);
        }
    }
    out
}

fn show(m: &Module) -> String {
    m.join("::")
}

#[test]
fn paths_expand_nested_groups() {
    assert_eq!(
        paths("a::{b, c::{d, e}, f}::x;"),
        vec![vec!["a", "b"], vec!["a", "c", "d"], vec!["a", "c", "e"], vec!["a", "f"]]
    );
    assert_eq!(paths("state::now()"), vec![vec!["state", "now"]]);
    let modules: BTreeSet<Module> =
        [vec!["a"], vec!["a", "b"], vec!["c"]].into_iter().map(|m| m.into_iter().map(String::from).collect()).collect();
    let m: Module = vec!["a".into(), "b".into()];
    let got = imports(&m, "use super::super::c::X;\nuse crate::{a::Y, c};\nfn f() { crate::a::b::g() }", &modules);
    assert_eq!(got, [vec!["a".to_string()], vec!["c".to_string()]].into_iter().collect());
}

#[test]
fn circles_are_found() {
    let e: BTreeMap<u8, BTreeSet<u8>> =
        [(1, [2].into()), (2, [3].into()), (3, [1].into()), (4, [1].into())].into_iter().collect();
    assert_eq!(circles(&e), vec![vec![1, 2, 3]]);
}

#[test]
fn no_circle_between_files() {
    let g = graph();
    let related = |a: &Module, b: &Module| a.starts_with(b) || b.starts_with(a);
    let files: BTreeMap<Module, BTreeSet<Module>> =
        g.iter().map(|(a, bs)| (a.clone(), bs.iter().filter(|b| !related(a, b)).cloned().collect())).collect();
    let found: Vec<String> =
        circles(&files).iter().map(|c| c.iter().map(show).collect::<Vec<_>>().join(" ⇄ ")).collect();
    assert!(found.is_empty(), "import circles between files:\n{}", found.join("\n"));
}

#[test]
fn top_level_modules_import_only_earlier_layers() {
    let lib = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/lib.rs")).expect("lib.rs");
    // `//! 1. leaves: `fsio` (…), `util`, …` — the names in backticks of each numbered line.
    let mut layer: BTreeMap<String, usize> = BTreeMap::new();
    for (n, line) in lib.lines().filter_map(|l| l.strip_prefix("//! ")).filter_map(|l| l.split_once(". ")).enumerate() {
        if line.0.parse::<usize>().is_err() {
            continue;
        }
        for name in line.1.split('`').skip(1).step_by(2) {
            layer.insert(name.to_string(), n);
        }
    }
    let g = graph();
    let top: BTreeSet<String> = g.keys().map(|m| m[0].clone()).collect();
    let unlisted: Vec<&String> = top.iter().filter(|m| !layer.contains_key(*m)).collect();
    assert!(unlisted.is_empty(), "modules missing from the layers in src/lib.rs: {unlisted:?}");
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut up = Vec::new();
    for (a, bs) in &g {
        for b in bs.iter().filter(|b| b[0] != a[0]) {
            edges.entry(a[0].clone()).or_default().insert(b[0].clone());
            if layer[&b[0]] > layer[&a[0]] {
                up.push(format!("{} → {}", show(a), show(b)));
            }
        }
    }
    assert!(up.is_empty(), "imports of a later layer (an arrow back up):\n{}", up.join("\n"));
    let found: Vec<String> = circles(&edges).iter().map(|c| c.join(" ⇄ ")).collect();
    assert!(found.is_empty(), "import circles between top-level modules:\n{}", found.join("\n"));
}

#[test]
fn no_source_file_over_600_lines() {
    let long: Vec<String> = sources()
        .iter()
        .map(|(m, text)| (show(m), text.lines().count()))
        .filter(|(_, n)| *n > 600)
        .map(|(m, n)| format!("{m}: {n} lines"))
        .collect();
    assert!(long.is_empty(), "split these by concept:\n{}", long.join("\n"));
}

/// README's Layout is the map of this tree: every top-level module of `src/`
/// is listed under `orchestrator/src/` (a file as `name.rs`, a folder as
/// `name/`) and every entry listed exists, as does every top-level folder the
/// map names.
#[test]
fn readme_layout_lists_the_tree_as_it_is() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let readme = std::fs::read_to_string(root.join("README.md")).expect("README.md");
    let layout = readme.split_once("\n## Layout\n").expect("README has a Layout section").1;
    let block = layout.split_once("```text\n").expect("its tree block").1;
    let block = block.split_once("```").expect("the block ends").0;
    let (mut listed, mut in_src) = (BTreeSet::new(), false);
    for line in block.lines() {
        let entry = line.split_whitespace().next().unwrap_or("");
        if !line.starts_with(' ') {
            in_src = entry == "orchestrator/src/";
            assert!(root.join(entry).exists(), "README's Layout lists {entry}, which is not in the repository");
        } else if in_src {
            listed.insert(entry.to_string());
        }
    }
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let actual: BTreeSet<String> = std::fs::read_dir(&src)
        .expect("src/ lists")
        .map(|e| e.expect("entry").path())
        .filter_map(|p| {
            let name = p.file_name()?.to_string_lossy().into_owned();
            match (p.is_dir(), name.as_str()) {
                (true, _) => Some(format!("{name}/")),
                (false, "lib.rs" | "main.rs") => None,
                (false, _) => name.ends_with(".rs").then_some(name),
            }
        })
        .collect();
    let missing: Vec<_> = actual.difference(&listed).collect();
    let stale: Vec<_> = listed.difference(&actual).collect();
    assert!(
        missing.is_empty() && stale.is_empty(),
        "README's Layout under orchestrator/src/: not listed {missing:?}, listed but gone {stale:?}"
    );
}
