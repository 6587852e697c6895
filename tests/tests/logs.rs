//! What the binaries write to their logs, read as an operator's log collector would: files
//! and pipes never hold terminal escape codes, and `--log-format json` lines parse and
//! carry the fields a processed batch is found by.

use autocomp_e2e::Pipeline;
use autocomp_e2e::services::{Service, http_request};
use serde_json::Value;

const PROBE: &str = env!("CARGO_BIN_EXE_probe-component");

fn no_escape_codes(what: &str, text: &str) {
    assert!(!text.is_empty(), "{what} logged nothing");
    assert!(!text.contains('\u{1b}'), "{what} wrote an escape code into its log:\n{text}");
}

#[test]
fn service_logs_written_to_files_hold_no_escape_codes_and_name_refused_requests() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = Service::store(&dir.path().join("store.db"), dir.path());
    let store_url = store.url();
    let mut index = Service::index(&store_url, &dir.path().join("index"), dir.path());
    // A request the service refuses is one warning naming the operation and the status.
    let (status, _) = http_request("POST", &format!("{}/v1/no_such_operation", index.url()), "{}").unwrap();
    assert_eq!(status, 404);
    let (status, _) = http_request("POST", &format!("{}/v1/append_event", store.url()), "{}").unwrap();
    assert_eq!(status, 401, "a write without the token");
    index.kill();
    store.kill();
    for (what, service) in [("autocomp-store serve", &store), ("sboi serve", &index)] {
        let logs = service.logs();
        no_escape_codes(what, &logs);
        assert!(logs.contains("WARN"), "{what}: the refused request is a warning:\n{logs}");
    }
}

#[test]
fn a_component_logs_each_processed_batch_as_json_with_its_fields() {
    let pipeline = Pipeline::new(PROBE);
    let id = pipeline.register(1).remove(0);
    let run = pipeline.run(&["--log-format", "json"]);
    assert_eq!(run.code, Some(0), "{}", run.show());
    let lines: Vec<Value> = run
        .stderr
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}\n{}", run.show())))
        .collect();
    let recorded = lines
        .iter()
        .find(|line| line["fields"]["batch"] == id.as_str())
        .unwrap_or_else(|| panic!("no log line names batch {id}:\n{}", run.show()));
    let fields = &recorded["fields"];
    assert_eq!(recorded["level"], "INFO", "{recorded}");
    assert_eq!(fields["component"], "probe", "{recorded}");
    assert_eq!(fields["outcome"], "success", "{recorded}");
    assert!(fields["generation"].as_i64().is_some_and(|g| g >= 1), "{recorded}");
    assert!(fields["duration_ms"].is_u64(), "{recorded}");
    assert!(recorded["timestamp"].is_string(), "{recorded}");
    // stdout keeps its one summary line per batch, for cron.
    assert!(run.stdout.starts_with(&format!("{id} Probed success")), "{}", run.show());
}

#[test]
fn text_logs_into_a_pipe_hold_no_escape_codes() {
    let pipeline = Pipeline::new(PROBE);
    pipeline.register(2);
    pipeline.configure("[settings]\nbehaviour = \"fail\"\n");
    let run = pipeline.run(&["-vv"]);
    assert_eq!(run.code, Some(1), "{}", run.show());
    no_escape_codes("a component at -vv", &run.stderr);
    assert!(run.stderr.contains("recorded Probed"), "{}", run.show());
    // Quiet when idle: nothing left to do, nothing on stdout or stderr at the default level.
    let idle = pipeline.run(&[]);
    assert_eq!((idle.code, idle.stdout.as_str(), idle.stderr.as_str()), (Some(0), "", ""), "{}", idle.show());
}
