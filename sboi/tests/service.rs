//! `sboi serve` as a real OS process on loopback, following a real SQLite store file that
//! this test writes to, reached through `HttpIndex` and raw HTTP: queries answer as
//! `Trigger::select` on the store, appends become visible within a bound (fresh queries at
//! once), a monitor's tallies and pages answer as the embedded index and
//! `Selection::matches_at`, rebuilds need the token, and bad bodies get a JSON 4xx, never a
//! 500 or a crash.

use std::collections::BTreeSet;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use autocomp_test_servers::http1::{call, get};
use autocomp_test_servers::{XorShift, wait_for, wait_until, wait_until_async_every};

use autocomp_http::api::Requests;
use autocomp_model::*;
use autocomp_sboi::http::wire::{IndexRequest, QueryAnswer};
use autocomp_sboi::{
    BatchIndex, CatchUp, HttpIndex, IndexEngine, IndexError, LocalIndex, MAX_PAGE, PageKey, PageOrder, PageRequest,
    Tally, open_index,
};
use autocomp_store::*;
use serde_json::{Value, json};

pub(crate) const TOKEN: &str = "index-s3cret";

/// A running `sboi serve`, killed when dropped.
pub(crate) struct Service {
    child: Child,
    port: u16,
    index_dir: PathBuf,
}

impl Service {
    /// Serves the index in `dir/index`, following the store file `dir/store.db`.
    fn start(dir: &Path) -> Service {
        Self::following(&store_url(dir), dir)
    }

    /// Serves the index in `dir/index`, following the store at `store`.
    fn following(store: &str, dir: &Path) -> Service {
        Self::with_args(store, dir, &[])
    }

    /// `following`, with more arguments for `sboi serve`.
    fn with_args(store: &str, dir: &Path, more: &[&str]) -> Service {
        Self::of_binary(env!("CARGO_BIN_EXE_sboi"), store, dir, more)
    }

    /// `sboi serve` of another release's binary, following `store`, its index under `dir`.
    pub(crate) fn of_binary(binary: &str, store: &str, dir: &Path, more: &[&str]) -> Service {
        let port = free_port();
        let index_dir = dir.join("index");
        let listen = format!("127.0.0.1:{port}");
        let mut args = vec!["serve", "--store", store, "--index-dir", index_dir.to_str().unwrap(), "--listen", &listen];
        args.extend(["--reconcile-every", "0"]);
        args.extend(more);
        let child = sboi_of(binary, &args).env("AUTOCOMP_TOKEN", TOKEN).spawn().expect("start sboi");
        let mut service = Service { child, port, index_dir };
        service.wait_healthy();
        service
    }

    pub(crate) fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn wait_healthy(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        let url = self.url();
        wait_for(deadline, &format!("sboi serve on {url}"), || {
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!("sboi serve exited with {status} before it was healthy");
            }
            get(&format!("{url}/health")).map(|(status, _)| status) == Some(200)
        });
    }

    fn index(&self) -> HttpIndex {
        HttpIndex::with_token(&self.url(), None).unwrap()
    }

    fn is_running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    /// The value of one gauge on `/metrics`.
    fn gauge(&self, name: &str) -> f64 {
        let (status, body) = get(&format!("{}/metrics", self.url())).expect("metrics answer");
        assert_eq!(status, 200);
        let text = String::from_utf8(body).unwrap();
        let line = text.lines().find(|line| line.split_whitespace().next() == Some(name));
        let line = line.unwrap_or_else(|| panic!("no {name} in /metrics:\n{text}"));
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        self.child.kill().ok();
        self.child.wait().ok();
    }
}

fn sboi(args: &[&str]) -> Command {
    sboi_of(env!("CARGO_BIN_EXE_sboi"), args)
}

fn sboi_of(binary: &str, args: &[&str]) -> Command {
    let mut command = Command::new(binary);
    command.args(args).env_remove("AUTOCOMP_TOKEN").env_remove("AUTOCOMP_STORE").stdout(Stdio::null());
    // The service's log, for a failing test: `SBOI_TEST_LOG=1 cargo test ...`.
    if std::env::var_os("SBOI_TEST_LOG").is_none() {
        command.stderr(Stdio::null());
    }
    command
}

pub(crate) fn store_url(dir: &Path) -> String {
    format!("sqlite://{}?synchronous=normal", dir.join("store.db").display())
}

