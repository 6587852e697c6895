//! The notifier (`autocomp_ops::notify`) against real parts: a SQLite store and a local index
//! in a temp dir, a real SMTP server (aiosmtpd, `autocomp_test_servers::smtp`) and a webhook
//! receiver (axum on 127.0.0.1) that records what it gets and can be told to answer 503.
//! Each item goes out once per channel: a permanent failure is one mail and one webhook
//! signed with HMAC-SHA256 (checked here by a second implementation), the digest one
//! message with the counts, two notifier processes on one store send each item once, a
//! receiver that was down gets the notice later and once, and transient or cancelled
//! failures send nothing.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use autocomp_e2e::finish;
use autocomp_framework::config::ComponentConfig;
use autocomp_model::{
    Agent, BatchId, BatchType, ComponentName, Event, EventType, NewBatch, NewEvent, Outcome, PassOutcome, PassPhase,
    PassRecord, SteeringChange, SteeringRequest, Trigger,
};
use autocomp_ops::notify::{KEY_HEADER, NotifyConfig, NotifyReport, SIGNATURE_HEADER, notify_once};
use autocomp_sboi::{BatchIndex, open_index};
use autocomp_store::{ObjectStore, SqliteStore};
use autocomp_test_servers::receiver::HttpReceiver;
use autocomp_test_servers::smtp::{Received, SinkTls, SmtpSink};
use autocomp_test_servers::wait_until_async;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

const SECRET: &str = "a-test-secret-of-the-webhook";
const CHILD: &str = "AUTOCOMP_NOTIFY_TEST_CHILD";

// ---- the pipeline ----

/// `checker` records Checked after Data_Received; `approve` is a human step (Approved after
/// Checked); `archiver` records Archived after Approved: the last step.
struct Pipeline {
    dir: tempfile::TempDir,
    store: Arc<dyn ObjectStore>,
    index: Arc<dyn BatchIndex>,
}

impl Pipeline {
    async fn new() -> Pipeline {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("config")).unwrap();
        let (store, index) = open(dir.path()).await;
        for (name, event_type, requires, manual) in [
            ("checker", "Checked", "Data_Received", false),
            ("approve", "Approved", "Checked", true),
            ("archiver", "Archived", "Approved", false),
        ] {
            let own = EventType::new(event_type).unwrap();
            let trigger = Trigger::builder().requires(requires).blocked_by(event_type).build();
            let mut descriptor =
                ComponentConfig::default().descriptor(ComponentName::new(name).unwrap(), "1.0.0", own, trigger, false);
            descriptor.manual = manual;
            let phase =
                PassPhase::Ended { outcome: PassOutcome::Idle, summary: String::new(), duration_ms: 1, work: vec![] };
            store.record_pass(PassRecord { descriptor, host: "host1".into(), phase }).await.unwrap();
        }
        Pipeline { dir, store, index }
    }

    fn config_dir(&self) -> PathBuf {
        self.dir.path().join("config")
    }

    /// Writes `notify.toml` (the `[notify]` keys given, mail to `sink`, the webhook to
    /// `receiver`) and the webhook's secret file; returns the config as loaded.
    fn configure(&self, notify: &str, sink: &SmtpSink, receiver: &Receiver) -> NotifyConfig {
        std::fs::write(self.config_dir().join("webhook-secret"), format!("{SECRET}\n")).unwrap();
        let text = format!(
            "[notify]\n{notify}\nretry_after = \"100ms\"\nretry_max = \"200ms\"\n\n[notify.mail]\nserver = \"{}\"\n\
             from = \"autocomp@example.org\"\nto = [\"ops@example.org\", \"ann@example.org\"]\ntimeout = \"10s\"\n\n\
             [notify.webhook]\nurl = \"http://{}/hook\"\nsecret_file = \"webhook-secret\"\ntimeout = \"5s\"\n",
            sink.url(),
            receiver.addr,
        );
        std::fs::write(self.config_dir().join("notify.toml"), text).unwrap();
        NotifyConfig::load(&self.config_dir()).unwrap()
    }

    async fn notify(&self, config: &NotifyConfig) -> NotifyReport {
        notify_once(Arc::clone(&self.store), Arc::clone(&self.index), config, "notify@test#1").await.unwrap()
    }

    /// The first pass: the cursor starts at the head, so what came before is not news. (On an
    /// empty store there is no head to start at: a batch without events makes one.)
    async fn first_pass(&self, config: &NotifyConfig) {
        if self.store.head().await.unwrap() == autocomp_model::Seq::ZERO {
            let new = NewBatch::new(BatchId::new("B00").unwrap(), BatchType::new("RoundTrip").unwrap());
            self.store.create_batch(new).await.unwrap();
        }
        let report = self.notify(config).await;
        assert!(report.notes.iter().any(|note| note.contains("first run")), "{report:?}");
    }

    /// A batch with a successful Data_Received (ready for the checker), and `events` after it:
    /// (type, outcome, details).
    async fn batch(&self, id: &str, events: &[(&str, Outcome, Value)]) -> Vec<Event> {
        let id = BatchId::new(id).unwrap();
        self.store.create_batch(NewBatch::new(id.clone(), BatchType::new("RoundTrip").unwrap())).await.unwrap();
        let mut recorded = vec![self.record(&id, "Data_Received", Outcome::Success, json!({})).await];
        for (event_type, outcome, details) in events {
            recorded.push(self.record(&id, event_type, *outcome, details.clone()).await);
        }
        recorded
    }

    async fn record(&self, id: &BatchId, event_type: &str, outcome: Outcome, details: Value) -> Event {
        let agent = Agent::new("probe/1.0.0@host1#7").unwrap();
        let event = NewEvent::new(EventType::new(event_type).unwrap(), outcome, agent).with_details(details);
        self.store.append_event(id, event).await.unwrap()
    }

    async fn steer(&self, change: SteeringChange, by: &str) {
        let request = SteeringRequest {
            change,
            by: Agent::new(by).unwrap(),
            reason: "tape maintenance".into(),
            expect_version: None,
        };
        self.store.steer(request).await.unwrap();
    }
}

