//! The store under real OS processes: concurrent writers on one file, and a writer killed
//! with SIGKILL mid-append. Children are this test binary re-run with `CHILD_MODE` set; they
//! print `ACK <seq> <batch> <n>` to stdout only after the store acknowledged the append.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use autocomp_model::*;
use autocomp_store::*;
use serde_json::json;

const CHILD_MODE: &str = "AUTOCOMP_STORE_TEST_CHILD";
const BATCHES: usize = 10;

fn batch_id(n: usize) -> BatchId {
    BatchId::new(format!("B{n}")).unwrap()
}

/// Runs as the child when `CHILD_MODE` is set; an ordinary no-op test otherwise.
#[tokio::test]
async fn child_process_entry() {
    let Ok(mode) = std::env::var(CHILD_MODE) else { return };
    let path = std::env::var("STORE_PATH").unwrap();
    let writer: String = std::env::var("WRITER").unwrap();
    let count: usize = std::env::var("COUNT").unwrap().parse().unwrap();
    let options = SqliteOptions {
        synchronous: if mode == "durable" { Synchronous::Full } else { Synchronous::Normal },
        ..SqliteOptions::default()
    };
    let store = SqliteStore::open_with(&path, options).await.unwrap();
    let agent = Agent::new(format!("writer-{writer}")).unwrap();
    let event_type = EventType::new("Appended").unwrap();
    for n in 0..count {
        let batch = batch_id(n % BATCHES);
        let event = NewEvent::new(event_type.clone(), Outcome::Success, agent.clone())
            .with_details(json!({"writer": writer, "n": n}));
        let recorded = store.append_event(&batch, event).await.unwrap();
        // Flushed per line, so the parent sees every ack the store gave before a kill.
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        writeln!(out, "ACK {} {} {}", recorded.seq, batch, n).unwrap();
        out.flush().unwrap();
    }
}

fn spawn_writer(store: &Path, mode: &str, writer: &str, count: usize) -> Child {
    autocomp_test_servers::this_binary_running!("child_process_entry")
        .env(CHILD_MODE, mode)
        .env("STORE_PATH", store)
        .env("WRITER", writer)
        .env("COUNT", count.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap()
}

#[derive(Debug, Clone, PartialEq)]
struct Ack {
    seq: Seq,
    batch: String,
    n: usize,
}

fn parse_ack(line: &str) -> Option<Ack> {
    let mut parts = line.strip_prefix("ACK ")?.split(' ');
    let seq = Seq(parts.next()?.parse().ok()?);
    let batch = parts.next()?.to_owned();
    let n = parts.next()?.parse().ok()?;
    Some(Ack { seq, batch, n })
}

async fn prepare_store(path: &Path) -> SqliteStore {
    let store = SqliteStore::open(path).await.unwrap();
    for n in 0..BATCHES {
        store.create_batch(NewBatch::new(batch_id(n), BatchType::new("Test").unwrap())).await.unwrap();
    }
    store
}

#[tokio::test(flavor = "multi_thread")]
async fn two_processes_appending_at_once_lose_nothing() {
    const PER_WRITER: usize = 5_000;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.db");
    let store = prepare_store(&path).await;

    let children: Vec<(String, Child)> =
        ["a", "b"].iter().map(|w| (w.to_string(), spawn_writer(&path, "fast", w, PER_WRITER))).collect();
    let mut acks_by_writer = Vec::new();
    for (writer, mut child) in children {
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let acks: Vec<Ack> = stdout.lines().map_while(Result::ok).filter_map(|l| parse_ack(&l)).collect();
        assert!(child.wait().unwrap().success(), "writer {writer} failed");
        acks_by_writer.push((writer, acks));
    }

    let mut all_seqs = Vec::new();
    for (writer, acks) in &acks_by_writer {
        assert_eq!(acks.len(), PER_WRITER, "writer {writer} acknowledged every append");
        assert!(acks.windows(2).all(|w| w[0].seq < w[1].seq), "writer {writer}: seqs increase in ack order");
        all_seqs.extend(acks.iter().map(|a| a.seq));
    }
    all_seqs.sort();
    all_seqs.dedup();
    assert_eq!(all_seqs.len(), 2 * PER_WRITER, "every seq is unique across processes");

    let mut stored = 0;
    for batch in store.list_batches(None, BATCHES).await.unwrap() {
        stored += batch.events.len();
        assert!(batch.events.windows(2).all(|w| w[0].seq < w[1].seq), "{}: log in seq order", batch.id);
        for (writer, _) in &acks_by_writer {
            let ns: Vec<u64> = batch
                .events
                .iter()
                .filter(|e| e.details["writer"] == writer.as_str())
                .map(|e| e.details["n"].as_u64().unwrap())
                .collect();
            assert_eq!(ns.len(), PER_WRITER / BATCHES);
            assert!(ns.windows(2).all(|w| w[0] < w[1]), "{}: writer {writer}'s events in append order", batch.id);
        }
    }
    assert_eq!(stored, 2 * PER_WRITER, "none lost");
    for (_, acks) in &acks_by_writer {
        for ack in acks.iter().step_by(97) {
            let batch = store.get_batch(&BatchId::new(&ack.batch).unwrap()).await.unwrap();
            let event = batch.events.iter().find(|e| e.seq == ack.seq).expect("acknowledged event present");
            assert_eq!(event.details["n"], ack.n);
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_writer_killed_mid_append_leaves_every_acknowledged_event() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.db");
    drop(prepare_store(&path).await);

    // Kill at a different point each round; the durable setting is the default one.
    for (round, kill_after) in [37usize, 211, 503].into_iter().enumerate() {
        let mut child = spawn_writer(&path, "durable", &format!("round{round}"), 1_000_000);
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut acks = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(120);
        let mut line = String::new();
        while acks.len() < kill_after {
            assert!(Instant::now() < deadline, "child acknowledged only {} appends in time", acks.len());
            line.clear();
            assert!(stdout.read_line(&mut line).unwrap() > 0, "child ended early");
            acks.extend(parse_ack(line.trim_end()));
        }
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        // Acks the child printed before it died were acknowledged by the store too.
        acks.extend(stdout.lines().map_while(Result::ok).filter_map(|l| parse_ack(&l)));

        let integrity: String = rusqlite::Connection::open(&path)
            .unwrap()
            .query_row("PRAGMA integrity_check", [], |row| row.get(0))
            .unwrap();
        assert_eq!(integrity, "ok", "round {round}");
        let store = SqliteStore::open(&path).await.unwrap();
        let mut present = std::collections::HashSet::new();
        for batch in store.list_batches(None, BATCHES).await.unwrap() {
            present.extend(batch.events.iter().map(|e| e.seq));
        }
        let missing: Vec<_> = acks.iter().filter(|a| !present.contains(&a.seq)).collect();
        assert!(missing.is_empty(), "round {round}: acknowledged but lost: {missing:?}");
        // And the store takes writes again.
        store
            .append_event(
                &batch_id(0),
                NewEvent::new(EventType::new("After").unwrap(), Outcome::Success, Agent::new("t").unwrap()),
            )
            .await
            .unwrap();
    }
}
