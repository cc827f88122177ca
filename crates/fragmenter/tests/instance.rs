//! The instance lock is machine-wide: run directories do not split it, and a dead holder's journal is
//! found from any run directory. These take the real lock (`/run/fraglab/lock`) but change no sysctl:
//! the journal written here records a sysctl's current value, so replaying it is a no-op.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use fraglab_fragmenter::instance::{Instance, LOCK_FILE};
use fraglab_fragmenter::sysctl::{self, Entry, Journal};

static SERIAL: Mutex<()> = Mutex::new(());

/// Another fraglab on this machine (another test binary, a user's hold) may have the lock first.
const LOCK_WAIT: Duration = Duration::from_secs(600);

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("fraglab-instance-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

#[test]
fn another_run_dir_is_refused_while_held_and_a_waiter_gets_it_after() {
    let _s = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let (a, b) = (scratch("held-a"), scratch("held-b"));
    let (first, _) = Instance::acquire_wait(&a, "first", LOCK_WAIT).unwrap();
    let record = Instance::holder().expect("the holder's record");
    assert_eq!(record.pid, std::process::id());
    assert_eq!(record.run_dir.as_deref(), Some(a.as_path()));

    let err = Instance::acquire_wait(&b, "second", Duration::ZERO).unwrap_err().to_string();
    assert!(
        err.contains(&format!("another fraglab is running: pid {} (`first`)", std::process::id())),
        "{err}"
    );
    assert!(!b.exists(), "a refused fraglab created its run directory");
    assert_eq!(Instance::holder().as_ref(), Some(&record), "the refused one touched the holder's record");

    let (tx, rx) = std::sync::mpsc::channel();
    let b2 = b.clone();
    let waiter = std::thread::spawn(move || {
        let got = Instance::acquire_wait(&b2, "waiter", Duration::from_secs(60));
        tx.send(()).unwrap();
        got.map(|(i, _)| i)
    });
    assert!(rx.recv_timeout(Duration::from_secs(1)).is_err(), "the waiter took a held lock");
    drop(first);
    rx.recv_timeout(Duration::from_secs(10)).expect("the waiter gets the lock once it is free");
    let second = waiter.join().unwrap().unwrap();
    assert_eq!(Instance::holder().unwrap().run_dir.as_deref(), Some(b.as_path()));
    drop(second);
    let _ = std::fs::remove_dir_all(&a);
    let _ = std::fs::remove_dir_all(&b);
}

/// Drops `instance` the way a SIGKILLed holder leaves things: its journal still in its run directory
/// and its record in the lock file (the record is kept because the journal is there).
fn die_holding(instance: Instance, dir: &Path, entry: &Entry) {
    std::fs::write(dir.join(Journal::FILE), format!("{}\n", serde_json::to_string(entry).unwrap())).unwrap();
    drop(instance);
}

#[test]
fn a_dead_holders_journal_is_recovered_from_another_run_dir() {
    let _s = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let (dead, other) = (scratch("dead"), scratch("other"));
    let name = "vm.compaction_proactiveness";
    let (instance, _) = Instance::acquire_wait(&dead, "dies", LOCK_WAIT).unwrap();
    // Holding the lock, nobody else changes it: this is its original value.
    let value = sysctl::read(name).unwrap();
    let entry = Entry { name: name.into(), original: value.clone(), set_to: "0".into(), pid: 1 };
    die_holding(instance, &dead, &entry);
    let record = std::fs::read_to_string(LOCK_FILE).unwrap();
    assert!(record.contains(dead.to_str().unwrap()), "the record must name the journal's run dir: {record}");

    let (restored, _) = Instance::recover_if_stale(&other).unwrap();
    if restored.is_empty() {
        // Any fraglab on this machine, whatever its run directory, may have taken the lock in between
        // and replayed it: what matters is that it is gone.
        eprintln!("note: another fraglab recovered the journal first");
    } else {
        assert_eq!(restored, [sysctl::Restored { name: name.into(), value: value.clone() }]);
    }
    assert!(!dead.join(Journal::FILE).exists(), "the dead holder's journal is still there");
    assert!(!other.exists(), "recovery created the recovering command's run directory");
    assert!(Instance::holder().is_none_or(|h| h.run_dir.as_deref() != Some(dead.as_path())));
    // Nothing left to do: the next command neither restores nor blocks — not even while another
    // fraglab holds the lock (here this test, on another descriptor): a call that waited for the
    // lock could only return after `holding` is dropped, so its answer arriving first shows it did
    // not wait. The bound is a hang guard for a call that does.
    assert!(Instance::recover_if_stale(&other).unwrap().0.is_empty());
    let (holding, _) = Instance::acquire_wait(&dead, "holds", LOCK_WAIT).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let other2 = other.clone();
    std::thread::spawn(move || tx.send(Instance::recover_if_stale(&other2).map(|r| r.0)).unwrap());
    let restored = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("recover_if_stale waited for a held lock (60 s hang guard)");
    assert!(restored.unwrap().is_empty(), "nothing to restore while another holds");
    drop(holding);
    assert!(!other.exists(), "recovery created the recovering command's run directory");
    let _ = std::fs::remove_dir_all(&dead);
}
