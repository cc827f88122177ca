//! The guest's whole root filesystem: an uncompressed cpio newc archive the kernel unpacks into its
//! rootfs. Uncompressed because the kernel decompresses under TCG at emulated speed, and the archive
//! is small (a static fraglab, a few modules, a few programs).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use cpio::newc::{Builder as Header, ModeFileType};

#[derive(Clone, Debug)]
enum Node {
    Dir,
    File { data: Vec<u8>, mode: u32 },
    Symlink(String),
    CharDev { major: u32, minor: u32 },
}

/// An initramfs being assembled, by absolute guest path.
#[derive(Default)]
pub struct Initramfs {
    nodes: BTreeMap<String, Node>,
}

fn normalize(guest: &str) -> Result<String> {
    if !guest.starts_with('/') {
        bail!("guest path {guest:?} is not absolute");
    }
    let parts: Vec<&str> = guest.split('/').filter(|p| !p.is_empty() && *p != ".").collect();
    if parts.contains(&"..") {
        bail!("guest path {guest:?} has ..");
    }
    Ok(parts.join("/"))
}

impl Initramfs {
    pub fn new() -> Self {
        let mut fs = Initramfs::default();
        for d in ["bin", "dev", "etc", "proc", "sys", "run", "tmp", "root", "results", "fraglab"] {
            fs.dir(&format!("/{d}")).expect("static path");
        }
        // The kernel opens /dev/console for init before devtmpfs is mounted; init opens the channel
        // port from here too, so a kernel without devtmpfs still works.
        fs.char_dev("/dev/console", 5, 1).expect("static path");
        fs.char_dev("/dev/null", 1, 3).expect("static path");
        fs.char_dev("/dev/ttyS0", 4, 64).expect("static path");
        fs.char_dev("/dev/ttyS1", 4, 65).expect("static path");
        fs
    }

    fn parents(&mut self, rel: &str) {
        let mut at = String::new();
        let parts: Vec<&str> = rel.split('/').collect();
        for p in &parts[..parts.len().saturating_sub(1)] {
            if !at.is_empty() {
                at.push('/');
            }
            at.push_str(p);
            self.nodes.entry(at.clone()).or_insert(Node::Dir);
        }
    }

    fn put(&mut self, guest: &str, node: Node) -> Result<()> {
        let rel = normalize(guest)?;
        if rel.is_empty() {
            bail!("cannot replace the guest's /");
        }
        self.parents(&rel);
        self.nodes.insert(rel, node);
        Ok(())
    }

    pub fn dir(&mut self, guest: &str) -> Result<()> {
        self.put(guest, Node::Dir)
    }

    pub fn char_dev(&mut self, guest: &str, major: u32, minor: u32) -> Result<()> {
        self.put(guest, Node::CharDev { major, minor })
    }

    pub fn symlink(&mut self, guest: &str, target: &str) -> Result<()> {
        self.put(guest, Node::Symlink(target.to_string()))
    }

    pub fn bytes(&mut self, guest: &str, data: Vec<u8>, mode: u32) -> Result<()> {
        self.put(guest, Node::File { data, mode })
    }

    /// A host file (symlinks followed), keeping its permission bits.
    pub fn host_file(&mut self, guest: &str, host: &Path) -> Result<()> {
        use std::os::unix::fs::PermissionsExt;
        let data = std::fs::read(host).with_context(|| format!("cannot read {}", host.display()))?;
        let mode = std::fs::metadata(host)?.permissions().mode() & 0o7777;
        self.bytes(guest, data, mode)
    }

    /// A host program at its host path, with its shared libraries and dynamic loader at theirs.
    pub fn program(&mut self, guest: &str, host: &Path) -> Result<()> {
        self.host_file(guest, host)?;
        for lib in crate::vm::elf::shared_libraries(host)? {
            let g = lib.to_string_lossy().into_owned();
            if !self.contains(&g) {
                self.host_file(&g, &lib)?;
            }
        }
        Ok(())
    }

    pub fn contains(&self, guest: &str) -> bool {
        normalize(guest).is_ok_and(|r| self.nodes.contains_key(&r))
    }

    /// Total bytes of file data.
    pub fn data_bytes(&self) -> u64 {
        self.nodes.values().map(|n| if let Node::File { data, .. } = n { data.len() as u64 } else { 0 }).sum()
    }

    /// Write the archive (parents before children: BTreeMap order sorts `a` before `a/b`).
    pub fn write(&self, out: impl Write) -> Result<()> {
        let mut w = out;
        for (ino, (path, node)) in self.nodes.iter().enumerate() {
            let h = Header::new(path).ino(ino as u32 + 1).uid(0).gid(0).nlink(1);
            let (h, data): (Header, &[u8]) = match node {
                Node::Dir => (h.mode(0o755).set_mode_file_type(ModeFileType::Directory).nlink(2), &[]),
                Node::File { data, mode } => (h.mode(*mode).set_mode_file_type(ModeFileType::Regular), data),
                Node::Symlink(t) => (h.mode(0o777).set_mode_file_type(ModeFileType::Symlink), t.as_bytes()),
                Node::CharDev { major, minor } => (
                    h.mode(0o600)
                        .set_mode_file_type(ModeFileType::Char)
                        .rdev_major(*major)
                        .rdev_minor(*minor),
                    &[],
                ),
            };
            let size = u32::try_from(data.len()).with_context(|| format!("{path}: over 4 GiB"))?;
            let mut fw = h.write(w, size);
            fw.write_all(data)?;
            w = fw.finish()?;
        }
        cpio::newc::trailer(w)?.flush()?;
        Ok(())
    }

    pub fn write_file(&self, path: &Path) -> Result<()> {
        let f = std::fs::File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
        self.write(std::io::BufWriter::new(f))
    }
}

