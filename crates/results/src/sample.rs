//! One line of probe.jsonl: a snapshot from the background sampler, and whether the target held
//! since the line before.

use fraglab_probe::snapshot::Sample;
use serde::{Deserialize, Serialize};

/// probe.jsonl's line.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SampleLine {
    /// The results schema ([`crate::SCHEMA`]); absent (1) in lines written before it.
    #[serde(default = "crate::schema_1")]
    pub schema: u32,
    #[serde(flatten)]
    pub sample: Sample,
    /// None for a baseline run, and in lines written before the keeper.
    #[serde(default)]
    pub target: Option<SampleTarget>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SampleTarget {
    /// Not lost at any moment since the previous sample.
    pub held: bool,
    pub lost_ms: f64,
    /// Free pages at or above the target order per zone at the keeper's last look (before it
    /// re-broke any); zones not in play (DMA, and every zone in regions mode) are reported, not
    /// counted.
    pub zones: Vec<fraglab_fragmenter::keeper::ZoneAbove>,
}
