//! Shape free memory into a target `/proc/buddyinfo` profile, hold it against compaction, release it.
//!
//! [`fragment::Fragmenter::start`] takes memory with one worker per CPU ([`populate`], [`arena`]),
//! reads where it landed physically into a bitmap of the frames it owns ([`frames`]), chooses which
//! pages to free so the buddy allocator is left with exactly the wanted free blocks ([`shape`]), and
//! frees them. Sysctls go through a journal ([`sysctl`]) so they are restored on
//! release, exit or signal, and by the next fraglab if this one was killed ([`instance`]). A holding
//! fragmenter answers `status` and `release` on a Unix socket ([`control`]); one that holds while its
//! caller runs workloads keeps its guard on a thread ([`hold`]). While holding, the keeper
//! ([`keeper`]) takes back free blocks of the target order that form, and records when the target held;
//! for a profile target, how close the free blocks are to it is measured ([`fidelity`]).

// outln!, errln!, out!, err!: printing that never panics on a closed pipe, in every module.
#[macro_use]
extern crate fraglab_stdio;

pub mod arena;
pub mod control;
pub mod cpu;
pub mod describe;
pub mod fidelity;
pub mod fragment;
pub mod frames;
pub mod hold;
pub mod instance;
pub mod keeper;
pub mod pipefill;
pub mod populate;
pub mod shape;
pub mod sysctl;
pub mod target;

pub use fragment::{Fragmenter, Pin, Plan, Status};
pub use target::Target;
