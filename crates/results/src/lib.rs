//! A run's results directory, `<output>/<name>-<UTC timestamp>/`: the typed records `fraglab run`
//! writes and every reader (`fraglab compare`, `report`, the run summary, the leak hunt) reads back.
//!
//! | file | type | what |
//! |---|---|---|
//! | run.json | [`record::RunRecord`] | how the run went: plan, phases, fragmenter status, verdict |
//! | workloads.json | [`record::WorkloadsFile`] | every workload window's [`workload::WorkloadResult`] |
//! | probe.jsonl | [`sample::SampleLine`] | the background sampler's snapshots |
//! | baseline.json, final.json | [`Versioned`]`<Snapshot>` | snapshots before and after |
//! | alloc_failures.jsonl | [`Versioned`]`<AllocFailure>` | failed allocations the kernel traced |
//! | kmsg.log | text | the kernel log during the run |
//!
//! Every JSON document and line carries `schema` ([`SCHEMA`]). [`load::Run::load`] reads this
//! schema and the one before it (schema 1: no `schema` field, sweep points as `k=v` labels, no
//! stored plan), and refuses newer ones by name.

pub mod dir;
pub mod load;
pub mod point;
pub mod record;
pub mod sample;
pub mod skmem;
pub mod workload;

use serde::{Deserialize, Serialize};

/// The results schema this fraglab writes. 2: `schema` in every file, sweep points as
/// `{axis: value}`, workload phases with their window, the resolved plan in run.json, workloads.json
/// an object. 1 (implied by no `schema` field): what fraglab 0.1 wrote before.
pub const SCHEMA: u32 = 2;

/// For `#[serde(default)]`: a file without a `schema` field is schema 1.
pub fn schema_1() -> u32 {
    1
}

/// A document or line with the schema beside its fields: `{"schema": 2, ...}`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Versioned<T> {
    #[serde(default = "schema_1")]
    pub schema: u32,
    #[serde(flatten)]
    pub body: T,
}

impl<T> Versioned<T> {
    /// `body` in the current schema.
    pub fn now(body: T) -> Self {
        Versioned { schema: SCHEMA, body }
    }
}
