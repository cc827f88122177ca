//! The kernel under test: a bzImage given by path (with its modules tree), or Debian's cloud kernel
//! fetched with apt into a cache directory — never installed into this machine's /boot.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

/// A bootable kernel and what goes with it.
#[derive(Clone, Debug)]
pub struct Kernel {
    pub image: PathBuf,
    /// The release string (`6.1.0-57-cloud-amd64`), from the bzImage header.
    pub release: Option<String>,
    /// `lib/modules/<release>` of this kernel, when there is one.
    pub modules: Option<PathBuf>,
    /// Where this came from, for messages (`Debian linux-image-… 6.1.192-3`, a path).
    pub origin: String,
}

/// The `--kernel` value that fetches Debian's cloud kernel.
pub const DEBIAN_CLOUD: &str = "debian-cloud";

/// One `--kernel` value: `[LABEL=]KERNEL`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelArg {
    pub label: Option<String>,
    /// A path, `debian-cloud` or `debian-cloud:ABI`.
    pub spec: String,
}

impl KernelArg {
    /// `base=/tmp/b/bzImage` → label `base`. A value that is an existing file, or whose part before
    /// `=` is not a plain name (letters, digits, `_`, `-`, `.`), is all kernel.
    pub fn parse(value: &str) -> KernelArg {
        match value.split_once('=') {
            Some((label, spec)) if is_label(label) && !Path::new(value).exists() => {
                KernelArg { label: Some(label.to_string()), spec: spec.to_string() }
            }
            _ => KernelArg { label: None, spec: value.to_string() },
        }
    }
}

/// A name for a kernel and its results directories.
pub fn is_label(s: &str) -> bool {
    !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c)) && !s.starts_with('.')
}

/// Resolve `--kernel` and `--modules`.
pub fn resolve(kernel: &str, modules: Option<&Path>, cache: &Path, verbose: bool) -> Result<Kernel> {
    let mut k = if kernel == DEBIAN_CLOUD {
        debian_cloud(cache, None, verbose)?
    } else if let Some(abi) = kernel.strip_prefix(DEBIAN_CLOUD).and_then(|r| r.strip_prefix(':')) {
        if abi.is_empty() || !abi.chars().all(|c| c.is_ascii_alphanumeric() || "-.".contains(c)) {
            bail!("--kernel {kernel}: give Debian's ABI after the colon, e.g. debian-cloud:6.1.0-47");
        }
        debian_cloud(cache, Some(abi), verbose)?
    } else {
        let image = PathBuf::from(kernel);
        let bytes = std::fs::read(&image).with_context(|| format!("--kernel {kernel}: cannot read it"))?;
        let release = bzimage_release(&bytes).ok_or_else(|| {
            anyhow::anyhow!(
                "--kernel {kernel}: not a bzImage (no \"HdrS\" boot header); give arch/x86/boot/bzImage or \
                 a /boot/vmlinuz-* file, not vmlinux"
            )
        })?;
        // Without --modules, a tree installed for this very release on the host is used if present.
        let host_tree = PathBuf::from("/lib/modules").join(&release);
        let modules = host_tree.join("kernel").is_dir().then_some(host_tree);
        Kernel { image, release: Some(release), modules, origin: kernel.to_string() }
    };
    if let Some(dir) = modules {
        k.modules = Some(modules_dir(dir, k.release.as_deref())?);
    }
    Ok(k)
}

/// `--modules DIR`: `lib/modules/<release>` itself, or an `INSTALL_MOD_PATH` prefix holding it.
pub fn modules_dir(dir: &Path, release: Option<&str>) -> Result<PathBuf> {
    if !dir.is_dir() {
        bail!("--modules {}: not a directory", dir.display());
    }
    if dir.join("modules.order").exists() || dir.join("kernel").is_dir() {
        return Ok(dir.to_path_buf());
    }
    for base in ["lib/modules", "usr/lib/modules", "modules"] {
        let base = dir.join(base);
        let Ok(entries) = std::fs::read_dir(&base) else { continue };
        let trees: Vec<PathBuf> = entries.flatten().map(|e| e.path()).filter(|p| p.is_dir()).collect();
        if let Some(r) = release {
            if base.join(r).is_dir() {
                return Ok(base.join(r));
            }
        }
        if let [only] = trees.as_slice() {
            return Ok(only.clone());
        }
        if !trees.is_empty() {
            bail!(
                "--modules {}: several trees under {} and none for this kernel ({}); give the one to use",
                dir.display(),
                base.display(),
                release.unwrap_or("release unknown")
            );
        }
    }
    bail!(
        "--modules {}: no kernel modules here; give lib/modules/<release> or the INSTALL_MOD_PATH of \
         `make modules_install`",
        dir.display()
    )
}

