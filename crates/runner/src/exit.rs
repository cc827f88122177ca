//! How every fraglab command ends: one exit status type, so `git bisect run`, CI jobs and scripts
//! read every command alike (README.md says the table to users).

use std::process::ExitCode;

use fraglab_results::record::Verdict;

/// A command's exit status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    /// 0: done; `run`: not reproduced; `workload`: no operation failed.
    Ok,
    /// 1: `run`: reproduced; `workload`: some operations failed; `fragment`: stopped before the
    /// target held; and any command that stopped on an error it reports.
    Failed,
    /// 125: could not test: the machine lacks something the command needs (a kernel feature, root,
    /// the target), so `git bisect run` skips this commit.
    CouldNotTest,
    /// 130: stopped by a signal, results incomplete; above 127, so `git bisect run` stops.
    Interrupted,
    /// 255: a mistyped flag (any command), or `run`, `compare` and `workload` could not run at all
    /// (a bad config, unreadable results), or a command whose output is its answer (probe, scan,
    /// compare, `fragment --dry-run`, completions, man) could not write it; `git bisect run` stops.
    Error,
    /// `fraglab vm`: the guest command's own status, passed through.
    Guest(u8),
}

impl Exit {
    pub fn code(self) -> u8 {
        match self {
            Exit::Ok => 0,
            Exit::Failed => 1,
            Exit::CouldNotTest => 125,
            Exit::Interrupted => 130,
            Exit::Error => 255,
            Exit::Guest(code) => code,
        }
    }
}

impl From<Verdict> for Exit {
    fn from(v: Verdict) -> Exit {
        match v {
            Verdict::NotReproduced => Exit::Ok,
            Verdict::Reproduced => Exit::Failed,
            Verdict::CouldNotTest => Exit::CouldNotTest,
            Verdict::Interrupted => Exit::Interrupted,
        }
    }
}

impl From<Exit> for ExitCode {
    fn from(e: Exit) -> ExitCode {
        ExitCode::from(e.code())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts_exit_as_git_bisect_run_reads_them() {
        let codes: Vec<u8> =
            [Verdict::NotReproduced, Verdict::Reproduced, Verdict::CouldNotTest, Verdict::Interrupted]
                .map(|v| Exit::from(v).code())
                .to_vec();
        assert_eq!(codes, [0, 1, 125, 130]);
        assert_eq!(Exit::Error.code(), 255);
        assert_eq!(Exit::Guest(3).code(), 3);
    }
}
