//! What the runner's test binaries share: the binary under test, the checkout, and running it the way
//! a test on a shared machine must.
#![allow(dead_code)] // each test binary uses its own subset

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Arc, Mutex};

pub const FRAGLAB: &str = env!("CARGO_BIN_EXE_fraglab");

/// The checkout: configs/ and docs/ are read from here, and runs start here.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `fraglab --run-dir RUN_DIR ARGS` from the checkout. The instance lock is machine-wide, so a test
/// queues behind any other fraglab (another test binary, an engineer's run) instead of being refused.
pub fn fraglab(run_dir: &Path, args: &[&str]) -> Output {
    Command::new(FRAGLAB)
        .arg("--run-dir")
        .arg(run_dir)
        .args(args)
        .current_dir(repo())
        .env(fraglab_fragmenter::instance::WAIT_ENV, "600s")
        .output()
        .unwrap()
}

/// A child's stdout or stderr, read on a thread as it comes so a test can look at it while the child
/// runs (and the pipe never fills and stalls it).
pub fn collect(mut from: impl Read + Send + 'static) -> Arc<Mutex<String>> {
    let text = Arc::new(Mutex::new(String::new()));
    let to = Arc::clone(&text);
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = from.read(&mut buf) {
            if n == 0 {
                break;
            }
            to.lock().unwrap().push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    });
    text
}
