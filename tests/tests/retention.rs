//! Retention, as an operator runs it: `autocomp prune` under a policy, again and again while
//! two watching workers finish sixty batches, on SQLite and on PostgreSQL. Every batch ends
//! pruned once, after its last step and never while worked on; its export files read back as
//! their manifest says; a pruned batch is ready for nothing (a forced run and an operator's
//! restart are refused naming the import); `autocomp import` puts back every event and run
//! exactly as exported; the PREMIS of the export files validates. Over the store service, an
//! import sends its lines in pages the service takes, and leaves a line no request can carry.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use autocomp_e2e::services::Service;
use autocomp_e2e::{PROBED, Pipeline, disjoint_by_batch, ledgered_batches, stop_watchers, two_watchers, wait_until};
use autocomp_model::{Agent, BatchId, BatchType, EventType, NewBatch, NewEvent, Outcome};
use autocomp_store::BatchHistory;
use serde_json::json;
use sha2::{Digest, Sha256};

const PROBE: &str = env!("CARGO_BIN_EXE_probe-component");

fn policy(pipeline: &Pipeline) -> PathBuf {
    let path = pipeline.path("retention.toml");
    let text = format!(
        "export_dir = \"{}\"\n\n[types.RoundTrip]\nafter = \"0s\"\nrequire = [\"{PROBED}\"]\n",
        pipeline.path("history").display()
    );
    std::fs::write(&path, text).unwrap();
    path
}

fn pruned(pipeline: &Pipeline, ids: &[BatchId]) -> usize {
    ids.iter().filter(|id| !pipeline.events(id, EventType::HISTORY_PRUNED).is_empty()).count()
}

fn sha256(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

/// Every line of every export file in `dir`, by batch, after checking each file against its
/// run's manifest (size, digest, counts).
fn exported(dir: &Path) -> BTreeMap<BatchId, BatchHistory> {
    let mut lines = BTreeMap::new();
    let mut manifests = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        assert!(!name.ends_with(".partial"), "a file left half written: {name}");
        if !name.starts_with("manifest-") {
            continue;
        }
        manifests += 1;
        let manifest: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        for file in manifest["files"].as_array().unwrap() {
            let bytes = std::fs::read(dir.join(file["file"].as_str().unwrap())).unwrap();
            assert_eq!(file["bytes"], bytes.len(), "{file}");
            assert_eq!(file["sha256"], sha256(&bytes), "{file}");
            let text = zstd::decode_all(&bytes[..]).unwrap();
            let mut counted = (0u64, 0u64);
            for line in text.split(|b| *b == b'\n').filter(|line| !line.is_empty()) {
                let history: BatchHistory = serde_json::from_slice(line).unwrap();
                counted.0 += 1;
                counted.1 += history.batch.events.len() as u64;
                let earlier = lines.insert(history.batch.id.clone(), history);
                assert!(earlier.is_none(), "a batch exported twice");
            }
            assert_eq!((file["batches"].as_u64().unwrap(), file["events"].as_u64().unwrap()), counted, "{file}");
        }
    }
    assert!(manifests > 0, "no manifest in {}", dir.display());
    lines
}