/// The kernel release from a bzImage's setup header (`kernel_version` at 0x20e points at a string
/// 0x200 bytes before where it says).
pub fn bzimage_release(b: &[u8]) -> Option<String> {
    if b.get(0x202..0x206)? != b"HdrS" {
        return None;
    }
    let ptr = u16::from_le_bytes(b.get(0x20e..0x210)?.try_into().ok()?) as usize;
    let s = b.get(ptr + 0x200..)?;
    let end = s.iter().take(256).position(|&c| c == 0)?;
    let text = std::str::from_utf8(&s[..end]).ok()?;
    text.split_whitespace().next().map(str::to_string)
}

/// `apt-cache depends linux-image-cloud-amd64` → `linux-image-6.1.0-57-cloud-amd64`.
fn parse_depends(text: &str) -> Option<String> {
    text.lines()
        .filter_map(|l| l.trim().strip_prefix("Depends:"))
        .map(str::trim)
        .find(|p| p.starts_with("linux-image-") && p != &"linux-image-cloud-amd64")
        .map(str::to_string)
}

fn run(cmd: &mut Command) -> Result<String> {
    let what = format!("{cmd:?}");
    let out = cmd.output().with_context(|| format!("cannot run {what}"))?;
    if !out.status.success() {
        bail!("{what} failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Debian's cloud kernel: the package `linux-image-cloud-amd64` depends on, or with `abi` (`6.1.0-47`)
/// `linux-image-<abi>-cloud-amd64`, downloaded and unpacked once per version into
/// `<cache>/kernels/<package>_<version>/`.
fn debian_cloud(cache: &Path, abi: Option<&str>, verbose: bool) -> Result<Kernel> {
    let kernels = cache.join("kernels");
    let wanted = abi.map(|a| format!("linux-image-{a}-cloud-amd64"));
    let package = match &wanted {
        Some(p) => Some(p.clone()),
        None => run(Command::new("apt-cache").args(["depends", "linux-image-cloud-amd64"]))
            .ok()
            .and_then(|t| parse_depends(&t)),
    };
    let resolved = package.and_then(|pkg| {
        let show = run(Command::new("apt-cache").args(["show", "--no-all-versions", &pkg])).ok()?;
        let version = show.lines().find_map(|l| l.strip_prefix("Version: "))?.trim().to_string();
        Some((pkg, version))
    });
    let dir = match resolved {
        Some((pkg, version)) => {
            let dir = kernels.join(format!("{pkg}_{version}"));
            if !dir.join("boot").is_dir() {
                fetch(&pkg, &version, &kernels, &dir, verbose)?;
            }
            dir
        }
        None => {
            // No apt lists (or no apt): use the newest matching kernel already fetched, if any.
            let prefix = wanted.as_ref().map_or_else(|| "linux-image-".to_string(), |p| format!("{p}_"));
            let mut cached: Vec<PathBuf> = std::fs::read_dir(&kernels)
                .map(|d| {
                    d.flatten()
                        .map(|e| e.path())
                        .filter(|p| p.join("boot").is_dir())
                        .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with(&prefix)))
                        .collect()
                })
                .unwrap_or_default();
            cached.sort();
            let what = wanted.as_deref().unwrap_or("linux-image-cloud-amd64");
            match cached.pop() {
                Some(d) => {
                    errln!(
                        "fraglab vm: apt-cache does not know {what} (run `apt-get update`); using the cached {}",
                        d.display()
                    );
                    d
                }
                None if abi.is_some() => bail!(
                    "--kernel debian-cloud:{}: apt-cache does not know {what}. Run `apt-get update`; \
                     `apt-cache search --names-only 'linux-image-.*-cloud-amd64$'` lists the builds Debian has",
                    abi.unwrap_or_default()
                ),
                None => bail!(
                    "--kernel debian-cloud: apt-cache does not know {what}. On Debian, run \
                     `apt-get update` first; elsewhere give --kernel PATH to a bzImage"
                ),
            }
        }
    };
    unpacked(&dir)
}

fn fetch(pkg: &str, version: &str, kernels: &Path, dir: &Path, verbose: bool) -> Result<()> {
    std::fs::create_dir_all(kernels).with_context(|| format!("cannot create {}", kernels.display()))?;
    let tmp = kernels.join(format!(".fetch-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp)?;
    errln!("fraglab vm: fetching {pkg} {version} (Debian's cloud kernel) into {}", dir.display());
    let result = (|| -> Result<()> {
        run(Command::new("apt-get").args(["download", "-q", &format!("{pkg}={version}")]).current_dir(&tmp))
            .context("apt-get download (is this Debian with a reachable mirror?)")?;
        let deb = std::fs::read_dir(&tmp)?
            .flatten()
            .map(|e| e.path())
            .find(|p| p.extension().is_some_and(|e| e == "deb"))
            .context("apt-get download left no .deb")?;
        let root = tmp.join("root");
        run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&root)).context("dpkg-deb -x")?;
        if verbose {
            errln!("fraglab vm: unpacked {}", deb.display());
        }
        // Another fraglab may have raced us here; either copy is as good.
        if std::fs::rename(&root, dir).is_err() && !dir.join("boot").is_dir() {
            bail!("cannot move the unpacked kernel to {}", dir.display());
        }
        Ok(())
    })();
    let _ = std::fs::remove_dir_all(&tmp);
    result
}

/// The vmlinuz and modules tree of an unpacked kernel package.
fn unpacked(dir: &Path) -> Result<Kernel> {
    let image = std::fs::read_dir(dir.join("boot"))?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("vmlinuz-")))
        .with_context(|| format!("{}: no boot/vmlinuz-*", dir.display()))?;
    let release = bzimage_release(&std::fs::read(&image)?);
    let modules = ["lib/modules", "usr/lib/modules"]
        .iter()
        .filter_map(|b| std::fs::read_dir(dir.join(b)).ok())
        .flat_map(|d| d.flatten().map(|e| e.path()))
        .find(|p| p.join("kernel").is_dir());
    let origin =
        format!("Debian {}", dir.file_name().unwrap_or_default().to_string_lossy().replace('_', " "));
    Ok(Kernel { image, release, modules, origin })
}

