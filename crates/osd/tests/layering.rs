//! The OSD's modules form layers: what a shard sends and the shared context sit below the
//! handlers (`op`, `peering`, `scrub`, `split`, `reclaim`), and the dispatch of a shard's
//! messages, the server and the startup above them. A module that reaches back up (the
//! shared context naming the shard's state, a handler naming the dispatch) makes a loop of
//! imports in which no file can be read or changed alone: this test reads the crate's
//! `crate::`/`super::` paths and fails on any loop but the one the design keeps (an op waits
//! for its PG's peering, and peering runs the ops that waited).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Loops of files allowed to stay, each as its sorted files.
const ALLOWED: &[&[&str]] = &[&["op/mod.rs", "peering/mod.rs"]];

#[test]
fn the_osd_modules_import_each_other_in_layers_without_loops() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let files = sources(&src);
    assert!(files.len() > 30, "read {} files under {src:?}", files.len());
    let graph: BTreeMap<String, BTreeSet<String>> = files
        .iter()
        .map(|(f, text)| (f.clone(), imports(f, text, &files)))
        .collect();
    // The shared context must not name a shard's state: that back-reference was the loop.
    assert!(
        !graph["context.rs"].iter().any(|d| d.starts_with("shard/")),
        "context.rs imports {:?}",
        graph["context.rs"]
    );
    let loops: Vec<Vec<String>> = strongly_connected(&graph)
        .into_iter()
        .filter(|c| c.len() > 1)
        .collect();
    let unexpected: Vec<_> = loops
        .iter()
        .filter(|c| !ALLOWED.iter().any(|a| a.iter().eq(c.iter())))
        .map(|c| {
            let edges: Vec<String> = c
                .iter()
                .flat_map(|f| {
                    graph[f]
                        .iter()
                        .filter(|d| c.contains(d))
                        .map(move |d| format!("{f} -> {d}"))
                })
                .collect();
            edges.join(", ")
        })
        .collect();
    assert!(
        unexpected.is_empty(),
        "import loops among the OSD's modules: {unexpected:#?}"
    );
}

/// Every source file under `dir` (paths relative to it), without unit-test files.
fn sources(dir: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).expect("read src dir") {
            let p: PathBuf = e.expect("dir entry").path();
            if p.is_dir() {
                todo.push(p);
                continue;
            }
            let rel = p.strip_prefix(dir).expect("under src");
            let rel = rel.to_string_lossy().replace('\\', "/");
            if rel.ends_with(".rs") && rel != "lib.rs" && !rel.ends_with("tests.rs") {
                out.insert(rel, std::fs::read_to_string(&p).expect("read source"));
            }
        }
    }
    out
}

/// The files `file` names through `crate::` and `super::` paths (its unit tests and comments
/// left out).
fn imports(file: &str, text: &str, files: &BTreeMap<String, String>) -> BTreeSet<String> {
    let code = text.split("#[cfg(test)]\nmod tests").next().unwrap_or(text);
    let code: String = code
        .lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n");
    let here = module_of(file);
    let mut out = BTreeSet::new();
    for (root, start) in [("crate::", Vec::new()), ("super::", parent(&here))] {
        let mut rest = code.as_str();
        while let Some(i) = rest.find(root) {
            let preceded = rest[..i].chars().last();
            rest = &rest[i + root.len()..];
            if preceded.is_some_and(|c| c.is_alphanumeric() || c == '_') {
                continue;
            }
            for path in expand(rest) {
                let full: Vec<String> = start.iter().cloned().chain(path).collect();
                if let Some(f) = resolve(&full, files) {
                    if f != file {
                        out.insert(f);
                    }
                }
            }
        }
    }
    out
}

/// The module path of a file: `peering/mod.rs` is `peering`, `op/read.rs` is `op::read`.
fn module_of(file: &str) -> Vec<String> {
    let stem = file.trim_end_matches(".rs");
    let mut parts: Vec<String> = stem.split('/').map(String::from).collect();
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    parts
}

fn parent(module: &[String]) -> Vec<String> {
    module[..module.len().saturating_sub(1)].to_vec()
}

/// The paths a `use`/expression path starting at `s` names: `a::b::C` or `a::{b, c::D}`.
fn expand(s: &str) -> Vec<Vec<String>> {
    let mut head = Vec::new();
    let mut rest = s;
    loop {
        let n = rest
            .find(|c: char| !(c.is_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        if n > 0 {
            head.push(rest[..n].to_string());
        }
        rest = &rest[n..];
        if let Some(r) = rest.strip_prefix("::") {
            rest = r;
            if let Some(group) = rest.strip_prefix('{') {
                let inner = &group[..closing(group)];
                return split_top(inner)
                    .into_iter()
                    .flat_map(|item| {
                        let head = head.clone();
                        expand(item.trim())
                            .into_iter()
                            .map(move |tail| head.iter().cloned().chain(tail).collect())
                    })
                    .collect();
            }
            continue;
        }
        return vec![head];
    }
}

/// Where the group opened just before `s` closes.
fn closing(s: &str) -> usize {
    let mut depth = 0;
    for (i, c) in s.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => return i,
            '}' => depth -= 1,
            _ => {}
        }
    }
    s.len()
}

/// The items of a group, split at its top-level commas.
fn split_top(s: &str) -> Vec<&str> {
    let (mut out, mut depth, mut from) = (Vec::new(), 0, 0);
    for (i, c) in s.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[from..i]);
                from = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[from..]);
    out
}

/// The file the longest prefix of `path` names, if any.
fn resolve(path: &[String], files: &BTreeMap<String, String>) -> Option<String> {
    (1..=path.len()).rev().find_map(|k| {
        let base = path[..k].join("/");
        [format!("{base}.rs"), format!("{base}/mod.rs")]
            .into_iter()
            .find(|f| files.contains_key(f))
    })
}

/// Tarjan's strongly connected components, each sorted.
fn strongly_connected(g: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct T<'a> {
        g: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on: BTreeSet<&'a str>,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(t: &mut T<'a>, v: &'a str) {
        let i = t.index.len();
        t.index.insert(v, i);
        t.low.insert(v, i);
        t.stack.push(v);
        t.on.insert(v);
        for w in t.g.get(v).into_iter().flatten() {
            let w = w.as_str();
            if !t.index.contains_key(w) {
                visit(t, w);
                let lw = t.low[w];
                let lv = t.low.get_mut(v).expect("visited");
                *lv = (*lv).min(lw);
            } else if t.on.contains(w) {
                let iw = t.index[w];
                let lv = t.low.get_mut(v).expect("visited");
                *lv = (*lv).min(iw);
            }
        }
        if t.low[v] == t.index[v] {
            let mut comp = Vec::new();
            while let Some(w) = t.stack.pop() {
                t.on.remove(w);
                comp.push(w.to_string());
                if w == v {
                    break;
                }
            }
            comp.sort();
            t.out.push(comp);
        }
    }
    let mut t = T {
        g,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in g.keys() {
        if !t.index.contains_key(v.as_str()) {
            visit(&mut t, v);
        }
    }
    t.out
}
