//! Catch-up under real OS processes: killed with SIGKILL at random points, and two processes
//! catching up on one index directory at once. After either, the index equals a fresh
//! rebuild. Children are this test binary re-run with `CHILD_MODE` set.

use std::path::Path;
use std::process::{Child, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use autocomp_model::*;
use autocomp_sboi::{BatchIndex, CatchUp, EngineOptions, IndexEngine, LocalIndex};
use autocomp_store::*;
use autocomp_test_servers::wait_until_every;
use serde_json::json;

const CHILD_MODE: &str = "AUTOCOMP_SBOI_TEST_CHILD";

fn small_commits() -> EngineOptions {
    EngineOptions {
        page_size: 100,
        commit_every: 200,
        writer_threads: 1,
        writer_memory_bytes: 15 << 20,
        ..EngineOptions::default()
    }
}

async fn open_store(dir: &Path) -> SqliteStore {
    let options = SqliteOptions { synchronous: Synchronous::Normal, ..SqliteOptions::default() };
    SqliteStore::open_with(dir.join("store.db"), options).await.unwrap()
}

/// Adds `count` batches numbered from `first`, each with a few events, and touches some
/// older ones so catch-ups re-index batches they have seen before.
async fn grow(store: &SqliteStore, first: usize, count: usize) {
    let agent = Agent::new("grow").unwrap();
    for n in first..first + count {
        let id = BatchId::new(format!("B{n:06}")).unwrap();
        let new = NewBatch::new(id.clone(), BatchType::new("RoundTrip").unwrap()).with_priority((n % 3) as i32);
        store.create_batch(new).await.unwrap();
        for (i, event_type) in ["Received", "Checked"].iter().enumerate() {
            let outcome = if (n + i) % 5 == 0 { Outcome::Failure } else { Outcome::Success };
            let event = NewEvent::new(EventType::new(*event_type).unwrap(), outcome, agent.clone())
                .with_details(json!({"n": n}));
            store.append_event(&id, event).await.unwrap();
        }
        if n % 4 == 0 && n > 0 {
            let older = BatchId::new(format!("B{:06}", n / 2)).unwrap();
            store.set_priority(&older, (n % 7) as i32).await.unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn child_process_entry() {
    let Ok(mode) = std::env::var(CHILD_MODE) else { return };
    let dir = std::path::PathBuf::from(std::env::var("WORK_DIR").unwrap());
    let store: Arc<dyn ObjectStore> = Arc::new(open_store(&dir).await);
    let engine = IndexEngine::open_with(dir.join("index"), small_commits()).unwrap();
    match mode.as_str() {
        // Catch up once; the parent kills us somewhere along the way.
        "catch-up" => {
            engine.catch_up(store.as_ref()).await.unwrap();
        }
        // Catch up and query until the index holds everything the parent announced.
        "concurrent" => {
            let index = LocalIndex::new(engine, Arc::clone(&store));
            let trigger = Trigger { requires: vec![EventType::new("Received").unwrap()], ..Trigger::default() };
            let final_head = dir.join("final-head");
            let deadline = Instant::now() + Duration::from_secs(120);
            loop {
                assert!(Instant::now() < deadline, "never caught up");
                index.query(&trigger).await.expect("queries never fail during concurrent catch-up");
                let cursor = match index.catch_up().await.expect("catch-up never fails") {
                    CatchUp::UpToDate { cursor } | CatchUp::Applied { cursor, .. } | CatchUp::WriterBusy { cursor } => {
                        cursor
                    }
                };
                if let Ok(text) = std::fs::read_to_string(&final_head)
                    && cursor.0 >= text.trim().parse::<i64>().unwrap()
                {
                    break;
                }
                tokio::task::yield_now().await;
            }
        }
        other => panic!("unknown child mode {other}"),
    }
}

fn spawn_child(mode: &str, dir: &Path) -> Child {
    autocomp_test_servers::this_binary_running!("child_process_entry")
        .env(CHILD_MODE, mode)
        .env("WORK_DIR", dir)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap()
}

async fn assert_equals_fresh_rebuild(store: &SqliteStore, engine: &IndexEngine, scratch: &Path) {
    let fresh = IndexEngine::open_with(scratch, small_commits()).unwrap();
    let indexed = fresh.rebuild(store).await.unwrap();
    let expected = fresh.dump().unwrap();
    assert_eq!(expected.len(), indexed);
    let actual = engine.dump().unwrap();
    assert_eq!(actual.len(), expected.len(), "one document per batch, no duplicates, none missing");
    for (a, e) in actual.iter().zip(&expected) {
        assert_eq!(a, e);
    }
    assert_eq!(engine.committed_cursor().unwrap(), store.head().await.unwrap());
}

#[tokio::test(flavor = "multi_thread")]
async fn catch_up_killed_at_random_points_ends_equal_to_a_rebuild() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_store(dir.path()).await;
    let seed = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos() as u64;
    eprintln!("kill-point seed {seed}");
    let mut random = seed;
    let mut next_random = move |bound: u64| {
        random = random.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (random >> 33) % bound
    };

    let mut killed_mid_way = 0;
    let mut batches = 0;
    let watcher = IndexEngine::open_with(dir.path().join("index"), small_commits()).unwrap();
    // Six rounds, or more (up to twelve) until two kills landed mid-way: a catch-up of a
    // round's 400 batches can end within milliseconds, before its kill.
    for round in 0..12 {
        if round >= 6 && killed_mid_way >= 2 {
            break;
        }
        grow(&store, batches, 400).await;
        batches += 400;
        let before = watcher.committed_cursor().unwrap();
        let head = store.head().await.unwrap();
        // Kill once the child has committed past a random point of this round's work, plus
        // a random extra moment, so the kill lands anywhere: mid-page, mid-commit, mid-merge.
        // The extra stays within 3 ms: up to 20 ms, the child had often finished (one round
        // of six killed mid-way once in CI).
        let target = Seq(before.0 + next_random((head.0 - before.0) as u64) as i64);
        let extra = Duration::from_micros(next_random(3_000));
        let mut child = spawn_child("catch-up", dir.path());
        let deadline = Instant::now() + Duration::from_secs(120);
        let mut finished = None;
        // Every millisecond, so the kill can land soon after any commit.
        let reached = wait_until_every(Duration::from_millis(1), deadline, || {
            finished = child.try_wait().unwrap();
            finished.is_some() || watcher.committed_cursor().unwrap() >= target
        });
        assert!(reached, "round {round}: the child made no progress");
        if finished.is_none() {
            // A random moment past the target: the kill is placed, not waited for.
            std::thread::sleep(extra);
        }
        match finished {
            Some(status) => assert!(status.success(), "round {round}: the child failed on its own"),
            None => {
                child.kill().unwrap();
                child.wait().unwrap();
            }
        }
        // Whatever was committed is consistent: the reopened index never went backwards.
        let reopened = IndexEngine::open_with(dir.path().join("index"), small_commits()).unwrap();
        let after = reopened.committed_cursor().unwrap();
        assert!(after >= before, "round {round}: cursor went from {before} back to {after}");
        if after < head {
            killed_mid_way += 1;
        }
        eprintln!("round {round}: target {target}, killed {extra:?} later; cursor {before} -> {after} of {head}");
    }
    assert!(killed_mid_way >= 2, "only {killed_mid_way} rounds were killed mid-way; the test proves little");

    let engine = IndexEngine::open_with(dir.path().join("index"), small_commits()).unwrap();
    engine.catch_up(&store).await.unwrap();
    assert_equals_fresh_rebuild(&store, &engine, &dir.path().join("fresh")).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn two_processes_catching_up_at_once_both_end_consistent() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_store(dir.path()).await;
    grow(&store, 0, 1_000).await;

    let children = [spawn_child("concurrent", dir.path()), spawn_child("concurrent", dir.path())];
    // More changes while both are catching up.
    grow(&store, 1_000, 300).await;
    std::fs::write(dir.path().join("final-head"), store.head().await.unwrap().to_string()).unwrap();
    for mut child in children {
        assert!(child.wait().unwrap().success(), "a concurrent catch-up surfaced an error");
    }

    let engine = IndexEngine::open_with(dir.path().join("index"), small_commits()).unwrap();
    assert_equals_fresh_rebuild(&store, &engine, &dir.path().join("fresh")).await;
}
