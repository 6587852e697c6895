//! The archiver as cron runs it: the real binary over a temp SQLite store, a local index and
//! local locks, archiving real directories. What the user sees: the archive tree, the
//! recorded event, and an archive root that never shows a half-written batch.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use autocomp_framework::testing::TempPipeline;
use autocomp_framework::{Batch, Event, Outcome};
use autocomp_test_servers::wait_until_every;

const ARCHIVER: &str = env!("CARGO_BIN_EXE_archiver");

/// A temp pipeline with `incoming/` and `archive/` under its root, and `archiver.toml`
/// naming the archive with these extra settings.
struct Pipeline {
    pipeline: TempPipeline,
}

impl std::ops::Deref for Pipeline {
    type Target = TempPipeline;
    fn deref(&self) -> &TempPipeline {
        &self.pipeline
    }
}

struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl Pipeline {
    fn new(settings: &str) -> Self {
        let pipeline = TempPipeline::new();
        for sub in ["incoming", "archive"] {
            std::fs::create_dir_all(pipeline.root().join(sub)).unwrap();
        }
        let archive = pipeline.root().join("archive");
        pipeline.configure("archiver", &format!("[settings]\narchive_root = \"{}\"\n{settings}", archive.display()));
        Self { pipeline }
    }

    fn archive(&self) -> PathBuf {
        self.pipeline.root().join("archive")
    }

    fn folder(&self, id: &str) -> PathBuf {
        self.pipeline.root().join("incoming").join(id)
    }

    /// Registers the batch at its folder with `Data_Received` and these later successes.
    fn register(&self, id: &str, later: &[&str]) {
        self.pipeline.add_batch(id, &self.folder(id));
        for event_type in later {
            self.pipeline.record(id, event_type, Outcome::Success, serde_json::json!({}));
        }
    }

    /// The archiver's command, to watch it while it works.
    fn command(&self) -> Command {
        self.pipeline.command(Path::new(ARCHIVER))
    }

    /// Runs the archiver once, as cron would.
    fn run(&self) -> Run {
        let output = self.pipeline.run(Path::new(ARCHIVER), &[]);
        Run {
            code: output.status.code(),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }
    }

    fn archive_entries(&self) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(self.archive())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }
}

/// What `Data_Received` is followed by for a batch ready to archive.
const CHECKED: [&str; 2] = ["Checksums_Verified", "Structure_Checked"];

/// A small delivery with what archives meet: nesting, spaces, an empty file, a read-only
/// file, binary bytes, a symlink.
fn write_delivery(folder: &Path) {
    std::fs::create_dir_all(folder.join("data/scans 2")).unwrap();
    std::fs::write(folder.join("bagit.txt"), "BagIt-Version: 1.0\n").unwrap();
    std::fs::write(folder.join("data/page-0001.txt"), "page one\n".repeat(1000)).unwrap();
    std::fs::write(folder.join("data/scans 2/scan 1.bin"), (0..=255u8).cycle().take(300_000).collect::<Vec<_>>())
        .unwrap();
    std::fs::write(folder.join("data/empty.txt"), "").unwrap();
    let read_only = folder.join("data/read-only.txt");
    std::fs::write(&read_only, "do not touch\n").unwrap();
    std::fs::set_permissions(&read_only, std::fs::Permissions::from_mode(0o444)).unwrap();
    std::os::unix::fs::symlink("page-0001.txt", folder.join("data/latest")).unwrap();
}

/// One entry of a tree, with what must survive archiving: kind, mode, mtime (files), and
/// the bytes (or link target).
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Entry {
    path: String,
    kind: &'static str,
    mode: u32,
    modified: Option<std::time::SystemTime>,
    bytes: Vec<u8>,
}