fn prune_while_they_work(pipeline: &Pipeline) {
    let ids = ledgered_batches(pipeline, 60, "100ms");
    let policy = policy(pipeline);
    let policy = policy.to_str().unwrap();
    let dry = pipeline.autocomp(&["prune", "--policy", policy, "--dry-run", "--format", "json"]);
    assert_eq!(dry.code, Some(0), "{}", dry.show());
    let dry: serde_json::Value = serde_json::from_str(&dry.stdout).unwrap();
    assert_eq!((dry["due"].as_u64(), dry["batches"].as_u64()), (Some(0), Some(60)), "nothing is finished yet");

    let running = two_watchers(pipeline);
    let mut runs = 0;
    let all_pruned = wait_until(Instant::now() + Duration::from_secs(120), || {
        let pruned = pipeline.autocomp(&["prune", "--policy", policy, "--format", "json"]);
        assert_eq!(pruned.code, Some(0), "{}", pruned.show());
        runs += 1;
        self::pruned(pipeline, &ids) == ids.len()
    });
    stop_watchers(running);
    assert!(all_pruned, "{} of 60 pruned after {runs} runs", pruned(pipeline, &ids));
    let quiet = pipeline.autocomp(&["prune", "--policy", policy]);
    assert_eq!((quiet.code, quiet.stdout.as_str()), (Some(0), ""), "quiet when nothing is due: {}", quiet.show());

    // Each batch pruned once, after its result, never while a worker had it.
    let by_batch = disjoint_by_batch(&pipeline.ledger());
    assert!(by_batch.values().all(|works| works.len() == 1), "a batch worked twice: {by_batch:?}");
    let exports = exported(&pipeline.path("history"));
    assert_eq!(exports.len(), 60, "each batch's history in exactly one file");
    for id in &ids {
        let batch = pipeline.batch(id);
        let kept: Vec<&str> = batch.events.iter().map(|e| e.event_type.as_str()).collect();
        assert_eq!(kept, ["Data_Received", PROBED, EventType::HISTORY_PRUNED], "{id}");
        let export = &exports[id];
        assert_eq!(export.batch.events.len(), 2, "{id}: {:?}", export.batch.events);
        assert_eq!(export.runs.len(), 1, "{id}: its one run");
        assert_eq!(batch.events[1], export.batch.events[1], "{id}: the final state kept as it was");
    }
    assert!(pipeline.open_runs().is_empty());

    // Ready for nothing: a forced run refuses it, an operator's restart is refused naming the import.
    let forced = pipeline.run(&["--batch", "B0001", "--force"]);
    assert_eq!(forced.code, Some(1), "{}", forced.show());
    assert!(forced.stderr.contains("its history was pruned"), "{}", forced.show());
    assert!(!forced.stderr.contains("--force"), "no advice to force what cannot be: {}", forced.show());
    let restart = pipeline.autocomp(&["restart", "B0001", "--from", PROBED, "--reason", "again"]);
    assert_eq!(restart.code, Some(1), "{}", restart.show());
    assert!(restart.stderr.contains("`autocomp import "), "{}", restart.show());
    let shown = pipeline.autocomp(&["show", "B0001"]);
    assert!(shown.stdout.starts_with("B0001: pruned: its history"), "{}", shown.show());
    assert!(shown.stdout.contains("next: autocomp import "), "{}", shown.show());
    assert_eq!(pipeline.batch(&ids[0]).events.len(), 3, "nothing recorded");

    // A policy whose export_dir is relative is refused; a second prune at once is refused;
    // what a prune that stopped left half written goes with the next one.
    let relative = pipeline.path("relative.toml");
    std::fs::write(&relative, "export_dir = \"history\"\n[types.RoundTrip]\nafter = \"0s\"\n").unwrap();
    let refused = pipeline.autocomp(&["prune", "--policy", relative.to_str().unwrap()]);
    assert_eq!(refused.code, Some(2), "{}", refused.show());
    assert!(refused.stderr.contains("invalid export_dir \"history\": must be an absolute path"), "{}", refused.show());
    // A prune takes the directory only when something is due: one more batch, worked.
    let more = pipeline.register_one("B0061", true);
    let one_more = two_watchers(pipeline);
    assert!(wait_until(Instant::now() + Duration::from_secs(60), || !pipeline.events(&more, PROBED).is_empty()));
    stop_watchers(one_more);
    let left = pipeline.path("history/history-2026-01-stopped.jsonl.zst.partial");
    std::fs::write(&left, b"half").unwrap();
    // `-o`: the lock stays with flock itself, not with the sleep it starts, so killing it frees it.
    let mut holder = Command::new("flock")
        .arg("-o")
        .arg(pipeline.path("history/.prune.lock"))
        .args(["sleep", "30"])
        .spawn()
        .expect("flock (util-linux)");
    let held = wait_until(Instant::now() + Duration::from_secs(10), || {
        let second = pipeline.autocomp(&["prune", "--policy", policy]);
        second.code == Some(1) && second.stderr.contains("another autocomp prune is writing to")
    });
    holder.kill().unwrap();
    holder.wait().unwrap();
    assert!(held, "a second prune is refused while one holds the directory");
    let cleaned = pipeline.autocomp(&["prune", "--policy", policy]);
    assert_eq!(cleaned.code, Some(0), "{}", cleaned.show());
    assert!(
        cleaned.stdout.contains("warning: removed history-2026-01-stopped.jsonl.zst.partial"),
        "{}",
        cleaned.show()
    );
    assert!(!left.exists());

    // The exports as PREMIS, without the store.
    let files: Vec<String> = std::fs::read_dir(pipeline.path("history"))
        .unwrap()
        .map(|entry| entry.unwrap().path().display().to_string())
        .filter(|path| path.ends_with(".jsonl.zst"))
        .collect();
    let mut premis = vec!["export", "--format", "premis", "--from"];
    premis.extend(files.iter().map(String::as_str));
    let xml = pipeline.autocomp(&premis);
    assert_eq!(xml.code, Some(0), "{}", xml.show());
    assert!(xml.stderr.contains("exported 61 batches, 122 events"), "{}", xml.show());
    std::fs::write(pipeline.path("premis.xml"), &xml.stdout).unwrap();
    let schema = concat!(env!("CARGO_MANIFEST_DIR"), "/data/premis/premis-v3-0.xsd");
    let valid = Command::new("xmllint")
        .args(["--noout", "--nonet", "--schema", schema])
        .arg(pipeline.path("premis.xml"))
        .output()
        .expect("xmllint (apt-get install libxml2-utils)");
    assert!(valid.status.success(), "{}", String::from_utf8_lossy(&valid.stderr));

    // A damaged file restores nothing; the files whole restore every history exactly.
    let damaged = pipeline.path("damaged.jsonl.zst");
    let mut bytes = std::fs::read(&files[0]).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0xff;
    std::fs::write(&damaged, bytes).unwrap();
    let mut import = vec!["import", files[0].as_str(), damaged.to_str().unwrap()];
    let refused = pipeline.autocomp(&import);
    assert_eq!(refused.code, Some(2), "{}", refused.show());
    assert!(refused.stderr.contains("damaged.jsonl.zst"), "{}", refused.show());
    // The same damage in place, under the manifest's eye.
    let original = std::fs::read(&files[0]).unwrap();
    std::fs::copy(&damaged, &files[0]).unwrap();
    let refused = pipeline.autocomp(&["import", files[0].as_str()]);
    assert_eq!(refused.code, Some(2), "{}", refused.show());
    assert!(refused.stderr.contains("is not the file its manifest lists"), "{}", refused.show());
    std::fs::write(&files[0], original).unwrap();
    assert_eq!(pruned(pipeline, &ids), 60, "nothing restored");
    import.truncate(1);
    import.extend(files.iter().map(String::as_str));
    import.extend(["--format", "json"]);
    let restored = pipeline.autocomp(&import);
    assert_eq!(restored.code, Some(0), "{}", restored.show());
    let restored: serde_json::Value = serde_json::from_str(&restored.stdout).unwrap();
    assert_eq!((restored["restored"].as_u64(), restored["runs"].as_u64()), (Some(61), Some(61)), "{restored}");
    let histories = pipeline.block_on(pipeline.any_store().histories(&ids)).unwrap();
    for history in &histories {
        let export = &exports[&history.batch.id];
        assert_eq!(history.batch.events, export.batch.events, "{}: every event as exported", history.batch.id);
        assert_eq!(history.runs, export.runs, "{}: every run as exported", history.batch.id);
        assert_eq!(history.batch.events.iter().filter(|e| e.outcome == Outcome::Success).count(), 2);
    }
    let again = pipeline.autocomp(&import);
    let again: serde_json::Value = serde_json::from_str(&again.stdout).unwrap();
    assert_eq!((again["restored"].as_u64(), again["not_pruned"].as_u64()), (Some(0), Some(61)), "{again}");
    let shown = pipeline.autocomp(&["show", "B0001"]);
    assert!(shown.stdout.starts_with("B0001: done"), "{}", shown.show());
}

