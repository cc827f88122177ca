//! The examples in README.md and docs/ that can run anywhere are what the binary prints.
//!
//! A fenced block right after a comment
//!
//! ```text
//! <!-- doc-example
//! fraglab scan crates/probe/tests/captures/kmsg/netdev-2018-08-10-sctp-buddyinfo.mail
//! -->
//! ```
//!
//! is checked against the commands' output (each one's stdout, then its stderr, run from the
//! checkout in the order given): every line of the block appears, in order, and lines not
//! separated by a `...` line appear one right after the other. Examples that depend on this
//! machine's memory or kernel carry no such comment.

use std::path::Path;
use std::process::Command;

mod common;
use common::{repo, FRAGLAB};

const MARK: &str = "<!-- doc-example";

struct Example {
    file: String,
    line: usize,
    commands: Vec<String>,
    block: Vec<String>,
}

/// Every marked example in one markdown file.
fn examples(path: &Path) -> Vec<Example> {
    let text = std::fs::read_to_string(path).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let file = path.strip_prefix(repo()).unwrap_or(path).display().to_string();
    let mut found = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        if !lines[i].starts_with(MARK) {
            i += 1;
            continue;
        }
        let line = i + 1;
        let mut commands = Vec::new();
        i += 1;
        while !lines[i].starts_with("-->") {
            commands.push(lines[i].trim().to_string());
            i += 1;
        }
        i += 1;
        assert!(
            lines[i].starts_with("```"),
            "{file}:{line}: a doc-example comment must be followed by a fenced block"
        );
        i += 1;
        let mut block = Vec::new();
        while !lines[i].starts_with("```") {
            block.push(lines[i].trim_end().to_string());
            i += 1;
        }
        assert!(!commands.is_empty() && !block.is_empty(), "{file}:{line}: an empty doc-example");
        found.push(Example { file: file.clone(), line, commands, block });
    }
    found
}

/// The commands' output, each one's stdout then its stderr.
fn output(e: &Example) -> Vec<String> {
    let mut out = Vec::new();
    for c in &e.commands {
        assert!(
            !c.contains(['"', '\'', '|', '>']),
            "{}:{}: write `{c}` without quotes or redirection",
            e.file,
            e.line
        );
        let mut words = c.split_whitespace();
        assert_eq!(words.next(), Some("fraglab"), "{}:{}: {c}", e.file, e.line);
        let o = Command::new(FRAGLAB).args(words).current_dir(repo()).output().unwrap();
        for stream in [&o.stdout, &o.stderr] {
            out.extend(String::from_utf8_lossy(stream).lines().map(|l| l.trim_end().to_string()));
        }
    }
    out
}

/// Where the block's lines fail to appear in `out`, if they do.
fn mismatch(block: &[String], out: &[String]) -> Option<String> {
    let mut from = 0;
    for segment in block.split(|l| l == "...") {
        if segment.is_empty() {
            continue;
        }
        let at = (from..out.len()).find(|&s| out[s..].starts_with(segment));
        match at {
            Some(s) => from = s + segment.len(),
            None => {
                // Name the first line of the segment that does not follow on.
                let start = (from..out.len()).find(|&s| out[s] == segment[0]);
                let why = match start {
                    None => format!("not printed: {:?}", segment[0]),
                    Some(s) => {
                        let k = segment.iter().zip(&out[s..]).take_while(|(a, b)| a == b).count();
                        format!(
                            "after {:?}: the block says {:?}, the binary prints {:?}",
                            segment[k - 1],
                            segment[k],
                            out.get(s + k)
                        )
                    }
                };
                return Some(why);
            }
        }
    }
    None
}

#[test]
fn documented_examples_are_what_the_binary_prints() {
    let root = repo();
    let mut files = vec![root.join("README.md")];
    let mut docs: Vec<_> = std::fs::read_dir(root.join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    docs.sort();
    files.extend(docs);
    let all: Vec<Example> = files.iter().flat_map(|f| examples(f)).collect();
    // The docs that promise examples from the binary have them.
    for want in ["docs/config.md", "docs/failures.md"] {
        assert!(all.iter().any(|e| e.file == want), "no doc-example in {want}");
    }
    let mut wrong = Vec::new();
    for e in &all {
        let out = output(e);
        if let Some(why) = mismatch(&e.block, &out) {
            wrong.push(format!("{}:{}: {why}\n--- printed:\n{}", e.file, e.line, out.join("\n")));
        }
    }
    assert!(wrong.is_empty(), "{} of {} examples differ:\n{}", wrong.len(), all.len(), wrong.join("\n\n"));
}

/// The matcher itself: order, adjacency and `...`.
#[test]
fn the_matcher_wants_order_and_adjacency() {
    let s = |v: &[&str]| v.iter().map(|l| l.to_string()).collect::<Vec<_>>();
    let out = s(&["a", "b", "c", "d"]);
    assert_eq!(mismatch(&s(&["a", "b"]), &out), None);
    assert_eq!(mismatch(&s(&["a", "...", "d"]), &out), None);
    assert!(mismatch(&s(&["a", "c"]), &out).unwrap().contains("the block says \"c\""));
    assert!(mismatch(&s(&["b", "...", "a"]), &out).unwrap().contains("not printed: \"a\""));
    assert!(mismatch(&s(&["x"]), &out).unwrap().contains("not printed"));
}
