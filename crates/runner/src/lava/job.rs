//! `fraglab lava-job`: a LAVA job definition for one scenario on one kernel, with the images it
//! deploys. The initramfs is `fraglab vm`'s ([`crate::vm::boot::build_initramfs`]), told to report
//! on the console; fraglab is its `/init`, so neither a qemu device nor a board needs `rdinit=`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use sha2::{Digest, Sha256};

use crate::cli::{AccelArg, LavaJobArgs, VmArgs};
use crate::exit::Exit;
use crate::vm::{boot, init, kernel};

use super::console;

/// What the job's deploy and boot actions take a kernel's first minutes for, on top of the test's
/// own timeout: fetching two images and booting (a Debian cloud kernel reaches init in ~4 s under
/// TCG; a board's bootloader and TFTP take longer).
const DEPLOY_MINUTES: u64 = 5;
const BOOT_MINUTES: u64 = 5;
/// LAVA's job-name limit.
const JOB_NAME_MAX: usize = 200;

/// The checked flags: everything that can be refused is refused here, before a kernel is fetched
/// or a file written.
struct Plan {
    vm: VmArgs,
    boot: boot::Plan,
    device: Device,
    image_url: String,
    test_minutes: u64,
    name: String,
}

/// Where the job runs.
enum Device {
    /// A lab's qemu: `deploy to: tmpfs`, `boot method: qemu`.
    Qemu,
    /// A board: `deploy to: tftp`, booted by its device type's method.
    Board { device_type: String, boot_method: String },
}

/// `fraglab lava-job`. Its failures exit 255: nothing was tested.
pub fn run(args: LavaJobArgs) -> Result<Exit> {
    write(&args).or_else(|e| {
        errln!("fraglab lava-job: {e:#}");
        Ok(Exit::Error)
    })
}

fn write(args: &LavaJobArgs) -> Result<Exit> {
    let plan = check(args)?;
    let cache = kernel::cache_dir();
    let k = kernel::resolve(&args.kernel, args.modules.as_deref(), &cache, args.verbose)?;
    let fs = boot::build_initramfs(&plan.vm, &plan.boot, &k, init::Report::Console)?;

    let out = &args.output;
    std::fs::create_dir_all(out).with_context(|| format!("-o {}", out.display()))?;
    let kernel_file = k
        .image
        .file_name()
        .map(PathBuf::from)
        .filter(|f| f != Path::new(RAMDISK))
        .unwrap_or_else(|| PathBuf::from("bzImage"));
    let kernel_name = kernel_file.to_string_lossy().into_owned();
    let dest = out.join(&kernel_file);
    // A job written again into the directory its kernel already sits in: copying a file onto
    // itself truncates it first.
    let same =
        matches!((std::fs::canonicalize(&k.image), std::fs::canonicalize(&dest)), (Ok(a), Ok(b)) if a == b);
    if !same {
        std::fs::copy(&k.image, &dest)
            .with_context(|| format!("copying {} into {}", k.image.display(), out.display()))?;
    }
    fs.write_file(&out.join(RAMDISK))?;
    let release = k.release.clone().unwrap_or_else(|| kernel_name.clone());
    let job = Job {
        name: args.job_name.clone().unwrap_or_else(|| {
            format!("fraglab {} on {release}", plan.name).chars().take(JOB_NAME_MAX).collect()
        }),
        scenario: plan.name.clone(),
        release,
        kernel: Image {
            url: format!("{}{kernel_name}", plan.image_url),
            sha256: sha256(&out.join(&kernel_file))?,
        },
        ramdisk: Image { url: format!("{}{RAMDISK}", plan.image_url), sha256: sha256(&out.join(RAMDISK))? },
        test_minutes: plan.test_minutes,
        mem_mib: plan.boot.mem_mib,
        cpus: args.cpus,
        no_kvm: args.no_kvm,
        append: args.append.clone(),
        command: std::env::args_os().map(|a| a.to_string_lossy().into_owned()).collect::<Vec<_>>().join(" "),
    };
    let yaml = job.yaml(&plan.device);
    let path = out.join("job.yaml");
    std::fs::write(&path, yaml).with_context(|| format!("cannot write {}", path.display()))?;
    outln!("{}", path.display());
    errln!(
        "fraglab lava-job: {} ({}), {} and {} in {}; submit with `lavacli jobs submit {}`{}",
        job.name,
        k.origin,
        kernel_name,
        RAMDISK,
        out.display(),
        path.display(),
        if plan.image_url.starts_with("file://") {
            " on a LAVA worker that can read these files (file:// URLs; give --image-url for a lab)"
        } else {
            ""
        }
    );
    Ok(Exit::Ok)
}

/// The initramfs's file name beside job.yaml.
const RAMDISK: &str = "fraglab-initramfs.cpio";

