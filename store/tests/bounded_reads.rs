//! Reads of the store service bounded by bytes, not only by count: a repeated id is read
//! once, an answer of several batches (or of their histories) stops at 64 MiB with a 413
//! naming the cap (and `HttpStore` pages through it by itself; a claim round's answer too, its
//! claims made and answered again in halves by their key), and a read without a token may
//! send at most 64 KiB of body, refused from its head when it declares more.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use autocomp_model::*;
use autocomp_store::*;
use autocomp_test_servers::http1::post;
use serde_json::{Value, json};

use super::service::{Service, TOKEN};

fn id(text: &str) -> BatchId {
    BatchId::new(text).unwrap()
}

fn new_batch(name: &str) -> NewBatch {
    NewBatch::new(id(name), BatchType::new("Delivery").unwrap()).with_location(format!("/incoming/{name}"))
}

fn ids_of(answer: &Value, key: impl Fn(&Value) -> &Value) -> Vec<String> {
    answer.as_array().unwrap().iter().map(|item| key(item).as_str().unwrap().to_string()).collect()
}

#[tokio::test]
async fn a_repeated_id_is_read_and_answered_once_through_the_service() {
    let dir = tempfile::tempdir().unwrap();
    let service = Service::start(&dir.path().join("store.db"));
    let http = service.client();
    for name in ["B1", "B2"] {
        http.create_batch(new_batch(name)).await.unwrap();
    }
    let url = |op: &str| format!("{}/v1/{op}", service.url());
    // Eight copies of one batch and another: each once, at its first place (open reads).
    let body = json!({"ids": ["B1", "B1", "B1", "B1", "B2", "B1", "B1", "B1", "B1"]}).to_string();
    let (status, answer) = post(&url("get_batches"), None, body.as_bytes());
    assert_eq!(status, 200, "{answer}");
    assert_eq!(ids_of(&answer, |b| &b["id"]), ["B1", "B2"]);
    let (status, answer) = post(&url("get_summaries"), None, body.as_bytes());
    assert_eq!((status, ids_of(&answer, |s| &s["id"])), (200, vec!["B1".to_string(), "B2".to_string()]));
    let (status, answer) = post(&url("get_listings"), None, body.as_bytes());
    assert_eq!((status, ids_of(&answer, |l| &l["summary"]["id"])), (200, vec!["B1".to_string(), "B2".to_string()]));
    let through_client = http.get_batches(&[id("B2"), id("B2"), id("B1")]).await.unwrap();
    assert_eq!(through_client.iter().map(|b| b.id.as_str()).collect::<Vec<_>>(), ["B2", "B1"]);
}

