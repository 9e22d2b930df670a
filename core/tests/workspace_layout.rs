//! The workspace's layout rules, checked on its own source, so that the map
//! a new engineer reads stays the map the code follows:
//!
//! - **No circles.** In no crate do two files import each other, directly
//!   or around a circle (`use`, and `crate::` / `super::` / `self::` paths
//!   in code; test modules left out). A circle means neither file can be
//!   read, changed or tested without the other.
//! - **No arrow runs back up in `node`.** No module of the node crate
//!   imports from its parent module's own file (`use super::…` reaching
//!   `mod.rs`): what a parent and its children share lives in a child of
//!   its own, and the parent only puts its children together.
//! - **No big files but the pure machines.** No file has more than
//!   [`MAX_LINES`] lines outside its test modules, except the named pure
//!   state machines of `core` ([`PURE_MACHINES`]), whose rules read best
//!   in one place.
//!
//! The scan reads text, not Rust's syntax tree: comments, strings and
//! character literals are blanked first, and `use` trees are expanded; a
//! path is charged to the file of the longest module prefix it names.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// Most lines a file may have outside its test modules.
const MAX_LINES: usize = 800;

/// The pure state machines allowed past [`MAX_LINES`]: each is one machine's
/// rules, tested on its outputs, and reads best whole.
const PURE_MACHINES: &[&str] = &[
    "core/src/escrow/machine.rs",
    "core/src/escrow/fair_key.rs",
    "core/src/coordinator/windows.rs",
    "core/src/coordinator/sharding.rs",
];

/// The crates of the workspace, by folder.
const CRATES: &[&str] = &[
    "core",
    "raft-store",
    "node",
    "client",
    "proto",
    "chaos-tests",
];

/// A module's path inside its crate (`["coordinator", "api"]`); the crate
/// root is the empty path.
type ModPath = Vec<String>;

/// One source file of a crate: its module path, its text with comments,
/// strings and test modules blanked, and its non-test line count.
struct SourceFile {
    path: PathBuf,
    module: ModPath,
    code: String,
    lines: usize,
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// Every library source file of a crate (binaries' own roots, `bin/`
/// folders and files named `tests.rs` or under a `tests` folder left out).
fn crate_files(crate_dir: &Path) -> Vec<SourceFile> {
    let src = crate_dir.join("src");
    let mut out = Vec::new();
    let mut stack = vec![src.clone()];
    while let Some(dir) = stack.pop() {
        for entry in fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            if path.is_dir() {
                if name != "bin" && name != "tests" {
                    stack.push(path);
                }
                continue;
            }
            if !name.ends_with(".rs") || name == "tests.rs" || name == "main.rs" {
                continue;
            }
            let relative = path.strip_prefix(&src).unwrap().with_extension("");
            let mut module: ModPath = relative
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            if matches!(module.last().map(String::as_str), Some("mod" | "lib")) {
                module.pop();
            }
            let text = fs::read_to_string(&path).unwrap();
            let blanked = blank_comments_and_literals(&text);
            let (code, test_lines) = blank_test_items(&blanked);
            let lines = text.lines().count() - test_lines;
            out.push(SourceFile {
                path,
                module,
                code,
                lines,
            });
        }
    }
    out
}

