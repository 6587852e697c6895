//! A full disk under the store: the store file on a small tmpfs of the test's own, filled
//! to the last byte while a component works. Appends fail with an error naming the store,
//! the component exits 5 (the store unavailable), every result acknowledged before stays,
//! and once space returns the next pass finishes the rest. Needs root (it mounts the tmpfs).

use std::path::{Path, PathBuf};
use std::process::Command;

use autocomp_e2e::{PROBED, Pipeline};
use autocomp_model::Outcome;

const PROBE: &str = env!("CARGO_BIN_EXE_probe-component");

/// A tmpfs of `size` mounted on a fresh directory; unmounted when dropped.
struct SmallDisk {
    dir: tempfile::TempDir,
}

impl SmallDisk {
    fn mount(size: &str) -> SmallDisk {
        let dir = tempfile::tempdir().expect("mount point");
        let mounted = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .output()
            .expect("mount runs");
        assert!(
            mounted.status.success(),
            "cannot mount a tmpfs for the disk-full test (it needs root): {}",
            String::from_utf8_lossy(&mounted.stderr)
        );
        SmallDisk { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let unmounted = Command::new("umount").arg("--lazy").arg(self.dir.path()).status();
        if !unmounted.is_ok_and(|s| s.success()) {
            eprintln!("cannot unmount the test tmpfs at {}", self.dir.path().display());
        }
    }
}

/// A pass killed if the test fails while it waits at its gate.
struct KillOnDrop(Option<std::process::Child>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            child.kill().ok();
            child.wait().ok();
        }
    }
}

/// Fills the filesystem of `path` up to the last block with one file.
fn fill(path: &Path) {
    use std::io::Write;
    let mut file = std::fs::File::create(path).expect("filler file");
    let block = vec![0u8; 4096];
    for _ in 0..1_000_000 {
        if file.write_all(&block).is_err() {
            break;
        }
    }
    // The last partial block.
    while file.write_all(&[0u8]).is_ok() {}
    file.sync_all().ok();
}

#[test]
fn a_full_disk_under_the_store_loses_nothing_acknowledged_and_work_resumes_when_space_returns() {
    let disk = SmallDisk::mount("8m");
    let store = disk.path("store.db");
    let pipeline = Pipeline::with_store(PROBE, &format!("sqlite://{}", store.display()));
    let first = pipeline.register(5);
    let done = pipeline.run(&[]);
    assert_eq!(done.code, Some(0), "{}", done.show());

    // More batches arrive and are claimed and worked on; the disk fills up before their
    // results are appended.
    let second: Vec<_> = (1..=5).map(|n| pipeline.register_one(&format!("LATE{n}"), true)).collect();
    let (started, gate) = pipeline.hold_work_at_a_gate("max_threads = 5\nqueue_size = 5");
    let mut working = KillOnDrop(Some(pipeline.spawn(&[])));
    let all_started = || std::fs::read_dir(&started).map(|d| d.count()).unwrap_or(0) == second.len();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    assert!(autocomp_e2e::wait_until(deadline, all_started), "the pass did not start on all five");
    fill(&disk.path("filler"));
    std::fs::write(&gate, "").unwrap();
    let full = autocomp_e2e::finish(working.0.take().expect("the pass"), std::time::Duration::from_secs(30));
    assert_eq!(full.code, Some(5), "the store cannot take writes: exit 5\n{}", full.show());
    assert!(full.stderr.contains("cannot record the result"), "the appends failed: {}", full.show());
    assert!(full.stderr.contains("database or disk is full"), "says the disk is full: {}", full.show());
    assert!(full.stderr.contains(&store.display().to_string()), "names the store: {}", full.show());

    // Nothing acknowledged is lost: the first results are all there, exactly once.
    for id in &first {
        let results = pipeline.events(id, PROBED);
        assert_eq!(results.iter().map(|e| e.outcome).collect::<Vec<_>>(), [Outcome::Success], "{id}");
    }
    let recorded_while_full = full.stdout.lines().count();
    eprintln!("while full: {}", full.stderr.lines().find(|l| l.contains("cannot record")).unwrap_or_default());

    // Space returns: the next pass does what is left, and nothing is recorded twice.
    std::fs::remove_file(disk.path("filler")).unwrap();
    let resumed = pipeline.run(&[]);
    assert!(matches!(resumed.code, Some(0)), "{}", resumed.show());
    for id in first.iter().chain(&second) {
        let results = pipeline.events(id, PROBED);
        assert_eq!(results.iter().map(|e| e.outcome).collect::<Vec<_>>(), [Outcome::Success], "{id}");
    }
    assert_eq!(recorded_while_full + resumed.stdout.lines().count(), second.len(), "{}", resumed.show());
    assert!(pipeline.open_runs().is_empty(), "no run left open: {:?}", pipeline.open_runs());
}