#[tokio::test]
async fn an_answer_over_64_mib_is_a_413_naming_the_cap_and_the_client_pages_through_it() {
    let dir = tempfile::tempdir().unwrap();
    let service = Service::start(&dir.path().join("store.db"));
    let http = service.client();
    two_batches_over_the_cap_together(&http).await;
    let url = |op: &str| format!("{}/v1/{op}", service.url());
    let both = json!({"ids": ["B1", "B2"]}).to_string();
    let (status, answer) = post(&url("get_batches"), None, both.as_bytes());
    assert_eq!(status, 413, "{}", answer.to_string().chars().take(300).collect::<String>());
    let error = &answer["error"];
    assert_eq!(error["kind"], "too_large");
    let message = error["message"].as_str().unwrap();
    assert!(message.contains("67108864 bytes") && message.contains("fewer ids"), "{message}");
    let (status, answer) = post(&url("list_batches"), Some(TOKEN), br#"{"limit": 10}"#);
    assert_eq!((status, answer["error"]["kind"].as_str()), (413, Some("too_large")));
    assert!(answer["error"]["message"].as_str().unwrap().contains("fewer limit"), "{answer}");
    // One batch is always answered, whatever its size.
    let (status, answer) = post(&url("get_batches"), None, br#"{"ids": ["B2"]}"#);
    assert_eq!((status, ids_of(&answer, |b| &b["id"])), (200, vec!["B2".to_string()]));

    // The typed client asks again in halves: callers never meet the cap.
    let anonymous = HttpStore::with_token(&service.url(), None).unwrap();
    for store in [&http, &anonymous] {
        let read = store.get_batches(&[id("B2"), id("B1"), id("B2")]).await.unwrap();
        assert_eq!(read.iter().map(|b| (b.id.as_str(), b.events.len())).collect::<Vec<_>>(), [("B2", 34), ("B1", 34)]);
        let listed = store.list_batches(None, 10).await.unwrap();
        assert_eq!(listed.iter().map(|b| b.id.as_str()).collect::<Vec<_>>(), ["B1", "B2"]);
    }
}

#[tokio::test]
async fn histories_over_64_mib_together_are_a_413_naming_the_cap_and_the_client_reads_them_all_in_halves() {
    let dir = tempfile::tempdir().unwrap();
    let service = Service::start(&dir.path().join("store.db"));
    let http = service.client();
    two_batches_over_the_cap_together(&http).await;
    let url = format!("{}/v1/histories", service.url());
    let (status, answer) = post(&url, None, br#"{"ids": ["B1", "B2"]}"#);
    assert_eq!(status, 413, "{}", answer.to_string().chars().take(300).collect::<String>());
    assert_eq!(answer["error"]["kind"], "too_large");
    let message = answer["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("the answer to histories")
            && message.contains("67108864 bytes")
            && message.contains("fewer ids"),
        "{message}"
    );
    // One history is always answered, whatever its size.
    let (status, answer) = post(&url, None, br#"{"ids": ["B2"]}"#);
    assert_eq!(status, 200, "{}", answer.to_string().chars().take(300).collect::<String>());
    let answered: Vec<(&str, usize)> = answer
        .as_array()
        .unwrap()
        .iter()
        .map(|history| (history["batch"]["id"].as_str().unwrap(), history["batch"]["events"].as_array().unwrap().len()))
        .collect();
    assert_eq!(answered, [("B2", 34)]);

    // The typed client (what `autocomp prune` exports with) asks again in halves: every
    // history comes back whole, in the order asked, each once.
    let histories = http.histories(&[id("B2"), id("B1"), id("B2")]).await.unwrap();
    let read: Vec<(&str, usize)> = histories.iter().map(|h| (h.batch.id.as_str(), h.batch.events.len())).collect();
    assert_eq!(read, [("B2", 34), ("B1", 34)]);
}

/// B1 and B2, of 34 MB each (under the default 64 MiB cap of one batch): 68 MB together.
async fn two_batches_over_the_cap_together(http: &HttpStore) {
    let blob = "x".repeat(1_000_000);
    for name in ["B1", "B2"] {
        http.create_batch(new_batch(name)).await.unwrap();
        for n in 0..34 {
            let event = NewEvent::new(EventType::new("Step_Done").unwrap(), Outcome::Success, Agent::new("t").unwrap())
                .with_details(json!({"n": n, "blob": blob}));
            http.append_event(&id(name), event).await.unwrap();
        }
    }
}

#[tokio::test]
async fn a_claim_round_answered_over_64_mib_is_a_413_and_the_client_claims_it_in_halves_with_its_key() {
    let dir = tempfile::tempdir().unwrap();
    let service = Service::start(&dir.path().join("store.db"));
    let http = service.client();
    two_batches_over_the_cap_together(&http).await;
    let descriptor = serde_json::from_value(json!({
        "name": "archiver", "version": "1.0", "event_type": "Archived",
        "trigger": {"requires": ["Step_Done"], "blocked_by": ["Archived"]},
        "max_attempts": 3, "retry_backoff": "90s", "queue_size": 5, "max_runtime": "2h",
    }))
    .unwrap();
    let holder = RunHolder {
        agent: Agent::new("archiver/1.0@host#1").unwrap(),
        host: "host".into(),
        pid: 1,
        claim_key: Some(IdempotencyKey::new("round-1").unwrap()),
        liveness: None,
    };
    let request = ReadyClaimRequest {
        batches: vec![id("B1"), id("B2")],
        descriptor,
        holder,
        force: false,
        known_steering: None,
        exclusive: false,
        takeovers: Vec::new(),
    };

    // Refused as a whole, the typed client asks again in halves with the round's key: each
    // batch answered whole, claimed by the run the refused round opened (generation 1), none
    // abandoned.
    let claims = http.claim_ready(&request).await.unwrap();
    assert!(!claims.held);
    let answered: Vec<(&str, usize, Option<i64>, bool)> = claims
        .answers
        .iter()
        .map(|answer| {
            let ready = answer.as_ref().unwrap();
            let claim = ready.claim.as_ref();
            (
                ready.batch.id.as_str(),
                ready.batch.events.len(),
                claim.map(Claim::generation),
                claim.is_some_and(|c| c.abandoned.is_some()),
            )
        })
        .collect();
    assert_eq!(answered, [("B1", 34, Some(1), false), ("B2", 34, Some(1), false)]);

    // The service's 413 names the cap; asked again with the same key, the round claims nothing new.
    let url = format!("{}/v1/claim_ready", service.url());
    let (status, answer) = post(&url, Some(TOKEN), &serde_json::to_vec(&request).unwrap());
    assert_eq!(status, 413, "{}", answer.to_string().chars().take(300).collect::<String>());
    assert_eq!(answer["error"]["kind"], "too_large");
    let message = answer["error"]["message"].as_str().unwrap();
    assert!(message.contains("67108864 bytes") && message.contains("fewer batches"), "{message}");
    let mut open: Vec<(String, i64)> =
        http.open_runs(None).await.unwrap().into_iter().map(|run| (run.batch_id.to_string(), run.generation)).collect();
    open.sort();
    assert_eq!(open, [("B1".to_string(), 1), ("B2".to_string(), 1)]);
}

/// Sends `head` (and `body`) on a fresh connection and reads the answer until the service
/// closes or 10 s pass: (status, the whole answer as text).
fn exchange(service: &Service, head: &str, body: &[u8]) -> (u16, String) {
    let address = service.url().trim_start_matches("http://").to_string();
    let mut stream = TcpStream::connect(address).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    stream.write_all(head.as_bytes()).unwrap();
    // The service may answer and close before all of it is sent: that is the point.
    let _ = stream.write_all(body);
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    let text = String::from_utf8_lossy(&answer).to_string();
    let status = text.split(' ').nth(1).and_then(|code| code.parse().ok()).unwrap_or(0);
    (status, text)
}

fn head(token: Option<&str>, framing: &str) -> String {
    let authorization = token.map(|token| format!("Authorization: Bearer {token}\r\n")).unwrap_or_default();
    format!(
        "POST /v1/get_summaries HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\nConnection: close\r\n\
         {authorization}{framing}\r\n\r\n"
    )
}

/// A `get_summaries` body of `count` distinct 100-character ids: about 103 bytes an id.
fn ids_body(count: usize) -> Vec<u8> {
    let ids: Vec<String> = (0..count).map(|n| format!("B{n:099}")).collect();
    json!({ "ids": ids }).to_string().into_bytes()
}

fn chunked(body: &[u8]) -> Vec<u8> {
    let mut framed = Vec::new();
    for chunk in body.chunks(8 << 10) {
        framed.extend(format!("{:x}\r\n", chunk.len()).into_bytes());
        framed.extend(chunk);
        framed.extend(b"\r\n");
    }
    framed.extend(b"0\r\n\r\n");
    framed
}

#[tokio::test]
async fn a_tokenless_read_body_over_64_kib_is_refused_before_it_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let service = Service::start(&dir.path().join("store.db"));
    let limit = autocomp_http::service::OPEN_READ_BODY_BYTES;
    assert_eq!(limit, 64 << 10);

    // 4 MB declared, not a byte of it sent: refused at once from the head.
    let started = Instant::now();
    let (status, answer) = exchange(&service, &head(None, "Content-Length: 4000000"), b"");
    assert_eq!(status, 413, "{answer}");
    assert!(answer.contains("65536 bytes") && answer.contains("token"), "names the limit and what lifts it: {answer}");
    assert!(started.elapsed() < Duration::from_secs(5), "answered in {:?}", started.elapsed());

    // Chunked: read up to the limit, refused past it.
    let small = ids_body(600);
    assert!(small.len() < limit, "{}", small.len());
    let (status, answer) = exchange(&service, &head(None, "Transfer-Encoding: chunked"), &chunked(&small));
    assert_eq!(status, 200, "under the limit: {answer}");
    let large = ids_body(700);
    assert!(large.len() > limit, "{}", large.len());
    let (status, answer) = exchange(&service, &head(None, "Transfer-Encoding: chunked"), &chunked(&large));
    assert_eq!(status, 413, "{answer}");
    // A token lifts it.
    let framing = format!("Content-Length: {}", large.len());
    let (status, answer) = exchange(&service, &head(Some(TOKEN), &framing), &large);
    assert_eq!(status, 200, "{answer}");

    // The typed client without a token cuts its requests to fit.
    service.client().create_batch(new_batch(&format!("B{:099}", 2_999))).await.unwrap();
    let anonymous = HttpStore::with_token(&service.url(), None).unwrap();
    let asked: Vec<BatchId> = (0..3_000).map(|n| id(&format!("B{n:099}"))).collect();
    let found = anonymous.get_summaries(&asked).await.unwrap();
    assert_eq!(found.iter().map(|s| s.id.clone()).collect::<Vec<_>>(), [asked[2_999].clone()]);
}

/// The JSON of a batch without `as_of` (the clock of each read).
fn without_clock(mut batch: Value) -> Value {
    batch.as_object_mut().unwrap().remove("as_of").expect("a batch has as_of");
    batch
}

#[tokio::test]
async fn a_large_batch_is_written_as_read_and_reads_as_the_store_holds_it() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("store.db");
    let service = Service::start(&db);
    let http = service.client();
    // Past the 1 MiB read whole: 3 events of 1 MB among 100 small ones (more than one page
    // of the log), metadata naming "events" itself, an open run; and a small batch.
    let mut large = new_batch("LARGE");
    large.metadata.as_object_mut().unwrap().insert("events".into(), json!([]));
    http.create_batch(large).await.unwrap();
    http.create_batch(new_batch("SMALL")).await.unwrap();
    let blob = "x".repeat(1_000_000);
    for n in 0..103 {
        let details =
            if n % 40 == 5 { json!({"n": n, "blob": blob}) } else { json!({"n": n, "quote": "\"events\":[]"}) };
        let event = NewEvent::new(EventType::new("Step_Done").unwrap(), Outcome::Success, Agent::new("t").unwrap())
            .with_details(details);
        http.append_event(&id("LARGE"), event).await.unwrap();
    }
    let holder =
        RunHolder { agent: Agent::new("t").unwrap(), host: "host".into(), pid: 1, claim_key: None, liveness: None };
    http.claim(&id("LARGE"), &ComponentName::new("step").unwrap(), &holder).await.unwrap();

    let direct = SqliteStore::open(&db).await.unwrap();
    let held = |name: &'static str| {
        let direct = &direct;
        async move { without_clock(serde_json::to_value(direct.get_batch(&id(name)).await.unwrap()).unwrap()) }
    };
    let (large, small) = (held("LARGE").await, held("SMALL").await);
    let url = |op: &str| format!("{}/v1/{op}", service.url());
    let (status, answer) = post(&url("get_batch"), None, br#"{"id": "LARGE"}"#);
    assert_eq!(status, 200);
    assert_eq!(without_clock(answer), large);
    let (status, answer) = post(&url("get_batches"), None, br#"{"ids": ["SMALL", "LARGE", "NONE", "SMALL"]}"#);
    assert_eq!(status, 200);
    let answered: Vec<Value> = answer.as_array().unwrap().iter().cloned().map(without_clock).collect();
    assert_eq!(answered, [small.clone(), large.clone()]);
    let (status, answer) = post(&url("list_batches"), None, br#"{"limit": 10}"#);
    assert_eq!(status, 200);
    let answered: Vec<Value> = answer.as_array().unwrap().iter().cloned().map(without_clock).collect();
    assert_eq!(answered, [large.clone(), small]);
    // The typed client reads it unchanged; an unknown batch is still a 404 before anything.
    let read = http.get_batch(&id("LARGE")).await.unwrap();
    assert_eq!(without_clock(serde_json::to_value(read).unwrap()), large);
    let (status, answer) = post(&url("get_batch"), None, br#"{"id": "NONE"}"#);
    assert_eq!((status, answer["error"]["kind"].as_str()), (404, Some("not_found")));
}
