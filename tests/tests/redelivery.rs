//! A re-delivered batch is verified again: its earlier results become stale, the checkers run
//! on the new content, and the archiver archives it again only once the new content is
//! verified, as a new version beside the old copy. Run with the real components on the
//! demo's embedded pipeline, and BagIt's reference tool (`bagit.py`) to re-make manifests.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use autocomp_e2e::{binary, finish};
use autocomp_model::{Batch, BatchId, Outcome, Seq};
use autocomp_store::SqliteStore;
use autocomp_store::prelude::*;
use serde_json::Value;

const STEPS: [&str; 4] = ["batch-trigger", "structure-checker", "checksum-verifier", "archiver"];

struct Demo {
    _dir: tempfile::TempDir,
    root: PathBuf,
    id: BatchId,
}

impl Demo {
    /// `autocomp demo` with one good delivery, run to the end: verified and archived.
    fn archived() -> Demo {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_path_buf();
        let demo = Command::new(binary("autocomp")).args(["demo", "--batches", "1", "--dir"]).arg(&root).output();
        let demo = demo.unwrap();
        assert!(demo.status.success(), "demo: {}", String::from_utf8_lossy(&demo.stderr));
        let id = std::fs::read_dir(root.join("incoming")).unwrap().next().unwrap().unwrap().file_name();
        let id = BatchId::new(id.to_str().unwrap()).unwrap();
        let this = Demo { _dir: dir, root, id };
        assert_eq!(this.states()["archiver"], "success", "the demo archives its good delivery");
        this
    }

    fn delivery(&self) -> PathBuf {
        self.root.join("incoming").join(self.id.as_str())
    }

    fn archive(&self) -> PathBuf {
        self.root.join("archive")
    }

    /// Each step once, in pipeline order, as cron would start them; until a round does nothing.
    fn run_pipeline(&self) {
        for _round in 0..4 {
            let mut worked = 0;
            for step in STEPS {
                let child = Command::new(binary(step))
                    .arg("--config-dir")
                    .arg(self.root.join("config"))
                    .env_remove("AUTOCOMP_STORE")
                    .env_remove("AUTOCOMP_INDEX")
                    .env_remove("AUTOCOMP_LOCKS")
                    .stdin(Stdio::null())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()
                    .unwrap();
                let run = finish(child, Duration::from_secs(60));
                assert!(matches!(run.code, Some(0 | 1)), "{step}: {}", run.show());
                worked += run.stdout.lines().count();
            }
            if worked == 0 {
                return;
            }
        }
        panic!("the pipeline did not settle in 4 rounds");
    }

    /// `autocomp ARGS` on the demo's pipeline: its stdout, after a successful exit.
    fn autocomp(&self, args: &[&str]) -> String {
        let output = Command::new(binary("autocomp"))
            .arg("--config-dir")
            .arg(self.root.join("config"))
            .args(args)
            .env_remove("AUTOCOMP_STORE")
            .output()
            .unwrap();
        assert!(output.status.success(), "autocomp {args:?}: {}", String::from_utf8_lossy(&output.stderr));
        String::from_utf8(output.stdout).unwrap()
    }

    /// `autocomp status --format json` for the batch: {component: state}.
    fn states(&self) -> serde_json::Map<String, Value> {
        let rows: Value = serde_json::from_str(&self.autocomp(&["status", "--format", "json"])).unwrap();
        rows[0]["components"].as_object().unwrap().clone()
    }

    fn batch(&self) -> Batch {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async {
            let store = SqliteStore::open(self.root.join("store.db")).await.unwrap();
            store.get_batch(&self.id).await.unwrap()
        })
    }

    fn archived_copies(&self) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(self.archive())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|name| !name.starts_with('.'))
            .collect();
        names.sort();
        names
    }
}

/// Events of `event_type` recorded after `seq`.
fn recorded_after<'b>(batch: &'b Batch, event_type: &str, seq: Seq) -> Vec<&'b autocomp_model::Event> {
    batch.events.iter().filter(|e| e.event_type.as_str() == event_type && e.seq > seq).collect()
}

