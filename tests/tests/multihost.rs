//! Multi-host mode end to end, every part a separate OS process on loopback: one store (the
//! store service over a SQLite file, or a PostgreSQL server every process connects to
//! directly), one sboi service, one ZooKeeper, and two processes of each component started
//! together as two hosts' crons would. Every batch must end where the embedded run ends it.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use autocomp_e2e::services::{Service, TOKEN, http_get};
use autocomp_e2e::zk::{self, ZooKeeper};
use autocomp_e2e::{PROBED, Pipeline, binary, copy_tree, finish, wait_until};
use autocomp_model::{Agent, BatchId, BatchType, EventType, NewBatch, NewEvent, Outcome, Trigger};
use autocomp_sboi::HttpIndex;
use autocomp_store::{HttpStore, ObjectStore, SqliteStore, open_store};
use autocomp_test_servers::postgres;
use serde_json::Value;

const STEPS: [&str; 4] = ["batch-trigger", "checksum-verifier", "structure-checker", "archiver"];

/// `autocomp status --format json` as {batch: {component: state}}.
fn status(config_dir: &Path, extra_env: &[(&str, &str)]) -> BTreeMap<String, BTreeMap<String, String>> {
    let output = Command::new(binary("autocomp"))
        .arg("--config-dir")
        .arg(config_dir)
        .args(["status", "--format", "json"])
        .envs(extra_env.iter().copied())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "status failed: {stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    let rows: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("status JSON ({e}): {stdout}"));
    rows.as_array()
        .unwrap_or_else(|| panic!("an array of rows: {stdout}"))
        .iter()
        .map(|row| {
            let states = row["components"].as_object().unwrap();
            let states = states.iter().map(|(k, v)| (k.clone(), v.as_str().unwrap().to_string())).collect();
            (row["id"].as_str().unwrap().to_string(), states)
        })
        .collect()
}

/// Where the multi-host pipeline keeps its store.
#[derive(Debug, Clone, Copy)]
enum StoreBackend {
    /// `autocomp-store serve` over a SQLite file; components and sboi reach it over HTTP.
    SqliteService,
    /// A PostgreSQL database every component, `sboi serve` and the CLI connect to directly.
    Postgres,
}

#[test]
fn two_hosts_per_component_over_the_services_end_every_batch_where_the_embedded_run_does() {
    two_hosts_per_component_end_every_batch_where_the_embedded_run_does(StoreBackend::SqliteService);
}

#[test]
fn two_hosts_per_component_straight_to_postgres_end_every_batch_where_the_embedded_run_does() {
    two_hosts_per_component_end_every_batch_where_the_embedded_run_does(StoreBackend::Postgres);
}