async fn open(dir: &Path) -> (Arc<dyn ObjectStore>, Arc<dyn BatchIndex>) {
    let store: Arc<dyn ObjectStore> = Arc::new(SqliteStore::open(dir.join("store.db")).await.unwrap());
    let index = open_index(&format!("local:{}", dir.join("index").display()), Arc::clone(&store)).unwrap();
    (store, index)
}

fn failure(summary: &str) -> Value {
    json!({
        "summary": summary, "failures_total": 1, "failures_cap": 10, "duration_ms": 5, "outcome": "failure",
        "failures": [{"reference": "data/a.txt", "type": "checksum", "description": "sha256 differs"}],
    })
}

// ---- the webhook receiver ----

#[derive(Debug, Clone)]
struct Request {
    key: String,
    signature: String,
    content_type: String,
    body: Vec<u8>,
    /// What the receiver answered.
    status: u16,
}

impl Request {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).expect("a JSON body")
    }
}

/// An HTTP server on 127.0.0.1 that records every POST and answers `status` (200 unless
/// told otherwise), on its own thread and runtime; stopped when dropped.
struct Receiver {
    addr: SocketAddr,
    requests: Arc<Mutex<Vec<Request>>>,
    status: Arc<AtomicU16>,
    _server: HttpReceiver,
}

impl Receiver {
    fn start() -> Receiver {
        let requests = Arc::new(Mutex::new(Vec::new()));
        let status = Arc::new(AtomicU16::new(200));
        let state = (Arc::clone(&requests), Arc::clone(&status));
        let server =
            HttpReceiver::start(axum::Router::new().route("/hook", axum::routing::post(receive)).with_state(state));
        Receiver { addr: server.addr, requests, status, _server: server }
    }

    fn answer(&self, status: u16) {
        self.status.store(status, Ordering::SeqCst);
    }

    fn requests(&self) -> Vec<Request> {
        self.requests.lock().unwrap().clone()
    }

    /// The requests it answered with a 2xx.
    fn accepted(&self) -> Vec<Request> {
        self.requests().into_iter().filter(|r| (200..300).contains(&r.status)).collect()
    }
}

type Shared = (Arc<Mutex<Vec<Request>>>, Arc<AtomicU16>);

async fn receive(
    axum::extract::State((requests, status)): axum::extract::State<Shared>,
    headers: axum::http::HeaderMap,
    body: axum::body::Bytes,
) -> axum::http::StatusCode {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
    let answer = status.load(Ordering::SeqCst);
    requests.lock().unwrap().push(Request {
        key: header(KEY_HEADER),
        signature: header(SIGNATURE_HEADER),
        content_type: header("content-type"),
        body: body.to_vec(),
        status: answer,
    });
    axum::http::StatusCode::from_u16(answer).unwrap()
}