fn check(args: &LavaJobArgs) -> Result<Plan> {
    let device = match (args.device_type.as_str(), &args.boot_method) {
        ("qemu", None) => Device::Qemu,
        ("qemu", Some(m)) => bail!("--boot-method {m}: a qemu device boots with method qemu; leave it out"),
        (t, None) => bail!(
            "--device-type {t}: a board needs --boot-method, the one its device type boots a kernel and \
             ramdisk from TFTP with (ipxe, grub, depthcharge, …)"
        ),
        (t, Some(m)) => Device::Board { device_type: t.to_string(), boot_method: m.clone() },
    };
    if matches!(device, Device::Board { .. }) {
        // A board's kernel command line and hardware come from its device dictionary.
        let qemu_only = [(args.append.is_some(), "--append"), (args.no_kvm, "--no-kvm")];
        if let Some((_, flag)) = qemu_only.iter().find(|(given, _)| *given) {
            bail!(
                "{flag}: a board's kernel command line and hardware come from its device dictionary \
                 (--device-type {}); {flag} is for a qemu device",
                args.device_type
            );
        }
    }
    if let Some(n) = args.job_name.as_ref().filter(|n| n.is_empty() || n.chars().count() > JOB_NAME_MAX) {
        bail!("--job-name {n:?}: LAVA takes 1 to {JOB_NAME_MAX} characters");
    }
    if !args.device_type.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)) {
        bail!(
            "--device-type {:?}: a LAVA device type name has letters, digits, '-', '_' and '.'",
            args.device_type
        );
    }
    let image_url = match &args.image_url {
        Some(u) if !u.contains("://") => {
            bail!("--image-url {u}: give a URL (https://lab.example/fraglab/), where --output will be served")
        }
        Some(u) => format!("{}/", u.trim_end_matches('/')),
        None => {
            let abs =
                std::path::absolute(&args.output).with_context(|| format!("-o {}", args.output.display()))?;
            format!("file://{}/", abs.display().to_string().trim_end_matches('/'))
        }
    };
    let timeout =
        fraglab_units::parse_duration(&args.timeout).map_err(|e| anyhow::anyhow!("--timeout: {e}"))?;
    if timeout < Duration::from_secs(60) {
        bail!("--timeout {}: give at least 1m (LAVA counts its timeouts in minutes)", args.timeout);
    }
    let source = crate::config::Source::read(&args.config)?;
    let config = source.parse()?;
    // The same checks `fraglab vm -- run CONFIG` makes, and the files it carries.
    let vm = VmArgs {
        kernel: vec![args.kernel.clone()],
        modules: args.modules.iter().map(|m| m.display().to_string()).collect(),
        rounds: None,
        print_kconfig: false,
        module: args.module.clone(),
        mem: args.mem.clone(),
        cpus: args.cpus,
        numa: 1,
        numa_from: None,
        timeout: args.timeout.clone(),
        results: None,
        extra_bin: args.extra_bin.clone(),
        file: Vec::new(),
        script: None,
        append: args.append.clone(),
        accel: AccelArg::Auto,
        qemu: PathBuf::from("qemu-system-x86_64"),
        guest_fraglab: args.guest_fraglab.clone(),
        verbose: args.verbose,
        keep: false,
        guest_init: false,
        command: vec!["run".into(), args.config.display().to_string()],
    };
    let plan = boot::check(&vm)?;
    Ok(Plan {
        boot: plan,
        vm,
        device,
        image_url,
        test_minutes: timeout.as_secs().div_ceil(60),
        name: config.run.name,
    })
}

fn sha256(path: &Path) -> Result<String> {
    let mut f = std::fs::File::open(path).with_context(|| format!("cannot read {}", path.display()))?;
    let mut h = Sha256::new();
    std::io::copy(&mut f, &mut h)?;
    Ok(format!("{:x}", h.finalize()))
}

struct Image {
    url: String,
    sha256: String,
}

struct Job {
    name: String,
    scenario: String,
    release: String,
    kernel: Image,
    ramdisk: Image,
    test_minutes: u64,
    mem_mib: u64,
    cpus: u32,
    no_kvm: bool,
    append: Option<String>,
    command: String,
}

/// A YAML scalar: a JSON string is a YAML double-quoted one, escapes and all. Written by hand
/// rather than through a YAML serializer (serde_yaml is unmaintained): the job has one fixed shape.
fn q(s: &str) -> String {
    serde_json::to_string(s).expect("a string serializes")
}