pub(crate) async fn open_store(dir: &Path) -> Arc<SqliteStore> {
    let options = SqliteOptions { synchronous: Synchronous::Normal, ..SqliteOptions::default() };
    Arc::new(SqliteStore::open_with(dir.join("store.db"), options).await.unwrap())
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn id(text: &str) -> BatchId {
    BatchId::new(text).unwrap()
}
fn ty(text: &str) -> EventType {
    EventType::new(text).unwrap()
}
fn agent() -> Agent {
    Agent::new("tester/1.0").unwrap()
}

async fn record(store: &SqliteStore, batch: &str, event_type: &str, outcome: Outcome) {
    store.append_event(&id(batch), NewEvent::new(ty(event_type), outcome, agent())).await.unwrap();
}

/// Thirty batches exercising every clause: two types, priorities, failures, transient
/// failures, reset markers and content changes after a check.
async fn varied_batches(store: &SqliteStore, first: usize) {
    for n in first..first + 30 {
        let name = format!("B{n:04}");
        let batch_type = BatchType::new(if n % 3 == 0 { "Delivery" } else { "RoundTrip" }).unwrap();
        store.create_batch(NewBatch::new(id(&name), batch_type).with_priority((n % 4) as i32)).await.unwrap();
        if n % 7 == 6 {
            continue;
        }
        record(store, &name, "Data_Received", if n % 11 == 0 { Outcome::Failure } else { Outcome::Success }).await;
        match n % 5 {
            0 => record(store, &name, "Checksums_Verified", Outcome::Success).await,
            1 => record(store, &name, "Checksums_Verified", Outcome::Failure).await,
            2 => {
                let transient = NewEvent::new(ty("Checksums_Verified"), Outcome::Failure, agent())
                    .with_details(json!({"transient": true}));
                store.append_event(&id(&name), transient).await.unwrap();
            }
            3 => {
                record(store, &name, "Checksums_Verified", Outcome::Success).await;
                let reset = NewEvent::reset(vec![ty("Checksums_Verified")], agent(), json!({"reason": "rerun"}));
                store.append_event(&id(&name), reset).await.unwrap();
            }
            _ => {
                record(store, &name, "Checksums_Verified", Outcome::Success).await;
                let mut patch = serde_json::Map::new();
                patch.insert("redelivered".into(), json!(true));
                store.record_content_change(&id(&name), patch).await.unwrap();
            }
        }
    }
}

fn triggers() -> Vec<Trigger> {
    let types = |names: &[&str]| names.iter().map(|n| ty(n)).collect::<Vec<_>>();
    vec![
        Trigger::default(),
        Trigger { requires: types(&["Data_Received"]), ..Trigger::default() },
        Trigger {
            requires: types(&["Data_Received"]),
            blocked_by: types(&["Checksums_Verified"]),
            ..Trigger::default()
        },
        Trigger {
            requires: types(&["Data_Received"]),
            repeat_on_change: types(&["Checksums_Verified"]),
            ..Trigger::default()
        },
        Trigger { transiently_failed: types(&["Checksums_Verified"]), ..Trigger::default() },
        Trigger {
            types: vec![BatchType::new("Delivery").unwrap()],
            requires: types(&["Data_Received"]),
            limit: Some(3),
            ..Trigger::default()
        },
        Trigger { batches: vec![id("B0003"), id("B0010"), id("B0041"), id("B9999")], ..Trigger::default() },
        Trigger { settled_for: Some(Duration::from_secs(3600)), ..Trigger::default() },
        Trigger { blocked_by: types(&["Data_Received"]), limit: Some(usize::MAX), ..Trigger::default() },
    ]
}

async fn select_in_store(store: &SqliteStore, trigger: &Trigger) -> Vec<BatchId> {
    let batches = store.list_batches(None, 10_000).await.unwrap();
    trigger.select(&batches, Timestamp::now())
}

#[tokio::test]
async fn queries_over_http_answer_as_trigger_select_on_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_store(dir.path()).await;
    // Some batches before the service starts (its first catch-up), some while it follows.
    varied_batches(&store, 0).await;
    let service = Service::start(dir.path());
    varied_batches(&store, 30).await;
    let index = service.index();
    for trigger in triggers() {
        let expected = select_in_store(&store, &trigger).await;
        assert_eq!(index.query(&trigger).await.unwrap(), expected, "{trigger:?}");
    }
    // The port through `open_index`, as components and the CLI open it.
    let opened = open_index(&service.url(), store.clone()).unwrap();
    let trigger = &triggers()[2];
    assert_eq!(opened.query(trigger).await.unwrap(), select_in_store(&store, trigger).await);
}

#[tokio::test]
async fn documents_and_catch_up_answer_as_the_embedded_index_does() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_store(dir.path()).await;
    varied_batches(&store, 0).await;
    let service = Service::start(dir.path());
    let index = service.index();
    let head = store.head().await.unwrap();
    assert_eq!(index.catch_up().await.unwrap(), CatchUp::UpToDate { cursor: head });

    // An embedded index of its own over the same store file says the same per batch.
    let local = LocalIndex::new(IndexEngine::open(dir.path().join("local-index")).unwrap(), store.clone());
    local.catch_up().await.unwrap();
    for n in [0, 4, 6, 12, 29] {
        let name = id(&format!("B{n:04}"));
        let over_http = index.document(&name).await.unwrap();
        assert!(over_http.is_some(), "{name} is indexed");
        assert_eq!(over_http, local.document(&name).await.unwrap(), "{name}");
    }
    assert_eq!(index.document(&id("B9999")).await.unwrap(), None);

    record(&store, "B0001", "Structure_Checked", Outcome::Success).await;
    let caught_up = index.catch_up().await.unwrap();
    assert_eq!(caught_up.cursor(), store.head().await.unwrap(), "{caught_up:?}");
    let document = index.document(&id("B0001")).await.unwrap().unwrap();
    assert!(document.succeeded.contains(&"Structure_Checked".to_string()), "{document:?}");
}

/// The component of the monitor tests: `checker` records `Checksums_Verified` once
/// `Data_Received` succeeded, and retries its own transient failures after an hour, so no
/// batch changes state by the clock while a test reads.
fn checker() -> ComponentDescriptor {
    let trigger = Trigger {
        requires: vec![ty("Data_Received")],
        blocked_by: vec![ty("Checksums_Verified")],
        ..Trigger::default()
    };
    ComponentDescriptor::new(ComponentName::new("checker").unwrap(), "1", ty("Checksums_Verified"), trigger)
        .with_limits(3, Duration::from_secs(3600), 10, Duration::from_secs(600))
}

/// Opens a `checker` run on each batch.
async fn claim(store: &SqliteStore, batches: &[&str]) {
    let holder = RunHolder {
        agent: agent(),
        host: "test-host".into(),
        pid: std::process::id(),
        claim_key: None,
        liveness: None,
    };
    for batch in batches {
        store.claim(&id(batch), &checker().name, &holder).await.unwrap();
    }
}

/// A monitor's selections over `varied_batches`: each state of `checker`, id prefixes,
/// priority ranges, and/or/not, a trigger and a quiet time.
fn selections() -> Vec<Selection> {
    let checker = checker();
    let not = |selection: Selection| Selection::Not(Box::new(selection));
    let mut selections: Vec<Selection> =
        ComponentState::ALL.iter().map(|state| Selection::component_state(&checker, *state)).collect();
    selections.extend([
        Selection::All,
        Selection::nothing(),
        Selection::And(Vec::new()),
        Selection::IdPrefix("B001".into()),
        Selection::IdPrefix("B00".into()),
        Selection::IdPrefix("X".into()),
        Selection::Priority { min: Some(1), max: Some(2) },
        Selection::Priority { min: Some(3), max: None },
        Selection::Priority { min: None, max: Some(0) },
        Selection::And(vec![
            Selection::BatchType(BatchType::new("Delivery").unwrap()),
            not(Selection::Succeeded(ty("Checksums_Verified"))),
        ]),
        Selection::Or(vec![
            Selection::Running(checker.name.clone()),
            Selection::Failed(ty("Data_Received")),
            Selection::TransientlyFailed(ty("Checksums_Verified")),
        ]),
        not(Selection::Present(ty("Data_Received"))),
        not(Selection::Or(vec![Selection::IdPrefix("B000".into()), Selection::Priority { min: Some(2), max: None }])),
        Selection::And(vec![Selection::IdPrefix("B00".into()), not(Selection::Running(checker.name.clone()))]),
        Selection::Trigger(triggers()[2].clone()),
        Selection::QuietFor(Duration::from_secs(3600)),
    ]);
    selections
}