/// `text` with every comment, string and character literal replaced by
/// spaces (newlines kept), so that neither braces nor paths inside them
/// are read as code.
fn blank_comments_and_literals(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let blank = |c: char| if c == '\n' { '\n' } else { ' ' };
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                out.push(' ');
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    out.push_str("  ");
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    out.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    out.push(blank(chars[i]));
                    i += 1;
                }
            }
        } else if c == 'r'
            && (next == Some('"') || next == Some('#'))
            && !is_ident_char(i.checked_sub(1).map(|p| chars[p]))
        {
            // A raw string r"…" or r#"…"#.
            let mut j = i + 1;
            let mut hashes = 0;
            while chars.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if chars.get(j) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            j += 1;
            loop {
                if j >= chars.len() {
                    break;
                }
                if chars[j] == '"' && (0..hashes).all(|h| chars.get(j + 1 + h) == Some(&'#')) {
                    j += 1 + hashes;
                    break;
                }
                j += 1;
            }
            for &ch in &chars[i..j.min(chars.len())] {
                out.push(blank(ch));
            }
            i = j;
        } else if c == '"' {
            out.push(' ');
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                if chars[i] == '\\' {
                    out.push(' ');
                    i += 1;
                }
                if i < chars.len() {
                    out.push(blank(chars[i]));
                    i += 1;
                }
            }
            out.push(' ');
            i += 1;
        } else if c == '\'' {
            // A character literal ('x', '\n', '\u{..}') or a lifetime ('a).
            let end = if next == Some('\\') {
                (i + 2..chars.len()).find(|&j| chars[j] == '\'')
            } else if chars.get(i + 2) == Some(&'\'') {
                Some(i + 2)
            } else {
                None
            };
            match end {
                Some(end) => {
                    for &ch in &chars[i..=end] {
                        out.push(blank(ch));
                    }
                    i = end + 1;
                }
                None => {
                    out.push(c);
                    i += 1;
                }
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

fn is_ident_char(c: Option<char>) -> bool {
    c.is_some_and(|c| c.is_alphanumeric() || c == '_')
}

/// `code` (already blanked) with every item under `#[cfg(test)]` blanked
/// (a test module, function, impl or `use`), and how many lines those items
/// spanned.
fn blank_test_items(code: &str) -> (String, usize) {
    let mut test_lines = 0;
    let mut out: Vec<char> = code.chars().collect();
    let text: String = out.iter().collect();
    let mut search_from = 0;
    while let Some(found) = text[search_from..].find("#[cfg(test)]") {
        let start = search_from + found;
        let chars_start = text[..start].chars().count();
        let mut j = chars_start;
        let mut depth = 0usize;
        let mut opened = false;
        while j < out.len() {
            match out[j] {
                '{' => {
                    depth += 1;
                    opened = true;
                }
                '}' if !opened => break,
                ',' if !opened => break,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        j += 1;
                        break;
                    }
                }
                ';' if !opened => {
                    j += 1;
                    break;
                }
                _ => {}
            }
            j += 1;
        }
        let end = j.min(out.len());
        for ch in &mut out[chars_start..end] {
            if *ch == '\n' {
                test_lines += 1;
            } else {
                *ch = ' ';
            }
        }
        search_from = start + "#[cfg(test)]".len();
    }
    (out.iter().collect::<String>(), test_lines)
}

/// The paths a file's code names, as written (`crate::a::b`, `super::x`,
/// `self::y`, and every path of its `use` trees).
fn named_paths(code: &str) -> Vec<Vec<String>> {
    let mut paths = Vec::new();
    let mut rest = code;
    let mut without_uses = String::new();
    // `use` trees first, expanded.
    while let Some(at) = find_word(rest, "use") {
        without_uses.push_str(&rest[..at]);
        let after = &rest[at + 3..];
        let Some(end) = after.find(';') else { break };
        expand_use_tree(after[..end].trim(), &mut Vec::new(), &mut paths);
        rest = &after[end + 1..];
    }
    without_uses.push_str(rest);
    // Then paths written in code.
    let bytes: Vec<char> = without_uses.chars().collect();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i].is_alphabetic() && !is_ident_char(i.checked_sub(1).map(|p| bytes[p])) {
            let mut j = i;
            let mut path = Vec::new();
            loop {
                let s = j;
                while j < bytes.len() && is_ident_char(Some(bytes[j])) {
                    j += 1;
                }
                path.push(bytes[s..j].iter().collect::<String>());
                if bytes.get(j) == Some(&':')
                    && bytes.get(j + 1) == Some(&':')
                    && is_ident_char(bytes.get(j + 2).copied())
                {
                    j += 2;
                } else {
                    break;
                }
            }
            if path.len() > 1 && matches!(path[0].as_str(), "crate" | "super" | "self") {
                paths.push(path);
            }
            i = j.max(i + 1);
        } else {
            i += 1;
        }
    }
    paths
}

/// Where the word `word` stands in `text` as a whole word.
fn find_word(text: &str, word: &str) -> Option<usize> {
    let mut from = 0;
    while let Some(found) = text[from..].find(word) {
        let at = from + found;
        let before = text[..at].chars().next_back();
        let after = text[at + word.len()..].chars().next();
        if !is_ident_char(before) && after.is_some_and(char::is_whitespace) {
            return Some(at);
        }
        from = at + word.len();
    }
    None
}