/// fraglab's cache: `$XDG_CACHE_HOME/fraglab`, else `~/.cache/fraglab`.
pub fn cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME").filter(|d| !d.is_empty()) {
        return PathBuf::from(d).join("fraglab");
    }
    let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/root"));
    home.join(".cache/fraglab")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_args_take_a_label_before_an_equals_sign() {
        let parse = |s: &str| {
            let k = KernelArg::parse(s);
            (k.label, k.spec)
        };
        assert_eq!(parse("base=/tmp/b/bzImage"), (Some("base".into()), "/tmp/b/bzImage".into()));
        assert_eq!(parse("debian-cloud:6.1.0-47"), (None, "debian-cloud:6.1.0-47".into()));
        assert_eq!(parse("old=debian-cloud:6.1.0-47"), (Some("old".into()), "debian-cloud:6.1.0-47".into()));
        // Not a plain name before `=`: all of it is the path.
        assert_eq!(parse("/tmp/a=b/bzImage"), (None, "/tmp/a=b/bzImage".into()));
        assert_eq!(parse("=x"), (None, "=x".into()));
    }

    #[test]
    fn depends_names_the_versioned_package() {
        let text = "linux-image-cloud-amd64\n  Depends: linux-image-6.1.0-57-cloud-amd64\n";
        assert_eq!(parse_depends(text).as_deref(), Some("linux-image-6.1.0-57-cloud-amd64"));
        assert_eq!(parse_depends("linux-image-cloud-amd64\n"), None);
    }

    #[test]
    fn bzimage_header() {
        let mut b = vec![0u8; 0x1000];
        b[0x202..0x206].copy_from_slice(b"HdrS");
        b[0x20e..0x210].copy_from_slice(&0x300u16.to_le_bytes());
        let v = b"6.1.0-57-cloud-amd64 (debian-kernel@lists.debian.org) #1 SMP\0";
        b[0x500..0x500 + v.len()].copy_from_slice(v);
        assert_eq!(bzimage_release(&b).as_deref(), Some("6.1.0-57-cloud-amd64"));
        assert_eq!(bzimage_release(b"\x7fELF"), None);
    }
}
