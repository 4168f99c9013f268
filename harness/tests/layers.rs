//! The harness library's layers hold: every `crate::` (and `super::`) path in a module
//! of `harness/src` names a module of its own layer or one below, and no files import
//! each other in a loop. The order is the one docs/architecture.md states; a change that
//! needs an upward import moves code down instead (or changes the order here and there,
//! on purpose).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Bottom to top. A module may use its own layer and the layers before it. Names joined
/// by `+` share a layer (they do not use each other).
const LAYERS: &[&str] = &[
    "error+domain+shutdown+files+clock+stats+console",
    "process",
    "metrics",
    "telemetry",
    "config",
    "client",
    "results",
    "backend",
    "sweep",
    "capacity+isolation+equal_load",
    "report",
    "tools",
];

/// A module's path below `crate`, e.g. `["backend", "k8s", "base"]`; `[]` is lib.rs.
type ModPath = Vec<String>;

/// Every module file of the tree at `root`, with the text that counts: test modules
/// (`*_tests.rs`, and everything from `#[cfg(test)]` on) may import anything.
fn module_sources(root: &Path) -> BTreeMap<ModPath, String> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
            .filter_map(|e| e.ok().map(|e| e.path()))
            .collect();
        entries.sort();
        for p in entries {
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|e| e == "rs") {
                out.push(p);
            }
        }
    }
    let mut files = Vec::new();
    walk(root, &mut files);
    let mut out = BTreeMap::new();
    for f in files {
        let rel = f.strip_prefix(root).expect("under root").with_extension("");
        let mut path: ModPath = rel.iter().map(|c| c.to_string_lossy().into_owned()).collect();
        if path.last().is_some_and(|l| l == "mod") {
            path.pop();
        }
        if path == ["lib"] || path == ["main"] {
            path.clear();
        }
        if path.iter().any(|p| p.ends_with("_tests")) {
            continue;
        }
        let text = std::fs::read_to_string(&f).unwrap_or_else(|e| panic!("reading {}: {e}", f.display()));
        out.insert(path, non_test_code(&text));
    }
    out
}

/// A module's code without its test module (everything from `#[cfg(test)]` on).
fn non_test_code(text: &str) -> String {
    match text.find("#[cfg(test)]") {
        Some(i) => text[..i].to_string(),
        None => text.to_string(),
    }
}

/// The module paths a path text names, e.g. `a::b::{c, d::e}` gives
/// `[a, b, c]` and `[a, b, d, e]`.
fn expand(text: &str) -> Vec<Vec<String>> {
    let text = text.trim();
    let mut prefix = Vec::new();
    let mut rest = text;
    loop {
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 1;
            let mut close = group.len();
            for (i, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => {
                        depth -= 1;
                        if depth == 0 {
                            close = i;
                            break;
                        }
                    }
                    _ => {}
                }
            }
            let inner = &group[..close];
            let mut items = Vec::new();
            let (mut depth, mut from) = (0, 0);
            for (i, c) in inner.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        items.push(&inner[from..i]);
                        from = i + 1;
                    }
                    _ => {}
                }
            }
            items.push(&inner[from..]);
            let mut out = Vec::new();
            for item in items.into_iter().map(str::trim).filter(|i| !i.is_empty()) {
                let item = item.split(" as ").next().unwrap_or(item);
                if item == "self" {
                    out.push(prefix.clone());
                    continue;
                }
                for tail in expand(item) {
                    out.push(prefix.iter().cloned().chain(tail).collect());
                }
            }
            return out;
        }
        let end = rest
            .find(|c: char| !(c.is_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        let ident = &rest[..end];
        if ident.is_empty() {
            break;
        }
        prefix.push(ident.to_string());
        rest = &rest[end..];
        match rest.strip_prefix("::") {
            Some(r) => rest = r,
            None => break,
        }
    }
    vec![prefix]
}