/// Every path of one `use` tree (`a::{b, c::{d as e}, self}`), each under
/// `prefix`.
fn expand_use_tree(tree: &str, prefix: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    let tree = tree.trim().trim_start_matches("::");
    if tree.is_empty() {
        return;
    }
    if let Some(inner) = tree.strip_prefix('{') {
        let inner = inner.strip_suffix('}').unwrap_or(inner);
        for part in split_top_level(inner) {
            expand_use_tree(part, prefix, out);
        }
        return;
    }
    match tree.find("::") {
        Some(sep) if !tree[..sep].contains('{') => {
            let head = tree[..sep].trim().to_string();
            prefix.push(head);
            expand_use_tree(&tree[sep + 2..], prefix, out);
            prefix.pop();
        }
        _ => {
            let name = tree.split_whitespace().next().unwrap_or("");
            let mut path = prefix.clone();
            if name != "self" && name != "*" {
                path.push(name.to_string());
            }
            if !path.is_empty() {
                out.push(path);
            }
        }
    }
}

/// `text` split at its commas outside braces.
fn split_top_level(text: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut depth = 0;
    let mut start = 0;
    for (i, c) in text.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&text[start..]);
    parts
}

/// A written path made absolute from the crate root, when it names the
/// crate's own modules: `crate::…`, `super::…`, `self::…`, or a child
/// module of `module` named bare.
fn absolute(module: &ModPath, path: &[String], children: &BTreeSet<String>) -> Option<ModPath> {
    let mut current: ModPath;
    let mut rest = path;
    match path.first().map(String::as_str) {
        Some("crate") => {
            current = Vec::new();
            rest = &path[1..];
        }
        Some("self") => {
            current = module.clone();
            rest = &path[1..];
        }
        Some("super") => current = module.clone(),
        Some(first) if children.contains(first) => current = module.clone(),
        _ => return None,
    }
    for segment in rest {
        if segment == "super" {
            current.pop()?;
        } else {
            current.push(segment.clone());
        }
    }
    Some(current)
}

/// Each file's imports, as the files they reach (the longest module prefix
/// that is a file), split into arrows to other files and arrows to the
/// file's own ancestors.
struct ImportGraph {
    files: BTreeMap<ModPath, PathBuf>,
    arrows: BTreeMap<ModPath, BTreeSet<ModPath>>,
    up_arrows: BTreeSet<(ModPath, ModPath)>,
}

fn import_graph(files: &[SourceFile]) -> ImportGraph {
    let by_module: BTreeMap<ModPath, PathBuf> = files
        .iter()
        .map(|f| (f.module.clone(), f.path.clone()))
        .collect();
    let mut arrows: BTreeMap<ModPath, BTreeSet<ModPath>> = BTreeMap::new();
    let mut up_arrows = BTreeSet::new();
    for file in files {
        let children: BTreeSet<String> = by_module
            .keys()
            .filter(|m| m.len() == file.module.len() + 1 && m.starts_with(&file.module))
            .map(|m| m.last().unwrap().clone())
            .collect();
        let from = arrows.entry(file.module.clone()).or_default();
        for path in named_paths(&file.code) {
            let Some(target) = absolute(&file.module, &path, &children) else {
                continue;
            };
            let Some(reached) = (0..=target.len())
                .rev()
                .map(|n| target[..n].to_vec())
                .find(|prefix| by_module.contains_key(prefix))
            else {
                continue;
            };
            if reached == file.module {
                continue;
            }
            if file.module.starts_with(&reached) {
                up_arrows.insert((file.module.clone(), reached));
            } else {
                from.insert(reached);
            }
        }
    }
    ImportGraph {
        files: by_module,
        arrows,
        up_arrows,
    }
}

/// The graph's circles: its strongly connected groups of two or more files.
fn circles(graph: &ImportGraph) -> Vec<Vec<ModPath>> {
    struct Walk<'a> {
        graph: &'a ImportGraph,
        index: BTreeMap<ModPath, usize>,
        low: BTreeMap<ModPath, usize>,
        stack: Vec<ModPath>,
        on_stack: BTreeSet<ModPath>,
        found: Vec<Vec<ModPath>>,
    }
    fn visit(walk: &mut Walk, v: &ModPath) {
        let n = walk.index.len();
        walk.index.insert(v.clone(), n);
        walk.low.insert(v.clone(), n);
        walk.stack.push(v.clone());
        walk.on_stack.insert(v.clone());
        let targets: Vec<ModPath> = walk
            .graph
            .arrows
            .get(v)
            .into_iter()
            .flatten()
            .cloned()
            .collect();
        for w in targets {
            if !walk.index.contains_key(&w) {
                visit(walk, &w);
                let low = walk.low[v].min(walk.low[&w]);
                walk.low.insert(v.clone(), low);
            } else if walk.on_stack.contains(&w) {
                let low = walk.low[v].min(walk.index[&w]);
                walk.low.insert(v.clone(), low);
            }
        }
        if walk.low[v] == walk.index[v] {
            let mut group = Vec::new();
            loop {
                let w = walk.stack.pop().unwrap();
                walk.on_stack.remove(&w);
                let done = &w == v;
                group.push(w);
                if done {
                    break;
                }
            }
            if group.len() > 1 {
                group.sort();
                walk.found.push(group);
            }
        }
    }
    let mut walk = Walk {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for v in graph.files.keys() {
        if !walk.index.contains_key(v) {
            visit(&mut walk, v);
        }
    }
    walk.found
}

