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

/// A fraglab started in the background, its output collected as it comes. If a test fails while it
/// runs, dropping it sends SIGTERM (release and restore), and SIGKILL plus a journal-restoring
/// command if that does not end it within 90 s.
pub struct Running {
    pub child: std::process::Child,
    pub run_dir: PathBuf,
    stdout: Arc<Mutex<String>>,
    stderr: Arc<Mutex<String>>,
}

impl Running {
    /// Start `cmd` (a fraglab whose run directory is `run_dir`) with its output piped.
    pub fn spawn(cmd: &mut Command, run_dir: &Path) -> Running {
        use std::process::Stdio;
        let mut child =
            cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        let stdout = collect(child.stdout.take().unwrap());
        let stderr = collect(child.stderr.take().unwrap());
        Running { child, run_dir: run_dir.to_path_buf(), stdout, stderr }
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    pub fn stdout(&self) -> String {
        self.stdout.lock().unwrap().clone()
    }

    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Both, for a failure message.
    pub fn output(&self) -> String {
        format!("stdout:\n{}\nstderr:\n{}", self.stdout(), self.stderr())
    }

    pub fn signal(&self, sig: nix::sys::signal::Signal) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid()), sig).unwrap();
    }

    pub fn running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    pub fn wait_for(&mut self, limit: std::time::Duration) -> Option<std::process::ExitStatus> {
        let deadline = std::time::Instant::now() + limit;
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                std::thread::sleep(std::time::Duration::from_millis(50)); // the readers take the last output
                return Some(s);
            }
            if std::time::Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if self.running() {
            self.signal(nix::sys::signal::Signal::SIGTERM);
            if self.wait_for(std::time::Duration::from_secs(90)).is_none() {
                let _ = self.child.kill();
                let _ = self.child.wait();
                let _ = fraglab(&self.run_dir, &["probe", "--json"]); // restores from the journal
            }
        }
    }
}
