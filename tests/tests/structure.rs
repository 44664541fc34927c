//! Import circles between the modules of `sql` and `server`, and the size
//! limits of the sql crate.
//!
//! A module imports the ones below it and is never imported back: this
//! program reads every `.rs` file under `sql/src` and `server/src`, takes each
//! `crate::module` path it names (in `use` lines, `use crate::{a, b::c}`
//! trees, and paths written inline in code), and builds the graph between
//! top-level modules of each crate. A module is a file path under `src/`:
//! `table/store.rs`, `table/mod.rs` and `session/dml.rs` belong to `table`
//! and `session`; names the crate root re-exports (`crate::Error`) count for
//! the module they come from. Comments are skipped, so doc links
//! (`[`crate::memory`]`) are not imports.
//!
//! It fails, naming every cycle and the lines that make it, if the graph has
//! one. It also fails, naming the offenders, when a function in `sql/src` is
//! longer than [`MAX_FUNCTION_LINES`], `Session::execute_inner` (the
//! session's one dispatch) longer than [`MAX_DISPATCH_LINES`], or
//! `sql/src/session.rs` longer than [`MAX_SESSION_LINES`] (issue 24's
//! limits: code a newcomer can walk). A function spans from its `fn` line to
//! the first line holding only its indentation and `}` (rustfmt's layout). Run with `cargo test -p sluice-tests --test structure`; it is a plain
//! program (`harness = false`), so it needs no build of the crates it reads.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// The crates whose module graph must be acyclic, relative to the workspace.
const CRATES: &[&str] = &["sql", "server"];

/// The longest function allowed in `sql/src`, in lines.
const MAX_FUNCTION_LINES: usize = 120;
/// The longest `Session::execute_inner` allowed, in lines.
const MAX_DISPATCH_LINES: usize = 60;
/// The longest `sql/src/session.rs` allowed, in lines.
const MAX_SESSION_LINES: usize = 600;

/// At most this many cycles are printed per crate; the components are always printed whole.
const MAX_CYCLES: usize = 200;

/// One module's imports: the module it names → the places (file:line) that name it.
type Edges = BTreeMap<String, BTreeMap<String, Vec<String>>>;

fn main() -> ExitCode {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ is inside the workspace")
        .to_path_buf();
    let mut failed = false;
    for krate in CRATES {
        let src = root.join(krate).join("src");
        let edges = crate_graph(&src);
        let cycles = cycles(&edges);
        if cycles.is_empty() {
            println!(
                "{krate}: no import circle among {} modules",
                modules(&edges).len()
            );
            continue;
        }
        failed = true;
        println!("{krate}: {} import circle(s):", cycles.len());
        for (i, cycle) in cycles.iter().enumerate().take(MAX_CYCLES) {
            println!("  {}. {} -> {}", i + 1, cycle.join(" -> "), cycle[0]);
        }
        if cycles.len() > MAX_CYCLES {
            println!("  ... and {} more", cycles.len() - MAX_CYCLES);
        }
        println!("{krate}: the imports that close them (module -> module: file:line):");
        let on_cycle: BTreeSet<(&String, &String)> = cycles
            .iter()
            .flat_map(|c| (0..c.len()).map(move |i| (&c[i], &c[(i + 1) % c.len()])))
            .collect();
        for (from, to) in on_cycle {
            println!("  {from} -> {to}: {}", edges[from][to].join(", "));
        }
    }
    let sizes = size_violations(&root.join("sql").join("src"));
    for v in &sizes {
        println!("sql: {v}");
    }
    if sizes.is_empty() {
        println!(
            "sql: every function within {MAX_FUNCTION_LINES} lines, execute_inner within \
             {MAX_DISPATCH_LINES}, session.rs within {MAX_SESSION_LINES}"
        );
    }
    if failed || !sizes.is_empty() {
        if failed {
            println!("import circles found: a module below must not import the one above it");
        }
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// The module graph of one crate (`src` is its source folder).
fn crate_graph(src: &Path) -> Edges {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    files.sort();
    let reexports = root_reexports(src);
    let mut edges: Edges = BTreeMap::new();
    for file in &files {
        let rel = file.strip_prefix(src).expect("file is under src");
        let Some(from) = module_of(rel) else { continue };
        edges.entry(from.clone()).or_default();
        let text = fs::read_to_string(file).expect("readable source file");
        let code = strip_comments(&text);
        for (line, to) in crate_paths(&code) {
            let to = reexports.get(&to).cloned().unwrap_or(to);
            if to == from || !is_module(src, &to) {
                continue;
            }
            edges
                .entry(from.clone())
                .or_default()
                .entry(to)
                .or_default()
                .push(format!("{}:{line}", rel.display()));
        }
    }
    edges
}

/// Functions, the dispatch and session.rs over their limits, one line each.
fn size_violations(src: &Path) -> Vec<String> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    files.sort();
    let mut out = Vec::new();
    for file in &files {
        let rel = file.strip_prefix(src).expect("file is under src");
        let text = fs::read_to_string(file).expect("readable source file");
        if rel == Path::new("session.rs") && text.lines().count() > MAX_SESSION_LINES {
            out.push(format!(
                "session.rs has {} lines (at most {MAX_SESSION_LINES})",
                text.lines().count()
            ));
        }
        for (name, line, len) in functions(&text) {
            let max = if name == "execute_inner" {
                MAX_DISPATCH_LINES
            } else {
                MAX_FUNCTION_LINES
            };
            if len > max {
                out.push(format!(
                    "{}:{line}: fn {name} has {len} lines (at most {max})",
                    rel.display()
                ));
            }
        }
    }
    out
}

/// Every function with a body: (name, first line, lines from `fn` to its closing brace).
fn functions(text: &str) -> Vec<(String, usize, usize)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let Some(name) = fn_name(line) else { continue };
        let indent = &line[..line.len() - line.trim_start().len()];
        let close = format!("{indent}}}");
        if line.trim_end().ends_with(';') || line.trim_end().ends_with('}') {
            continue; // a declaration, or a body on one line
        }
        if let Some(end) = lines[i + 1..].iter().position(|l| *l == close) {
            out.push((name, i + 1, end + 2));
        }
    }
    out
}