fn bagit(bag: &Path, body: &str) {
    let script = format!("import sys, bagit\nbag = bagit.Bag(sys.argv[1])\n{body}\n");
    let output = Command::new("python3").args(["-c", &script]).arg(bag).output().expect("python3 runs");
    assert!(
        output.status.success(),
        "bagit (`pip install bagit`) failed on {}: {}",
        bag.display(),
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn a_tampered_redelivery_is_caught_and_a_benign_one_is_verified_and_archived_again() {
    let demo = Demo::archived();
    let first_copy = demo.archive().join(demo.id.as_str());
    let page = "data/page-0001.txt";
    let archived_page = std::fs::read(first_copy.join(page)).unwrap();
    let before = demo.batch();

    // Tampered: a payload file changes, the manifests do not.
    let mut text = std::fs::read_to_string(demo.delivery().join(page)).unwrap();
    text.push_str("a line nobody checksummed\n");
    std::fs::write(demo.delivery().join(page), &text).unwrap();
    demo.run_pipeline();

    let tampered = demo.batch();
    assert!(tampered.modified_seq > before.modified_seq, "batch-trigger recorded the re-delivery");
    let verified = recorded_after(&tampered, "Checksums_Verified", tampered.modified_seq);
    assert_eq!(verified.len(), 1, "the new content was verified once: {:#?}", tampered.events);
    assert_eq!(verified[0].outcome, Outcome::Failure, "and the checksum failure is recorded");
    assert_eq!(recorded_after(&tampered, "Data_Archived", before.changed_seq), Vec::<&autocomp_model::Event>::new());
    assert_eq!(demo.archived_copies(), vec![demo.id.to_string()], "no archive of the new content");
    assert_eq!(std::fs::read(first_copy.join(page)).unwrap(), archived_page, "the old copy is untouched");
    let states = demo.states();
    assert_eq!(states["checksum-verifier"], "failed", "{states:?}");
    assert_eq!(states["archiver"], "stale", "the archive holds content the batch no longer has: {states:?}");
    let shown = demo.autocomp(&["show", demo.id.as_str()]);
    let archived_line = shown.lines().find(|line| line.trim_start().starts_with("Data_Archived")).unwrap();
    assert!(archived_line.contains("stale: worked out from the content of seq"), "{shown}");
    let explained = demo.autocomp(&["explain", demo.id.as_str(), "--component", "archiver"]);
    assert!(explained.contains("(stale: the batch's content changed after it was worked out"), "{explained}");

    // Benign: a file added and the manifests made again by the reference tool.
    std::fs::write(demo.delivery().join("data/page-0004.txt"), "a page the scanner sent late\n").unwrap();
    bagit(&demo.delivery(), "bag.save(manifests=True)");
    demo.run_pipeline();

    let benign = demo.batch();
    assert!(benign.modified_seq > tampered.modified_seq, "a second re-delivery");
    for step in ["Structure_Checked", "Checksums_Verified", "Data_Archived"] {
        let results = recorded_after(&benign, step, benign.modified_seq);
        assert_eq!(results.len(), 1, "{step} once on the new content: {:#?}", benign.events);
        assert_eq!(results[0].outcome, Outcome::Success, "{step}: {:#?}", results[0].details);
    }
    let second_copy = demo.archive().join(format!("{}.v2", demo.id));
    assert_eq!(demo.archived_copies(), vec![demo.id.to_string(), format!("{}.v2", demo.id)]);
    assert_eq!(std::fs::read(first_copy.join(page)).unwrap(), archived_page, "version 1 is kept as it was");
    assert_eq!(std::fs::read_to_string(second_copy.join(page)).unwrap(), text, "version 2 is the new content");
    assert!(second_copy.join("data/page-0004.txt").exists());
    let states = demo.states();
    // The demo's Python step (catalogue) is not among the steps these rounds run: its result
    // was worked out from the first content, so it is stale, as a reader of the content's.
    assert_eq!(states["catalogue"], "stale", "{states:?}");
    assert!(states.iter().filter(|(step, _)| *step != "catalogue").all(|(_, state)| state == "success"), "{states:?}");
}