/// Pack a directory tree (the guest's results) as cpio newc: directories and regular files; other
/// kinds are skipped and named in the returned list.
pub fn pack_dir(root: &Path, out: impl Write) -> Result<Vec<PathBuf>> {
    use std::os::unix::fs::PermissionsExt;
    let mut skipped = Vec::new();
    let mut w = out;
    let mut stack = vec![PathBuf::new()];
    let mut ino = 0u32;
    while let Some(rel) = stack.pop() {
        let dir = root.join(&rel);
        let mut entries: Vec<_> = std::fs::read_dir(&dir)?.flatten().collect();
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            let r = rel.join(e.file_name());
            let name = r.to_string_lossy().into_owned();
            let meta = e.metadata()?;
            ino += 1;
            let h = Header::new(&name).ino(ino).nlink(1).mode(meta.permissions().mode() & 0o7777);
            if meta.is_dir() {
                w = h.set_mode_file_type(ModeFileType::Directory).write(w, 0).finish()?;
                stack.push(r);
            } else if meta.is_file() {
                let data = std::fs::read(e.path())?;
                let size = u32::try_from(data.len()).with_context(|| format!("{name}: over 4 GiB"))?;
                let mut fw = h.set_mode_file_type(ModeFileType::Regular).write(w, size);
                fw.write_all(&data)?;
                w = fw.finish()?;
            } else {
                skipped.push(r);
            }
        }
    }
    cpio::newc::trailer(w)?.flush()?;
    Ok(skipped)
}

/// Unpack a results archive into `dest`: regular files and directories only, no path leaving `dest`.
/// Returns the files written.
pub fn unpack(archive: &[u8], dest: &Path) -> Result<Vec<PathBuf>> {
    unpack_except(archive, dest, &[])
}

/// [`unpack`], leaving out the files named in `skip` (paths relative to the archive's root).
pub fn unpack_except(archive: &[u8], dest: &Path, skip: &[PathBuf]) -> Result<Vec<PathBuf>> {
    use std::os::unix::fs::PermissionsExt;
    let mut files = Vec::new();
    let mut rest = archive;
    loop {
        let reader = cpio::NewcReader::new(rest).context("results archive: bad cpio header")?;
        let entry = reader.entry();
        if entry.is_trailer() {
            break;
        }
        let name = entry.name().to_string();
        let rel = Path::new(&name);
        if rel.is_absolute() || rel.components().any(|c| !matches!(c, std::path::Component::Normal(_))) {
            bail!("results archive: refusing path {name:?}");
        }
        let target = dest.join(rel);
        let mode = entry.mode();
        match mode & 0o170000 {
            0o040000 => {
                std::fs::create_dir_all(&target)?;
                rest = reader.finish()?;
            }
            0o100000 if skip.iter().any(|s| s == rel) => rest = reader.finish()?,
            0o100000 => {
                if let Some(p) = target.parent() {
                    std::fs::create_dir_all(p)?;
                }
                let f = std::fs::File::create(&target)
                    .with_context(|| format!("cannot write {}", target.display()))?;
                rest = reader.to_writer(&f)?;
                f.set_permissions(std::fs::Permissions::from_mode(mode & 0o777))?;
                files.push(target);
            }
            _ => rest = reader.finish()?,
        }
    }
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn archive_has_parents_first_and_round_trips_a_results_dir() {
        let mut fs = Initramfs::new();
        fs.bytes("/fraglab/job.json", b"{}".to_vec(), 0o644).unwrap();
        fs.symlink("/usr/local/bin/x", "/usr/bin/x").unwrap();
        assert!(fs.contains("/usr/local"));
        assert!(fs.bytes("relative", vec![], 0o644).is_err());
        assert!(fs.bytes("/a/../b", vec![], 0o644).is_err());
        let mut out = Vec::new();
        fs.write(&mut out).unwrap();
        let mut names = Vec::new();
        let mut rest = &out[..];
        loop {
            let r = cpio::NewcReader::new(rest).unwrap();
            if r.entry().is_trailer() {
                break;
            }
            names.push(r.entry().name().to_string());
            rest = r.finish().unwrap();
        }
        let pos = |n: &str| names.iter().position(|x| x == n).unwrap();
        assert!(pos("usr") < pos("usr/local") && pos("usr/local") < pos("usr/local/bin/x"));
        assert!(pos("dev") < pos("dev/console"));

        let base = std::env::temp_dir().join(format!("fraglab-cpio-{}", std::process::id()));
        let src = base.join("src");
        std::fs::create_dir_all(src.join("sub")).unwrap();
        std::fs::write(src.join("a.json"), "{\"x\":1}").unwrap();
        std::fs::write(src.join("sub/b.txt"), "b").unwrap();
        let mut packed = Vec::new();
        assert!(pack_dir(&src, &mut packed).unwrap().is_empty());
        let files = unpack(&packed, &base.join("dst")).unwrap();
        assert_eq!(files.len(), 2);
        assert_eq!(std::fs::read_to_string(base.join("dst/sub/b.txt")).unwrap(), "b");
        assert_eq!(std::fs::read_to_string(base.join("dst/a.json")).unwrap(), "{\"x\":1}");
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn unpack_refuses_escapes() {
        let mut out = Vec::new();
        let mut w =
            Header::new("../evil").mode(0o644).set_mode_file_type(ModeFileType::Regular).write(&mut out, 1);
        w.write_all(b"x").unwrap();
        let out2 = w.finish().unwrap();
        cpio::newc::trailer(out2).unwrap();
        assert!(unpack(&out, &std::env::temp_dir().join("fraglab-never")).is_err());
    }
}