impl Job {
    fn yaml(&self, device: &Device) -> String {
        let job_minutes = DEPLOY_MINUTES + BOOT_MINUTES + self.test_minutes;
        // The boot action's timeout is also the console connection's, which the test's monitor
        // waits on for each line (lava_dispatcher's monitor: `timeout=test_connection.timeout`):
        // with only the boot's 5 minutes, a run longer than that lost every result. Measured: the
        // log said `test monitoring timeout: 300 seconds` for a 10-minute test.
        let boot_minutes = BOOT_MINUTES + self.test_minutes;
        let mut y = format!(
            "# Written by: {command}\n\
             # The guest runs the scenario and reports each workload window and the run's verdict as a\n\
             # test case (reproduced = fail, not reproduced = pass, could not test = skip, no verdict =\n\
             # unknown); its results directory follows as FRAGLAB-ARCHIVE lines: `fraglab lava-results LOG`.\n\
             device_type: {device_type}\n\
             job_name: {name}\n\
             visibility: public\n\
             priority: medium\n\
             timeouts:\n  job: {{minutes: {job_minutes}}}\n  action: {{minutes: {boot_minutes}}}\n  connection: {{minutes: 2}}\n\
             metadata:\n  fraglab.scenario: {scenario}\n  fraglab.kernel: {release}\n",
            command = self.command.replace('\n', " "),
            device_type = q(match device {
                Device::Qemu => "qemu",
                Device::Board { device_type, .. } => device_type,
            }),
            name = q(&self.name),
            scenario = q(&self.scenario),
            release = q(&self.release),
        );
        match device {
            Device::Qemu => {
                // loglevel 6: LAVA's boot action waits for the kernel's `Linux version` banner, a
                // notice (level 5), which `fraglab vm`'s loglevel=5 hides; info stays off the
                // emulated console.
                let mut cmdline = "console=ttyS0,115200 loglevel=6".to_string();
                if let Some(a) = &self.append {
                    cmdline += " ";
                    cmdline += a;
                }
                // One word of qemu's command line, which LAVA joins with spaces and pexpect splits
                // again: double quotes keep the spaces, and within them nothing escapes a `"` — so a
                // parameter's own quotes (`x="a b"`) go in single quotes between double-quoted runs.
                let word: Vec<String> = cmdline.split('"').map(|run| format!("\"{run}\"")).collect();
                let cmdline = word.join("'\"'");
                y += &format!(
                    "context:\n  arch: amd64\n  memory: {mem}\n  extra_options: [\"-smp\", \"{cpus}\"]\n{kvm}\
                     actions:\n\
                     - deploy:\n    to: tmpfs\n    timeout: {{minutes: {DEPLOY_MINUTES}}}\n    images:\n\
                     \x20     kernel:\n        image_arg: {karg}\n        url: {kurl}\n        sha256sum: {ksum}\n\
                     \x20     ramdisk:\n        image_arg: \"-initrd {{ramdisk}}\"\n        url: {rurl}\n        sha256sum: {rsum}\n\
                     - boot:\n    method: qemu\n    media: tmpfs\n    timeout: {{minutes: {boot_minutes}}}\n    prompts: [{ready}]\n",
                    mem = self.mem_mib,
                    cpus = self.cpus,
                    kvm = if self.no_kvm { "  no_kvm: true\n" } else { "" },
                    karg = q(&format!("-kernel {{kernel}} -append {cmdline}")),
                    kurl = q(&self.kernel.url),
                    ksum = q(&self.kernel.sha256),
                    rurl = q(&self.ramdisk.url),
                    rsum = q(&self.ramdisk.sha256),
                    ready = q(console::READY),
                );
            }
            Device::Board { boot_method, .. } => {
                y += &format!(
                    "actions:\n\
                     - deploy:\n    to: tftp\n    timeout: {{minutes: {DEPLOY_MINUTES}}}\n\
                     \x20   kernel:\n      url: {kurl}\n      sha256sum: {ksum}\n\
                     \x20   ramdisk:\n      url: {rurl}\n      sha256sum: {rsum}\n      install_overlay: false\n      install_modules: false\n\
                     - boot:\n    method: {method}\n    commands: ramdisk\n    timeout: {{minutes: {boot_minutes}}}\n    prompts: [{ready}]\n",
                    kurl = q(&self.kernel.url),
                    ksum = q(&self.kernel.sha256),
                    rurl = q(&self.ramdisk.url),
                    rsum = q(&self.ramdisk.sha256),
                    method = q(boot_method),
                    ready = q(console::READY),
                );
            }
        }
        y += &format!(
            "- test:\n    timeout: {{minutes: {test}}}\n    monitors:\n    - name: {monitor}\n      start: {start}\n      end: {end}\n      pattern: {pattern}\n",
            test = self.test_minutes,
            monitor = q(&format!("fraglab-{}", console::word(&self.scenario))),
            start = q(console::START),
            end = q(console::END),
            pattern = q(console::PATTERN),
        );
        y
    }
}
