//! `scripts/install`: the binary, a man page per command and shell completions, generated from the
//! same clap definitions the binary parses with — installed, then used as a user would.

use std::path::Path;
use std::process::Command;

mod common;

fn sh(script: &str) -> (bool, String) {
    let out = Command::new("bash").arg("-c").arg(script).output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

#[test]
fn install_puts_binary_man_pages_and_completions_where_they_are_found() {
    let prefix = std::env::temp_dir().join(format!("fraglab-install-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&prefix);
    let out = Command::new(common::repo().join("scripts/install"))
        .args(["--prefix", prefix.to_str().unwrap(), "--binary", env!("CARGO_BIN_EXE_fraglab")])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{said}");
    let p = |rel: &str| prefix.join(rel);
    assert!(p("bin/fraglab").is_file(), "{said}");

    // A page per command, and man reads them: `man fraglab-run` shows run's own flags.
    let man1 = p("share/man/man1");
    for page in
        ["fraglab.1", "fraglab-run.1", "fraglab-compare.1", "fraglab-vm.1", "fraglab-workload-tcp-stream.1"]
    {
        assert!(man1.join(page).is_file(), "{page} missing from {}", man1.display());
    }
    let (ok, text) =
        sh(&format!("MANPATH={} MANWIDTH=100 man -P cat fraglab-run 2>&1", p("share/man").display()));
    assert!(ok && text.contains("--dry-run") && text.contains("--baseline"), "{text}");
    let (ok, text) = sh(&format!("MANWIDTH=100 man -P cat -l {} 2>&1", man1.join("fraglab.1").display()));
    assert!(ok && text.contains("fraglab-compare(1)"), "{text}");

    // bash completes subcommands and a subcommand's flags from the installed script.
    let bash = p("share/bash-completion/completions/fraglab");
    let complete = |words: &str| {
        let (ok, text) = sh(&format!(
            "source {}; COMP_WORDS=({words}); COMP_CWORD=$((${{#COMP_WORDS[@]}} - 1)); \
             _fraglab fraglab \"${{COMP_WORDS[-1]}}\" \"${{COMP_WORDS[-2]}}\"; echo \"${{COMPREPLY[@]}}\"",
            bash.display()
        ));
        assert!(ok, "{text}");
        text
    };
    let subcommands = complete("fraglab r");
    for s in ["run", "release", "report"] {
        assert!(subcommands.split_whitespace().any(|w| w == s), "{s} not offered: {subcommands}");
    }
    let flags = complete("fraglab compare --f");
    assert!(flags.split_whitespace().any(|w| w == "--format"), "{flags}");
    for (file, marker) in [
        ("share/zsh/site-functions/_fraglab", "#compdef fraglab"),
        ("share/fish/vendor_completions.d/fraglab.fish", "complete -c fraglab"),
    ] {
        let text = std::fs::read_to_string(p(file)).unwrap();
        assert!(text.contains(marker), "{file}: {marker:?} missing");
    }
    std::fs::remove_dir_all(&prefix).unwrap();

    // Relative paths are the caller's, not the source tree's.
    let cwd = std::env::temp_dir().join(format!("fraglab-install-rel-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&cwd);
    std::fs::create_dir_all(&cwd).unwrap();
    std::fs::copy(env!("CARGO_BIN_EXE_fraglab"), cwd.join("fraglab")).unwrap();
    let out = Command::new(common::repo().join("scripts/install"))
        .current_dir(&cwd)
        .args(["--prefix", "rel", "--binary", "./fraglab"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(cwd.join("rel/bin/fraglab").is_file() && cwd.join("rel/share/man/man1/fraglab-run.1").is_file());
    assert!(!common::repo().join("rel").exists(), "installed into the source tree");
    std::fs::remove_dir_all(&cwd).unwrap();

    // A bad argument is refused, naming it, with nothing installed.
    let out =
        Command::new(common::repo().join("scripts/install")).args(["--prefx", "/tmp/x"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown argument '--prefx'"));
    assert!(!Path::new("/tmp/x/bin/fraglab").exists());
}

/// A mistyped flag is bad input like any other: 255, which stops `git bisect run` (clap's own 2 would
/// mark the commit bad); help and version are not errors.
#[test]
fn a_mistyped_flag_exits_255_and_help_exits_0() {
    let fraglab = |args: &[&str]| Command::new(env!("CARGO_BIN_EXE_fraglab")).args(args).output().unwrap();
    for args in [
        &["run", "--bogus", "x.toml"][..],
        &["compare"],
        &["nosuch"],
        &["compare", "a", "b", "--format", "html"],
    ] {
        let out = fraglab(args);
        assert_eq!(out.status.code(), Some(255), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        assert!(String::from_utf8_lossy(&out.stderr).contains("error:"), "{args:?}");
    }
    for args in [&["--help"][..], &["run", "--help"], &["--version"]] {
        let out = fraglab(args);
        assert_eq!(out.status.code(), Some(0), "{args:?}");
        assert!(!out.stdout.is_empty(), "{args:?}: printed on stdout");
    }
}
