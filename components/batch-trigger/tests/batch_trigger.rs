//! `batch-trigger` as cron runs it: the real binary scanning a real incoming directory into a
//! temp SQLite store, with local locks. What the user sees: registered batches, their
//! `Data_Received` events, re-deliveries, and one stdout line per registration.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use autocomp_framework::ComponentName;
use autocomp_framework::locks::{LockHolder, LockPath, open_locks};
use autocomp_framework::testing::TempPipeline;
use autocomp_framework::{Batch, Event, Outcome, Timestamp};
use autocomp_test_servers::wait_until;

const TRIGGER: &str = env!("CARGO_BIN_EXE_batch-trigger");

/// A temp pipeline with `incoming/` under its root.
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
    /// batch-trigger.toml gets `top_level` keys, then `[settings]` with `incoming` and `settings`.
    fn new(top_level: &str, settings: &str) -> Self {
        let pipeline = TempPipeline::new();
        let incoming = pipeline.root().join("incoming");
        std::fs::create_dir_all(&incoming).unwrap();
        pipeline.configure(
            "batch-trigger",
            &format!("{top_level}\n[settings]\nincoming = \"{}\"\n{settings}", incoming.display()),
        );
        Self { pipeline }
    }

    fn folder(&self, name: &str) -> PathBuf {
        self.pipeline.root().join("incoming").join(name)
    }

    /// The batch, if registered.
    fn batch(&self, id: &str) -> Option<Batch> {
        self.pipeline.find_batch(id)
    }

    fn run(&self, args: &[&str]) -> Run {
        let output = self.pipeline.run(Path::new(TRIGGER), args);
        Run {
            code: output.status.code(),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }
    }
}

/// A delivery's payload and tag files; the marker (the tag manifest) is not written.
fn write_payload(folder: &Path) {
    std::fs::create_dir_all(folder.join("data/scans 2")).unwrap();
    std::fs::write(folder.join("bagit.txt"), "BagIt-Version: 1.0\n").unwrap();
    std::fs::write(folder.join("data/page-0001.txt"), "page one\n".repeat(100)).unwrap();
    std::fs::write(folder.join("data/scans 2/scan 1.txt"), "a scan\n").unwrap();
}

/// The completion marker, written last as a deliverer would.
fn write_marker(folder: &Path, name: &str) {
    std::fs::write(folder.join(name), "0123  bagit.txt\n").unwrap();
}

fn received(batch: &Batch) -> Vec<&Event> {
    batch.events.iter().filter(|e| e.event_type == *"Data_Received").collect()
}

#[test]
fn a_settled_folder_is_registered_once() {
    let pipeline = Pipeline::new("", "settle_for = \"1h\"\n");
    let folder = pipeline.folder("B400022028241-RT1");
    write_payload(&folder);
    write_marker(&folder, "tagmanifest-sha256.txt");
    // Things in incoming that are not batches are left alone, silently.
    std::fs::create_dir(pipeline.folder("tmp")).unwrap();
    std::fs::write(pipeline.folder("B1-RT1.tar"), "not a folder").unwrap();

    let run = pipeline.run(&[]);
    assert_eq!(run.code, Some(0), "{}{}", run.stdout, run.stderr);
    assert_eq!(run.stderr, "");
    assert_eq!(
        run.stdout,
        format!(
            "B400022028241-RT1 registered: 4 files, 942 B at {} (marker tagmanifest-sha256.txt)\n",
            folder.display()
        )
    );
    let batch = pipeline.batch("B400022028241-RT1").expect("registered");
    assert_eq!(batch.batch_type.as_str(), "RoundTrip");
    assert_eq!(batch.location(), Some(folder.to_str().unwrap()));
    assert_eq!(batch.metadata["fingerprint"]["files"], 4);
    let events = received(&batch);
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].outcome, Outcome::Success);
    assert!(events[0].agent.as_str().starts_with("batch-trigger/"), "{}", events[0].agent);
    assert_eq!((events[0].details["files"].as_u64(), events[0].details["bytes"].as_u64()), (Some(4), Some(942)));
    assert_eq!(pipeline.batch_count(), 1);

    // The next cron start: nothing new, so nothing printed and nothing recorded.
    let again = pipeline.run(&[]);
    assert_eq!((again.code, again.stdout.as_str(), again.stderr.as_str()), (Some(0), "", ""));
    assert_eq!(received(&pipeline.batch("B400022028241-RT1").unwrap()).len(), 1);
}