/// The batches `selection` holds in the store now, oldest first: what the index must say.
async fn selected_in_store(store: &SqliteStore, selection: &Selection) -> Vec<Batch> {
    let now = Timestamp::now();
    let batches = store.list_batches(None, 10_000).await.unwrap();
    let mut selected: Vec<Batch> = batches.into_iter().filter(|batch| selection.matches_at(batch, now)).collect();
    selected.sort_by_key(|batch| batch.created_seq);
    selected
}

#[tokio::test]
async fn tallies_and_pages_over_http_answer_as_the_embedded_index_and_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_store(dir.path()).await;
    // Some batches before the service starts, some (and runs, and a priority change) while
    // it follows.
    varied_batches(&store, 0).await;
    let service = Service::start(dir.path());
    varied_batches(&store, 30).await;
    claim(&store, &["B0000", "B0005", "B0013", "B0031", "B0040"]).await;
    store.set_priority(&id("B0007"), 3).await.unwrap();
    let index = service.index();
    let local = LocalIndex::new(IndexEngine::open(dir.path().join("local-index")).unwrap(), store.clone());
    let selections = selections();

    let tallies = index.tally(&selections, true).await.unwrap();
    assert_eq!(tallies, local.tally(&selections, true).await.unwrap());
    assert_eq!(tallies, local.engine().tally_at(&selections, Timestamp::now(), true).unwrap());
    for (selection, tally) in selections.iter().zip(&tallies) {
        let expected = selected_in_store(&store, selection).await;
        let quietest = expected.iter().map(|batch| batch.last_activity_at()).min();
        assert_eq!(*tally, Tally { count: expected.len() as u64, quietest }, "{selection:?}");
    }
    let states = &tallies[..ComponentState::ALL.len()];
    assert_eq!(states.iter().map(|tally| tally.count).sum::<u64>(), 60, "each batch is in one state: {states:?}");
    assert!(states.iter().filter(|tally| tally.count > 0).count() >= 4, "the states are not all trivial: {states:?}");
    assert_eq!(index.tally(&[], true).await.unwrap(), Vec::new());

    // Every selection paged in both orders, four at a time: each batch once, in order, and
    // page by page what the embedded index pages.
    const LIMIT: usize = 4;
    for selection in &selections {
        let in_store = selected_in_store(&store, selection).await;
        for order in [PageOrder::Oldest, PageOrder::Priority] {
            let mut expected = in_store.clone();
            if order == PageOrder::Priority {
                expected.sort_by_key(|batch| (-batch.priority, batch.created_seq));
            }
            let expected: Vec<BatchId> = expected.into_iter().map(|batch| batch.id).collect();
            let (mut paged, mut pages, mut after) = (Vec::new(), 0, None);
            loop {
                let request = PageRequest { selection: selection.clone(), order, after, limit: LIMIT };
                let page = index.page(&request).await.unwrap();
                assert_eq!(page, local.page(&request).await.unwrap(), "{request:?}");
                assert!(page.batches.len() <= LIMIT, "{page:?}");
                pages += 1;
                paged.extend(page.batches);
                match page.next {
                    Some(next) => after = Some(next),
                    None => break,
                }
                assert!(pages <= expected.len(), "paging does not end: {request:?}");
            }
            assert_eq!(paged, expected, "{selection:?} in {order:?} pages of {LIMIT}");
            assert_eq!(pages, expected.len().div_ceil(LIMIT).max(1), "no empty page but a lone first one");
        }
    }
    let empty = PageRequest { selection: Selection::All, order: PageOrder::Priority, after: None, limit: 0 };
    let page = index.page(&empty).await.unwrap();
    assert!(page.batches.is_empty() && page.next.is_none(), "{page:?}");

    // The bodies on the wire, as the OpenAPI document describes them.
    let head = store.head().await.unwrap();
    let body = json!({"selections": ["all", {"id_prefix": "B001"}, {"or": []}], "quietest": true});
    let (status, answer) = call("POST", &format!("{}/v1/tally", service.url()), None, body.to_string().into_bytes());
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["tallies"][0]["count"], 60, "{answer}");
    assert!(answer["tallies"][0]["quietest"].as_str().is_some_and(|t| t.ends_with('Z')), "{answer}");
    assert_eq!(answer["tallies"][1]["count"], 10, "{answer}");
    assert_eq!(answer["tallies"][2], json!({"count": 0, "quietest": null}), "{answer}");
    assert_eq!(answer["stale"], false, "{answer}");
    assert!(answer["indexed_seq"].as_i64().unwrap() >= head.0, "{answer}");

    let working = json!({"and": [
        {"or": [{"running": "checker"}, {"id_prefix": "B001"}]},
        {"not": {"succeeded": "Checksums_Verified"}},
    ]});
    let expected: Vec<BatchId> = selected_in_store(&store, &serde_json::from_value(working.clone()).unwrap())
        .await
        .into_iter()
        .map(|b| b.id)
        .collect();
    assert!(expected.len() > 2, "{expected:?}");
    let page_url = format!("{}/v1/page", service.url());
    let (status, first) =
        call("POST", &page_url, None, json!({"selection": working, "limit": 2}).to_string().into_bytes());
    assert_eq!(status, 200, "{first}");
    let keys: Vec<&str> = first.as_object().unwrap().keys().map(String::as_str).collect();
    assert_eq!(keys, ["batches", "indexed_seq", "next", "stale"], "{first}");
    assert_eq!(first["batches"], json!(expected[..2]), "{first}");
    assert!(first["next"]["priority"].is_i64() && first["next"]["created_seq"].is_i64(), "{first}");
    let rest = json!({"selection": working, "order": "oldest", "after": first["next"], "limit": 100});
    let (status, rest) = call("POST", &page_url, None, rest.to_string().into_bytes());
    assert_eq!(status, 200, "{rest}");
    assert_eq!(rest["batches"], json!(expected[2..]), "{rest}");
    assert_eq!(rest["next"], Value::Null, "{rest}");
}