/// The demo's deliveries through two processes of each component at once (two hosts' crons),
/// the index behind `sboi serve`, locks in ZooKeeper, the store as `backend` says. Every
/// batch must end where the embedded demo ends it, with one result per (batch, event type),
/// no run left open and no lock left held.
fn two_hosts_per_component_end_every_batch_where_the_embedded_run_does(backend: StoreBackend) {
    zk::require_installed();
    // The reference: the embedded demo (one SQLite file, local index, flock locks).
    let embedded = tempfile::tempdir().unwrap();
    let demo =
        Command::new(binary("autocomp")).args(["demo", "--batches", "20", "--dir"]).arg(embedded.path()).output();
    let demo = demo.unwrap();
    assert!(demo.status.success(), "demo: {}", String::from_utf8_lossy(&demo.stderr));
    let mut expected = status(&embedded.path().join("config"), &[]);
    assert_eq!(expected.len(), 20);
    // The demo's Python step runs after these; the hosts here run the Rust components only.
    for components in expected.values_mut() {
        components.remove("catalogue");
    }

    // The same deliveries and component configs, pointed at the services.
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    copy_tree(&embedded.path().join("incoming"), &root.join("incoming"));
    for sub in ["config", "archive", "logs"] {
        std::fs::create_dir_all(root.join(sub)).unwrap();
    }
    let zookeeper = ZooKeeper::standalone();
    // `store_url` is what components, sboi and the CLI are given; `truth_url` is read at the end.
    let (store_service, store_url, truth_url) = match backend {
        StoreBackend::SqliteService => {
            let service = Service::store(&root.join("store.db"), &root.join("logs"));
            let url = service.url();
            (Some(service), url, format!("sqlite://{}", root.join("store.db").display()))
        }
        StoreBackend::Postgres => {
            let url = postgres::shared().unique_database();
            (None, url.clone(), url)
        }
    };
    let index = Service::index(&store_url, &root.join("index"), &root.join("logs"));
    std::fs::write(
        root.join("config/autocomp.toml"),
        format!(
            "store = \"{store_url}\"\nindex = \"{}\"\nlocks = \"{}\"\n",
            index.url(),
            zookeeper.url("autocomp", "10s")
        ),
    )
    .unwrap();
    for step in STEPS {
        let text = std::fs::read_to_string(embedded.path().join(format!("config/{step}.toml"))).unwrap();
        let text = text.replace(&embedded.path().display().to_string(), &root.display().to_string());
        std::fs::write(root.join(format!("config/{step}.toml")), text).unwrap();
    }

    // Cron on two hosts: each round starts both processes of a step at once.
    let mut rounds = 0;
    loop {
        rounds += 1;
        assert!(rounds <= 12, "the pipeline did not settle in 11 rounds");
        let mut processed = 0;
        for step in STEPS {
            let children: Vec<_> = (0..2)
                .map(|_| {
                    Command::new(binary(step))
                        .arg("--config-dir")
                        .arg(root.join("config"))
                        .env("AUTOCOMP_TOKEN", TOKEN)
                        .env_remove("AUTOCOMP_STORE")
                        .env_remove("AUTOCOMP_INDEX")
                        .env_remove("AUTOCOMP_LOCKS")
                        .env_remove("PGUSER")
                        .env_remove("PGPASSWORD")
                        .stdin(Stdio::null())
                        .stdout(Stdio::piped())
                        .stderr(Stdio::piped())
                        .spawn()
                        .unwrap()
                })
                .collect();
            for child in children {
                let run = finish(child, Duration::from_secs(120));
                assert!(matches!(run.code, Some(0 | 1 | 3)), "{step} in round {rounds}: {}", run.show());
                processed += run.stdout.lines().filter(|l| !l.trim().is_empty()).count();
            }
        }
        if processed == 0 {
            break;
        }
    }

    // The operator CLI works unchanged against the services too.
    let actual = status(&root.join("config"), &[("AUTOCOMP_TOKEN", TOKEN)]);
    assert_eq!(actual, expected, "every batch ends where the embedded run ends it");
    assert_eq!(std::fs::read_dir(root.join("archive")).unwrap().count(), 16, "every good batch archived once");

    let explained = Command::new(binary("autocomp"))
        .arg("--config-dir")
        .arg(root.join("config"))
        .args(["explain", "B400022028244-RT1", "--component", "archiver", "--format", "json"])
        .env("AUTOCOMP_TOKEN", TOKEN)
        .output()
        .unwrap();
    assert!(explained.status.success(), "explain: {}", String::from_utf8_lossy(&explained.stderr));
    let explained: Value = serde_json::from_slice(&explained.stdout).unwrap();
    assert_eq!(explained["state"], "waiting", "the bad checksum keeps it from the archiver: {explained:#}");
    assert_eq!(explained["ready_in_index"], false, "the index service's document agrees: {explained:#}");
    assert_eq!(explained["ready_in_store"], false);
    // An operator action through the store service: one event, and the batch shows it.
    let autocomp = |args: &[&str]| {
        let output = Command::new(binary("autocomp"))
            .arg("--config-dir")
            .arg(root.join("config"))
            .args(args)
            .env("AUTOCOMP_TOKEN", TOKEN)
            .output()
            .unwrap();
        assert!(output.status.success(), "autocomp {args:?}: {}", String::from_utf8_lossy(&output.stderr));
        String::from_utf8(output.stdout).unwrap()
    };
    autocomp(&["--as", "tester", "prioritize", "B400022028244-RT1", "7", "--reason", "re-delivery expected"]);
    let shown: Value = serde_json::from_str(&autocomp(&["show", "B400022028244-RT1", "--format", "json"])).unwrap();
    assert_eq!(shown["priority"], 7, "{shown:#}");
    let last = shown["events"].as_array().unwrap().last().unwrap().clone();
    assert_eq!((last["type"].as_str(), last["agent"].as_str()), (Some("Prioritized"), Some("operator:tester")));
    assert_eq!(autocomp(&["locks", "--format", "json"]).trim(), "[]", "no lock held in ZooKeeper");

    for (token, code) in [(None, 2), (Some(TOKEN), 0)] {
        let mut reindex = Command::new(binary("autocomp"));
        reindex.arg("--config-dir").arg(root.join("config")).arg("reindex").env_remove("AUTOCOMP_TOKEN");
        if let Some(token) = token {
            reindex.env("AUTOCOMP_TOKEN", token);
        }
        let reindex = reindex.output().unwrap();
        let text = format!("{}{}", String::from_utf8_lossy(&reindex.stdout), String::from_utf8_lossy(&reindex.stderr));
        assert_eq!(reindex.status.code(), Some(code), "reindex with token {token:?}: {text}");
        if code == 0 {
            assert!(text.contains("reindexed 20 batches on http://"), "{text}");
        } else {
            assert!(text.contains("AUTOCOMP_TOKEN"), "says where the token comes from: {text}");
        }
    }

    // Nothing ran twice: one result per (batch, event type) from the components, no run left
    // open, no lock left.
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let truth = runtime.block_on(open_store(&truth_url)).unwrap();
    let batches = runtime.block_on(truth.list_batches(None, 100)).unwrap();
    assert_eq!(batches.len(), 20, "every delivery registered once");
    for batch in &batches {
        let mut results: BTreeMap<&str, usize> = BTreeMap::new();
        for event in batch.events.iter().filter(|e| !e.agent.as_str().starts_with("operator:")) {
            *results.entry(event.event_type.as_str()).or_default() += 1;
        }
        assert!(results.values().all(|&n| n == 1), "{}: results {results:?}", batch.id);
        let successes = batch.events.iter().filter(|e| e.outcome == Outcome::Success).count();
        assert!(successes >= 1, "{} was received", batch.id);
    }
    assert!(runtime.block_on(truth.open_runs(None)).unwrap().is_empty(), "no run left open");
    let left: Vec<_> = zookeeper.tree("/autocomp").into_iter().filter(|node| node.ephemeral_owner != 0).collect();
    assert!(left.is_empty(), "lock nodes left behind: {left:?}");
    drop(index);
    drop(store_service);
}