#[test]
fn a_paused_pipeline_registers_nothing_until_it_is_resumed() {
    use autocomp_framework::SteeringChange;
    let pipeline = Pipeline::new("", "settle_for = \"1h\"\n");
    let folder = pipeline.folder("B400022028241-RT1");
    write_payload(&folder);
    write_marker(&folder, "tagmanifest-sha256.txt");
    pipeline.steer(SteeringChange::Pause { component: None, drain: false });
    let paused = pipeline.run(&[]);
    assert_eq!((paused.code, paused.stdout.as_str(), paused.stderr.as_str()), (Some(0), "", ""));
    assert_eq!(pipeline.batch_count(), 0, "nothing registered while the pipeline is paused");
    let manual = pipeline.run(&["--batch", "B400022028241-RT1"]);
    assert_eq!(manual.code, Some(1), "{}{}", manual.stdout, manual.stderr);
    assert!(manual.stderr.contains("the pipeline is paused by operator:test"), "{}", manual.stderr);
    assert_eq!(pipeline.batch_count(), 0);

    pipeline.steer(SteeringChange::Resume { component: None });
    let resumed = pipeline.run(&[]);
    assert_eq!(resumed.code, Some(0), "{}{}", resumed.stdout, resumed.stderr);
    assert!(resumed.stdout.starts_with("B400022028241-RT1 registered"), "{}", resumed.stdout);
}

#[test]
fn an_unsettled_folder_waits_until_nothing_changed_for_settle_for() {
    let pipeline = Pipeline::new("", "settle_for = \"3s\"\n");
    let folder = pipeline.folder("B2-RT1");
    write_payload(&folder);
    let last_write = Instant::now();

    let run = pipeline.run(&[]);
    assert_eq!((run.code, run.stdout.as_str(), run.stderr.as_str()), (Some(0), "", ""));
    assert!(pipeline.batch("B2-RT1").is_none());
    let dry = pipeline.run(&["--dry-run"]);
    assert!(
        dry.stdout.starts_with("B2-RT1 waiting: last change ") && dry.stdout.contains("ago, settle_for 3s"),
        "{}",
        dry.stdout
    );

    // Cron keeps starting it; it registers the folder once it has been quiet for 3s.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut registered = String::new();
    let done = wait_until(deadline, || {
        let run = pipeline.run(&[]);
        assert_eq!(run.code, Some(0), "{}{}", run.stdout, run.stderr);
        registered = run.stdout;
        !registered.is_empty()
    });
    assert!(done, "never registered");
    // File times tick in jiffies, so allow a few milliseconds of rounding.
    assert!(last_write.elapsed() >= Duration::from_millis(2900), "{:?}", last_write.elapsed());
    assert!(
        registered.starts_with("B2-RT1 registered: 3 files") && registered.contains("(no change for 3s)"),
        "{registered}"
    );
    assert_eq!(received(&pipeline.batch("B2-RT1").unwrap()).len(), 1);
}

#[test]
fn a_completion_marker_settles_a_folder_at_once() {
    let pipeline = Pipeline::new("", "settle_for = \"1h\"\n");
    let folder = pipeline.folder("B3-RT1");
    write_payload(&folder);
    let run = pipeline.run(&[]);
    assert_eq!((run.code, run.stdout.as_str()), (Some(0), ""));
    assert!(pipeline.batch("B3-RT1").is_none());

    write_marker(&folder, "tagmanifest-md5.txt");
    let run = pipeline.run(&[]);
    assert_eq!(run.code, Some(0), "{}{}", run.stdout, run.stderr);
    assert!(
        run.stdout.starts_with("B3-RT1 registered: 4 files") && run.stdout.contains("(marker tagmanifest-md5.txt)")
    );
    assert_eq!(received(&pipeline.batch("B3-RT1").unwrap()).len(), 1);
}