/// HMAC-SHA256 (RFC 2104) over sha2, written here so the notifier's signature is checked by
/// a second implementation.
fn hmac_sha256(key: &[u8], message: &[u8]) -> String {
    let mut block = [0u8; 64];
    if key.len() > 64 {
        block[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        block[..key.len()].copy_from_slice(key);
    }
    let pad = |byte: u8| block.iter().map(|b| b ^ byte).collect::<Vec<u8>>();
    let inner = Sha256::new().chain_update(pad(0x36)).chain_update(message).finalize();
    hex::encode(Sha256::new().chain_update(pad(0x5c)).chain_update(inner).finalize())
}

/// Each mail's notice key (the last line of its text says it).
fn mail_keys(messages: &[Received]) -> Vec<String> {
    messages
        .iter()
        .map(|m| {
            let key = m.body.lines().rev().find_map(|l| l.strip_prefix("autocomp notify; notice "));
            key.map_or_else(|| format!("(no notice line in {:?})", m.body), str::to_owned)
        })
        .collect()
}

// ---- the tests ----

#[tokio::test]
async fn a_permanent_failure_is_one_mail_and_one_signed_webhook() {
    assert_eq!(hmac_sha256(b"Jefe", b"what do ya want for nothing?")[..16], *"5bdcc146bf60754e", "RFC 4231 case 2");
    let (sink, receiver) = (SmtpSink::start(), Receiver::start());
    let pipeline = Pipeline::new().await;
    let config = pipeline.configure("events = [\"failure\"]", &sink, &receiver);
    // Before the first pass: not news to a notifier that was not there.
    pipeline.batch("B0", &[("Checked", Outcome::Failure, failure("an old failure"))]).await;
    pipeline.first_pass(&config).await;

    let hostile = "checksum mismatch\r\nBcc: everyone@example.org\u{202e}";
    let events = pipeline.batch("B1", &[("Checked", Outcome::Failure, failure(hostile))]).await;
    let seq = events[1].seq;
    let report = pipeline.notify(&config).await;
    assert_eq!((report.found, report.sent, report.failed), (2, 2, 0), "{report:?}");
    assert!(report.cursor >= seq, "{report:?}");

    let mails = sink.messages();
    assert_eq!(mails.len(), 1, "{mails:#?}");
    let mail = &mails[0];
    assert_eq!(mail_keys(&mails), [format!("mail:failure:B1:{seq}")]);
    assert_eq!(mail.rcpt_tos, ["ops@example.org", "ann@example.org"]);
    assert_eq!(mail.mail_from, "autocomp@example.org");
    assert!(mail.subject.starts_with("[autocomp] checker failed on B1: checksum mismatch"), "{}", mail.subject);
    assert!(!mail.subject.contains(['\r', '\n', '\u{202e}']), "{:?}", mail.subject);
    assert!(mail.header("Bcc").is_empty(), "user text made a header: {:?}", mail.headers);
    assert!(mail.body.contains("autocomp show B1"), "{}", mail.body);
    assert!(mail.body.contains("\\u202e") && !mail.body.contains('\u{202e}'), "{}", mail.body);

    let requests = receiver.requests();
    assert_eq!(requests.len(), 1, "{requests:#?}");
    let hook = &requests[0];
    assert_eq!(hook.key, format!("webhook:failure:B1:{seq}"));
    assert_eq!(hook.signature, format!("sha256={}", hmac_sha256(SECRET.as_bytes(), &hook.body)));
    assert_eq!(hook.content_type, "application/json");
    let body = hook.json();
    assert_eq!((body["kind"].as_str(), body["batch"].as_str()), (Some("failure"), Some("B1")));
    assert_eq!((body["component"].as_str(), body["seq"].as_i64()), (Some("checker"), Some(seq.0)));
    assert_eq!(body["summary"].as_str(), Some(hostile), "the receiver gets the recorded text as it is");
    assert_eq!(body["key"].as_str(), Some(hook.key.as_str()));

    // Found again by the next pass: already in the outbox, not sent again.
    let again = pipeline.notify(&config).await;
    assert!(again.is_quiet(), "{again:?}");
    assert_eq!(again.render(), "");
    assert_eq!((sink.messages().len(), receiver.requests().len()), (1, 1));
}

#[tokio::test]
async fn transient_and_cancelled_failures_send_nothing() {
    let (sink, receiver) = (SmtpSink::start(), Receiver::start());
    let pipeline = Pipeline::new().await;
    let config = pipeline.configure("events = [\"failure\", \"success\"]", &sink, &receiver);
    pipeline.first_pass(&config).await;

    let mut transient = failure("the server is busy");
    transient["transient"] = json!(true);
    pipeline.batch("B1", &[("Checked", Outcome::Failure, transient)]).await;
    let b2 = pipeline.batch("B2", &[]).await[0].batch_id.clone();
    let cancel =
        NewEvent::new(EventType::new("Checked").unwrap(), Outcome::Failure, Agent::new("operator:ann").unwrap())
            .with_details(
                json!({"cancelled": true, "action": "cancel", "reason": "wrong delivery", "summary": "cancelled"}),
            );
    pipeline.store.cancel_run(&b2, &ComponentName::new("checker").unwrap(), cancel).await.unwrap();
    // A success that is not the last step's is no news either.
    pipeline.batch("B3", &[("Checked", Outcome::Success, json!({}))]).await;

    let report = pipeline.notify(&config).await;
    assert!(report.is_quiet(), "{report:?}");
    assert!(report.cursor > autocomp_model::Seq::ZERO);
    assert_eq!((sink.messages().len(), receiver.requests().len()), (0, 0));
}

#[tokio::test]
async fn the_digest_is_one_message_with_the_counts() {
    let (sink, receiver) = (SmtpSink::start(), Receiver::start());
    let pipeline = Pipeline::new().await;
    // 00:00 UTC: the day's digest is due whenever the test runs.
    let config = pipeline.configure("events = [\"digest\"]\ndigest_at = \"00:00\"", &sink, &receiver);
    let ok = || json!({});
    pipeline.batch("B1", &[("Checked", Outcome::Failure, failure("checksum mismatch"))]).await;
    pipeline.batch("B2", &[("Checked", Outcome::Success, ok())]).await;
    pipeline.batch("B3", &[("Checked", Outcome::Success, ok()), ("Approved", Outcome::Success, ok())]).await;
    let done = [
        ("Checked", Outcome::Success, ok()),
        ("Approved", Outcome::Success, ok()),
        ("Archived", Outcome::Success, ok()),
    ];
    pipeline.batch("B4", &done).await;
    pipeline.batch("B5", &[]).await;
    pipeline
        .steer(
            SteeringChange::Pause { component: Some(ComponentName::new("archiver").unwrap()), drain: false },
            "operator:ann",
        )
        .await;

    let first = pipeline.notify(&config).await;
    assert_eq!((first.found, first.sent), (2, 2), "{first:?}");
    let second = pipeline.notify(&config).await;
    assert_eq!((second.found, second.sent), (0, 0), "one digest a day: {second:?}");

    let mails = sink.messages();
    assert_eq!(mails.len(), 1, "{mails:#?}");
    let date = chrono_free_utc_date();
    assert_eq!(mail_keys(&mails), [format!("mail:digest:{date}")]);
    let text = &mails[0].body;
    assert!(mails[0].subject.contains("1 failed in 24h, 1 waiting for a person, 1 held"), "{}", mails[0].subject);
    for line in [
        "  checker: ready 1, failed 1, success 3",
        "  approve: person 1, waiting 2, success 2",
        "  archiver: ready 1, waiting 3, success 1",
        "Failed in the last 24 hours (and failed still):\n  checker: 1",
        "Waiting for a person:\n  approve: 1 (B2)",
        "  archiver: paused by operator:ann since",
    ] {
        assert!(text.contains(line), "{line:?} not in:\n{text}");
    }

    let requests = receiver.requests();
    assert_eq!(requests.len(), 1);
    assert_eq!(requests[0].key, format!("webhook:digest:{date}"));
    let body = requests[0].json();
    assert_eq!(body["states"]["checker"]["failed"], 1);
    assert_eq!(body["states"]["checker"]["ready"], 1);
    assert_eq!(body["states"]["archiver"]["success"], 1);
    assert_eq!(body["failed_last_24h"], json!({"checker": 1}));
    assert_eq!(body["waiting_for_person"], json!({"approve": {"count": 1, "oldest": ["B2"]}}));
    assert_eq!(body["held"][0]["what"], "archiver");
    assert_eq!(body["held"][0]["hold"], "pause");
}

/// Today's UTC date as the digest's key spells it, from the system clock.
fn chrono_free_utc_date() -> String {
    let days = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() / 86_400;
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}")
}

