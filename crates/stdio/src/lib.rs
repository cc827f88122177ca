//! Output to a terminal, a file or a pipe that may close.
//!
//! Rust ignores SIGPIPE, so a write to a pipe whose reader went away (`fraglab status | head -1`)
//! fails with EPIPE — and `println!` panics on it. A fraglab that panics while it holds memory or
//! has sysctls changed leaves the next command to clean up after it; one that is only printing a
//! table gives the user a backtrace for a `head`. These macros write the same way but never panic:
//! once a stream fails, the rest of what goes to it is dropped, the command goes on to its usual
//! end and exit status, and [`stdout_closed`] lets a command that only prints (a `--watch` loop)
//! stop. A closed pipe is expected and silent; any other failure (`> /dev/full`) is said once on
//! stderr.

use std::fmt;
use std::io::{self, Write};
use std::sync::atomic::{AtomicBool, Ordering};

static STDOUT_FAILED: AtomicBool = AtomicBool::new(false);
static STDERR_FAILED: AtomicBool = AtomicBool::new(false);
/// Set when stdout failed with anything but a closed pipe: output the user asked for was lost.
static STDOUT_LOST: AtomicBool = AtomicBool::new(false);

/// True once a write to stdout failed: nobody reads what follows.
pub fn stdout_closed() -> bool {
    STDOUT_FAILED.load(Ordering::Relaxed)
}

/// True once a write to stdout failed for another reason than a reader that went away (a full
/// disk, `> /dev/full`): what the command was asked to print is incomplete, which the exit status of
/// a command whose output is its answer must say.
pub fn stdout_lost() -> bool {
    STDOUT_LOST.load(Ordering::Relaxed)
}

/// Forget that a stream failed: stdout and stderr now go somewhere new (a daemon's log, after
/// `dup2`), where what follows can be written.
pub fn reset() {
    for failed in [&STDOUT_FAILED, &STDERR_FAILED, &STDOUT_LOST] {
        failed.store(false, Ordering::Relaxed);
    }
}

/// Write to stdout and flush, so a failed write is seen here, unless stdout already failed.
pub fn write_stdout(args: fmt::Arguments) {
    on_stdout(|out| out.write_fmt(args));
}

/// Write bytes to stdout as they are (a guest's output, a generated file), unless it already failed.
pub fn write_stdout_bytes(bytes: &[u8]) {
    on_stdout(|out| out.write_all(bytes));
}

fn on_stdout(write: impl FnOnce(&mut io::StdoutLock) -> io::Result<()>) {
    if STDOUT_FAILED.load(Ordering::Relaxed) {
        return;
    }
    let mut out = io::stdout().lock();
    if let Err(e) = write(&mut out).and_then(|()| out.flush()) {
        STDOUT_FAILED.store(true, Ordering::Relaxed);
        if e.kind() != io::ErrorKind::BrokenPipe {
            STDOUT_LOST.store(true, Ordering::Relaxed);
            write_stderr(format_args!(
                "fraglab: cannot write to stdout: {e}; the rest of the output is dropped\n"
            ));
        }
    }
}

/// Write to stderr unless it already failed.
pub fn write_stderr(args: fmt::Arguments) {
    if STDERR_FAILED.load(Ordering::Relaxed) {
        return;
    }
    if io::stderr().lock().write_fmt(args).is_err() {
        // Nowhere left to say it.
        STDERR_FAILED.store(true, Ordering::Relaxed);
    }
}

/// `print!` that never panics.
#[macro_export]
macro_rules! out {
    ($($arg:tt)*) => { $crate::write_stdout(format_args!($($arg)*)) };
}

/// `println!` that never panics.
#[macro_export]
macro_rules! outln {
    () => { $crate::write_stdout(format_args!("\n")) };
    ($($arg:tt)*) => { $crate::write_stdout(format_args!("{}\n", format_args!($($arg)*))) };
}

/// `eprint!` that never panics.
#[macro_export]
macro_rules! err {
    ($($arg:tt)*) => { $crate::write_stderr(format_args!($($arg)*)) };
}

/// `eprintln!` that never panics.
#[macro_export]
macro_rules! errln {
    () => { $crate::write_stderr(format_args!("\n")) };
    ($($arg:tt)*) => { $crate::write_stderr(format_args!("{}\n", format_args!($($arg)*))) };
}

/// Rows laid out in columns two spaces apart, each as wide as its widest cell (counted in chars:
/// `≥` and `×` are one column on a terminal), with no trailing spaces. `right[i]` aligns column
/// `i` to the right (numbers); columns past the end of `right` align left. A row may be shorter
/// than the others: its missing cells are empty.
pub fn columns(rows: &[Vec<String>], right: &[bool]) -> Vec<String> {
    let n = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..n)
        .map(|i| rows.iter().filter_map(|r| r.get(i)).map(|c| c.chars().count()).max().unwrap_or(0))
        .collect();
    rows.iter()
        .map(|r| {
            let mut line = String::new();
            for (i, c) in r.iter().enumerate() {
                if i > 0 {
                    line += "  ";
                }
                let pad = " ".repeat(widths[i] - c.chars().count());
                if right.get(i).copied().unwrap_or(false) {
                    line += &pad;
                    line += c;
                } else {
                    line += c;
                    line += &pad;
                }
            }
            line.trim_end().to_string()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cells(rows: &[&[&str]]) -> Vec<Vec<String>> {
        rows.iter().map(|r| r.iter().map(|c| c.to_string()).collect()).collect()
    }

    /// A label of any length pushes its column, never the ones after it out of line.
    #[test]
    fn columns_are_as_wide_as_their_widest_cell() {
        for label in ["a", "threads=1 sysctl.net.core.high_order_alloc_disable=0", "Node 12, zone Movable"] {
            let rows = cells(&[&["point", "n", "mean"], &[label, "3", "12.50"], &["b", "10", "7.00"]]);
            let lines = columns(&rows, &[false, true, true]);
            let w = label.chars().count().max(5);
            assert_eq!(lines[0], format!("{:<w$}   n   mean", "point"));
            assert_eq!(lines[1], format!("{label:<w$}   3  12.50"));
            assert_eq!(lines[2], format!("{:<w$}  10   7.00", "b"));
        }
    }

    /// Width is counted in characters, so `≥` does not shift a row; short rows leave no trailing space.
    #[test]
    fn columns_count_characters_and_trim() {
        let rows = cells(&[&["order ≥ 4", "0"], &["x"], &["zone", "1024"]]);
        assert_eq!(columns(&rows, &[false, true]), ["order ≥ 4     0", "x", "zone       1024"]);
    }
}
