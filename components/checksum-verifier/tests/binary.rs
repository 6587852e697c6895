//! The real `checksum-verifier` binary, started as cron starts it, over a real SQLite store with
//! a local index and local locks: the events it records say which batches are intact and name
//! the offending file of the one that is not.

use std::fs;
use std::path::Path;

use autocomp_bagit::testing::bagit_tool;
use autocomp_framework::Outcome;
use autocomp_framework::testing::TempPipeline;

const BINARY: &str = env!("CARGO_BIN_EXE_checksum-verifier");

fn bag(parent: &Path, name: &str) -> std::path::PathBuf {
    let dir = parent.join(name);
    fs::create_dir_all(dir.join("sub dir")).unwrap();
    fs::write(dir.join("page 1.txt"), "first page\n").unwrap();
    fs::write(dir.join("sub dir/page 2.txt"), "second page\n").unwrap();
    bagit_tool().make_bag(&dir, &[]);
    dir
}

#[test]
fn records_checksums_verified_and_names_the_corrupt_file() {
    let deliveries = tempfile::tempdir().unwrap();
    let good = bag(deliveries.path(), "B1-RT1");
    let corrupt = bag(deliveries.path(), "B2-RT1");
    fs::write(corrupt.join("data/sub dir/page 2.txt"), "second pagE\n").unwrap();
    let plain = deliveries.path().join("B4-RT1");
    fs::create_dir(&plain).unwrap();
    fs::write(plain.join("scan.tif"), "tiff").unwrap();
    let md5sum = std::process::Command::new("md5sum").arg("scan.tif").current_dir(&plain).output().unwrap();
    fs::write(plain.join("MD5SUMS"), md5sum.stdout).unwrap();

    let pipeline = TempPipeline::new();
    pipeline.configure("checksum-verifier", "[settings]\nplain_manifest = \"MD5SUMS\"\n");
    pipeline.add_batch("B1-RT1", &good);
    pipeline.add_batch("B2-RT1", &corrupt);
    pipeline.add_batch("B3-RT1", &deliveries.path().join("never-delivered"));
    pipeline.add_batch("B4-RT1", &plain);

    let output = pipeline.run(Path::new(BINARY), &[]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "some batch failed, so exit 1\n{stdout}\n{stderr}");
    assert_eq!(stdout.lines().count(), 4, "one line per batch:\n{stdout}");
    assert!(stdout.contains("data/sub dir/page 2.txt"), "the corrupt file is named on stdout:\n{stdout}");

    let event = pipeline.event("B1-RT1", "Checksums_Verified").expect("B1 recorded");
    assert_eq!(event.outcome, Outcome::Success, "{:#}", event.details);
    let summary = event.details["summary"].as_str().unwrap();
    assert!(summary.starts_with("verified 6 files") && summary.contains("md5+sha256"), "{summary}");

    let event = pipeline.event("B2-RT1", "Checksums_Verified").expect("B2 recorded");
    assert_eq!(event.outcome, Outcome::Failure);
    let failures = event.details["failures"].as_array().unwrap();
    assert_eq!(failures.len(), 1, "{:#}", event.details);
    assert_eq!(failures[0]["reference"], "data/sub dir/page 2.txt");
    assert_eq!(failures[0]["type"], "mismatch");
    let mismatches = failures[0]["details"]["mismatches"].as_array().unwrap();
    assert_eq!(mismatches.len(), 2, "both md5 and sha256 differ: {:#}", failures[0]);

    // A location that does not exist is a permanent failure naming the path, not a retry.
    let event = pipeline.event("B3-RT1", "Checksums_Verified").expect("B3 recorded");
    assert_eq!(event.outcome, Outcome::Failure);
    assert!(!event.flag("transient"), "{:#}", event.details);
    let summary = event.details["summary"].as_str().unwrap();
    assert!(summary.contains("never-delivered") && summary.contains("does not exist"), "{summary}");

    let event = pipeline.event("B4-RT1", "Checksums_Verified").expect("B4 recorded");
    assert_eq!(event.outcome, Outcome::Success, "{:#}", event.details);
    assert_eq!(event.details["summary"], "verified 1 file (4 B) against MD5SUMS (md5)");

    // Everything is recorded, so the next cron start has nothing to do and says nothing.
    let again = pipeline.run(Path::new(BINARY), &[]);
    assert_eq!(again.status.code(), Some(0), "{}", String::from_utf8_lossy(&again.stderr));
    assert!(again.stdout.is_empty(), "quiet when idle: {}", String::from_utf8_lossy(&again.stdout));
}

#[test]
fn an_unknown_setting_is_a_config_error_naming_it() {
    let pipeline = TempPipeline::new();
    pipeline.configure("checksum-verifier", "[settings]\nplain_manifset = \"MD5SUMS\"\n");
    let output = pipeline.run(Path::new(BINARY), &[]);
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("plain_manifset"), "{stderr}");
}
