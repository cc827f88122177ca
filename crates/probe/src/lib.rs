//! Read and record the kernel's memory state.
//!
//! One module per kernel interface; each parses text (so real captures can be tested) and reads the
//! live file. Parse errors name the file and line. Derived views — the `free` table, the
//! fragmentation indices — live beside the interface they are computed from.

pub mod buddyinfo;
pub mod error;
pub mod extfrag;
pub mod fallback;
pub mod kmsg;
pub mod meminfo;
pub mod page_reporting;
pub mod pagetypeinfo;
pub mod slabinfo;
pub mod snapshot;
pub mod sock_diag;
pub mod sockstat;
pub mod stack;
pub mod tracefs;
pub mod vmstat;
pub mod zoneinfo;

pub use error::{Error, Result};
