//! The index service across an upgrade, against what an earlier release really said: the
//! requests a client of that release sent to `sboi serve` and its answers, recorded when the
//! release was cut (`sboi/tests/data/protocol/<release>.json`, by `scripts/record-protocol`),
//! every operation once or more, over the same small store.
//!
//! - An older client against this service: each recorded request, sent as recorded, gets an
//!   answer of the same status and shape.
//! - This client against an older service: the scenario, run by this release's `HttpIndex`
//!   against a server answering what the older service answered, reads every answer.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use autocomp_model::*;
use autocomp_sboi::{BatchIndex, HttpIndex, PageOrder, PageRequest};
use autocomp_store::*;
use autocomp_test_servers::recording::{self, Call, Recording, Replay, recording_proxy, replay_server};

use super::service::{Service, TOKEN, open_store, store_url};

/// The recordings kept, one per release cut (the newest last).
const RECORDINGS: &[&str] = &["0.1.0-protocol-1"];

fn recording_path(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/protocol").join(format!("{name}.json"))
}

/// The store every recording is made over: three deliveries, one checked.
async fn fill(store: &dyn ObjectStore) {
    let agent = Agent::new("trigger/1.0").unwrap();
    for (n, name) in ["B1", "B2", "B3"].into_iter().enumerate() {
        let id = BatchId::new(name).unwrap();
        let new = NewBatch::new(id.clone(), BatchType::new("Delivery").unwrap()).with_priority(n as i32);
        store.create_batch(new).await.unwrap();
        let received = NewEvent::new(EventType::new("Received").unwrap(), Outcome::Success, agent.clone());
        store.append_event(&id, received).await.unwrap();
    }
    let checked = NewEvent::new(EventType::new("Checked").unwrap(), Outcome::Success, agent);
    store.append_event(&BatchId::new("B2").unwrap(), checked).await.unwrap();
}

/// The store filled by a store service of the release recorded (`binary`), so the file has
/// that release's schema, which its `sboi` opens.
async fn fill_with_release(binary: &str, dir: &Path) {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut service = std::process::Command::new(binary)
        .args(["serve", "--db", &store_url(dir), "--listen", &format!("127.0.0.1:{port}")])
        .env("AUTOCOMP_TOKEN", TOKEN)
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("the release's autocomp-store");
    let url = format!("http://127.0.0.1:{port}");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    autocomp_test_servers::wait_for(deadline, "the release's store service", || {
        autocomp_test_servers::http1::get(&format!("{url}/health")).map(|(status, _)| status) == Some(200)
    });
    fill(&HttpStore::with_token(&url, Some(TOKEN.into())).unwrap()).await;
    service.kill().ok();
    service.wait().ok();
}

/// The scenario every recording is made with: every operation of the index service, as a
/// client of this release calls it.
pub(crate) async fn scenario(index: &HttpIndex) {
    index.catch_up().await.unwrap();
    let ready = Trigger::builder().requires("Received").blocked_by("Checked").build();
    assert_eq!(index.query(&ready).await.unwrap().len(), 2);
    index.query_with(&ready, true).await.unwrap();
    index.document(&BatchId::new("B2").unwrap()).await.unwrap();
    index.document(&BatchId::new("B9").unwrap()).await.unwrap();
    let checked = Selection::Succeeded(EventType::new("Checked").unwrap());
    index.tally(&[checked.clone(), Selection::All], true).await.unwrap();
    let request = PageRequest { selection: Selection::All, order: PageOrder::Priority, after: None, limit: 2 };
    let first = index.page(&request).await.unwrap();
    index.page(&PageRequest { after: first.next, ..request }).await.unwrap();
    index.reconcile().await.unwrap();
    index.rebuild().await.unwrap();
}

#[tokio::test]
async fn an_older_clients_requests_get_answers_of_the_shape_it_was_given() {
    for name in RECORDINGS {
        let recording = recording::read(&recording_path(name));
        let dir = tempfile::tempdir().unwrap();
        fill(open_store(dir.path()).await.as_ref()).await;
        let service = Service::of_binary(env!("CARGO_BIN_EXE_sboi"), &store_url(dir.path()), dir.path(), &[]);
        recording::replay_requests(name, &recording, &service.url(), TOKEN).await;
    }
}

#[tokio::test]
async fn this_client_reads_every_answer_an_older_index_service_gave() {
    for name in RECORDINGS {
        let recording = recording::read(&recording_path(name));
        let replay = Replay::new(recording.protocol.clone(), recording.calls.iter().cloned());
        let address = replay_server(Arc::clone(&replay)).await;
        let index = HttpIndex::with_token(&format!("http://{address}"), Some(TOKEN.into())).unwrap();
        scenario(&index).await;
        assert!(replay.calls.lock().unwrap().is_empty(), "{name}: every recorded call was asked");
    }
}

/// Records the scenario against the `sboi` binary `$AUTOCOMP_RECORD_SBOI` (over a store its
/// release's `$AUTOCOMP_RECORD_BINARY` filled) into
/// `sboi/tests/data/protocol/$AUTOCOMP_RECORD_NAME.json`: run by `scripts/record-protocol`
/// when a release is cut, never by the suite.
#[tokio::test]
#[ignore = "writes a recording: scripts/record-protocol runs it when a release is cut"]
async fn record_a_release() {
    let binary = std::env::var("AUTOCOMP_RECORD_SBOI").expect("AUTOCOMP_RECORD_SBOI");
    let store = std::env::var("AUTOCOMP_RECORD_BINARY").expect("AUTOCOMP_RECORD_BINARY");
    let name = std::env::var("AUTOCOMP_RECORD_NAME").expect("AUTOCOMP_RECORD_NAME");
    let dir = tempfile::tempdir().unwrap();
    fill_with_release(&store, dir.path()).await;
    let service = Service::of_binary(&binary, &store_url(dir.path()), dir.path(), &[]);
    let upstream = service.url();
    let protocol = {
        let upstream = upstream.clone();
        tokio::task::spawn_blocking(move || recording::protocol_of(&upstream)).await.unwrap()
    };
    let recorded = Arc::new(Mutex::new(Vec::<Call>::new()));
    let address = recording_proxy(upstream, TOKEN, Arc::clone(&recorded)).await;
    let index = HttpIndex::with_token(&format!("http://{address}"), Some(TOKEN.into())).unwrap();
    scenario(&index).await;
    let calls = recorded.lock().unwrap().clone();
    let release = std::env::var("AUTOCOMP_RECORD_RELEASE").unwrap_or_else(|_| name.clone());
    recording::write(&recording_path(&name), &Recording { release, protocol, calls });
}