/// The name of the function a line opens (`pub(crate) async fn name<T>(`).
fn fn_name(line: &str) -> Option<String> {
    let mut rest = line.trim_start();
    if rest.starts_with("//") {
        return None;
    }
    for prefix in [
        "pub(crate) ",
        "pub(super) ",
        "pub ",
        "const ",
        "async ",
        "unsafe ",
    ] {
        rest = rest.strip_prefix(prefix).unwrap_or(rest);
    }
    // the qualifiers come in that order; once more for `pub async`, `pub const`
    for prefix in ["const ", "async ", "unsafe "] {
        rest = rest.strip_prefix(prefix).unwrap_or(rest);
    }
    let rest = rest.strip_prefix("fn ")?;
    let name: String = rest
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect();
    (!name.is_empty()).then_some(name)
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).expect("readable source folder") {
        let path = entry.expect("readable folder entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level module a file belongs to; `None` for the crate root and binaries.
fn module_of(rel: &Path) -> Option<String> {
    let first = rel.components().next()?.as_os_str().to_str()?;
    if rel.components().count() > 1 {
        return (first != "bin").then(|| first.to_string());
    }
    let name = first.strip_suffix(".rs")?;
    (!matches!(name, "lib" | "main")).then(|| name.to_string())
}

/// Whether `name` is a top-level module of the crate (`name.rs` or `name/`).
fn is_module(src: &Path, name: &str) -> bool {
    src.join(format!("{name}.rs")).is_file() || src.join(name).is_dir()
}

/// Names `lib.rs` re-exports, mapped to the module they come from
/// (`pub use error::{Error, Result};` → `Error` → `error`).
fn root_reexports(src: &Path) -> BTreeMap<String, String> {
    let mut map = BTreeMap::new();
    let Ok(text) = fs::read_to_string(src.join("lib.rs")) else {
        return map;
    };
    let code = strip_comments(&text);
    for stmt in code.split(';') {
        let stmt = stmt.trim();
        let Some(tree) = stmt.strip_prefix("pub use ") else {
            continue;
        };
        let tree = tree.trim().trim_start_matches("crate::");
        let Some((module, rest)) = tree.split_once("::") else {
            continue;
        };
        let rest = rest.trim().trim_start_matches('{').trim_end_matches('}');
        for name in rest.split(',') {
            let name = name.split(" as ").last().unwrap_or(name).trim();
            let name = name.rsplit("::").next().unwrap_or(name);
            if !name.is_empty() {
                map.insert(name.to_string(), module.trim().to_string());
            }
        }
    }
    map
}

/// The source with comments blanked out (newlines kept, so line numbers
/// stay), string and char literals kept as they are.
fn strip_comments(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i..].starts_with(b"//") {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if b[i..].starts_with(b"/*") {
            let mut depth = 0;
            while i < b.len() {
                if b[i..].starts_with(b"/*") {
                    depth += 1;
                    i += 2;
                } else if b[i..].starts_with(b"*/") {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    if b[i] == b'\n' {
                        out.push(b'\n');
                    }
                    i += 1;
                }
            }
        } else if b[i] == b'\'' {
            // A char literal (`'"'`, `'\''`) is copied whole; a lifetime is one quote.
            let len = if b.get(i + 1) == Some(&b'\\') {
                b[i + 2..].iter().position(|&c| c == b'\'').map(|p| p + 3)
            } else if b.get(i + 2) == Some(&b'\'') {
                Some(3)
            } else {
                None
            };
            let len = len.unwrap_or(1);
            out.extend_from_slice(&b[i..i + len]);
            i += len;
        } else if b[i] == b'"' {
            // A string literal: copy it whole so a `//` inside is not a comment.
            out.push(b[i]);
            i += 1;
            while i < b.len() && b[i] != b'"' {
                if b[i] == b'\\' && i + 1 < b.len() {
                    out.push(b[i]);
                    i += 1;
                }
                out.push(b[i]);
                i += 1;
            }
            if i < b.len() {
                out.push(b[i]);
                i += 1;
            }
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).expect("comments removed on ASCII boundaries")
}

fn is_ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// Every top-level module named through `crate::`, with its line number:
/// `crate::a::X` gives `a`; `crate::{a, b::{c, d}}` gives `a` and `b`.
fn crate_paths(code: &str) -> Vec<(usize, String)> {
    let b = code.as_bytes();
    let mut found = Vec::new();
    let line_at = |pos: usize| code[..pos].bytes().filter(|&c| c == b'\n').count() + 1;
    let mut start = 0;
    while let Some(off) = code[start..].find("crate::") {
        let at = start + off;
        start = at + "crate::".len();
        if at > 0 && (is_ident(b[at - 1]) || b[at - 1] == b'$') {
            continue;
        }
        let mut i = start;
        while i < b.len() && b[i].is_ascii_whitespace() {
            i += 1;
        }
        if i < b.len() && b[i] == b'{' {
            // A use tree: the first identifier of each item at depth 1.
            let mut depth = 0;
            let mut expect_item = true;
            while i < b.len() {
                match b[i] {
                    b'{' => {
                        depth += 1;
                        expect_item = depth == 1;
                        i += 1;
                    }
                    b'}' => {
                        depth -= 1;
                        i += 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    b',' => {
                        expect_item = depth == 1;
                        i += 1;
                    }
                    c if is_ident(c) && expect_item => {
                        let s = i;
                        while i < b.len() && is_ident(b[i]) {
                            i += 1;
                        }
                        found.push((line_at(s), code[s..i].to_string()));
                        expect_item = false;
                    }
                    _ => i += 1,
                }
            }
        } else {
            let s = i;
            while i < b.len() && is_ident(b[i]) {
                i += 1;
            }
            if i > s {
                found.push((line_at(s), code[s..i].to_string()));
            }
        }
    }
    found
}

fn modules(edges: &Edges) -> BTreeSet<&String> {
    edges
        .iter()
        .flat_map(|(from, to)| std::iter::once(from).chain(to.keys()))
        .collect()
}

/// Every elementary cycle of the graph, each starting at its smallest module
/// (so each is listed once), shortest first.
fn cycles(edges: &Edges) -> Vec<Vec<String>> {
    let mut found = Vec::new();
    for start in modules(edges) {
        let mut path = vec![start.clone()];
        walk(edges, start, &mut path, &mut found);
    }
    found.sort_by(|a: &Vec<String>, b| a.len().cmp(&b.len()).then(a.cmp(b)));
    found
}

/// Depth-first from the last module of `path`, only through modules greater
/// than `path[0]`, recording each way back to `path[0]`.
fn walk(edges: &Edges, start: &String, path: &mut Vec<String>, found: &mut Vec<Vec<String>>) {
    let last = path.last().expect("path starts non-empty").clone();
    let Some(next) = edges.get(&last) else { return };
    for to in next.keys() {
        if to == start {
            found.push(path.clone());
        } else if to > start && !path.contains(to) {
            path.push(to.clone());
            walk(edges, start, path, found);
            path.pop();
        }
    }
}