#[tokio::test]
async fn bad_tally_and_page_bodies_are_refused_naming_what_is_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_store(dir.path()).await;
    varied_batches(&store, 0).await;
    let service = Service::start(dir.path());
    let cases = [
        ("tally", r#"{"selections":[{"bogus":"x"}]}"#, "unknown variant `bogus`"),
        ("tally", r#"{"selections":["none"]}"#, "unknown variant `none`"),
        ("tally", r#"{"selections":[{"and":[{"running":"checker"},{"not":{"sucseeded":"X"}}]}]}"#, "`sucseeded`"),
        ("tally", r#"{"selections":[{"running":"bad name!"}]}"#, "character ' ' is not allowed"),
        ("tally", r#"{"selections":[{"quiet_for":"5 parsecs"}]}"#, "5 parsecs"),
        ("tally", r#"{"selections":[{"priority":{"min":"high"}}]}"#, "invalid type: string \"high\""),
        ("tally", r#"{"selections":"all"}"#, "invalid type: string \"all\", expected a sequence"),
        ("tally", r#"{"selection":["all"]}"#, "unknown field `selection`"),
        ("page", r#"{"selection":"all","limit":5,"offset":10}"#, "unknown field `offset`"),
        ("page", r#"{"selection":"all","limit":"ten"}"#, "invalid type: string \"ten\""),
        ("page", r#"{"selection":"all","limit":-1}"#, "invalid value: integer `-1`"),
        ("page", r#"{"selection":"all","limit":2.5}"#, "invalid type: floating point `2.5`"),
        ("page", r#"{"selection":"all"}"#, "missing field `limit`"),
        ("page", r#"{"limit":5}"#, "missing field `selection`"),
        ("page", r#"{"selection":"all","limit":5,"order":"newest"}"#, "unknown variant `newest`"),
        ("page", r#"{"selection":"all","limit":5,"after":{"priority":1}}"#, "missing field `created_seq`"),
        ("page", r#"{"selection":{"not":"everything"},"limit":5}"#, "unknown variant `everything`"),
    ];
    for (operation, body, names) in cases {
        let (status, answer) = call("POST", &format!("{}/v1/{operation}", service.url()), None, body.into());
        assert_eq!(status, 400, "{operation} {body}: {answer}");
        assert_eq!(answer["error"]["kind"], "invalid", "{answer}");
        let message = answer["error"]["message"].as_str().unwrap();
        assert!(message.contains(names), "{operation} {body}: {message:?} should name {names:?}");
    }

    // At most a thousand selections per tally: over HTTP, and through the port.
    let tally_url = format!("{}/v1/tally", service.url());
    let (status, answer) = call("POST", &tally_url, None, json!({"selections": vec!["all"; 1001]}).to_string().into());
    assert_eq!(status, 400, "{answer}");
    assert_eq!((&answer["error"]["field"], &answer["error"]["value"]), (&json!("selections"), &json!("1001")));
    let refused = service.index().tally(&vec![Selection::All; 1001], false).await.unwrap_err();
    assert!(
        matches!(&refused, IndexError::Store(StoreError::Invalid(input)) if input.field == "selections"),
        "{refused:?}"
    );
    let most = service.index().tally(&vec![Selection::All; 1000], false).await.unwrap();
    assert_eq!(most.len(), 1000);
    assert!(most.iter().all(|tally| tally.count == 30), "{:?}", most[0]);
}

#[tokio::test]
async fn a_page_holds_at_most_max_page_batches() {
    assert_eq!(MAX_PAGE, 1000, "openapi.json documents 1000");
    let dir = tempfile::tempdir().unwrap();
    let store = open_store(dir.path()).await;
    let total = MAX_PAGE + 30;
    for n in 0..total {
        let batch = NewBatch::new(id(&format!("P{n:05}")), BatchType::new("RoundTrip").unwrap());
        store.create_batch(batch.with_priority((n % 3) as i32)).await.unwrap();
    }
    let service = Service::start(dir.path());
    let index = service.index();
    for order in [PageOrder::Oldest, PageOrder::Priority] {
        for limit in [MAX_PAGE, MAX_PAGE + 1, 50_000, usize::MAX] {
            let request = PageRequest { selection: Selection::All, order, after: None, limit };
            let first = index.page(&request).await.unwrap();
            assert_eq!(first.batches.len(), MAX_PAGE, "{order:?} limit {limit}");
            let after: Option<PageKey> = first.next;
            assert!(after.is_some(), "more follow");
            let rest = index.page(&PageRequest { after, ..request }).await.unwrap();
            assert_eq!((rest.batches.len(), rest.next), (total - MAX_PAGE, None), "{order:?} limit {limit}");
            let mut all: Vec<BatchId> = first.batches.into_iter().chain(rest.batches).collect();
            all.sort();
            all.dedup();
            assert_eq!(all.len(), total, "every batch once");
        }
    }
    let body = format!(r#"{{"selection":"all","limit":{}}}"#, u64::MAX);
    let (status, answer) = call("POST", &format!("{}/v1/page", service.url()), None, body.into_bytes());
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["batches"].as_array().unwrap().len(), MAX_PAGE);
    assert_eq!(answer["batches"][0], "P00000");
}

/// The OpenAPI document in the repository (the one the service serves) lists exactly the
/// operations the service dispatches, each with its request, answer and error bodies, the
/// token only where a write needs it, and every `$ref` resolves.
#[test]
fn the_openapi_document_describes_exactly_the_operations_served() {
    let document: Value = serde_json::from_str(&autocomp_sboi::http::server::openapi()).unwrap();
    let documented: BTreeSet<&str> =
        document["paths"].as_object().unwrap().keys().filter_map(|path| path.strip_prefix("/v1/")).collect();
    let served: BTreeSet<&str> = IndexRequest::OPERATIONS.iter().map(|op| op.name).collect();
    assert_eq!(documented, served, "the document lists exactly the operations in OPERATIONS");
    for (name, write) in IndexRequest::OPERATIONS.iter().map(|op| (op.name, &op.write)) {
        let post = &document["paths"][format!("/v1/{name}")]["post"];
        assert_eq!(post["operationId"], *name);
        let security = post.get("security").unwrap_or(&document["security"]).as_array().unwrap();
        let open = security.iter().any(|scheme| scheme.as_object().unwrap().is_empty());
        assert_eq!(open, !write, "{name}: reads are open from loopback, writes need the token");
        for status in ["200", "400", "401", "413", "503"] {
            assert!(post["responses"][status].is_object(), "{name} documents HTTP {status}");
        }
        assert!(post["requestBody"]["content"]["application/json"]["schema"]["$ref"].is_string(), "{name}");
    }
    let schemas = &document["components"]["schemas"];
    assert_eq!(schemas["TallyRequest"]["properties"]["selections"]["maxItems"], 1000);
    let limit = schemas["PageRequest"]["properties"]["limit"]["description"].as_str().unwrap();
    assert!(limit.contains(&MAX_PAGE.to_string()), "{limit}");

    fn refs<'a>(value: &'a Value, found: &mut Vec<&'a str>) {
        match value {
            Value::Object(object) => {
                found.extend(object.get("$ref").and_then(Value::as_str));
                object.values().for_each(|value| refs(value, found));
            }
            Value::Array(items) => items.iter().for_each(|value| refs(value, found)),
            _ => {}
        }
    }
    let mut found = Vec::new();
    refs(&document, &mut found);
    assert!(found.contains(&"#/components/schemas/Selection"));
    for reference in found {
        let pointer = reference.strip_prefix('#').unwrap_or_else(|| panic!("{reference} is not local"));
        assert!(document.pointer(pointer).is_some(), "{reference} resolves");
    }
}

#[tokio::test]
async fn an_append_becomes_visible_within_a_bound_and_at_once_to_fresh_queries() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_store(dir.path()).await;
    let service = Service::start(dir.path());
    let index = service.index();
    let bound = Duration::from_secs(2);

    // Not fresh: the query reads what the follower has indexed; poll until it shows.
    let mut lags = Vec::new();
    for n in 0..30 {
        let name = format!("F{n:03}");
        store.create_batch(NewBatch::new(id(&name), BatchType::new("RoundTrip").unwrap())).await.unwrap();
        record(&store, &name, "Data_Received", Outcome::Success).await;
        lags.push(visible_after(&index, &name, "Data_Received", bound).await);
    }
    lags.sort();
    println!(
        "append -> visible to a non-fresh query over HTTP (store file, 30 appends): p50 {:?}, max {:?}",
        lags[lags.len() / 2],
        lags[lags.len() - 1]
    );

    // Fresh (the default): visible in the very first answer after the append.
    let mut latencies = Vec::new();
    for n in 0..30 {
        let name = format!("G{n:03}");
        store.create_batch(NewBatch::new(id(&name), BatchType::new("RoundTrip").unwrap())).await.unwrap();
        record(&store, &name, "Data_Received", Outcome::Success).await;
        let trigger = Trigger { requires: vec![ty("Data_Received")], batches: vec![id(&name)], ..Trigger::default() };
        let asked = Instant::now();
        let answer = index.query_with(&trigger, true).await.unwrap();
        latencies.push(asked.elapsed());
        assert_eq!(answer.batches, vec![id(&name)], "{answer:?}");
        assert!(!answer.stale);
        assert!(answer.indexed_seq >= store.head().await.unwrap());
    }
    latencies.sort();
    println!(
        "fresh query right after an append (30 appends): p50 {:?}, max {:?}",
        latencies[latencies.len() / 2],
        latencies[latencies.len() - 1]
    );
}

#[tokio::test]
async fn metrics_show_the_index_lag_and_fresh_queries_say_when_they_are_stale() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_store(dir.path()).await;
    varied_batches(&store, 0).await;
    let service = Service::start(dir.path());
    let index = service.index();
    index.catch_up().await.unwrap();
    let head = store.head().await.unwrap();
    assert_eq!(service.gauge("sboi_index_lag"), 0.0);
    assert_eq!(service.gauge("sboi_indexed_seq"), head.0 as f64);
    assert_eq!(service.gauge("sboi_store_head_seq"), head.0 as f64);

    // The service keeps the index writer while it runs. Another process (this test, as
    // `autocomp reindex` on the directory would) holds it when the service starts again:
    // the service answers from the committed index and cannot catch up.
    drop(index);
    drop(service);
    let writer =
        tantivy::Index::open_in_dir(dir.path().join("index")).unwrap().writer::<tantivy::TantivyDocument>(15 << 20);
    let writer = writer.unwrap();
    let service = Service::start(dir.path());
    let index = service.index();
    assert_eq!(service.gauge("sboi_indexed_seq"), head.0 as f64);
    record(&store, "B0001", "Structure_Checked", Outcome::Success).await;
    record(&store, "B0002", "Structure_Checked", Outcome::Success).await;
    assert_eq!(service.gauge("sboi_index_lag"), 2.0);
    assert_eq!(service.gauge("sboi_store_head_seq"), (head.0 + 2) as f64);
    let trigger = Trigger { requires: vec![ty("Structure_Checked")], ..Trigger::default() };
    // A fresh query corrects the committed answer with the two changes since: exact at once,
    // although nothing can be indexed.
    let answer = index.query_with(&trigger, true).await.unwrap();
    let expected = vec![id("B0002"), id("B0001")];
    assert_eq!(answer, QueryAnswer { batches: expected, indexed_seq: Seq(head.0 + 2), stale: false, corrected: 2 });
    assert_eq!(service.gauge("sboi_index_lag"), 2.0);
    let answer = index.query_with(&trigger, false).await.unwrap();
    assert!(answer.stale && answer.batches.is_empty() && answer.indexed_seq == head, "{answer:?}");

    // Past the bound of corrections (none here), a fresh query waits for the index, in vain.
    drop(index);
    drop(service);
    let service = Service::with_args(&store_url(dir.path()), dir.path(), &["--max-corrections", "0"]);
    let index = service.index();
    let asked = Instant::now();
    let answer = index.query_with(&trigger, true).await.unwrap();
    assert!(answer.stale && answer.batches.is_empty() && answer.indexed_seq == head, "{answer:?}");
    assert_eq!(answer.corrected, 0);
    assert!(asked.elapsed() < Duration::from_secs(4), "a fresh query is bounded: {:?}", asked.elapsed());

    drop(writer);
    let deadline = Instant::now() + Duration::from_secs(10);
    wait_for(deadline, "the follower to catch up once the writer was free", || service.gauge("sboi_index_lag") == 0.0);
    let answer = index.query_with(&trigger, false).await.unwrap();
    assert_eq!(answer.batches, vec![id("B0002"), id("B0001")], "priority 2 before 1");
    assert!(!answer.stale);
}

#[tokio::test]
async fn a_rebuild_needs_the_token_and_without_it_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_store(dir.path()).await;
    varied_batches(&store, 0).await;
    let service = Service::start(dir.path());
    service.index().catch_up().await.unwrap();
    let meta = || std::fs::read(service.index_dir.join("meta.json")).unwrap();
    let before = meta();

    let rebuild = format!("{}/v1/rebuild", service.url());
    for token in [None, Some("wrong-token")] {
        let (status, body) = call("POST", &rebuild, token, b"{}".to_vec());
        assert_eq!(status, 401, "{body}");
        assert_eq!(body["error"]["kind"], "unauthorized", "{body}");
    }
    let refused = service.index().rebuild().await.unwrap_err().to_string();
    assert!(
        refused.contains(&format!("index service at {}", service.url())) && refused.contains("AUTOCOMP_TOKEN"),
        "{refused}"
    );
    assert_eq!(meta(), before, "a refused rebuild committed nothing");

    let (status, body) = call("POST", &rebuild, Some(TOKEN), Vec::new());
    assert_eq!((status, &body), (200, &json!({"batches": 30})));
    let index = HttpIndex::with_token(&service.url(), Some(TOKEN.into())).unwrap();
    assert_eq!(index.rebuild().await.unwrap(), 30);
    assert_ne!(meta(), before, "a rebuild commits");
    let trigger = &triggers()[1];
    assert_eq!(index.query(trigger).await.unwrap(), select_in_store(&store, trigger).await);
}

/// A body `operation` must refuse: malformed, truncated, wrong types, unknown fields,
/// invalid names, too deep, not an object, not UTF-8, or too large.
fn bad_body(rng: &mut XorShift, operation: &str) -> Vec<u8> {
    let valid = match operation {
        "query" => r#"{"trigger":{"requires":["Data_Received"],"limit":5},"fresh":false}"#,
        "document" => r#"{"id":"B0001"}"#,
        "tally" => r#"{"selections":["all",{"and":[{"running":"checker"},{"not":{"succeeded":"Checked"}}]}]}"#,
        "page" => r#"{"selection":{"priority":{"min":1,"max":null}},"order":"priority","limit":5}"#,
        _ => "{}",
    };
    match rng.below(9) {
        // A proper prefix of a JSON object is never a JSON value.
        0 => valid.as_bytes()[..1 + rng.below(valid.len() - 1)].to_vec(),
        1 => {
            let mut bytes: Vec<u8> = (0..1 + rng.below(300)).map(|_| rng.next_u64() as u8).collect();
            bytes[0] = *rng.pick(b"#x]}\"\\\x00\xff");
            bytes
        }
        2 => wrong_type(rng, operation).into_bytes(),
        3 => format!("{}, \"zz{}\": 1}}", valid.trim_end_matches('}'), rng.below(1000)).replace("{,", "{").into_bytes(),
        4 => {
            let depth = 200 + rng.below(20_000);
            match operation {
                // A selection nested deeper than any parser should follow.
                "tally" | "page" => {
                    let (open, close) = ("{\"not\":".repeat(depth), "}".repeat(depth));
                    format!(r#"{{"selections":[{open}"all"{close}],"selection":{open}"all"{close},"limit":1}}"#)
                        .into_bytes()
                }
                _ => {
                    let field = if operation == "document" { "id" } else { "trigger" };
                    format!("{{\"{field}\":{}{}}}", "[".repeat(depth), "]".repeat(depth)).into_bytes()
                }
            }
        }
        5 => rng.pick(&["[]", "\"text\"", "null", "0", "true", "1e999", "[{}]", "{}{}", "{\"a\"}"]).as_bytes().to_vec(),
        6 => {
            let mut body = br#"{"id":""#.to_vec();
            body.extend_from_slice(&[0xff, 0xfe, b'a', 0xc3]);
            body.extend_from_slice(br#""}"#);
            body
        }
        // A field of several MiB, under the limit: read, then refused as an invalid name.
        7 if rng.below(8) == 0 => format!("{{\"id\":\"{}\"}}", "a".repeat(3 << 20)).into_bytes(),
        // Over the 4 MiB limit: 413 before parsing.
        8 if rng.below(8) == 0 => vec![b' '; (4 << 20) + 1 + rng.below(1 << 20)],
        _ => wrong_type(rng, operation).into_bytes(),
    }
}

fn wrong_type(rng: &mut XorShift, operation: &str) -> String {
    let long_id = format!("\"{}\"", "x".repeat(129));
    match operation {
        "query" => {
            let list_field =
                *rng.pick(&["requires", "blocked_by", "repeat_on_change", "transiently_failed", "types", "batches"]);
            match rng.below(5) {
                0 => format!(r#"{{"trigger":{}}}"#, rng.pick(&["1", "\"x\"", "true", "null", "[]", "[1]"])),
                1 => {
                    let value =
                        rng.pick(&["1", "\"x\"", "{}", "[1]", "[\"bad name!\"]", "[\"\"]", "true", "[null]", "[[]]"]);
                    format!(r#"{{"trigger":{{"{list_field}":{value}}}}}"#)
                }
                2 => format!(
                    r#"{{"trigger":{{"settled_for":{}}}}}"#,
                    rng.pick(&["\"x\"", "-1", "1.5", "[]", "{}", "true", "\"5 parsecs\""])
                ),
                3 => format!(
                    r#"{{"trigger":{{"limit":{}}}}}"#,
                    rng.pick(&["-1", "\"x\"", "1.5", "[]", "true", "1e30", "{}"])
                ),
                _ => format!(r#"{{"trigger":{{}},"fresh":{}}}"#, rng.pick(&["1", "\"yes\"", "[]", "{}", "null"])),
            }
        }
        "document" => {
            let values = ["1", "true", "null", "[]", "{}", "\"\"", "\"bad id!\"", "\"-dash-first\"", long_id.as_str()];
            format!(r#"{{"id":{}}}"#, rng.pick(&values))
        }
        "tally" | "page" => {
            let selection = *rng.pick(&[
                "1",
                "null",
                "[]",
                "{}",
                "\"none\"",
                r#"{"bogus":"x"}"#,
                r#"{"running":"bad name!"}"#,
                r#"{"succeeded":1}"#,
                r#"{"quiet_for":"5 parsecs"}"#,
                r#"{"quiet_for":-1}"#,
                r#"{"priority":{"min":"high"}}"#,
                r#"{"priority":{"min":4294967296}}"#,
                r#"{"and":"all"}"#,
                r#"{"or":[{"not":[]}]}"#,
                r#"{"not":null}"#,
                r#"{"running":"checker","present":"Checked"}"#,
                r#"{"trigger":{"requires":"Checked"}}"#,
            ]);
            if operation == "tally" {
                match rng.below(3) {
                    0 => format!(r#"{{"selections":[{selection}]}}"#),
                    1 => format!(r#"{{"selections":{}}}"#, rng.pick(&["\"all\"", "{}", "1", "null"])),
                    _ => format!(r#"{{"selections":["all"],"fresh":{}}}"#, rng.pick(&["true", "1"])),
                }
            } else {
                match rng.below(4) {
                    0 => format!(r#"{{"selection":{selection},"limit":5}}"#),
                    1 => format!(
                        r#"{{"selection":"all","limit":{}}}"#,
                        rng.pick(&["-1", "\"ten\"", "1.5", "null", "[]", "1e30", "18446744073709551616"])
                    ),
                    2 => format!(
                        r#"{{"selection":"all","limit":5,"order":{}}}"#,
                        rng.pick(&["\"newest\"", "1", "null", "\"Oldest\""])
                    ),
                    _ => format!(
                        r#"{{"selection":"all","limit":5,"after":{}}}"#,
                        rng.pick(&["{}", "{\"priority\":1}", "[1]", "1", "{\"priority\":1,\"created_seq\":\"x\"}"])
                    ),
                }
            }
        }
        _ => format!(
            r#"{{"{}":{}}}"#,
            rng.pick(&["id", "trigger", "force", ""]),
            rng.pick(&["1", "\"x\"", "{}", "null"])
        ),
    }
}

#[tokio::test]
async fn bad_bodies_get_a_json_4xx_and_the_service_lives_on() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_store(dir.path()).await;
    varied_batches(&store, 0).await;
    let mut service = Service::start(dir.path());
    let base = service.url();
    let mut rng = XorShift(0x5b01_f022_2026_0007);
    let operations = ["query", "document", "tally", "page", "catch_up", "rebuild"];
    let mut statuses = std::collections::BTreeMap::<u16, usize>::new();
    for round in 0..400 {
        let operation = *rng.pick(&operations);
        let body = bad_body(&mut rng, operation);
        // Rebuilds with the token, so the body is read (without it: 401 before reading).
        let token = (operation == "rebuild" && round % 4 != 0).then_some(TOKEN);
        let shown = String::from_utf8_lossy(&body[..body.len().min(80)]).into_owned();
        let (status, answer) = call("POST", &format!("{base}/v1/{operation}"), token, body);
        assert!((400..500).contains(&status), "round {round}: {operation} {shown:?} -> HTTP {status}: {answer}");
        assert!(answer["error"]["kind"].is_string() && answer["error"]["message"].is_string(), "{answer}");
        *statuses.entry(status).or_default() += 1;
    }
    println!("fuzz: 400 bad bodies answered {statuses:?}");
    assert!(statuses.contains_key(&400) && statuses.contains_key(&413) && statuses.contains_key(&401), "{statuses:?}");

    // Paths and methods nobody serves: JSON too.
    for (method, path, expected) in [("POST", "/v1/nope", 404), ("GET", "/nope", 404), ("GET", "/v1/query", 405)] {
        let (status, answer) = call(method, &format!("{base}{path}"), None, Vec::new());
        assert_eq!(status, expected, "{method} {path}: {answer}");
        assert!(answer["error"]["message"].is_string(), "{answer}");
    }

    assert!(service.is_running(), "the service survived the fuzz loop");
    assert_eq!(get(&format!("{base}/health")).unwrap().0, 200);
    let trigger = &triggers()[2];
    assert_eq!(service.index().query(trigger).await.unwrap(), select_in_store(&store, trigger).await);
    let (status, openapi) = call("GET", &format!("{base}/openapi.json"), None, Vec::new());
    assert_eq!(status, 200);
    assert_eq!(openapi, serde_json::from_str::<Value>(&autocomp_sboi::http::server::openapi()).unwrap());
    assert!(openapi["paths"]["/v1/query"].is_object(), "{openapi}");
}

#[tokio::test]
async fn an_unreachable_index_service_is_unavailable_naming_its_url() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_store(dir.path()).await;
    let url = format!("http://127.0.0.1:{}", free_port());
    let index = open_index(&url, store).unwrap();
    let trigger = Trigger::default();
    let errors = [
        index.query(&trigger).await.unwrap_err(),
        index.catch_up().await.unwrap_err(),
        index.document(&id("B0001")).await.unwrap_err(),
        index.rebuild().await.unwrap_err(),
        index.tally(&[Selection::All], false).await.unwrap_err(),
        index
            .page(&PageRequest { selection: Selection::All, order: PageOrder::Oldest, after: None, limit: 10 })
            .await
            .unwrap_err(),
    ];
    for error in errors {
        let IndexError::Unavailable(message) = &error else { panic!("expected Unavailable, got {error:?}") };
        assert!(message.contains("index service") && message.contains(&url), "{message}");
        // Said as the index's outage, not the store's.
        assert!(error.to_string().starts_with("index unavailable:"), "{error}");
    }
    let bad = open_index("http://", Arc::new(SqliteStore::open(dir.path().join("s.db")).await.unwrap()));
    assert!(matches!(bad, Err(IndexError::Store(StoreError::Invalid(_)))));
}

fn exit_status(mut command: Command) -> ExitStatus {
    let mut child = command.spawn().expect("start sboi");
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut exited = None;
    if !wait_until(deadline, || {
        exited = child.try_wait().unwrap();
        exited.is_some()
    }) {
        child.kill().ok();
        panic!("sboi did not exit");
    }
    exited.expect("it exited")
}

#[test]
fn serve_exits_5_without_its_index_and_2_on_usage_errors() {
    let dir = tempfile::tempdir().unwrap();
    let index_dir = dir.path().join("index");
    let index = index_dir.to_str().unwrap();
    let listen = format!("127.0.0.1:{}", free_port());
    let serve = |store: &str, index: &str, extra: &[&str], token: bool| {
        let mut command = sboi(&["serve", "--store", store, "--index-dir", index, "--listen", &listen]);
        command.args(extra);
        if token {
            command.env("AUTOCOMP_TOKEN", TOKEN);
        }
        exit_status(command).code()
    };
    // (A store that does not answer yet is waited for, not an exit: tests/tests/multihost.rs.)
    let a_file = dir.path().join("a-file");
    std::fs::write(&a_file, "not a directory").unwrap();
    assert_eq!(serve(&store_url(dir.path()), a_file.to_str().unwrap(), &[], true), Some(5), "index unopenable");
    assert_eq!(serve("ftp://somewhere", index, &[], true), Some(2), "unknown store scheme");
    assert_eq!(serve(&store_url(dir.path()), index, &[], false), Some(2), "no token");
    assert_eq!(serve(&store_url(dir.path()), index, &["--reconcile-every", "often"], true), Some(2));
    assert_eq!(exit_status(sboi(&["serve"])).code(), Some(2), "missing flags");
    assert_eq!(exit_status(sboi(&["--help"])).code(), Some(0));
}

/// Polls non-fresh queries until `batch` is listed ready for `requires`; how long that took.
async fn visible_after(index: &HttpIndex, batch: &str, requires: &str, bound: Duration) -> Duration {
    let started = Instant::now();
    let trigger = Trigger { requires: vec![ty(requires)], batches: vec![id(batch)], ..Trigger::default() };
    // Every 2 ms: the delay is the figure being measured.
    let visible = wait_until_async_every(Duration::from_millis(2), started + bound, async || {
        index.query_with(&trigger, false).await.is_ok_and(|answer| answer.batches == vec![id(batch)])
    })
    .await;
    assert!(visible, "{batch} not visible after {bound:?}");
    started.elapsed()
}

/// The document in the repository is the one the declarations generate (and the service
/// serves). After changing an operation, regenerate it with the command the failure names.
#[test]
fn the_checked_in_openapi_document_is_the_generated_one() {
    autocomp_test_servers::assert_generated(
        concat!(env!("CARGO_MANIFEST_DIR"), "/openapi.json"),
        &autocomp_sboi::http::server::openapi(),
        "cargo test -p autocomp-sboi --test integration service::the_checked_in_openapi_document_is_the_generated_one",
    );
}

/// Bodies exactly as clients of earlier releases send them get the answers they expect: an
/// older client and a newer service still talk.
#[tokio::test]
async fn bodies_as_earlier_clients_send_them_get_the_same_answers() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_store(dir.path()).await;
    varied_batches(&store, 0).await;
    let service = Service::start(dir.path());
    let base = service.url();
    let post = |op: &str, token: Option<&str>, body: &str| call("POST", &format!("{base}/v1/{op}"), token, body.into());

    let trigger = &triggers()[2];
    let body = json!({"trigger": trigger, "fresh": true}).to_string();
    let (status, answer) = post("query", None, &body);
    assert_eq!(status, 200, "{answer}");
    let expected: Vec<String> = select_in_store(&store, trigger).await.iter().map(|id| id.to_string()).collect();
    assert_eq!(answer["batches"], json!(expected));
    assert!(answer["indexed_seq"].is_i64() && answer["stale"] == false, "{answer}");
    let (status, answer) = post("query", None, r#"{"trigger":{"requires":["Data_Received"],"limit":5},"fresh":false}"#);
    assert_eq!(status, 200, "{answer}");
    assert!(answer["batches"].as_array().unwrap().len() <= 5, "{answer}");
    let (status, answer) = post("document", None, r#"{"id":"B0001"}"#);
    assert_eq!(status, 200, "{answer}");
    assert!(answer["indexed_seq"].is_i64() && answer.get("document").is_some(), "{answer}");
    let (status, answer) = post(
        "tally",
        None,
        r#"{"selections":["all",{"and":[{"running":"checker"},{"not":{"succeeded":"Checked"}}]}],"quietest":true}"#,
    );
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["tallies"].as_array().map(Vec::len), Some(2), "{answer}");
    assert!(answer["tallies"][0]["count"].is_u64() && answer["stale"].is_boolean(), "{answer}");
    let (status, answer) =
        post("page", None, r#"{"selection":{"priority":{"min":1,"max":null}},"order":"priority","limit":5}"#);
    assert_eq!(status, 200, "{answer}");
    assert!(answer["batches"].is_array() && answer.get("next").is_some() && answer["indexed_seq"].is_i64(), "{answer}");
    let (status, answer) = post("catch_up", None, "{}");
    assert_eq!(status, 200, "{answer}");
    assert!(answer["status"].is_string() && answer["cursor"].is_i64(), "{answer}");
    let (status, answer) = post("rebuild", None, "");
    assert_eq!((status, answer["error"]["kind"].as_str()), (401, Some("unauthorized")), "{answer}");
    let (status, answer) = post("rebuild", Some(TOKEN), "");
    assert_eq!(status, 200, "{answer}");
    assert!(answer["batches"].as_u64().unwrap() > 0, "{answer}");
    let (status, answer) = post("reconcile", None, "{}");
    assert_eq!((status, answer["error"]["kind"].as_str()), (401, Some("unauthorized")), "{answer}");
    let (status, answer) = post("document", None, r#"{"id":"B0001","fresh":true}"#);
    assert_eq!(
        (status, answer["error"]["kind"].as_str(), answer["error"]["field"].as_str()),
        (400, Some("invalid"), Some("fresh"))
    );
}