/// A child process killed when the test ends, however it ends.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        self.0.kill().ok();
        self.0.wait().ok();
    }
}

fn dead_url() -> String {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    format!("http://127.0.0.1:{port}")
}

#[test]
fn an_unreachable_store_or_index_exits_5_naming_it_and_claims_nothing() {
    let pipeline = Pipeline::new(env!("CARGO_BIN_EXE_probe-component"));
    pipeline.register(3);
    let head = pipeline.head();

    let dead = dead_url();
    pipeline.use_backend("store", &dead);
    let run = pipeline.run(&[]);
    assert_eq!(run.code, Some(5), "{}", run.show());
    assert!(run.stderr.contains(&dead) && run.stderr.contains("store"), "{}", run.show());
    assert!(run.elapsed < Duration::from_secs(5), "a first contact fails at once: {:?}", run.elapsed);

    let store = Service::store(&pipeline.path("store.db"), &pipeline.path(""));
    pipeline.use_backend("store", &store.url());
    let dead = dead_url();
    pipeline.use_backend("index", &dead);
    let run = pipeline.run(&[]);
    assert_eq!(run.code, Some(5), "{}", run.show());
    assert!(run.stderr.contains(&dead) && run.stderr.contains("index unavailable"), "{}", run.show());
    assert!(!run.stderr.contains("store unavailable"), "the index's outage, not the store's: {}", run.show());
    assert_eq!(pipeline.head(), head, "nothing claimed, nothing written");
    assert!(pipeline.open_runs().is_empty());
}

