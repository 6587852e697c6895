//! The testing helpers tried on a probe component: its work's outcomes and reports, test
//! batches and a temporary pipeline. Apart so the helpers read without their tests.

use serde::Deserialize;
use serde_json::json;

use super::*;
use crate::component::IoResultExt;
use autocomp_model::Trigger;

/// A component whose settings choose what its `work` does.
struct Probe;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ProbeSettings {
    behaviour: String,
}

#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct Pages {
    pages: u32,
}

impl Component for Probe {
    type Settings = ProbeSettings;

    fn name(&self) -> &str {
        "probe"
    }
    fn version(&self) -> &str {
        "1"
    }
    fn event_type(&self) -> &str {
        "Probed"
    }
    fn trigger(&self) -> Trigger {
        Trigger::builder().requires("Data_Received").blocked_by("Probed").build()
    }

    fn work(&self, batch: &Batch, settings: &ProbeSettings, context: &mut WorkContext) -> Result<(), WorkError> {
        match settings.behaviour.as_str() {
            "succeed" => context.set_summary(format!("probed {}", batch.id)),
            "fail" => context.fail("empty_delivery", "the delivery holds no files"),
            "transient" => {
                context.set_summary("tried once");
                return Err(WorkError::transient("the share is offline"));
            }
            "result" => context.set_result(&Pages { pages: 412 })?,
            "read" => {
                let path = context.location()?.join("missing.txt");
                std::fs::read(&path).with_path(&path)?;
            }
            "many" => {
                for n in 0..150 {
                    context.add_failure(format!("page-{n}"), "mismatch", "wrong bytes", Value::Null);
                }
            }
            "earlier" => {
                let earlier: Option<Pages> = batch.result("Ocr_Done")?;
                context.set_summary(format!("{:?}", earlier));
            }
            other => panic!("unknown behaviour {other}"),
        }
        Ok(())
    }
}

fn probe(behaviour: &str) -> WorkRun {
    let dir = tempfile::tempdir().unwrap();
    run_work_on(&Probe, &settings(&format!("behaviour = {behaviour:?}")), dir.path())
}

#[test]
fn a_success_is_recorded_as_one() {
    let run = probe("succeed");
    assert_eq!(run.returned, Ok(()));
    assert!(run.succeeded() && !run.is_transient());
    assert_eq!(run.report.summary, "probed B1");
    assert_eq!((run.report.failures_total, run.report.result.as_ref()), (0, None));
    assert_eq!(run.result::<Pages>(), None);
}

#[test]
fn a_failure_in_the_report_fails_the_batch_permanently() {
    let run = probe("fail");
    assert_eq!(run.returned, Ok(()));
    assert!(!run.succeeded() && !run.is_transient());
    assert_eq!(run.report.failures_total, 1);
    let failure = &run.report.failures[0];
    assert_eq!((failure.reference.as_str(), failure.kind.as_str()), ("", "empty_delivery"));
    assert_eq!(failure.description, "the delivery holds no files");
}

#[test]
fn a_transient_error_is_a_failure_flagged_for_retry_after_the_summary() {
    let run = probe("transient");
    assert_eq!(run.returned, Err(WorkError::transient("the share is offline")));
    assert!(!run.succeeded() && run.is_transient());
    assert_eq!(run.report.outcome, Outcome::Failure);
    assert_eq!(run.report.summary, "tried once; the share is offline");
}

#[test]
fn a_structured_result_reads_back_typed() {
    let run = probe("result");
    assert!(run.succeeded());
    assert_eq!(run.result::<Pages>(), Some(Pages { pages: 412 }));
    assert_eq!(run.report.result, Some(json!({ "pages": 412 })));
}

#[test]
#[should_panic(expected = "does not fit")]
fn a_result_of_the_wrong_type_panics_naming_it() {
    probe("result").result::<Vec<String>>();
}

#[test]
fn a_missing_file_is_a_permanent_failure_naming_its_path() {
    let dir = tempfile::tempdir().unwrap();
    let run = run_work_on(&Probe, &settings("behaviour = \"read\""), dir.path());
    let missing = dir.path().join("missing.txt");
    assert!(matches!(&run.returned, Err(WorkError::Permanent(m)) if m.starts_with(&*missing.to_string_lossy())));
    assert!(!run.succeeded() && !run.is_transient());
    assert!(run.report.summary.contains(&*missing.to_string_lossy()), "{}", run.report.summary);
}

#[test]
fn the_report_keeps_the_first_hundred_failures_and_counts_all() {
    let run = probe("many");
    assert_eq!((run.report.failures.len(), run.report.failures_total), (100, 150));
    assert_eq!(run.report.failures[99].reference, "page-99");
}

#[test]
fn a_batch_without_a_location_is_a_permanent_failure() {
    let batch = TestBatch::new("B2").succeeded("Data_Received").build();
    let run = run_work(&Probe, &settings("behaviour = \"read\""), &batch);
    assert!(matches!(run.returned, Err(WorkError::Permanent(_))));
    assert!(run.report.summary.contains("location"), "{}", run.report.summary);
}

