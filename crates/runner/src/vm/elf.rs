//! Just enough ELF: is a program statically linked (no `PT_INTERP`), what does a kernel module's
//! `.modinfo` say, and which shared libraries does a dynamic program need (`ldd`).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

fn u16_at(b: &[u8], off: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(off..off + 2)?.try_into().ok()?))
}
fn u32_at(b: &[u8], off: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(off..off + 4)?.try_into().ok()?))
}
fn u64_at(b: &[u8], off: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(off..off + 8)?.try_into().ok()?))
}

/// A little-endian ELF64 file (x86_64), or an error saying what it is instead.
fn check_header(b: &[u8], what: &str) -> Result<()> {
    if b.get(..4) != Some(b"\x7fELF") {
        bail!("{what} is not an ELF file");
    }
    if b.get(4) != Some(&2) || b.get(5) != Some(&1) {
        bail!("{what} is not a 64-bit little-endian ELF file");
    }
    Ok(())
}

/// The program interpreter (`PT_INTERP`, e.g. `/lib64/ld-linux-x86-64.so.2`), `None` for a static
/// program (static-pie included: it relocates itself).
pub fn interpreter(bytes: &[u8], what: &str) -> Result<Option<String>> {
    check_header(bytes, what)?;
    let bad = || anyhow::anyhow!("{what}: truncated ELF program headers");
    let phoff = u64_at(bytes, 0x20).ok_or_else(bad)? as usize;
    let phentsize = u16_at(bytes, 0x36).ok_or_else(bad)? as usize;
    let phnum = u16_at(bytes, 0x38).ok_or_else(bad)? as usize;
    for i in 0..phnum {
        let ph = phoff + i * phentsize;
        if u32_at(bytes, ph).ok_or_else(bad)? == 3 {
            let off = u64_at(bytes, ph + 8).ok_or_else(bad)? as usize;
            let size = u64_at(bytes, ph + 32).ok_or_else(bad)? as usize;
            let raw = bytes.get(off..off + size).ok_or_else(bad)?;
            let end = raw.iter().position(|&c| c == 0).unwrap_or(raw.len());
            return Ok(Some(String::from_utf8_lossy(&raw[..end]).into_owned()));
        }
    }
    Ok(None)
}

/// Whether the program at `path` runs without a dynamic loader.
pub fn is_static(path: &Path) -> Result<bool> {
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    Ok(interpreter(&bytes, &path.display().to_string())?.is_none())
}

/// The `key=value` strings of a kernel module's `.modinfo` section.
pub fn modinfo(bytes: &[u8], what: &str) -> Result<Vec<(String, String)>> {
    check_header(bytes, what)?;
    let bad = || anyhow::anyhow!("{what}: truncated ELF section headers");
    let shoff = u64_at(bytes, 0x28).ok_or_else(bad)? as usize;
    let shentsize = u16_at(bytes, 0x3a).ok_or_else(bad)? as usize;
    let shnum = u16_at(bytes, 0x3c).ok_or_else(bad)? as usize;
    let shstrndx = u16_at(bytes, 0x3e).ok_or_else(bad)? as usize;
    let section = |i: usize| -> Result<(u32, usize, usize)> {
        let sh = shoff + i * shentsize;
        Ok((
            u32_at(bytes, sh).ok_or_else(bad)?,
            u64_at(bytes, sh + 0x18).ok_or_else(bad)? as usize,
            u64_at(bytes, sh + 0x20).ok_or_else(bad)? as usize,
        ))
    };
    let (_, str_off, str_size) = section(shstrndx)?;
    let names = bytes.get(str_off..str_off + str_size).ok_or_else(bad)?;
    for i in 0..shnum {
        let (name, off, size) = section(i)?;
        let name = names.get(name as usize..).unwrap_or_default();
        let end = name.iter().position(|&c| c == 0).unwrap_or(name.len());
        if &name[..end] == b".modinfo" {
            let data = bytes.get(off..off + size).ok_or_else(bad)?;
            return Ok(data
                .split(|&c| c == 0)
                .filter_map(|kv| {
                    let kv = String::from_utf8_lossy(kv);
                    kv.split_once('=').map(|(k, v)| (k.to_string(), v.to_string()))
                })
                .collect());
        }
    }
    bail!("{what} has no .modinfo section: not a kernel module")
}

/// A dynamic program's shared libraries and its loader, as host paths, from `ldd`.
pub fn shared_libraries(program: &Path) -> Result<Vec<PathBuf>> {
    let out = Command::new("ldd")
        .arg(program)
        .output()
        .context("cannot run ldd (glibc's libc-bin) to find the program's shared libraries")?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        if text.contains("not a dynamic executable")
            || String::from_utf8_lossy(&out.stderr).contains("not a dynamic")
        {
            return Ok(Vec::new());
        }
        bail!("ldd {} failed: {}", program.display(), String::from_utf8_lossy(&out.stderr).trim());
    }
    parse_ldd(&text).map_err(|e| anyhow::anyhow!("ldd {}: {e}", program.display()))
}

/// `libsctp.so.1 => /lib/x86_64-linux-gnu/libsctp.so.1 (0x...)`, `/lib64/ld-linux-x86-64.so.2 (0x...)`;
/// `linux-vdso.so.1 (0x...)` is the kernel's and needs no file.
fn parse_ldd(text: &str) -> Result<Vec<PathBuf>, String> {
    let mut libs = Vec::new();
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        if line.contains("not found") {
            return Err(format!("a library is missing on this host: {line}"));
        }
        let path = match line.split_once("=>") {
            Some((_, rest)) => rest.split_whitespace().next().unwrap_or(""),
            None => line.split_whitespace().next().unwrap_or(""),
        };
        if path.starts_with('/') {
            libs.push(PathBuf::from(path));
        }
    }
    Ok(libs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ldd_output() {
        let text = "\tlinux-vdso.so.1 (0x00007ffd1c3f2000)\n\
                    \tlibsctp.so.1 => /lib/x86_64-linux-gnu/libsctp.so.1 (0x00007f0c1c2a1000)\n\
                    \tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f0c1c0c0000)\n\
                    \t/lib64/ld-linux-x86-64.so.2 (0x00007f0c1c2b2000)\n";
        assert_eq!(
            parse_ldd(text).unwrap(),
            [
                "/lib/x86_64-linux-gnu/libsctp.so.1",
                "/lib/x86_64-linux-gnu/libc.so.6",
                "/lib64/ld-linux-x86-64.so.2"
            ]
            .map(PathBuf::from)
        );
        assert!(parse_ldd("\tlibfoo.so.1 => not found\n").is_err());
    }

    #[test]
    fn this_test_binary_has_an_interpreter_or_not() {
        // Whatever the build, the answer must agree with ldd's.
        let me = std::env::current_exe().unwrap();
        let bytes = std::fs::read(&me).unwrap();
        let interp = interpreter(&bytes, "self").unwrap();
        assert_eq!(interp.is_none(), shared_libraries(&me).unwrap().is_empty());
        assert!(interpreter(b"#!/bin/sh\n", "script").is_err());
    }
}