#[test]
fn an_index_service_started_before_its_store_waits_for_it_and_then_serves() {
    let pipeline = Pipeline::new(env!("CARGO_BIN_EXE_probe-component"));
    let ids = pipeline.register(3);
    let db_url = format!("sqlite://{}?synchronous=normal", pipeline.path("store.db").display());
    let mut store = Service::store_unstarted(&db_url, &pipeline.path(""));
    let mut index = Service::index_unstarted(&store.url(), &pipeline.path("index"), &pipeline.path(""), "sboi");
    index.launch();
    // The monitor, started at the same time, waits for both.
    let monitor_port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let monitor_log = std::fs::File::create(pipeline.path("monitor.log")).unwrap();
    let monitor = Command::new(binary("autocomp-monitor"))
        .arg("--config-dir")
        .arg(pipeline.config_dir())
        .args(["--listen", &format!("127.0.0.1:{monitor_port}"), "--store", &store.url(), "--index", &index.url()])
        .env("AUTOCOMP_TOKEN", TOKEN)
        .env_remove("AUTOCOMP_TOKEN_FILE")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(monitor_log)
        .spawn()
        .unwrap();
    let _monitor = KillOnDrop(monitor);
    let monitor_health = format!("http://127.0.0.1:{monitor_port}/health");

    // Up without its store, as at a boot that starts everything at once: /health says what
    // it waits for, the log says it keeps trying, and it does not exit.
    let health = format!("{}/health", index.url());
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut answer = None;
    let waiting = wait_until(deadline, || {
        answer = http_get(&health);
        answer.as_ref().is_some_and(|(status, _)| *status == 503) && index.logs().contains("waiting for the store")
    });
    assert!(waiting, "no waiting answer: {answer:?}\n{}", index.logs());
    let (_, body) = answer.unwrap();
    let body: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["status"], "starting", "{body}");
    assert!(body["waiting_for"].as_str().unwrap().contains(&store.url()), "{body}");
    let refused = autocomp_e2e::services::http_request("POST", &format!("{}/v1/catch_up", index.url()), "{}");
    assert_eq!(refused.map(|(status, _)| status), Some(503), "operations wait too");
    assert!(index.is_running(), "{}", index.logs());
    let monitor_waits = wait_until(Instant::now() + Duration::from_secs(30), || {
        http_get(&monitor_health).is_some_and(|(status, body)| status == 503 && body.contains("\"starting\""))
    });
    let monitor_said = || std::fs::read_to_string(pipeline.path("monitor.log")).unwrap_or_default();
    assert!(monitor_waits, "the monitor does not say it waits: {}", monitor_said());

    // The store comes up: the index service follows it, the monitor serves, and the
    // pipeline moves.
    store.restart();
    let deadline = Instant::now() + Duration::from_secs(30);
    assert!(wait_until(deadline, || http_get(&health).is_some_and(|(status, _)| status == 200)), "{}", index.logs());
    let serving = wait_until(deadline, || http_get(&monitor_health).is_some_and(|(status, _)| status == 200));
    assert!(serving, "the monitor never served: {}", monitor_said());
    assert!(monitor_said().contains("waiting for the store and the index"), "{}", monitor_said());
    pipeline.use_backend("store", &store.url());
    pipeline.use_backend("index", &index.url());
    let run = pipeline.run(&[]);
    assert_eq!(run.code, Some(0), "{}", run.show());
    for id in &ids {
        assert_eq!(pipeline.events(id, PROBED).len(), 1, "{id}: {}", run.show());
    }
}

#[test]
fn components_fail_over_between_index_services_and_keep_moving_with_either_killed() {
    let pipeline = Pipeline::new(env!("CARGO_BIN_EXE_probe-component"));
    let store = Service::store(&pipeline.path("store.db"), &pipeline.path(""));
    let mut first = Service::index(&store.url(), &pipeline.path("index-a"), &pipeline.path(""));
    let mut second = Service::index_unstarted(&store.url(), &pipeline.path("index-b"), &pipeline.path(""), "sboi-b");
    second.restart();
    pipeline.use_backend("store", &store.url());
    pipeline.use_backend("index", &format!("{},{}", first.url(), second.url()));

    // `dead`: the index service listed first is down, so the pass must say it failed over.
    let moves = |round: &str, dead: &str| {
        let ids: Vec<BatchId> = (1..=2).map(|n| pipeline.register_one(&format!("{round}{n}"), true)).collect();
        let run = pipeline.run(&[]);
        assert_eq!(run.code, Some(0), "{}", run.show());
        for id in &ids {
            assert_eq!(pipeline.events(id, PROBED).len(), 1, "{id} done once: {}", run.show());
        }
        if !dead.is_empty() {
            assert!(run.stderr.contains(&format!("index service at {dead} not answering")), "{}", run.show());
        }
    };
    moves("BOTH", "");
    // Either one killed, even at the start of a pass: the other answers.
    first.kill();
    moves("SECOND", &first.url());
    first.restart();
    second.kill();
    moves("FIRST", "");
    let status = Command::new(binary("autocomp"))
        .arg("--config-dir")
        .arg(pipeline.config_dir())
        .args(["status", "--format", "json"])
        .env("AUTOCOMP_TOKEN", TOKEN)
        .output()
        .unwrap();
    assert!(status.status.success(), "the CLI fails over too: {}", String::from_utf8_lossy(&status.stderr));
}