#[tokio::test]
async fn a_receiver_that_was_down_gets_the_notice_on_a_later_pass_and_only_once() {
    let (sink, receiver) = (SmtpSink::start(), Receiver::start());
    let pipeline = Pipeline::new().await;
    let config = pipeline.configure("events = [\"failure\"]", &sink, &receiver);
    pipeline.first_pass(&config).await;
    let seq = pipeline.batch("B1", &[("Checked", Outcome::Failure, failure("disk full"))]).await[1].seq;

    receiver.answer(503);
    sink.refuse();
    let report = pipeline.notify(&config).await;
    assert_eq!((report.found, report.sent, report.failed), (2, 0, 2), "{report:?}");
    assert!(report.errors.iter().any(|e| e.starts_with("webhook:failure:B1") && e.contains("503")), "{report:?}");
    assert!(report.errors.iter().any(|e| e.starts_with("mail:failure:B1") && e.contains("451")), "{report:?}");
    assert!(report.render().contains("notify: 2 new, 0 sent, 2 failed"), "{}", report.render());
    let outbox = pipeline.store.recent_notices(10).await.unwrap();
    assert!(outbox.iter().all(|n| n.attempts == 1 && n.sent_at.is_none() && n.last_error.is_some()), "{outbox:#?}");

    receiver.answer(200);
    sink.accept();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut passes = Vec::new();
    let delivered = wait_until_async(deadline, async || {
        passes.push(pipeline.notify(&config).await);
        receiver.accepted().len() == 1 && sink.messages().len() == 1
    })
    .await;
    assert!(delivered, "not delivered after the receivers came back: {passes:#?}");
    assert!(passes.iter().all(|p| p.found == 0), "nothing found twice: {passes:#?}");
    assert_eq!(passes.iter().map(|p| p.sent).sum::<u64>(), 2, "{passes:#?}");

    let after = pipeline.notify(&config).await;
    assert!(after.is_quiet(), "{after:?}");
    let requests = receiver.requests();
    assert_eq!(requests.iter().map(|r| r.status).collect::<Vec<_>>(), [503, 200], "{requests:#?}");
    assert!(requests.iter().all(|r| r.key == format!("webhook:failure:B1:{seq}")));
    assert_eq!(requests[0].body, requests[1].body, "the same notice both times");
    assert_eq!(mail_keys(&sink.messages()), [format!("mail:failure:B1:{seq}")]);
    let outbox = pipeline.store.recent_notices(10).await.unwrap();
    assert!(outbox.iter().all(|n| n.sent_at.is_some()), "{outbox:#?}");
}

