//! The `fraglab` binary: everything lives in the library so tests and the run pipeline share it.

fn main() -> std::process::ExitCode {
    fraglab::main()
}