#[test]
fn a_redelivery_is_a_content_change_with_a_new_data_received() {
    let pipeline = Pipeline::new("", "settle_for = \"1h\"\n");
    let folder = pipeline.folder("B4-RT1");
    write_payload(&folder);
    write_marker(&folder, "tagmanifest-sha256.txt");
    assert_eq!(pipeline.run(&[]).code, Some(0));
    let first = pipeline.batch("B4-RT1").unwrap();

    // The deliverer sends the round trip again: a page changes, then the new tag manifest.
    std::fs::write(folder.join("data/page-0001.txt"), "page one, rescanned\n".repeat(100)).unwrap();
    let mid_delivery = pipeline.run(&[]);
    assert_eq!((mid_delivery.code, mid_delivery.stdout.as_str()), (Some(0), ""), "the old marker proves nothing");
    write_marker(&folder, "tagmanifest-sha256.txt");
    let run = pipeline.run(&[]);
    assert_eq!(run.code, Some(0), "{}{}", run.stdout, run.stderr);
    assert!(run.stdout.starts_with("B4-RT1 re-delivered: 4 files, 2.0 KiB"), "{}", run.stdout);
    assert!(run.stdout.contains("was 4 files, 942 bytes"), "{}", run.stdout);

    let batch = pipeline.batch("B4-RT1").unwrap();
    assert!(batch.modified_seq > first.modified_seq, "a re-delivery is a content change");
    assert_eq!(batch.created_seq, first.created_seq);
    assert_eq!(batch.metadata["fingerprint"]["bytes"], 2042);
    let events = received(&batch);
    assert_eq!(events.len(), 2);
    assert!(events[1].seq > batch.modified_seq, "the new Data_Received follows the content change");
    assert_eq!(events[1].details["redelivery"], true);
    assert_eq!(events[1].details["previous"]["bytes"], 942);

    let again = pipeline.run(&[]);
    assert_eq!((again.code, again.stdout.as_str()), (Some(0), ""));
    assert_eq!(received(&pipeline.batch("B4-RT1").unwrap()).len(), 2);
}

#[test]
fn an_operator_rerun_records_data_received_again_without_a_content_change() {
    let pipeline = Pipeline::new("", "settle_for = \"1h\"\n");
    let folder = pipeline.folder("B11-RT1");
    write_payload(&folder);
    write_marker(&folder, "tagmanifest-sha256.txt");
    assert_eq!(pipeline.run(&[]).code, Some(0));
    let first = pipeline.batch("B11-RT1").unwrap();
    // What `autocomp rerun B11-RT1 --component batch-trigger` appends.
    pipeline.reset("B11-RT1", &["Data_Received"], "the scanner's record was lost");

    let run = pipeline.run(&[]);
    assert_eq!(run.code, Some(0), "{}{}", run.stdout, run.stderr);
    assert!(run.stdout.starts_with("B11-RT1 registered: 4 files"), "{}", run.stdout);
    let batch = pipeline.batch("B11-RT1").unwrap();
    assert_eq!(received(&batch).len(), 2);
    assert_eq!(batch.modified_seq, first.modified_seq, "the folder did not change");
}

#[test]
fn a_batch_added_by_hand_gets_its_delivery_recorded() {
    let pipeline = Pipeline::new("", "settle_for = \"1h\"\n");
    pipeline.add_unlocated_batch("B12-RT1");
    assert_eq!(pipeline.batch("B12-RT1").unwrap().location(), None);
    let folder = pipeline.folder("B12-RT1");
    write_payload(&folder);
    write_marker(&folder, "tagmanifest-sha256.txt");

    let run = pipeline.run(&[]);
    assert_eq!(run.code, Some(0), "{}{}", run.stdout, run.stderr);
    assert!(run.stdout.contains("the batch existed without a delivery"), "{}", run.stdout);
    let batch = pipeline.batch("B12-RT1").unwrap();
    assert_eq!(batch.location(), Some(folder.to_str().unwrap()));
    assert_eq!(received(&batch).len(), 1);
    assert_eq!(received(&batch)[0].details["redelivery"], false);
}

#[test]
fn a_folder_whose_name_is_not_a_batch_id_is_refused() {
    let pipeline = Pipeline::new("", "pattern = \"*\"\nsettle_for = \"1h\"\n");
    for name in ["bad name!", "B5-RT1"] {
        write_payload(&pipeline.folder(name));
        write_marker(&pipeline.folder(name), "tagmanifest-sha256.txt");
    }
    let run = pipeline.run(&[]);
    assert_eq!(run.code, Some(1), "{}{}", run.stdout, run.stderr);
    assert!(
        run.stderr.contains("skipping folder") && run.stderr.contains("invalid batch id \"bad name!\""),
        "{}",
        run.stderr
    );
    assert!(run.stdout.starts_with("B5-RT1 registered"), "{}", run.stdout);
    assert_eq!(run.stdout.lines().count(), 1);
    assert_eq!(pipeline.batch_count(), 1);
}