#[tokio::test]
async fn state_news_goes_out_once_per_item() {
    let (sink, receiver) = (SmtpSink::start(), Receiver::start());
    let pipeline = Pipeline::new().await;
    let events = "events = [\"circuit\", \"paused_too_long\", \"overdue\", \"waiting_for_person\", \"success\"]\n\
                  paused_too_long = \"1ms\"\noverdue_after = \"1ms\"";
    let config = pipeline.configure(events, &sink, &receiver);
    pipeline.first_pass(&config).await;
    let ok = || json!({});
    pipeline.batch("B1", &[]).await;
    pipeline.batch("B2", &[("Checked", Outcome::Success, ok())]).await;
    let done = [
        ("Checked", Outcome::Success, ok()),
        ("Approved", Outcome::Success, ok()),
        ("Archived", Outcome::Success, ok()),
    ];
    let archived = pipeline.batch("B3", &done).await[3].seq;
    pipeline.steer(SteeringChange::Pause { component: None, drain: true }, "operator:ann").await;
    let checker = ComponentName::new("checker").unwrap();
    let opened = SteeringChange::Outcome {
        component: checker.clone(),
        batch: BatchId::new("B9").unwrap(),
        failed: true,
        break_after: 1,
        summary: "disk full".into(),
    };
    pipeline.steer(opened, "checker/1.0.0@host1#7").await;
    let steering = pipeline.store.steering().await.unwrap();
    let (drain_since, circuit_version) = (steering.pipeline.as_ref().unwrap().since, steering.version);

    // Overdue and paused take a moment of quiet (1 ms): pass until a pass finds nothing new.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut reports = Vec::new();
    let settled = wait_until_async(deadline, async || {
        let report = pipeline.notify(&config).await;
        let quiet = report.found == 0;
        reports.push(report);
        quiet && sink.messages().len() >= 5
    })
    .await;
    assert!(settled, "{reports:#?}\n{:#?}", sink.messages());
    let keys: BTreeSet<String> = mail_keys(&sink.messages()).into_iter().collect();
    let find = |prefix: &str| keys.iter().find(|k| k.starts_with(prefix)).cloned();
    let overdue = find("mail:overdue:checker:B1:").unwrap_or_else(|| panic!("no overdue item for B1: {keys:#?}"));
    let person = find("mail:person:approve:B2:").unwrap_or_else(|| panic!("no waiting item for B2: {keys:#?}"));
    let expected = BTreeSet::from([
        format!("mail:circuit:checker:{circuit_version}"),
        overdue,
        format!("mail:paused:all:{}", drain_since.millis()),
        person,
        format!("mail:success:B3:{archived}"),
    ]);
    // A human step's batch waiting longer than overdue_after may be overdue news as well
    // (as `autocomp alerts` counts it); nothing else is.
    let extra: Vec<&String> = keys.difference(&expected).collect();
    assert!(extra.iter().all(|k| k.starts_with("mail:overdue:approve:B2:")), "{keys:#?}");
    assert!(expected.is_subset(&keys), "{keys:#?}");

    // Found again and again: never sent twice, on either channel.
    for _ in 0..2 {
        let again = pipeline.notify(&config).await;
        assert_eq!((again.found, again.sent), (0, 0), "{again:?}");
    }
    let mails = sink.messages();
    assert_eq!(mails.len(), keys.len(), "{mails:#?}");
    let hooks: BTreeSet<String> = receiver.requests().into_iter().map(|r| r.key).collect();
    assert_eq!(hooks.len(), receiver.requests().len());
    assert_eq!(hooks, keys.iter().map(|k| k.replacen("mail:", "webhook:", 1)).collect());
    let circuit = mails.iter().find(|m| m.subject.contains("circuit open")).unwrap();
    assert!(circuit.body.contains("autocomp resume checker --rerun-failed"), "{}", circuit.body);
    let waiting = mails.iter().find(|m| m.subject.contains("waits for a person")).unwrap();
    assert!(waiting.body.contains("autocomp approve B2 --step approve"), "{}", waiting.body);
}