/// Every entry under `dir`, by relative path.
fn tree(dir: &Path) -> Vec<Entry> {
    let mut entries = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(current) = pending.pop() {
        for entry in std::fs::read_dir(&current).unwrap() {
            let path = entry.unwrap().path();
            let meta = path.symlink_metadata().unwrap();
            let relative = path.strip_prefix(dir).unwrap().display().to_string();
            let mode = meta.permissions().mode();
            let (kind, modified, bytes) = if meta.is_dir() {
                pending.push(path.clone());
                ("dir", None, Vec::new())
            } else if meta.file_type().is_symlink() {
                ("link", None, std::fs::read_link(&path).unwrap().display().to_string().into_bytes())
            } else {
                ("file", Some(meta.modified().unwrap()), std::fs::read(&path).unwrap())
            };
            entries.push(Entry { path: relative, kind, mode, modified, bytes });
        }
    }
    entries.sort();
    entries
}

fn archived_events(batch: &Batch) -> Vec<&Event> {
    batch.events.iter().filter(|e| e.event_type == *"Data_Archived").collect()
}

#[test]
fn a_verified_batch_is_archived_identically_and_only_once() {
    let pipeline = Pipeline::new("");
    write_delivery(&pipeline.folder("B1-RT1"));
    pipeline.register("B1-RT1", &CHECKED);
    // Not verified yet: the archiver must leave it alone.
    write_delivery(&pipeline.folder("B2-RT1"));
    pipeline.register("B2-RT1", &["Checksums_Verified"]);

    let run = pipeline.run();
    assert_eq!(run.code, Some(0), "{}{}", run.stdout, run.stderr);
    let target = pipeline.archive().join("B1-RT1");
    assert!(run.stdout.starts_with("B1-RT1 Data_Archived success"), "{}", run.stdout);
    assert_eq!(run.stdout.lines().count(), 1, "{}", run.stdout);
    assert_eq!(pipeline.archive_entries(), ["B1-RT1"]);
    assert_eq!(tree(&target), tree(&pipeline.folder("B1-RT1")));
    let batch = pipeline.batch("B1-RT1");
    let events = archived_events(&batch);
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].outcome, Outcome::Success);
    let summary = events[0].details["summary"].as_str().unwrap();
    assert!(summary.contains(&format!("archived to {}", target.display())) && summary.contains("6 files"), "{summary}");
    assert_eq!(events[0].details["failures_total"], 0);

    // The next cron start: blocked by its own event, nothing to do, nothing printed.
    let again = pipeline.run();
    assert_eq!((again.code, again.stdout.as_str(), again.stderr.as_str()), (Some(0), "", ""));
    assert_eq!(archived_events(&pipeline.batch("B1-RT1")).len(), 1);
    assert!(archived_events(&pipeline.batch("B2-RT1")).is_empty());
}

#[test]
fn the_archive_never_shows_a_half_written_batch() {
    let pipeline = Pipeline::new("");
    let folder = pipeline.folder("B3-RT1");
    // Big enough that copying, syncing and re-reading take a while.
    let mut expected = Vec::new();
    for n in 0..48 {
        let dir = folder.join(format!("data/part-{}", n % 4));
        std::fs::create_dir_all(&dir).unwrap();
        let bytes: Vec<u8> = (0..1 << 20).map(|i: u32| (i.wrapping_mul(2_654_435_761) >> 13) as u8 ^ n).collect();
        std::fs::write(dir.join(format!("page-{n:04}.bin")), &bytes).unwrap();
        expected.push((format!("data/part-{}/page-{n:04}.bin", n % 4), bytes.len() as u64));
    }
    pipeline.register("B3-RT1", &CHECKED);

    let mut child = pipeline.command().stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    let target = pipeline.archive().join("B3-RT1");
    let (mut saw_temp, mut saw_final) = (false, false);
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut status = None;
    // Every millisecond: the temp name is visible only while the copy runs.
    let finished = wait_until_every(Duration::from_millis(1), deadline, || {
        status = child.try_wait().unwrap();
        for name in pipeline.archive_entries() {
            if name == "B3-RT1" {
                if !saw_final {
                    // The first sight of the final name must already be the whole batch.
                    for (path, size) in &expected {
                        let meta = std::fs::metadata(target.join(path));
                        assert_eq!(meta.map(|m| m.len()).ok(), Some(*size), "{path} incomplete when first visible");
                    }
                    saw_final = true;
                }
            } else {
                assert!(name.starts_with(".archiving.B3-RT1."), "unexpected entry {name} in the archive root");
                saw_temp = true;
            }
        }
        status.is_some()
    });
    assert!(finished, "the archiver did not finish within 120s");
    let status = status.expect("it finished");
    assert!(status.success());
    assert!(saw_temp, "the copy should have been seen under its temp name while in progress");
    assert!(saw_final);
    assert_eq!(pipeline.archive_entries(), ["B3-RT1"]);
    assert_eq!(tree(&target), tree(&folder));
}

