//! The fraglab that runs inside the guest, as its PID 1 and as the command. A statically linked one
//! needs nothing else in the initramfs; in order of preference:
//!
//! 1. `--guest-fraglab PATH` (or `FRAGLAB_GUEST_BIN`);
//! 2. this very program, when it is static (`RUSTFLAGS=-C target-feature=+crt-static`);
//! 3. a static release build of the source tree this fraglab was built from, made with cargo into
//!    `target/vm-guest/` (once; cargo rebuilds only what changed);
//! 4. this program with its shared libraries and loader (works, but a debug build is slow under TCG).

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use super::elf;

/// A fraglab for the guest and whether it needs its shared libraries carried along.
#[derive(Clone, Debug)]
pub struct GuestBin {
    pub path: PathBuf,
    pub dynamic: bool,
    pub how: String,
}

const TARGET: &str = "x86_64-unknown-linux-gnu";

pub fn find(explicit: Option<&Path>, verbose: bool) -> Result<GuestBin> {
    let explicit =
        explicit.map(Path::to_path_buf).or_else(|| std::env::var_os("FRAGLAB_GUEST_BIN").map(PathBuf::from));
    if let Some(p) = explicit {
        if !p.is_file() {
            bail!("--guest-fraglab {}: no such file", p.display());
        }
        let dynamic = !elf::is_static(&p)?;
        return Ok(GuestBin { path: p, dynamic, how: "given".into() });
    }
    let me = std::env::current_exe().context("cannot find this program (current_exe)")?;
    if elf::is_static(&me)? {
        return Ok(GuestBin { path: me, dynamic: false, how: "this program (static)".into() });
    }
    if let Some(ws) = source_workspace() {
        match build_static(&ws, verbose) {
            Ok(p) => {
                return Ok(GuestBin {
                    path: p,
                    dynamic: false,
                    how: format!("built static from {}", ws.display()),
                })
            }
            Err(e) => errln!(
                "fraglab vm: could not build a static fraglab ({e:#}); using this one with its libraries"
            ),
        }
    }
    Ok(GuestBin { path: me, dynamic: true, how: "this program with its shared libraries".into() })
}

/// The workspace this binary was compiled from, if it is still there and cargo is on PATH.
fn source_workspace() -> Option<PathBuf> {
    let manifest = PathBuf::from(option_env!("CARGO_MANIFEST_DIR")?);
    let ws = manifest.parent()?.parent()?.to_path_buf();
    let ok = ws.join("Cargo.toml").is_file() && ws.join("crates/runner/src/main.rs").is_file();
    let cargo = Command::new("cargo").arg("--version").output().is_ok_and(|o| o.status.success());
    (ok && cargo).then_some(ws)
}

/// `RUSTFLAGS="-C target-feature=+crt-static" cargo build --release --target x86_64-unknown-linux-gnu -p fraglab`,
/// into its own target directory so it neither fights a running `cargo test` for the lock nor
/// invalidates the ordinary build with different RUSTFLAGS.
fn build_static(ws: &Path, verbose: bool) -> Result<PathBuf> {
    let target_dir = ws.join("target/vm-guest");
    let out = target_dir.join(TARGET).join("release/fraglab");
    let mut cmd = Command::new("cargo");
    cmd.current_dir(ws)
        .args(["build", "--quiet", "--release", "--target", TARGET, "-p", "fraglab"])
        .env("RUSTFLAGS", "-C target-feature=+crt-static")
        .env("CARGO_TARGET_DIR", &target_dir)
        // Line tables would quadruple the initramfs, which the guest loads at emulated speed.
        .env("CARGO_PROFILE_RELEASE_DEBUG", "false")
        .env("CARGO_PROFILE_RELEASE_STRIP", "debuginfo")
        .env_remove("CARGO_BUILD_TARGET")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let started = Instant::now();
    let mut child = cmd.spawn().context("cannot run cargo")?;
    let mut stderr = child.stderr.take().expect("piped");
    let errors = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    // Up to date takes a fraction of a second; say something only when it is really building.
    let mut said = verbose;
    if verbose {
        errln!("fraglab vm: cargo build of the static guest fraglab in {}", target_dir.display());
    }
    let status = loop {
        if let Some(s) = child.try_wait()? {
            break s;
        }
        if !said && started.elapsed() > Duration::from_secs(2) {
            errln!(
                "fraglab vm: building a static fraglab for the guest (cargo, {}; a few minutes the first time)",
                target_dir.display()
            );
            said = true;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let errors = errors.join().unwrap_or_default();
    if !status.success() {
        bail!("cargo build of the static guest fraglab failed ({status}):\n{}", errors.trim_end());
    }
    if !elf::is_static(&out)? {
        bail!("{} came out dynamically linked", out.display());
    }
    Ok(out)
}