/// Runs as a notifier process when `CHILD` names a pipeline dir; a no-op test otherwise.
#[tokio::test]
async fn child_notifier_entry() {
    let Ok(dir) = std::env::var(CHILD) else { return };
    let dir = PathBuf::from(dir);
    let (store, index) = open(&dir).await;
    let config = NotifyConfig::load(&dir.join("config")).unwrap();
    let holder = format!("notify@test#{}", std::process::id());
    let passes: usize = std::env::var("NOTIFY_PASSES").ok().and_then(|n| n.parse().ok()).unwrap_or(2);
    let mut reports = Vec::new();
    for _ in 0..passes {
        reports.push(notify_once(Arc::clone(&store), Arc::clone(&index), &config, &holder).await.unwrap());
    }
    println!("REPORTS {}", serde_json::to_string(&reports).unwrap());
}

/// Runs `passes` notifier passes in a process of their own, with `env` set; their reports.
fn notifier_process(pipeline: &Pipeline, passes: usize, env: &[(&str, &Path)]) -> std::process::Child {
    let mut command = autocomp_test_servers::this_binary_running!("child_notifier_entry");
    command
        .env(CHILD, pipeline.dir.path())
        .env("NOTIFY_PASSES", passes.to_string())
        .env_remove("RUST_LOG")
        .env_remove("AUTOCOMP_CA_FILE")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (key, value) in env {
        command.env(key, value);
    }
    command.spawn().unwrap()
}

/// A notifier process's reports, once it exited 0.
fn reports_of(child: std::process::Child) -> Vec<Value> {
    let done = finish(child, Duration::from_secs(120));
    assert_eq!(done.code, Some(0), "{}", done.show());
    let line =
        done.stdout.lines().find_map(|l| l.strip_prefix("REPORTS ")).unwrap_or_else(|| panic!("{}", done.show()));
    serde_json::from_str::<Vec<Value>>(line).unwrap()
}

fn sum(reports: &[Value], field: &str) -> u64 {
    reports.iter().map(|r| r[field].as_u64().unwrap()).sum()
}

#[tokio::test]
async fn two_notifier_processes_send_each_item_once() {
    let (sink, receiver) = (SmtpSink::start(), Receiver::start());
    let pipeline = Pipeline::new().await;
    let config = pipeline.configure("events = [\"failure\", \"overdue\", \"waiting_for_person\"]", &sink, &receiver);
    pipeline.first_pass(&config).await;
    let mut seqs = Vec::new();
    for n in 1..=6 {
        let summary = format!("failure number {n}");
        seqs.push(pipeline.batch(&format!("F{n}"), &[("Checked", Outcome::Failure, failure(&summary))]).await[1].seq);
    }

    let children = [notifier_process(&pipeline, 2, &[]), notifier_process(&pipeline, 2, &[])];
    let mut totals = (0, 0);
    for child in children {
        let reports = reports_of(child);
        totals = (totals.0 + sum(&reports, "found"), totals.1 + sum(&reports, "sent"));
    }
    // Overdue and waiting items may or may not be due yet; the failures are, and every item
    // found is in the outbox once and sent once, whoever found or sent it.
    assert_eq!(totals.0, totals.1, "every notice found was sent, once: {totals:?}");
    assert!(totals.1 >= 12, "six failures, two channels: {totals:?}");
    let mails = mail_keys(&sink.messages());
    let unique: BTreeSet<&String> = mails.iter().collect();
    assert_eq!(unique.len(), mails.len(), "a mail went out twice: {mails:#?}");
    let hooks: Vec<String> = receiver.requests().into_iter().map(|r| r.key).collect();
    let unique_hooks: BTreeSet<&String> = hooks.iter().collect();
    assert_eq!(unique_hooks.len(), hooks.len(), "a webhook went out twice: {hooks:#?}");
    assert_eq!((mails.len() + hooks.len()) as u64, totals.1);
    for (n, seq) in (1..=6).zip(&seqs) {
        assert!(mails.contains(&format!("mail:failure:F{n}:{seq}")), "F{n}: {mails:#?}");
        assert!(hooks.contains(&format!("webhook:failure:F{n}:{seq}")), "F{n}: {hooks:#?}");
    }
    let outbox = pipeline.store.recent_notices(1_000).await.unwrap();
    assert!(outbox.iter().all(|n| n.sent_at.is_some() && n.attempts == 0), "{outbox:#?}");
}

