//! Shape free memory into a target `/proc/buddyinfo` profile, hold it against compaction, release it.

pub mod shape;
pub mod target;