fn shown(module: &ModPath) -> String {
    if module.is_empty() {
        "<crate root>".to_string()
    } else {
        module.join("/")
    }
}

#[test]
fn no_files_of_a_crate_import_each_other_around_a_circle() {
    let mut found = Vec::new();
    for name in CRATES {
        let graph = import_graph(&crate_files(&workspace_root().join(name)));
        for group in circles(&graph) {
            let members: BTreeSet<&ModPath> = group.iter().collect();
            let inside: Vec<String> = group
                .iter()
                .flat_map(|from| {
                    graph.arrows[from]
                        .iter()
                        .filter(|to| members.contains(to))
                        .map(move |to| format!("{} -> {}", shown(from), shown(to)))
                })
                .collect();
            found.push(format!("{name}: {}", inside.join(", ")));
        }
    }
    assert!(
        found.is_empty(),
        "circles of imports:\n{}",
        found.join("\n")
    );
}

#[test]
fn no_module_of_the_node_crate_imports_from_its_parent_file() {
    let graph = import_graph(&crate_files(&workspace_root().join("node")));
    let up: Vec<String> = graph
        .up_arrows
        .iter()
        .map(|(from, to)| format!("{} -> {}", shown(from), shown(to)))
        .collect();
    assert!(up.is_empty(), "arrows back up in node:\n{}", up.join("\n"));
}

#[test]
fn no_file_but_the_pure_machines_is_over_the_line_limit() {
    let root = workspace_root();
    let mut big = Vec::new();
    for name in CRATES {
        for file in crate_files(&root.join(name)) {
            let relative = file
                .path
                .strip_prefix(&root)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            if file.lines > MAX_LINES && !PURE_MACHINES.contains(&relative.as_str()) {
                big.push(format!("{relative}: {} lines", file.lines));
            }
        }
    }
    assert!(
        big.is_empty(),
        "files over {MAX_LINES} lines outside their tests:\n{}",
        big.join("\n")
    );
}

// The scan itself, on inputs whose answer is known.

#[test]
fn use_trees_expand_into_every_path_they_name() {
    let mut out = Vec::new();
    expand_use_tree(
        "crate::{a::{b, c as d}, e, self}",
        &mut Vec::new(),
        &mut out,
    );
    let shown: Vec<String> = out.iter().map(|p| p.join("::")).collect();
    assert_eq!(shown, ["crate::a::b", "crate::a::c", "crate::e", "crate"]);
}

#[test]
fn paths_in_comments_strings_and_tests_are_not_imports() {
    let code = "// use crate::a;\nfn f() { let s = \"crate::b::c\"; let c = '{'; }\n#[cfg(test)]\nmod tests { use crate::d; }\nfn g() { crate::e::f(); }\n";
    let (blanked, test_lines) = blank_test_items(&blank_comments_and_literals(code));
    assert_eq!(test_lines, 1);
    let paths: Vec<String> = named_paths(&blanked).iter().map(|p| p.join("::")).collect();
    assert_eq!(paths, ["crate::e::f"]);
}

#[test]
fn a_circle_through_three_files_is_found_and_a_chain_is_not() {
    let module = |s: &str| -> ModPath { s.split('/').map(String::from).collect() };
    let mut graph = ImportGraph {
        files: BTreeMap::new(),
        arrows: BTreeMap::new(),
        up_arrows: BTreeSet::new(),
    };
    for (from, to) in [("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")] {
        graph.files.insert(module(from), PathBuf::new());
        graph.files.insert(module(to), PathBuf::new());
        graph
            .arrows
            .entry(module(from))
            .or_default()
            .insert(module(to));
    }
    assert_eq!(
        circles(&graph),
        vec![vec![module("a"), module("b"), module("c")]]
    );
    graph
        .arrows
        .get_mut(&module("c"))
        .unwrap()
        .remove(&module("a"));
    assert!(circles(&graph).is_empty());
}