#[test]
fn a_second_scanner_exits_3_while_the_poll_lock_is_held() {
    let pipeline = Pipeline::new("poll_lock_timeout = \"0s\"", "settle_for = \"0s\"\n");
    write_payload(&pipeline.folder("B6-RT1"));
    let locks = pipeline.block_on(open_locks(&pipeline.locks_url())).unwrap();
    let holder =
        LockHolder { agent: "test".into(), host: "testhost".into(), pid: std::process::id(), since: Timestamp::now() };
    let path = LockPath::Poll(ComponentName::new("batch-trigger").unwrap());
    let held = pipeline.block_on(locks.try_lock(&path, &holder, Duration::ZERO)).unwrap().expect("free");

    let run = pipeline.run(&[]);
    assert_eq!((run.code, run.stdout.as_str(), run.stderr.as_str()), (Some(3), "", ""));
    assert!(pipeline.batch("B6-RT1").is_none());

    pipeline.block_on(held.release()).unwrap();
    let run = pipeline.run(&[]);
    assert_eq!(run.code, Some(0), "{}{}", run.stdout, run.stderr);
    assert!(pipeline.batch("B6-RT1").is_some());
}

#[test]
fn dry_run_lists_what_it_would_register_and_writes_nothing() {
    let pipeline = Pipeline::new("", "settle_for = \"1h\"\n");
    let folder = pipeline.folder("B7-RT1");
    write_payload(&folder);
    write_marker(&folder, "tagmanifest-sha256.txt");
    let run = pipeline.run(&["--dry-run"]);
    assert_eq!(run.code, Some(0), "{}{}", run.stdout, run.stderr);
    assert_eq!(
        run.stdout,
        format!("B7-RT1 would register: 4 files, 942 B at {} (marker tagmanifest-sha256.txt)\n", folder.display())
    );
    assert_eq!(pipeline.batch_count(), 0);
}

#[test]
fn a_dry_run_needs_no_lock_service_and_a_real_pass_names_the_missing_one() {
    let pipeline = Pipeline::new("", "settle_for = \"1h\"\n");
    let folder = pipeline.folder("B7-RT1");
    write_payload(&folder);
    write_marker(&folder, "tagmanifest-sha256.txt");
    let shared = pipeline.config_dir().join("autocomp.toml");
    let without_locks: String = std::fs::read_to_string(&shared)
        .unwrap()
        .lines()
        .filter(|line| !line.starts_with("locks"))
        .map(|line| format!("{line}\n"))
        .collect();
    std::fs::write(&shared, without_locks).unwrap();

    let dry = pipeline.run(&["--dry-run"]);
    assert_eq!(dry.code, Some(0), "{}{}", dry.stdout, dry.stderr);
    assert!(dry.stdout.starts_with("B7-RT1 would register"), "{}", dry.stdout);
    let real = pipeline.run(&[]);
    assert_eq!(real.code, Some(2), "{}{}", real.stdout, real.stderr);
    assert!(real.stderr.contains("no locks backend configured"), "{}", real.stderr);
    assert_eq!(pipeline.batch_count(), 0);
}

#[test]
fn batch_and_force_register_one_unsettled_folder() {
    let pipeline = Pipeline::new("", "settle_for = \"1h\"\n");
    write_payload(&pipeline.folder("B8-RT1"));
    write_payload(&pipeline.folder("B9-RT1"));
    let run = pipeline.run(&["--batch", "B8-RT1", "--force"]);
    assert_eq!(run.code, Some(0), "{}{}", run.stdout, run.stderr);
    assert!(
        run.stdout.starts_with("B8-RT1 registered: 3 files") && run.stdout.ends_with("(forced)\n"),
        "{}",
        run.stdout
    );
    assert_eq!(pipeline.batch_count(), 1);

    let missing = pipeline.run(&["--batch", "B10-RT1"]);
    assert_eq!(missing.code, Some(2));
    assert!(missing.stderr.contains("--batch B10-RT1: no folder"), "{}", missing.stderr);
    let scheduled = pipeline.run(&["--schedule", "*/5 * * * *"]);
    assert_eq!(scheduled.code, Some(2));
    assert!(scheduled.stderr.contains("--schedule"), "{}", scheduled.stderr);
    // Nothing in the store announces a new delivery, so watching would scan once and exit.
    let watching = pipeline.run(&["--watch"]);
    assert_eq!(watching.code, Some(2));
    assert!(watching.stderr.contains("does not take --watch"), "{}", watching.stderr);
    assert_eq!(pipeline.batch_count(), 1);
}

#[test]
fn config_mistakes_are_usage_errors_naming_the_key() {
    let pipeline = Pipeline::new("", "pattern = \"B<digit>-RT<digits>\"\n");
    let run = pipeline.run(&[]);
    assert_eq!(run.code, Some(2));
    assert!(run.stderr.contains("pattern") && run.stderr.contains("unknown class <digit>"), "{}", run.stderr);
    let pipeline = Pipeline::new("", "settle_after = \"1m\"\n");
    let run = pipeline.run(&[]);
    assert_eq!(run.code, Some(2));
    assert!(run.stderr.contains("settle_after"), "{}", run.stderr);
}