/// A private CA and a certificate for 127.0.0.1 it signed, made by openssl in `dir`:
/// (`ca.pem`, `server.pem`, `server.key`).
fn certificates(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let script = "set -e
        openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 2 -subj '/CN=autocomp test CA'
        openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr -subj /CN=127.0.0.1
        printf 'subjectAltName=IP:127.0.0.1\\nbasicConstraints=CA:FALSE\\nextendedKeyUsage=serverAuth\\n' > ext.cnf
        openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out server.pem -days 2 \\
            -extfile ext.cnf";
    let made = Command::new("sh").args(["-c", script]).current_dir(dir).output();
    let made =
        made.unwrap_or_else(|e| panic!("openssl does not run ({e}): install it with `apt-get install -y openssl`"));
    assert!(made.status.success(), "openssl failed: {}", String::from_utf8_lossy(&made.stderr));
    (dir.join("ca.pem"), dir.join("server.pem"), dir.join("server.key"))
}

#[tokio::test]
async fn mail_goes_over_starttls_and_smtps_trusting_a_private_ca_and_not_without_it() {
    let certs = tempfile::tempdir().unwrap();
    let (ca, cert, key) = certificates(certs.path());
    let receiver = Receiver::start();
    let pipeline = Pipeline::new().await;
    let starttls = SmtpSink::start_with(SinkTls::StartTls { cert: cert.clone(), key: key.clone() });
    let smtps = SmtpSink::start_with(SinkTls::Implicit { cert, key });
    let mut config = pipeline.configure("events = [\"failure\"]", &starttls, &receiver);
    pipeline.first_pass(&config).await;

    for (n, sink, server) in [
        (1, &starttls, format!("smtp://127.0.0.1:{}?tls=starttls", starttls.port())),
        (2, &smtps, format!("smtps://127.0.0.1:{}", smtps.port())),
    ] {
        let file = pipeline.config_dir().join("notify.toml");
        let text = std::fs::read_to_string(&file).unwrap();
        let text = text.replace(&config.mail.as_ref().unwrap().server.url, &server);
        std::fs::write(&file, text).unwrap();
        config = NotifyConfig::load(&pipeline.config_dir()).unwrap();
        let seq = pipeline.batch(&format!("T{n}"), &[("Checked", Outcome::Failure, failure("tls"))]).await[1].seq;

        // Without the private CA the server is an impostor: not delivered, tried again later.
        let refused = reports_of(notifier_process(&pipeline, 1, &[]));
        assert_eq!((sum(&refused, "sent"), sum(&refused, "failed")), (1, 1), "{refused:#?}");
        let error = refused[0]["errors"][0].as_str().unwrap();
        assert!(error.starts_with(&format!("mail:failure:T{n}:{seq}: ")), "{error}");
        assert!(error.contains("certificate") || error.contains("Certificate"), "{error}");
        assert!(sink.messages().is_empty());

        // With it (as every client of the pipeline trusts one): delivered, once.
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut passes = Vec::new();
        let delivered = wait_until_async(deadline, async || {
            passes.extend(reports_of(notifier_process(&pipeline, 1, &[("AUTOCOMP_CA_FILE", &ca)])));
            !sink.messages().is_empty()
        })
        .await;
        assert!(delivered, "{passes:#?}");
        assert_eq!(mail_keys(&sink.messages()), [format!("mail:failure:T{n}:{seq}")]);
        assert_eq!(sum(&passes, "failed"), 0, "{passes:#?}");
    }
}