#[test]
fn an_existing_archive_is_not_overwritten() {
    let pipeline = Pipeline::new("");
    write_delivery(&pipeline.folder("B4-RT1"));
    pipeline.register("B4-RT1", &CHECKED);
    let existing = pipeline.archive().join("B4-RT1");
    std::fs::create_dir(&existing).unwrap();
    std::fs::write(existing.join("archived-last-year.txt"), "keep me").unwrap();

    let run = pipeline.run();
    assert_eq!(run.code, Some(1), "{}{}", run.stdout, run.stderr);
    assert!(run.stdout.contains("already archived"), "{}", run.stdout);
    let batch = pipeline.batch("B4-RT1");
    let event = archived_events(&batch)[0];
    assert_eq!(event.outcome, Outcome::Failure);
    assert_eq!(event.details["failures"][0]["type"], "already_archived");
    assert!(event.details["failures"][0]["description"].as_str().unwrap().contains("replace = true"));
    assert_eq!(pipeline.archive_entries(), ["B4-RT1"]);
    assert_eq!(tree(&existing).len(), 1);
    assert_eq!(std::fs::read_to_string(existing.join("archived-last-year.txt")).unwrap(), "keep me");
}

#[test]
fn replace_swaps_in_the_new_copy() {
    let pipeline = Pipeline::new("replace = true\n");
    write_delivery(&pipeline.folder("B5-RT1"));
    pipeline.register("B5-RT1", &CHECKED);
    let existing = pipeline.archive().join("B5-RT1");
    std::fs::create_dir(&existing).unwrap();
    std::fs::write(existing.join("archived-last-year.txt"), "outdated").unwrap();

    let run = pipeline.run();
    assert_eq!(run.code, Some(0), "{}{}", run.stdout, run.stderr);
    assert_eq!(pipeline.archive_entries(), ["B5-RT1"], "the previous copy must be gone, not left aside");
    assert_eq!(tree(&existing), tree(&pipeline.folder("B5-RT1")));
}

#[test]
fn a_failed_copy_leaves_nothing_behind_and_names_the_file() {
    let pipeline = Pipeline::new("");
    let folder = pipeline.folder("B6-RT1");
    write_delivery(&folder);
    // Sorted after the regular files, so the copy is well under way when it meets the pipe.
    let status = Command::new("mkfifo").arg(folder.join("data/zz-pipe")).status().unwrap();
    assert!(status.success());
    pipeline.register("B6-RT1", &CHECKED);

    let run = pipeline.run();
    assert_eq!(run.code, Some(1), "{}{}", run.stdout, run.stderr);
    let batch = pipeline.batch("B6-RT1");
    let event = archived_events(&batch)[0];
    assert_eq!(event.outcome, Outcome::Failure);
    assert_eq!(event.details["failures"][0]["reference"], "data/zz-pipe");
    assert_eq!(event.details["failures"][0]["type"], "unsupported_file_type");
    assert_eq!(pipeline.archive_entries(), Vec::<String>::new(), "no temp dir, no partial archive");
}

#[test]
fn a_temp_dir_left_by_a_crashed_attempt_is_removed() {
    let pipeline = Pipeline::new("");
    write_delivery(&pipeline.folder("B7-RT1"));
    pipeline.register("B7-RT1", &CHECKED);
    let stale = pipeline.archive().join(".archiving.B7-RT1.4242");
    std::fs::create_dir_all(stale.join("data")).unwrap();
    std::fs::write(stale.join("data/half.bin"), "half").unwrap();
    // Another batch's temp dir (its id only shares a prefix) is not ours to remove.
    let other = pipeline.archive().join(".archiving.B7-RT1.x.4242");
    std::fs::create_dir(&other).unwrap();

    let run = pipeline.run();
    assert_eq!(run.code, Some(0), "{}{}", run.stdout, run.stderr);
    assert_eq!(pipeline.archive_entries(), [".archiving.B7-RT1.x.4242", "B7-RT1"]);
}

