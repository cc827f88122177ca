//! Every crate's modules import one way: no module imports one that imports it back, directly or
//! around a loop (docs/development.md, "The map"). Read from the source itself: each file's
//! paths (`crate::`, `super::`, `self::`, and a child module's bare `name::`) outside comments and
//! test modules, resolved to the longest module they name; `mod` declarations are not imports.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

mod common;

/// `src/a/b.rs` or `src/a/b/mod.rs` → `a::b`; `src/lib.rs`, `src/main.rs` → `` (the root).
fn module_of(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).unwrap().with_extension("");
    let mut parts: Vec<String> = rel.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    if matches!(parts.last().map(String::as_str), Some("mod" | "lib" | "main")) {
        parts.pop();
    }
    parts.join("::")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The code of a file an import can be in: comments out, and every `#[cfg(test)] mod … { … }`
/// block (another `#[cfg(test)]` item stays: counting it can only show a loop, never hide one).
fn code(text: &str) -> String {
    let code: String = text
        .lines()
        .map(|l| match l.find("//") {
            Some(i) => &l[..i],
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n");
    let mut out = String::new();
    let mut rest = code.as_str();
    while let Some(i) = rest.find("#[cfg(test)]") {
        let after = &rest[i + "#[cfg(test)]".len()..];
        let item = after.trim_start();
        if item.starts_with("mod ") && item.find('{').is_some_and(|b| !item[..b].contains(';')) {
            out.push_str(&rest[..i]);
            let open = after.len() - item.len() + item.find('{').unwrap();
            let close = matching(after, open);
            rest = &after[(close + 1).min(after.len())..];
        } else {
            out.push_str(&rest[..i + "#[cfg(test)]".len()]);
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// Every path starting at `crate`, `super` or `self` in `code`, as segments from that word on;
/// `use crate::{a, b::c}` gives one path per member.
fn paths(code: &str) -> Vec<Vec<String>> {
    let bytes = code.as_bytes();
    let mut out = Vec::new();
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    let mut i = 0;
    while i < bytes.len() {
        let rest = code.get(i..).unwrap_or("");
        let boundary = i == 0 || !(ident(bytes[i - 1]) || bytes[i - 1] == b':');
        if !boundary || !rest.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_') {
            i += 1;
            continue;
        }
        let word_end = rest.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(rest.len());
        let word = &rest[..word_end];
        if !rest[word_end..].starts_with("::") {
            i += word_end.max(1);
            continue;
        }
        // `crate::`, `super::`, `self::`, or a bare `child::` (a module of this one, or another
        // crate, which resolves to no module here).
        let (mut segs, mut j) = match word {
            "crate" | "super" | "self" => (vec![word.to_string()], i + word_end + 2),
            _ => (vec!["self".to_string()], i),
        };
        // Segments (more `super`s among them); a `{` opens a list of member paths.
        loop {
            if code[j..].starts_with('{') {
                let close = matching(code, j);
                out.extend(expand(&segs, &code[j + 1..close]));
                segs.clear();
                j = close;
                break;
            }
            let start = j;
            while j < bytes.len() && ident(bytes[j]) {
                j += 1;
            }
            if j > start {
                segs.push(code[start..j].to_string());
            }
            if j > start && code[j..].starts_with("::") {
                j += 2;
                continue;
            }
            break;
        }
        if !segs.is_empty() {
            out.push(segs);
        }
        i = j.max(i + 1);
    }
    out
}

fn matching(code: &str, open: usize) -> usize {
    let mut depth = 0;
    for (k, c) in code[open..].char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return open + k;
                }
            }
            _ => {}
        }
    }
    code.len()
}

/// The paths of a `{…}` list after `prefix`, nested lists expanded: `a::{b, c::{d, e}}`.
fn expand(prefix: &[String], list: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    for member in split_top(list) {
        let member = member.trim();
        let (head, inner) = match member.find('{') {
            Some(b) => (&member[..b], Some(&member[b + 1..member.rfind('}').unwrap_or(member.len())])),
            None => (member, None),
        };
        let mut p = prefix.to_vec();
        p.extend(
            head.split("::")
                .map(|s| s.split(" as ").next().unwrap().trim().to_string())
                .filter(|s| !s.is_empty() && s != "*" && s != "self"),
        );
        match inner {
            Some(inner) => out.extend(expand(&p, inner)),
            None => out.push(p),
        }
    }
    out
}

fn split_top(list: &str) -> Vec<String> {
    let (mut out, mut cur, mut depth) = (Vec::new(), String::new(), 0);
    for c in list.chars() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                out.push(std::mem::take(&mut cur));
                continue;
            }
            _ => {}
        }
        cur.push(c);
    }
    out.push(cur);
    out.into_iter().filter(|m| !m.trim().is_empty()).collect()
}

/// The module a path from `here` names: the longest known module prefix once `crate`/`super`/`self`
/// are resolved.
fn target(here: &str, path: &[String], modules: &BTreeSet<String>) -> String {
    let mut base: Vec<&str> = if here.is_empty() { vec![] } else { here.split("::").collect() };
    let mut rest = path;
    match rest[0].as_str() {
        "crate" => base.clear(),
        "super" => {
            while rest.first().is_some_and(|s| s == "super") {
                base.pop();
                rest = &rest[1..];
            }
        }
        _ => {}
    }
    let skip = usize::from(matches!(path[0].as_str(), "crate" | "self"));
    let mut m: Vec<String> = base.iter().map(|s| s.to_string()).collect();
    let mut best = m.join("::");
    for seg in &rest[skip.min(rest.len())..] {
        m.push(seg.clone());
        let name = m.join("::");
        if modules.contains(&name) {
            best = name;
        } else {
            break;
        }
    }
    best
}

