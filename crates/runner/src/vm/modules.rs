//! Kernel modules for the guest: find them in a `lib/modules/<release>` tree, put their dependencies
//! first, and decompress them on the host.
//!
//! Dependencies come from each module's own `.modinfo` (`depends=`, and `softdep=pre:` when that
//! names a module in the tree), not from `modules.dep`: a kernel package unpacked with `dpkg-deb -x`
//! has no `modules.dep` (depmod runs in its postinst), and a `make modules_install` tree may be
//! stale. Compressed modules (`.ko.xz`, `.ko.zst`, `.ko.gz`) are decompressed here rather than by the
//! guest kernel, which can do it only when built with `CONFIG_MODULE_DECOMPRESS` (Debian's cloud
//! kernel is not).

use std::collections::{BTreeMap, HashSet};
use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

/// Modules every guest gets when its kernel has them: SCTP (the host kernel has none), and the
/// sock_diag handlers the socket workloads read their sockets' memory through (`ss -tm`'s source;
/// a guest has no modprobe to load them on first use, as a distribution's userspace would).
pub const DEFAULT_MODULES: &[&str] = &["sctp", "inet_diag", "tcp_diag", "sctp_diag"];

/// A module ready for the initramfs.
#[derive(Clone, Debug)]
pub struct Module {
    pub name: String,
    pub source: PathBuf,
    /// The ELF object, decompressed.
    pub object: Vec<u8>,
}

/// The modules of one kernel, by name.
pub struct Tree {
    root: PathBuf,
    by_name: BTreeMap<String, PathBuf>,
    builtin: HashSet<String>,
}

/// Module names use `_` and `-` interchangeably; the kernel's own spelling is `_`.
pub fn canonical(name: &str) -> String {
    name.trim().replace('-', "_")
}

/// `sctp.ko.xz` → `sctp`.
fn module_name(file: &str) -> Option<String> {
    [".ko", ".ko.xz", ".ko.zst", ".ko.gz"].iter().find_map(|suffix| file.strip_suffix(suffix)).map(canonical)
}

impl Tree {
    pub fn open(root: &Path) -> Result<Tree> {
        let mut by_name = BTreeMap::new();
        let mut stack = vec![root.to_path_buf()];
        while let Some(dir) = stack.pop() {
            let entries =
                std::fs::read_dir(&dir).with_context(|| format!("cannot read {}", dir.display()))?;
            for e in entries.flatten() {
                let path = e.path();
                let ft = e.file_type()?;
                if ft.is_dir() {
                    stack.push(path);
                } else if let Some(name) = module_name(&e.file_name().to_string_lossy()) {
                    by_name.entry(name).or_insert(path);
                }
            }
        }
        let builtin = std::fs::read_to_string(root.join("modules.builtin"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.rsplit('/').next().and_then(module_name))
            .collect();
        Ok(Tree { root: root.to_path_buf(), by_name, builtin })
    }

    pub fn len(&self) -> usize {
        self.by_name.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }

    pub fn contains(&self, name: &str) -> bool {
        self.by_name.contains_key(&canonical(name))
    }

    pub fn is_builtin(&self, name: &str) -> bool {
        self.builtin.contains(&canonical(name))
    }

    /// `wanted` and everything it depends on, each once, dependencies before their users.
    pub fn resolve(&self, wanted: &[String]) -> Result<Vec<Module>> {
        let mut order = Vec::new();
        let mut seen = HashSet::new();
        for w in wanted {
            self.visit(&canonical(w), &mut seen, &mut order, &mut Vec::new())?;
        }
        Ok(order)
    }

    fn visit(
        &self,
        name: &str,
        seen: &mut HashSet<String>,
        order: &mut Vec<Module>,
        path: &mut Vec<String>,
    ) -> Result<()> {
        if seen.contains(name) {
            return Ok(());
        }
        if path.iter().any(|p| p == name) {
            bail!("module dependency cycle: {} -> {name}", path.join(" -> "));
        }
        let Some(source) = self.by_name.get(name) else {
            if self.is_builtin(name) {
                seen.insert(name.to_string());
                return Ok(()); // built into the kernel: nothing to load
            }
            bail!(
                "module {name} is not in {}{}",
                self.root.display(),
                path.last().map(|p| format!(" (needed by {p})")).unwrap_or_default()
            );
        };
        let object = read_module(source)?;
        let info = crate::vm::elf::modinfo(&object, &source.display().to_string())?;
        let mut deps: Vec<String> = Vec::new();
        for (k, v) in &info {
            match k.as_str() {
                "depends" => deps.extend(v.split(',').filter(|d| !d.is_empty()).map(canonical)),
                // `softdep=pre: crc32c post: foo`: load the pre ones we have; they may be aliases
                // or built in, which needs nothing.
                "softdep" => {
                    let pre = v.split("post:").next().unwrap_or("");
                    deps.extend(
                        pre.trim_start_matches("pre:")
                            .split_whitespace()
                            .map(canonical)
                            .filter(|d| self.by_name.contains_key(d)),
                    );
                }
                _ => {}
            }
        }
        path.push(name.to_string());
        for d in deps {
            self.visit(&d, seen, order, path)?;
        }
        path.pop();
        seen.insert(name.to_string());
        order.push(Module { name: name.to_string(), source: source.clone(), object });
        Ok(())
    }
}

/// A module file, decompressed by its suffix.
pub fn read_module(path: &Path) -> Result<Vec<u8>> {
    let raw = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    let name = path.to_string_lossy();
    let mut out = Vec::new();
    if name.ends_with(".xz") {
        lzma_rs::xz_decompress(&mut &raw[..], &mut out)
            .map_err(|e| anyhow::anyhow!("{}: xz: {e:?}", path.display()))?;
    } else if name.ends_with(".zst") {
        ruzstd::StreamingDecoder::new(&raw[..])
            .map_err(|e| anyhow::anyhow!("{}: zstd: {e}", path.display()))?
            .read_to_end(&mut out)
            .with_context(|| format!("{}: zstd", path.display()))?;
    } else if name.ends_with(".gz") {
        flate2::read::GzDecoder::new(&raw[..])
            .read_to_end(&mut out)
            .with_context(|| format!("{}: gzip", path.display()))?;
    } else {
        return Ok(raw);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert_eq!(module_name("sctp.ko").as_deref(), Some("sctp"));
        assert_eq!(module_name("ip6_udp_tunnel.ko.xz").as_deref(), Some("ip6_udp_tunnel"));
        assert_eq!(module_name("crc32c-intel.ko.zst").as_deref(), Some("crc32c_intel"));
        assert_eq!(module_name("modules.dep"), None);
        assert_eq!(canonical("crc32c-intel"), "crc32c_intel");
    }

    #[test]
    fn compressed_modules_decompress() {
        let dir = std::env::temp_dir().join(format!("fraglab-modtest-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let object = b"\x7fELF pretend module".repeat(100);
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        std::io::Write::write_all(&mut gz, &object).unwrap();
        std::fs::write(dir.join("a.ko.gz"), gz.finish().unwrap()).unwrap();
        let mut xz = Vec::new();
        lzma_rs::xz_compress(&mut &object[..], &mut xz).unwrap();
        std::fs::write(dir.join("b.ko.xz"), xz).unwrap();
        std::fs::write(dir.join("c.ko"), &object).unwrap();
        for f in ["a.ko.gz", "b.ko.xz", "c.ko"] {
            assert_eq!(read_module(&dir.join(f)).unwrap(), object, "{f}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