#[test]
fn archive_root_is_required() {
    let pipeline = Pipeline::new("");
    pipeline.configure("archiver", "[settings]\nreplace = true\n");
    let run = pipeline.run();
    assert_eq!(run.code, Some(2), "{}{}", run.stdout, run.stderr);
    assert!(run.stderr.contains("archiver.toml") && run.stderr.contains("archive_root"), "{}", run.stderr);
}

/// A configuration mistake is not a batch's failure: a missing or read-only archive root
/// ends the pass with exit 2 naming the setting, before anything is claimed.
#[test]
fn an_unusable_archive_root_exits_2_and_touches_no_batch() {
    let pipeline = Pipeline::new("");
    write_delivery(&pipeline.folder("B8-RT1"));
    pipeline.register("B8-RT1", &CHECKED);
    let before = pipeline.batch("B8-RT1");
    let missing = pipeline.root().join("unmounted");
    pipeline.configure("archiver", &format!("[settings]\narchive_root = \"{}\"\n", missing.display()));

    let run = pipeline.run();
    assert_eq!(run.code, Some(2), "{}{}", run.stdout, run.stderr);
    assert!(run.stderr.contains("archive_root") && run.stderr.contains("unmounted"), "{}", run.stderr);
    assert_eq!(pipeline.batch("B8-RT1").changed_seq, before.changed_seq, "no claim, no event");

    // Read-only (as a user other than root would find it; root writes anyway, so only the
    // permission bits are asserted where they bind).
    std::fs::create_dir(&missing).unwrap();
    std::fs::set_permissions(&missing, std::fs::Permissions::from_mode(0o555)).unwrap();
    let run = pipeline.run();
    if std::fs::write(missing.join("probe"), b"").is_err() {
        assert_eq!(run.code, Some(2), "{}{}", run.stdout, run.stderr);
        assert!(run.stderr.contains("cannot write"), "{}", run.stderr);
    } else {
        std::fs::remove_file(missing.join("probe")).ok();
        assert_eq!(run.code, Some(0), "{}{}", run.stdout, run.stderr);
    }
}

/// A batch archived once and then re-delivered and verified again is archived as a new
/// version beside the old copy, never over it.
#[test]
fn a_redelivered_batch_is_archived_as_a_new_version() {
    let pipeline = Pipeline::new("");
    let folder = pipeline.folder("B9-RT1");
    write_delivery(&folder);
    pipeline.register("B9-RT1", &[]);
    let verify = || CHECKED.iter().for_each(|event_type| pipeline.record_on_content("B9-RT1", event_type));
    verify();
    let run = pipeline.run();
    assert_eq!(run.code, Some(0), "{}{}", run.stdout, run.stderr);
    let first = tree(&pipeline.archive().join("B9-RT1"));

    std::fs::write(folder.join("data/late.txt"), "sent late").unwrap();
    pipeline.record_content_change("B9-RT1");
    // The checkers' results are stale now; the archiver waits for them on the new content.
    let run = pipeline.run();
    assert_eq!((run.code, run.stdout.as_str()), (Some(0), ""), "nothing to archive yet: {}", run.stderr);
    verify();
    let run = pipeline.run();
    assert_eq!(run.code, Some(0), "{}{}", run.stdout, run.stderr);
    assert!(run.stdout.contains("version 2"), "{}", run.stdout);
    assert_eq!(pipeline.archive_entries(), ["B9-RT1", "B9-RT1.v2"]);
    assert_eq!(tree(&pipeline.archive().join("B9-RT1")), first, "version 1 is kept as it was");
    assert_eq!(tree(&pipeline.archive().join("B9-RT1.v2")), tree(&folder));
    let batch = pipeline.batch("B9-RT1");
    let archived = archived_events(&batch);
    assert_eq!(archived.len(), 2);
    assert_eq!(archived[1].details["result"]["version"], 2);
}