/// Strongly connected groups of more than one module.
fn cycles(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    let nodes: Vec<&String> = edges.keys().collect();
    let reach = |from: &String| -> BTreeSet<String> {
        let mut seen = BTreeSet::new();
        let mut stack = vec![from.clone()];
        while let Some(n) = stack.pop() {
            for m in edges.get(&n).into_iter().flatten() {
                if seen.insert(m.clone()) {
                    stack.push(m.clone());
                }
            }
        }
        seen
    };
    let reaches: BTreeMap<&String, BTreeSet<String>> = nodes.iter().map(|n| (*n, reach(n))).collect();
    let mut groups: Vec<Vec<String>> = Vec::new();
    for n in &nodes {
        let group: Vec<String> = nodes
            .iter()
            .filter(|m| reaches[n].contains(**m) && reaches[*m].contains(*n))
            .map(|m| m.to_string())
            .collect();
        if group.len() > 1 && !groups.contains(&group) {
            groups.push(group);
        }
    }
    groups
}

#[test]
fn no_crate_has_a_module_cycle() {
    let crates = common::repo().join("crates");
    let mut found = Vec::new();
    let mut checked = 0;
    for c in std::fs::read_dir(&crates).unwrap() {
        let src = c.unwrap().path().join("src");
        if !src.is_dir() {
            continue;
        }
        let mut files = Vec::new();
        rust_files(&src, &mut files);
        let modules: BTreeSet<String> = files.iter().map(|f| module_of(&src, f)).collect();
        let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for f in &files {
            let here = module_of(&src, f);
            let code = code(&std::fs::read_to_string(f).unwrap());
            for p in paths(&code) {
                let to = target(&here, &p, &modules);
                if to != here {
                    edges.entry(here.clone()).or_default().insert(to);
                }
            }
            edges.entry(here).or_default();
        }
        checked += modules.len();
        for g in cycles(&edges) {
            let show = |m: &String| if m.is_empty() { "(crate root)".to_string() } else { m.clone() };
            let detail: Vec<String> = g
                .iter()
                .map(|m| {
                    let to: Vec<String> = edges[m].iter().filter(|t| g.contains(t)).map(show).collect();
                    format!("{} → {}", show(m), to.join(", "))
                })
                .collect();
            let name = src.parent().unwrap().file_name().unwrap().to_string_lossy().into_owned();
            found.push(format!("crates/{name}: {}", detail.join("; ")));
        }
    }
    assert!(checked > 50, "only {checked} modules found: is the source tree where it should be?");
    assert!(found.is_empty(), "modules that import each other round a loop:\n{}", found.join("\n"));
}

/// The reader itself, on code it must get right.
/// No crate prints with std's macros, which panic on a closed pipe (`fraglab status | head -1`);
/// fraglab-stdio's print the same way and never do. Tests inside a crate may: the harness reads them.
#[test]
fn no_crate_prints_with_macros_that_panic() {
    let crates = common::repo().join("crates");
    let mut found = Vec::new();
    for c in std::fs::read_dir(&crates).unwrap() {
        let src = c.unwrap().path().join("src");
        if !src.is_dir() || src.starts_with(crates.join("stdio")) {
            continue;
        }
        let mut files = Vec::new();
        rust_files(&src, &mut files);
        for f in files {
            let code = code(&std::fs::read_to_string(&f).unwrap());
            for l in code.lines() {
                let bare = |m: &str| {
                    l.match_indices(m)
                        .any(|(i, _)| !l[..i].ends_with(|c: char| c.is_alphanumeric() || c == '_'))
                };
                if ["println!", "eprintln!", "print!", "eprint!"].iter().any(|m| bare(m)) {
                    found.push(format!("{}: {}", f.display(), l.trim()));
                }
            }
        }
    }
    assert!(found.is_empty(), "std's print macros (use outln!/errln!):\n{}", found.join("\n"));
}

#[test]
fn the_reader_resolves_paths_lists_and_super() {
    let modules: BTreeSet<String> = ["", "a", "a::b", "c"].iter().map(|s| s.to_string()).collect();
    let text = code("use crate::{a::b::X, c};\n// crate::c in a comment\nfn f() { super::b::y(); self::z(); std::mem::drop(e::f()); }\n#[cfg(test)]\nmod tests { use crate::c; }");
    let got: Vec<String> = paths(&text).iter().map(|p| target("a::d", p, &modules)).collect();
    assert_eq!(got, ["a::b", "c", "a::b", "a::d", "a::d", "a::d"]);
    let got: Vec<String> = paths("use b::X;").iter().map(|p| target("a", p, &modules)).collect();
    assert_eq!(got, ["a::b"]);
    // Nested lists reach every module they name; only the test module is left out.
    let nested = code("use crate::{a::{b::X, self}, c as d};\n#[cfg(test)]\nfn helper() { crate::c::f(); }\n#[cfg(test)]\nmod tests { use crate::a::b; }\nfn g() { crate::a::b::h(); }");
    let got: Vec<String> = paths(&nested).iter().map(|p| target("", p, &modules)).collect();
    assert_eq!(got, ["a::b", "a", "c", "c", "a::b"]);
    let mut edges = BTreeMap::new();
    edges.insert("a".to_string(), BTreeSet::from(["c".to_string()]));
    edges.insert("c".to_string(), BTreeSet::from(["a".to_string()]));
    assert_eq!(cycles(&edges), [["a", "c"]]);
}