/// The modules `code` (the module at `here`) names through `crate::` and `super::`
/// paths, as the longest prefix that is a module of `known`.
fn imports(here: &ModPath, code: &str, known: &BTreeSet<ModPath>) -> BTreeSet<ModPath> {
    let mut out = BTreeSet::new();
    let bytes = code.as_bytes();
    let boundary =
        |i: usize| i == 0 || !(bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_' || bytes[i - 1] == b':');
    let mut targets: Vec<Vec<String>> = Vec::new();
    for (i, _) in code.match_indices("crate::") {
        if boundary(i) {
            targets.extend(expand(&code[i + "crate::".len()..]));
        }
    }
    for (i, _) in code.match_indices("super::") {
        if !boundary(i) {
            continue;
        }
        // `super::super::x`: one level up per `super`; a module's own `super` is its parent.
        let mut base: Vec<String> = here.clone();
        let mut rest = &code[i..];
        while let Some(r) = rest.strip_prefix("super::") {
            base.pop();
            rest = r;
        }
        for tail in expand(rest) {
            targets.push(base.iter().cloned().chain(tail).collect());
        }
    }
    for t in targets {
        for n in (1..=t.len()).rev() {
            let prefix = t[..n].to_vec();
            if known.contains(&prefix) {
                if &prefix != here {
                    out.insert(prefix);
                }
                break;
            }
        }
    }
    out
}

/// The layer of a module (its top-level name's place in [`LAYERS`]); lib.rs is above all.
fn layer(m: &ModPath) -> Option<usize> {
    let top = m.first()?;
    LAYERS.iter().position(|l| l.split('+').any(|n| n == top))
}

/// Every broken rule of the graph: an import into a higher layer, a top-level module in
/// no layer, and each loop of files (a strongly connected set of more than one file).
fn violations(sources: &BTreeMap<ModPath, String>) -> Vec<String> {
    let known: BTreeSet<ModPath> = sources.keys().cloned().collect();
    let edges: BTreeMap<ModPath, BTreeSet<ModPath>> = sources
        .iter()
        .map(|(m, code)| (m.clone(), imports(m, code, &known)))
        .collect();
    let name = |m: &ModPath| if m.is_empty() { "lib".to_string() } else { m.join("::") };
    let mut out = Vec::new();
    for m in sources.keys().filter(|m| !m.is_empty()) {
        if layer(m).is_none() {
            out.push(format!(
                "{} is in no layer: add it to LAYERS and docs/architecture.md",
                name(m)
            ));
        }
    }
    for (from, tos) in &edges {
        let Some(lf) = layer(from) else { continue };
        for to in tos {
            if let Some(lt) = layer(to)
                && lt > lf
            {
                out.push(format!(
                    "{} imports {}, a higher layer ({} above {})",
                    name(from),
                    name(to),
                    LAYERS[lt],
                    LAYERS[lf]
                ));
            }
        }
    }
    // Tarjan's strongly connected components.
    struct Tarjan<'a> {
        edges: &'a BTreeMap<ModPath, BTreeSet<ModPath>>,
        index: BTreeMap<ModPath, usize>,
        low: BTreeMap<ModPath, usize>,
        stack: Vec<ModPath>,
        on: BTreeSet<ModPath>,
        loops: Vec<Vec<ModPath>>,
    }
    impl Tarjan<'_> {
        fn visit(&mut self, v: &ModPath) {
            let i = self.index.len();
            self.index.insert(v.clone(), i);
            self.low.insert(v.clone(), i);
            self.stack.push(v.clone());
            self.on.insert(v.clone());
            let next: Vec<ModPath> = self.edges.get(v).into_iter().flatten().cloned().collect();
            for w in next {
                if !self.index.contains_key(&w) {
                    self.visit(&w);
                    let lw = self.low[&w];
                    let lv = self.low.get_mut(v).expect("visited");
                    *lv = (*lv).min(lw);
                } else if self.on.contains(&w) {
                    let iw = self.index[&w];
                    let lv = self.low.get_mut(v).expect("visited");
                    *lv = (*lv).min(iw);
                }
            }
            if self.low[v] == self.index[v] {
                let mut component = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on.remove(&w);
                    let done = &w == v;
                    component.push(w);
                    if done {
                        break;
                    }
                }
                if component.len() > 1 {
                    component.sort();
                    self.loops.push(component);
                }
            }
        }
    }
    let mut t = Tarjan {
        edges: &edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        loops: Vec::new(),
    };
    for v in edges.keys() {
        if !t.index.contains_key(v) {
            t.visit(v);
        }
    }
    for l in t.loops {
        out.push(format!(
            "these files import each other in a loop: {}",
            l.iter().map(name).collect::<Vec<_>>().join(" <-> ")
        ));
    }
    out
}

#[test]
fn the_harness_library_keeps_its_layers() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let sources = module_sources(&root);
    assert!(sources.len() > 50, "read {} modules", sources.len());
    let broken = violations(&sources);
    assert!(
        broken.is_empty(),
        "the layers of harness/src are broken:\n{}",
        broken.join("\n")
    );
}

fn tree(files: &[(&str, &str)]) -> BTreeMap<ModPath, String> {
    files
        .iter()
        .map(|(p, code)| {
            let path: ModPath = p.split("::").filter(|s| !s.is_empty()).map(String::from).collect();
            (path, non_test_code(code))
        })
        .collect()
}

#[test]
fn an_upward_import_and_a_loop_are_caught() {
    // config (a lower layer) reaching into backend, through a `use` group.
    let up = tree(&[
        ("config", "use crate::{domain::Strategy, backend::k8s::objects};"),
        ("domain", ""),
        ("backend", ""),
        ("backend::k8s", ""),
        ("backend::k8s::objects", "use crate::domain::Strategy;"),
    ]);
    let v = violations(&up);
    assert_eq!(v.len(), 1, "{v:?}");
    assert!(v[0].starts_with("config imports backend::k8s::objects"), "{v:?}");
    // Two files of one layer using each other, one through `super::`.
    let cycle = tree(&[
        ("backend", ""),
        ("backend::a", "use super::b::thing;"),
        ("backend::b", "fn f() { crate::backend::a::g() }"),
    ]);
    let v = violations(&cycle);
    assert_eq!(
        v,
        ["these files import each other in a loop: backend::a <-> backend::b"]
    );
    // Test code may import anything; a module of no layer is named.
    let fine = tree(&[
        ("config", "fn f() {}\n#[cfg(test)]\nmod tests { use crate::report; }"),
        ("report", ""),
        ("gadgets", ""),
    ]);
    assert_eq!(
        violations(&fine),
        ["gadgets is in no layer: add it to LAYERS and docs/architecture.md"]
    );
}