#[test]
fn test_batches_hold_what_was_added_in_order() {
    let batch = TestBatch::new("B400022028241-RT1")
        .location("/deliveries/B400022028241-RT1")
        .metadata("pages", json!(12))
        .succeeded("Data_Received")
        .failed("Checksums_Verified", true)
        .with_result("Ocr_Done", &Pages { pages: 7 })
        .build();
    assert_eq!(batch.id.as_str(), "B400022028241-RT1");
    assert_eq!((batch.batch_type.as_str(), batch.priority), ("RoundTrip", 0));
    assert_eq!(batch.location(), Some("/deliveries/B400022028241-RT1"));
    assert_eq!(batch.metadata["pages"], 12);
    let types: Vec<&str> = batch.events.iter().map(|e| e.event_type.as_str()).collect();
    assert_eq!(types, ["Data_Received", "Checksums_Verified", "Ocr_Done"]);
    assert!(batch.events.windows(2).all(|w| w[0].seq < w[1].seq));
    assert!(batch.events.iter().all(|e| e.seq > batch.modified_seq && e.seq <= batch.changed_seq));
    assert_eq!(batch.events[0].outcome, Outcome::Success);
    assert!(batch.events[1].is_transient_failure());
    assert!(!TestBatch::new("B1").failed("X", false).build().events[0].is_transient_failure());
    assert_eq!(batch.result::<Pages>("Ocr_Done").unwrap(), Some(Pages { pages: 7 }));
    assert!(Probe.trigger().matches(&TestBatch::new("B1").succeeded("Data_Received").build()));
    assert!(!Probe.trigger().matches(&TestBatch::new("B1").succeeded("Data_Received").succeeded("Probed").build()));

    let run = run_work(&Probe, &settings("behaviour = \"earlier\""), &batch);
    assert_eq!(run.report.summary, "Some(Pages { pages: 7 })");
}

#[test]
#[should_panic(expected = "bad id!")]
fn an_invalid_batch_id_panics_naming_it() {
    TestBatch::new("bad id!");
}

#[test]
#[should_panic(expected = "behavior")]
fn unknown_settings_panic_naming_the_key() {
    settings::<ProbeSettings>("behavior = \"succeed\"");
}

#[test]
fn a_temp_pipeline_records_and_reads_back_batches() {
    let pipeline = TempPipeline::new();
    let toml = std::fs::read_to_string(pipeline.config_dir().join("autocomp.toml")).unwrap();
    let root = pipeline.root().display().to_string();
    assert!(toml.contains(&format!("sqlite://{root}/store.db")) && toml.contains(&format!("local:{root}/index")));
    assert!(toml.contains(&pipeline.locks_url()));
    assert_eq!((pipeline.batch_count(), pipeline.find_batch("B1-RT1")), (0, None));

    let folder = pipeline.root().join("incoming/B1-RT1");
    pipeline.add_batch("B1-RT1", &folder);
    pipeline.add_bare_batch("B2-RT1", &folder);
    pipeline.add_unlocated_batch("B3-RT1");
    pipeline.record("B1-RT1", "Checksums_Verified", Outcome::Failure, json!({ "transient": true }));
    assert_eq!(pipeline.batch_count(), 3);
    let batch = pipeline.batch("B1-RT1");
    assert_eq!((batch.batch_type.as_str(), batch.location()), ("RoundTrip", Some(&*folder.to_string_lossy())));
    assert_eq!(pipeline.event("B1-RT1", "Data_Received").unwrap().outcome, Outcome::Success);
    assert!(pipeline.event("B1-RT1", "Checksums_Verified").unwrap().is_transient_failure());
    assert!(pipeline.batch("B2-RT1").events.is_empty());
    assert_eq!(pipeline.batch("B3-RT1").location(), None);

    pipeline.reset("B1-RT1", &["Checksums_Verified"], "re-scanned");
    assert_eq!(pipeline.event("B1-RT1", "Checksums_Verified"), None);
    assert_eq!(pipeline.events("B1-RT1", "Checksums_Verified").len(), 1, "superseded, not erased");

    pipeline.configure("probe", "max_threads = 1\n");
    assert_eq!(std::fs::read_to_string(pipeline.config_dir().join("probe.toml")).unwrap(), "max_threads = 1\n");
}

#[test]
fn a_binary_runs_with_the_config_dir_and_no_terminal() {
    let pipeline = TempPipeline::new();
    // `cat` ends at once on a null stdin; one waiting on a terminal would hang the test.
    let output = pipeline.run(Path::new("sh"), &["-c", "cat; echo \"$AUTOCOMP_CONFIG_DIR\"; echo oops >&2; exit 3"]);
    assert_eq!(output.status.code(), Some(3));
    assert_eq!(String::from_utf8_lossy(&output.stdout), format!("{}\n", pipeline.config_dir().display()));
    assert_eq!(String::from_utf8_lossy(&output.stderr), "oops\n");
}
