//! Helpers shared by the probe's tests: mutations of real captures, the check that a parse error
//! names its source and a line that exists, and the one way a test skips.
#![allow(dead_code)] // each test binary uses what it needs

use std::fmt::Display;
use std::time::{Duration, Instant};

use fraglab_probe::Error;
use proptest::prelude::*;

/// Set to `1` by scripts/test (so in CI): a test that would skip fails instead, naming why. On the
/// CI machine every probe test can run, so a skip there is a broken machine or a broken test.
pub const REQUIRE_ALL: &str = "FRAGLAB_REQUIRE_ALL";

pub fn require_all() -> bool {
    std::env::var(REQUIRE_ALL).is_ok_and(|v| v == "1")
}

/// The one way a probe test skips: says `skipped: <reason>` and returns, and the caller returns too.
/// Under `FRAGLAB_REQUIRE_ALL=1` it panics instead, with the reason.
pub fn skip(reason: impl Display) {
    if require_all() {
        panic!("{REQUIRE_ALL}=1: this test would have skipped: {reason}");
    }
    println!("skipped: {reason}");
}

/// For a test that cannot run while the machine is busy (another fraglab uses tracefs): `busy`
/// says why it cannot run now, or `None`. Without `FRAGLAB_REQUIRE_ALL=1` a busy machine is a skip
/// (false). With it the test waits, up to `bound`, and then fails naming the bound and the reason;
/// true once `busy` says `None`.
pub fn wait_until_idle(bound: Duration, mut busy: impl FnMut() -> Option<String>) -> bool {
    let start = Instant::now();
    let mut said = false;
    loop {
        let Some(why) = busy() else { return true };
        if !require_all() {
            skip(why);
            return false;
        }
        if start.elapsed() >= bound {
            panic!("{REQUIRE_ALL}=1: this test would have skipped: {why}; still so after waiting {bound:?}");
        }
        if !said {
            eprintln!("waiting (at most {bound:?}, {REQUIRE_ALL}=1): {why}");
            said = true;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Up to 8 line- and character-level edits of `base`.
pub fn mutated(base: &'static str) -> impl Strategy<Value = String> {
    let edit = (any::<prop::sample::Index>(), any::<prop::sample::Index>(), 0u8..7, any::<char>());
    prop::collection::vec(edit, 1..8).prop_map(move |edits| {
        let mut lines: Vec<Vec<char>> = base.lines().map(|l| l.chars().collect()).collect();
        for (li, ci, kind, ch) in edits {
            if lines.is_empty() {
                lines.push(Vec::new());
            }
            let l = li.index(lines.len());
            let c = ci.index(lines[l].len() + 1);
            match kind {
                0 => drop(lines.remove(l)),
                1 => lines.insert(l, lines[l].clone()),
                2 => lines[l].insert(c, ch),
                3 if c < lines[l].len() => lines[l][c] = ch,
                4 if c < lines[l].len() => drop(lines[l].remove(c)),
                5 => lines[l].splice(c..c, "99999999999999999999".chars()).for_each(drop),
                6 => lines[l].splice(c..c, " -1 ".chars()).for_each(drop),
                _ => {}
            }
        }
        lines.iter().map(|l| l.iter().collect::<String>()).collect::<Vec<_>>().join("\n")
    })
}

/// Every parse error must name `path` and a 1-based line that exists in `text`, quoting it.
pub fn assert_names_line(err: &Error, path: &str, text: &str) {
    let Error::Parse { path: p, line, text: quoted, .. } = err else { panic!("not a parse error: {err}") };
    assert_eq!(p.to_str(), Some(path), "{err}");
    let lines: Vec<&str> = text.lines().collect();
    assert!(*line >= 1 && *line <= lines.len().max(1), "line {line} outside 1..={}: {err}", lines.len());
    let expected: String = lines.get(line - 1).copied().unwrap_or("").chars().take(160).collect();
    assert_eq!(*quoted, expected, "{err}");
}
