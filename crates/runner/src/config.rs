//! A run config as written (`configs/*.toml`): serde structs that reject unknown keys. Nothing here
//! reads the kernel; [`crate::runplan`] resolves a config into a validated plan.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::Deserialize;

use crate::resolve::FragmentSpec;

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub run: RunSection,
    /// The fragmenter's target; absent or `enabled = false` for a baseline run.
    #[serde(default)]
    pub fragment: Option<FragmentSpec>,
    #[serde(default)]
    pub probe: ProbeSection,
    /// One or more workloads, run in order at every sweep point and iteration.
    #[serde(default)]
    pub workload: Vec<toml::Table>,
    #[serde(default)]
    pub sweep: SweepSection,
    #[serde(default)]
    pub expect: ExpectSection,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunSection {
    pub name: String,
    #[serde(default = "one")]
    pub iterations: u32,
    /// Where `<name>-<UTC timestamp>/` result directories go.
    #[serde(default = "results_dir")]
    pub output: PathBuf,
    /// A few words for the reader of the results.
    #[serde(default)]
    pub description: Option<String>,
}

fn one() -> u32 {
    1
}

fn results_dir() -> PathBuf {
    PathBuf::from("results")
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProbeSection {
    /// Background sampling interval (`1s`).
    #[serde(default = "default_interval")]
    pub interval: String,
    /// Monitors to sample (default: all this machine allows).
    #[serde(default)]
    pub monitors: Vec<String>,
    /// The failure catcher records failed allocations of this order and above.
    #[serde(default = "default_catch_order")]
    pub catch_min_order: u32,
    /// Watch /dev/kmsg for "page allocation failure" and OOM lines.
    #[serde(default = "crate::resolve::yes")]
    pub kmsg: bool,
}

impl Default for ProbeSection {
    fn default() -> Self {
        ProbeSection {
            interval: default_interval(),
            monitors: Vec::new(),
            catch_min_order: default_catch_order(),
            kmsg: true,
        }
    }
}

fn default_interval() -> String {
    "1s".into()
}

fn default_catch_order() -> u32 {
    1
}

/// `[sweep]`: every key is an array; the run crosses them into a matrix. Workload option names apply
/// to every workload that has that option; `sysctl."name"` sets a sysctl (journaled, restored).
// No deny_unknown_fields: every other key is a workload option, checked when the plan is resolved.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct SweepSection {
    #[serde(default)]
    pub sysctl: BTreeMap<String, Vec<toml::Value>>,
    #[serde(flatten)]
    pub options: BTreeMap<String, Vec<toml::Value>>,
}

/// `[expect]`: what counts as "reproduced". Any one condition met is enough.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExpectSection {
    /// An errno any workload saw, by name (`ENOMEM`, `ENOBUFS`).
    #[serde(default)]
    pub errno: Vec<String>,
    /// A failed allocation of this order or above caught in the kernel (tracefs or kmsg) that
    /// surfaced: one the kernel falls back from counts only when `failed_in` names its call site.
    #[serde(default)]
    pub failed_order: Option<u32>,
    /// Kernel functions: a caught failure counts only when its stack names one of them
    /// (`sctp_packet_transmit`), so a THP fault or another subsystem's quiet fallback does not.
    #[serde(default)]
    pub failed_in: Vec<String>,
}

/// The text of a config and where it came from, kept so errors can point into it.
pub struct Source {
    pub path: PathBuf,
    pub text: String,
}

impl Source {
    pub fn read(path: &Path) -> Result<Source> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read config {}", path.display()))?;
        Ok(Source { path: path.to_path_buf(), text })
    }

    /// Parse into [`Config`]. Syntax errors, wrong types and unknown keys come back with the file,
    /// line and column, and the offending text underlined by the toml crate.
    pub fn parse(&self) -> Result<Config> {
        toml::from_str(&self.text).map_err(|e| anyhow::anyhow!("{}: {e}", self.path.display()))
    }

    /// `configs/x.toml:12:1: [fragment] budget` — where a key path is written, for semantic errors.
    /// Path elements are table keys or array indices (`["workload", "1", "threads"]`).
    pub fn locate(&self, path: &[&str]) -> String {
        let key = render_key(path);
        match self.span_of(path) {
            Some(offset) => {
                let before = &self.text[..offset];
                let line = before.matches('\n').count() + 1;
                let col = offset - before.rfind('\n').map_or(0, |i| i + 1) + 1;
                format!("{}:{line}:{col}: {key}", self.path.display())
            }
            None => format!("{}: {key}", self.path.display()),
        }
    }

    fn span_of(&self, path: &[&str]) -> Option<usize> {
        use toml::de::{DeTable, DeValue};
        let root = DeTable::parse(&self.text).ok()?;
        let mut table = root.get_ref();
        let mut value: Option<&toml::Spanned<DeValue>> = None;
        for (i, part) in path.iter().enumerate() {
            let v = match value {
                Some(v) => match v.get_ref() {
                    DeValue::Table(t) => t.get(*part)?,
                    DeValue::Array(a) => a.get(part.parse::<usize>().ok()?)?,
                    _ => return None,
                },
                None => table.get(*part)?,
            };
            if i + 1 == path.len() {
                return Some(v.span().start);
            }
            value = Some(v);
            if let DeValue::Table(t) = v.get_ref() {
                table = t;
            }
        }
        None
    }
}

/// `["fragment", "budget"]` → `[fragment] budget`; `["workload", "1", "threads"]` →
/// `[[workload]] #2 threads`.
pub fn render_key(path: &[&str]) -> String {
    match path {
        [table] => format!("[{table}]"),
        ["workload", i] => format!("[[workload]] #{}", i.parse::<usize>().map(|n| n + 1).unwrap_or(0)),
        ["workload", i, rest @ ..] => {
            let n = i.parse::<usize>().map(|n| n + 1).unwrap_or(0);
            format!("[[workload]] #{n} {}", rest.join("."))
        }
        [table, rest @ ..] => format!("[{table}] {}", rest.join(".")),
        [] => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn src(text: &str) -> Source {
        Source { path: "t.toml".into(), text: text.into() }
    }

    #[test]
    fn locate_points_at_the_value() {
        let s = src("[run]\nname = \"x\"\n\n[fragment]\nbudget = \"9TiB\"\n\n[[workload]]\nkind = \"a\"\n[[workload]]\nkind = \"b\"\nthreads = 0\n");
        assert_eq!(s.locate(&["fragment", "budget"]), "t.toml:5:10: [fragment] budget");
        assert_eq!(s.locate(&["workload", "1", "threads"]), "t.toml:11:11: [[workload]] #2 threads");
        assert_eq!(s.locate(&["fragment", "nope"]), "t.toml: [fragment] nope");
    }

    #[test]
    fn unknown_keys_and_types_name_line_and_column() {
        let e = src("[run]\nname = \"x\"\nitterations = 3\n").parse().unwrap_err().to_string();
        assert!(e.contains("t.toml") && e.contains("line 3") && e.contains("itterations"), "{e}");
        let e = src("[run]\nname = \"x\"\n[fragment]\nbudgett = \"1GiB\"\n").parse().unwrap_err().to_string();
        assert!(e.contains("line 4") && e.contains("budgett"), "{e}");
        let e = src("[run]\nname = \"x\"\niterations = \"three\"\n").parse().unwrap_err().to_string();
        assert!(e.contains("line 3") && e.contains("iterations"), "{e}");
    }
}