#[test]
fn a_store_restart_in_the_middle_of_a_run_records_no_event_twice() {
    let pipeline = Pipeline::new(env!("CARGO_BIN_EXE_probe-component"));
    let ids = pipeline.register(40);
    let mut store = Service::store(&pipeline.path("store.db"), &pipeline.path(""));
    pipeline.use_backend("store", &format!("{}?retry_for=20s", store.url()));
    let ledger = pipeline.path("ledger.txt");
    pipeline.configure(&format!(
        "max_threads = 2\nqueue_size = 100\n\n[settings]\nwork_time = \"40ms\"\nledger = \"{}\"\n",
        ledger.display()
    ));

    let mut child = pipeline.spawn(&[]);
    // Kill the store service twice while the run is working; restart it on the same port.
    for done in [6, 16] {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        let progressed =
            wait_until(deadline, || pipeline.ledger().len() >= done || child.try_wait().ok().flatten().is_some());
        assert!(
            progressed && pipeline.ledger().len() >= done,
            "the run stopped early: {}",
            finish(child, Duration::ZERO).show()
        );
        // Down until a batch's work ends, so that its append meets the dead service.
        let at_kill = pipeline.ledger().len();
        store.kill();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        assert!(wait_until(deadline, || pipeline.ledger().len() > at_kill), "no work finished while down");
        store.restart();
    }
    let first = finish(child, Duration::from_secs(60));
    assert!(matches!(first.code, Some(0 | 1 | 5)), "{}", first.show());
    let retried = first.stderr.matches("not answering; retrying").count();
    assert!(retried >= 2, "both restarts were ridden out by retries: {}", first.show());
    eprintln!("first run: exit {:?}, {retried} retries, {} results", first.code, first.stdout.lines().count());
    // Whatever the first run could not finish, the next ones do.
    for _ in 0..3 {
        if ids.iter().all(|id| !pipeline.events(id, PROBED).is_empty()) {
            break;
        }
        let again = pipeline.run(&[]);
        assert!(matches!(again.code, Some(0 | 1)), "{}", again.show());
    }
    for id in &ids {
        let results = pipeline.events(id, PROBED);
        assert_eq!(results.len(), 1, "{id}: exactly one result, got {results:?}\nfirst run: {}", first.show());
        assert_eq!(results[0].outcome, Outcome::Success);
    }
    assert!(pipeline.open_runs().is_empty(), "no run left open");
}

#[test]
fn the_index_service_keeps_answering_while_the_store_restarts_and_then_follows_on() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let mut store = Service::store(&root.join("store.db"), root);
    let mut index = Service::index(&store.url(), &root.join("index"), root);
    let truth = runtime.block_on(SqliteStore::open(root.join("store.db"))).unwrap();
    let client = HttpIndex::with_token(&index.url(), Some(TOKEN.into())).unwrap();
    let over_http = HttpStore::with_token(&store.url(), Some(TOKEN.into())).unwrap();
    let received = |store: &dyn ObjectStore, name: &str| {
        let id = BatchId::new(name).unwrap();
        let new = NewBatch::new(id.clone(), BatchType::new("RoundTrip").unwrap());
        runtime.block_on(store.create_batch(new)).unwrap();
        let event = NewEvent::new(EventType::new("Data_Received").unwrap(), Outcome::Success, Agent::new("t").unwrap());
        runtime.block_on(store.append_event(&id, event)).unwrap();
    };
    let requires_received = Trigger { requires: vec![EventType::new("Data_Received").unwrap()], ..Trigger::default() };
    let visible = |name: &str, within: Duration| {
        let trigger = Trigger { batches: vec![BatchId::new(name).unwrap()], ..requires_received.clone() };
        wait_until(Instant::now() + within, || {
            runtime.block_on(client.query_with(&trigger, false)).is_ok_and(|answer| answer.batches.len() == 1)
        })
    };
    // Through the store service the follower's long poll answers at once after a write.
    for n in 0..10 {
        let name = format!("S{n:03}");
        received(&over_http, &name);
        assert!(visible(&name, Duration::from_secs(2)), "{name} not visible within 2 s");
    }

    // The store goes away: the index keeps answering; fresh queries say they are stale.
    store.kill();
    let asked = Instant::now();
    let answer = runtime.block_on(client.query_with(&requires_received, true)).unwrap();
    assert!(answer.stale && answer.batches.len() == 10, "{answer:?}");
    assert!(asked.elapsed() < Duration::from_secs(4), "a fresh query is bounded: {:?}", asked.elapsed());
    assert_eq!(index.health()["status"], "ok");

    // Back on the same port: the follower carries on by itself.
    store.restart();
    received(&truth, "AFTER"); // another writer on the same file
    assert!(visible("AFTER", Duration::from_secs(15)), "the follower did not resume: {}", index.logs());
    assert!(index.is_running(), "the index service survived the store's restart");
    // The lag gauge is refreshed by the follower's next look at the store head.
    let caught_up = wait_until(Instant::now() + Duration::from_secs(10), || index.health()["index_lag"] == 0);
    assert!(caught_up, "{}", index.health());
}
