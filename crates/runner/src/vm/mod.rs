//! `fraglab vm`: boot a kernel under test in qemu and run a fraglab command (or a script of them)
//! inside it, as if it had run here: its stdout, stderr, exit status and results directory come back.
//!
//! The pieces: [`kernel`] (a bzImage, or Debian's cloud kernel fetched with apt), [`modules`]
//! (dependency order from `.modinfo`, decompressed on the host), [`initramfs`] (cpio newc with a
//! static fraglab as PID 1), [`qemu`] (the boot, the timeout), [`channel`] (guest → host frames on a
//! serial port) and [`init`] (the guest side); [`boot`] puts them together for one boot, [`ab`] for
//! an A/B of two kernels. docs/vm.md has the why of each choice.

pub mod ab;
pub mod boot;
pub mod channel;
pub mod elf;
pub mod guestbin;
pub mod init;
pub mod initramfs;
pub mod kernel;
pub mod modules;
pub mod numa;
pub mod qemu;

use anyhow::Result;

use crate::cli::VmArgs;
use crate::exit::Exit;

/// `fraglab vm`. Its own failures exit 125 so they cannot be mistaken for the guest command's.
pub fn run(args: VmArgs) -> Result<Exit> {
    if args.guest_init {
        init::run();
    }
    if args.print_kconfig {
        out!("{}", KCONFIG);
        return Ok(Exit::Ok);
    }
    match host(args) {
        Ok(code) => Ok(code),
        Err(e) => {
            errln!("fraglab vm: {e:#}");
            Ok(Exit::CouldNotTest)
        }
    }
}

/// The kconfig fragment `--print-kconfig` prints: what a kernel needs for everything fraglab does in
/// a guest, each option with the reason.
pub const KCONFIG: &str = include_str!("fraglab.config");

fn host(args: VmArgs) -> Result<Exit> {
    if args.kernel.len() > 1 || args.rounds.is_some() {
        return ab::run(&args);
    }
    let plan = boot::check(&args)?;
    let kernels = boot::kernel_args(&args)?;
    let cache = kernel::cache_dir();
    let (arg, modules) = &kernels[0];
    let k = kernel::resolve(&arg.spec, modules.as_deref(), &cache, args.verbose)?;
    let guest = boot::Guest::prepare(&args, &plan, k)?;
    let result = boot::boot_and_report(&args, &plan, &guest, &cache).map(|b| b.exit);
    guest.clean_up(args.keep);
    result
}