#[test]
fn pruning_while_components_run_on_sqlite_exports_each_finished_batch_once_and_import_restores_it_exactly() {
    prune_while_they_work(&Pipeline::new(PROBE));
}

#[test]
fn pruning_while_components_run_on_postgresql_exports_each_finished_batch_once_and_import_restores_it_exactly() {
    let database = autocomp_test_servers::postgres::shared().unique_database();
    prune_while_they_work(&Pipeline::with_store(PROBE, &database));
}

/// A batch of type Big whose history line is about `blobs` x 900 kB (each event's details
/// under the 1 MiB one may have), and one small event.
fn big_batch(pipeline: &Pipeline, name: &str, blobs: usize) -> BatchId {
    let id = BatchId::new(name).unwrap();
    let store = pipeline.any_store();
    let new = NewBatch::new(id.clone(), BatchType::new("Big").unwrap()).with_location(format!("/incoming/{name}"));
    pipeline.block_on(store.create_batch(new)).unwrap();
    let blob = "x".repeat(900_000);
    let details = (0..blobs).map(|n| json!({"n": n, "blob": blob})).chain([json!({"n": "last"})]);
    for details in details {
        let event = NewEvent::new(EventType::new("Step_Done").unwrap(), Outcome::Success, Agent::new("t").unwrap())
            .with_details(details);
        pipeline.block_on(store.append_event(&id, event)).unwrap();
    }
    id
}

