//! The real `structure-checker` binary, started as cron starts it, over a real SQLite store
//! with a local index and local locks: a good bag passes, and a broken one's recorded failure
//! names the offending file.

use std::fs;
use std::path::{Path, PathBuf};

use autocomp_bagit::testing::bagit_tool;
use autocomp_framework::Outcome;
use autocomp_framework::testing::TempPipeline;

const BINARY: &str = env!("CARGO_BIN_EXE_structure-checker");

fn bag(parent: &Path, name: &str) -> PathBuf {
    let dir = parent.join(name);
    fs::create_dir_all(dir.join("pages")).unwrap();
    fs::write(dir.join("pages/0001.tif"), "II*\0page one").unwrap();
    fs::write(dir.join("pages/0002.tif"), "II*\0page two").unwrap();
    bagit_tool().make_bag(&dir, &["--source-organization", "Royal Danish Library"]);
    dir
}

#[test]
fn records_structure_checked_and_names_the_offending_files() {
    let deliveries = tempfile::tempdir().unwrap();
    let good = bag(deliveries.path(), "B1-RT1");
    let empty = bag(deliveries.path(), "B2-RT1");
    fs::write(empty.join("data/pages/0003.tif"), "").unwrap();
    let escaping = bag(deliveries.path(), "B3-RT1");
    std::os::unix::fs::symlink("/etc/hostname", escaping.join("data/pages/0003.tif")).unwrap();

    let pipeline = TempPipeline::new();
    pipeline.configure(
        "structure-checker",
        "[settings]\nrequired_bag_info = [\"Source-Organization\"]\nallowed_payload_names = [\"*.tif\"]\n",
    );
    pipeline.add_batch("B1-RT1", &good);
    pipeline.add_batch("B2-RT1", &empty);
    pipeline.add_batch("B3-RT1", &escaping);

    let output = pipeline.run(Path::new(BINARY), &[]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(1), "{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    assert_eq!(stdout.lines().count(), 3, "one line per batch:\n{stdout}");

    let event = pipeline.event("B1-RT1", "Structure_Checked").expect("B1 recorded");
    assert_eq!(event.outcome, Outcome::Success, "{:#}", event.details);
    let summary = event.details["summary"].as_str().unwrap();
    assert!(summary.starts_with("checked 8 files and 2 directories: BagIt 0.97"), "{summary}");

    for (id, path, kind) in
        [("B2-RT1", "data/pages/0003.tif", "empty"), ("B3-RT1", "data/pages/0003.tif", "symlink-escape")]
    {
        let event = pipeline.event(id, "Structure_Checked").expect("recorded");
        assert_eq!(event.outcome, Outcome::Failure, "{id}");
        let failures = event.details["failures"].as_array().unwrap();
        assert_eq!(failures.len(), 1, "{id}: {:#}", event.details);
        assert_eq!(failures[0]["reference"], path, "{id}");
        assert_eq!(failures[0]["type"], kind, "{id}");
    }
}

#[test]
fn a_bad_pattern_is_a_config_error_naming_it() {
    let pipeline = TempPipeline::new();
    pipeline.configure("structure-checker", "[settings]\nrequired_files = [\"/etc/passwd\"]\n");
    let output = pipeline.run(Path::new(BINARY), &[]);
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("/etc/passwd") && stderr.contains("absolute"), "{stderr}");
}