/// `autocomp` or `autocomp-monitor` with the pipeline's config dir (its `autocomp.toml` names
/// the test's store and index) and nothing from the environment that would change it.
fn binary_in(pipeline: &Pipeline, name: &str, args: &[&str]) -> Command {
    let dir = pipeline.dir.path();
    let shared = format!(
        "store = \"sqlite://{}\"\nindex = \"local:{}\"\n",
        dir.join("store.db").display(),
        dir.join("index").display()
    );
    // Written only when it differs: rewriting it (truncate, then write) while an earlier
    // binary_in's monitor read it made that monitor see an empty file, "no store backend
    // configured", and exit 2 (a CI failure of the notifier test).
    let path = pipeline.config_dir().join("autocomp.toml");
    if std::fs::read_to_string(&path).ok().as_deref() != Some(shared.as_str()) {
        std::fs::write(&path, shared).unwrap();
    }
    let mut command = Command::new(autocomp_e2e::binary(name));
    command.arg("--config-dir").arg(pipeline.config_dir()).args(args);
    for var in
        ["AUTOCOMP_STORE", "AUTOCOMP_INDEX", "AUTOCOMP_LOCKS", "AUTOCOMP_CONFIG_DIR", "RUST_LOG", "AUTOCOMP_CA_FILE"]
    {
        command.env_remove(var);
    }
    command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    command
}

#[tokio::test]
async fn the_cli_and_the_monitor_run_the_notifier_and_each_item_still_goes_out_once() {
    let (sink, receiver) = (SmtpSink::start(), Receiver::start());
    let pipeline = Pipeline::new().await;
    let config = pipeline.configure("events = [\"failure\"]", &sink, &receiver);
    pipeline.first_pass(&config).await;

    // From cron: quiet with nothing to send.
    let idle = finish(binary_in(&pipeline, "autocomp", &["notify"]).spawn().unwrap(), Duration::from_secs(60));
    assert_eq!((idle.code, idle.stdout.as_str()), (Some(0), ""), "{}", idle.show());

    // Inside the monitor, every second, while cron runs too.
    let mut monitor = binary_in(&pipeline, "autocomp-monitor", &["--listen", "127.0.0.1:0", "--notify-every", "1s"]);
    let mut monitor = KillOnDrop(monitor.spawn().unwrap());
    let seq = pipeline.batch("B1", &[("Checked", Outcome::Failure, failure("disk full"))]).await[1].seq;
    let cron = finish(binary_in(&pipeline, "autocomp", &["notify"]).spawn().unwrap(), Duration::from_secs(60));
    assert_eq!(cron.code, Some(0), "{}", cron.show());
    let delivered = wait_until_async(Instant::now() + Duration::from_secs(30), async || {
        receiver.accepted().len() == 1 && sink.messages().len() == 1
    })
    .await;
    assert!(delivered, "mails {:#?}, hooks {:#?}", sink.messages(), receiver.requests());
    // A few more monitor passes and another cron run send nothing more.
    let again = finish(binary_in(&pipeline, "autocomp", &["notify"]).spawn().unwrap(), Duration::from_secs(60));
    assert_eq!((again.code, again.stdout.as_str()), (Some(0), ""), "{}", again.show());
    let outbox = pipeline.store.recent_notices(100).await.unwrap();
    let sent: Vec<&str> = outbox.iter().filter(|n| n.sent_at.is_some()).map(|n| n.key.as_str()).collect();
    assert_eq!(sent.len(), 2, "{outbox:#?}");
    // A window in which the monitor makes three more passes, none of which may send
    // anything again: watched throughout, so a repeat fails the test as it happens.
    let repeated = wait_until_async(Instant::now() + Duration::from_secs(3), async || {
        receiver.requests().len() > 1 || sink.messages().len() > 1
    })
    .await;
    assert!(!repeated, "a notice went out twice");
    if let Some(status) = monitor.0.try_wait().unwrap() {
        let mut said = String::new();
        if let Some(mut stderr) = monitor.0.stderr.take() {
            std::io::Read::read_to_string(&mut stderr, &mut said).ok();
        }
        panic!("the monitor exited ({status}) instead of serving on:\n{said}");
    }
    // Said in full when it fails: each notice's attempts and last error tell a second send
    // after a timed-out answer apart from one the leases let through.
    let outbox = pipeline.store.recent_notices(100).await.unwrap();
    assert_eq!(receiver.requests().len(), 1, "the webhook went out once; outbox {outbox:#?}");
    let mails: Vec<String> = sink.messages().iter().map(|m| m.body.clone()).collect();
    assert_eq!(mail_keys(&sink.messages()), [format!("mail:failure:B1:{seq}")], "mails {mails:#?}, outbox {outbox:#?}");
}

/// A child process killed (and reaped) when the test ends, however it ends.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        self.0.kill().ok();
        self.0.wait().ok();
    }
}