#[test]
fn an_import_over_the_store_service_sends_pages_it_takes_and_leaves_a_line_no_request_carries() {
    let pipeline = Pipeline::new(PROBE);
    let service = Service::store(&pipeline.path("store.db"), &pipeline.path(""));
    pipeline.use_backend("store", &service.url());
    // 1.8 MB then 3.6 MB: 5.4 MB together, past the service's 4 MiB request limit, each under
    // it; then a small one, and 4.5 MB alone over it.
    let ids: Vec<BatchId> = [("A1", 2), ("A2", 4), ("A3", 0), ("A4", 5)]
        .into_iter()
        .map(|(name, blobs)| big_batch(&pipeline, name, blobs))
        .collect();
    let policy = pipeline.path("retention.toml");
    let text = format!("export_dir = \"{}\"\n[types.Big]\nafter = \"0s\"\n", pipeline.path("history").display());
    std::fs::write(&policy, text).unwrap();
    let pruned = pipeline.autocomp(&["prune", "--policy", policy.to_str().unwrap(), "--format", "json"]);
    assert_eq!(pruned.code, Some(0), "{}", pruned.show());
    let pruned: serde_json::Value = serde_json::from_str(&pruned.stdout).unwrap();
    assert_eq!(pruned["pruned"], 4, "{pruned}");
    let exports = exported(&pipeline.path("history"));
    let file = pipeline.path("history").join(pruned["files"][0]["file"].as_str().unwrap());
    let file = file.to_str().unwrap();
    // A4's line as the file holds it: its size is what the import names.
    let text = zstd::decode_all(&std::fs::read(file).unwrap()[..]).unwrap();
    let a4_bytes = text
        .split(|b| *b == b'\n')
        .find(|line| serde_json::from_slice::<BatchHistory>(line).is_ok_and(|h| h.batch.id == ids[3]))
        .map(<[u8]>::len)
        .unwrap();
    assert!(a4_bytes > 4 << 20, "{a4_bytes}");

    // Every line that fits one request is restored; the one that does not is left, named with
    // its size, and the exit code says lines were left (1), not an outage (5).
    let imported = pipeline.autocomp(&["import", file, "--format", "json"]);
    assert_eq!(imported.code, Some(1), "{}", imported.show());
    assert!(imported.stderr.contains("1 lines of the export were left"), "{}", imported.show());
    let imported: serde_json::Value = serde_json::from_str(&imported.stdout).unwrap();
    assert_eq!((imported["restored"].as_u64(), imported["batches"].as_u64()), (Some(3), Some(4)), "{imported}");
    let left = imported["other"].as_array().unwrap();
    assert_eq!(left.len(), 1, "{imported}");
    let left = left[0].as_str().unwrap();
    assert!(left.starts_with("invalid history \"A4\": "), "{left}");
    assert!(left.contains(&format!("is {a4_bytes} bytes as exported")) && left.contains("4194304 bytes"), "{left}");
    let histories = pipeline.block_on(pipeline.any_store().histories(&ids)).unwrap();
    for history in &histories[..3] {
        assert_eq!(history.batch.events, exports[&history.batch.id].batch.events, "{}", history.batch.id);
    }
    let a4: Vec<&str> = histories[3].batch.events.iter().map(|e| e.event_type.as_str()).collect();
    assert_eq!(a4, ["Step_Done", EventType::HISTORY_PRUNED], "A4 is as pruned: nothing of it written");

    // The store's own URL takes the line the service could not.
    let own = format!("sqlite://{}", pipeline.path("store.db").display());
    let again = pipeline.autocomp(&["--store", &own, "import", file, "--format", "json"]);
    assert_eq!(again.code, Some(0), "{}", again.show());
    let again: serde_json::Value = serde_json::from_str(&again.stdout).unwrap();
    assert_eq!((again["restored"].as_u64(), again["not_pruned"].as_u64()), (Some(1), Some(3)), "{again}");
    let a4 = pipeline.block_on(pipeline.any_store().histories(&ids[3..])).unwrap();
    assert_eq!(a4[0].batch.events, exports[&ids[3]].batch.events);
}
