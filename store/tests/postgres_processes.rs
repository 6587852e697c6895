//! The PostgreSQL store under real OS processes on a real server: the change feed followed
//! while two processes write at once, processes racing to migrate an empty database, the
//! schema-version refusals, and a client killed with SIGKILL mid-write.
//!
//! Children are this test binary re-run with `CHILD_MODE` set (as in `processes.rs`). A
//! writer prints `ACK <seq> <batch> <kind> <writer> <n>` on stdout only after the store
//! acknowledged the write (`kind`: create, append, once, claim, fenced, content, priority),
//! `FENCED <batch> <component> <generation>` when a fenced append was refused, and
//! `DONE <writer> <ops>` when a task finished. Every wait polls with a deadline.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ExitStatus, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use autocomp_model::*;
use autocomp_store::postgres::LATEST_VERSION;
use autocomp_store::*;
use autocomp_test_servers::postgres::{NamedDatabase, Postgres, shared};
use serde_json::{Map, Value, json};

const CHILD_MODE: &str = "AUTOCOMP_PG_PROCESSES_CHILD";
/// How long any one test may take before it fails instead of hanging.
const TEST_LIMIT: Duration = Duration::from_secs(180);
const COMPONENTS: [&str; 3] = ["alpha", "beta", "gamma"];

// ---------------------------------------------------------------------------------------
// The child side.

/// Runs as the child when `CHILD_MODE` is set; an ordinary no-op test otherwise.
#[tokio::test(flavor = "multi_thread")]
async fn child_process_entry() {
    let Ok(mode) = std::env::var(CHILD_MODE) else { return };
    let url = std::env::var("PG_URL").unwrap();
    let var = |name: &str| std::env::var(name).unwrap_or_else(|_| panic!("child {mode}: ${name} not set"));
    match mode.as_str() {
        "writers" | "victim" => {
            let name = var("PROC");
            let tasks: usize = var("TASKS").parse().unwrap();
            let ops: usize = var("OPS").parse().unwrap();
            let hot: usize = var("HOT").parse().unwrap();
            let seed: u64 = var("SEED").parse().unwrap();
            let store = PgStore::open(&url).await.unwrap_or_else(|e| panic!("child {name}: open: {e}"));
            let handles: Vec<_> = (0..tasks)
                .map(|task| {
                    let writer = Writer {
                        store: store.clone(),
                        name: format!("{name}.{task}"),
                        rng: Rng::new(seed ^ ((task as u64 + 1) << 32) ^ name.len() as u64),
                        hot,
                    };
                    if mode == "writers" {
                        tokio::spawn(writer.feed_workload(ops))
                    } else {
                        tokio::spawn(writer.victim_workload())
                    }
                })
                .collect();
            for handle in handles {
                handle.await.unwrap();
            }
        }
        "open" => {
            say("READY");
            let mut line = String::new();
            std::io::stdin().read_line(&mut line).unwrap();
            assert_eq!(line.trim(), "GO", "the parent's start signal");
            let started = Instant::now();
            let store = PgStore::open(&url).await.unwrap_or_else(|e| panic!("open by pid {}: {e}", std::process::id()));
            let head = store.head().await.unwrap();
            let version = store.schema_version().await.unwrap();
            say(&format!("OPENED {version} {} {}", head.0, started.elapsed().as_millis()));
        }
        other => panic!("unknown child mode {other:?}"),
    }
}

/// One line on stdout, flushed at once, so the parent sees every ack given before a kill.
fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}").unwrap();
    out.flush().unwrap();
}

/// xorshift64*: the children's random choices, reproducible from `SEED`.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

fn hot_batch(n: usize) -> BatchId {
    BatchId::new(format!("H{n:03}")).unwrap()
}

fn component(name: &str) -> ComponentName {
    ComponentName::new(name).unwrap()
}

fn holder(who: &str) -> RunHolder {
    RunHolder {
        agent: Agent::new(format!("{who}/1.0@test-host#{}", std::process::id())).unwrap(),
        host: "test-host".into(),
        pid: std::process::id(),
        claim_key: None,
        liveness: None,
    }
}

/// One concurrent writer task of a child process.
struct Writer {
    store: PgStore,
    name: String,
    rng: Rng,
    hot: usize,
}

impl Writer {
    fn ack(&self, seq: Seq, batch: &BatchId, kind: &str, n: usize) {
        say(&format!("ACK {} {batch} {kind} {} {n}", seq.0, self.name));
    }

    fn event(&self, event_type: &str, n: usize) -> NewEvent {
        NewEvent::new(EventType::new(event_type).unwrap(), Outcome::Success, Agent::new(&self.name).unwrap())
            .with_details(json!({"writer": self.name, "n": n}))
    }

    async fn append(&self, batch: &BatchId, kind: &str, n: usize) {
        let event_type = if kind == "once" { "Once" } else { "Appended" };
        let recorded = self
            .store
            .append_event(batch, self.event(event_type, n))
            .await
            .unwrap_or_else(|e| panic!("{}: append to {batch}: {e}", self.name));
        self.ack(recorded.seq, batch, kind, n);
    }

    /// A claim, sometimes a checkpoint, then the fenced append that closes the run (refused
    /// when another task claimed the same (batch, component) in between).
    async fn claim_and_record(&mut self, batch: &BatchId, n: usize) {
        let name = COMPONENTS[self.rng.below(COMPONENTS.len())];
        let component = component(name);
        let claim = self
            .store
            .claim(batch, &component, &holder(&self.name))
            .await
            .unwrap_or_else(|e| panic!("{}: claim {batch} {name}: {e}", self.name));
        let generation = claim.run.generation;
        self.ack(claim.run.claim_seq, batch, "claim", n);
        if self.rng.below(3) == 0 {
            match self.store.save_checkpoint(batch, &component, generation, json!({"n": n})).await {
                Ok(()) => {}
                Err(e) if e.is_fenced() => {}
                Err(e) => panic!("{}: checkpoint {batch} {name} {generation}: {e}", self.name),
            }
        }
        tokio::task::yield_now().await;
        let event = self.event(&format!("Done_{name}"), n).in_run(component, generation);
        match self.store.append_event(batch, event).await {
            Ok(recorded) => self.ack(recorded.seq, batch, "fenced", n),
            Err(e) if e.is_fenced() => say(&format!("FENCED {batch} {name} {generation}")),
            Err(e) => panic!("{}: fenced append to {batch} {name} {generation}: {e}", self.name),
        }
    }

    async fn content_change(&self, batch: &BatchId, n: usize) {
        let mut patch = Map::new();
        patch.insert("touched_by".into(), Value::String(format!("{}.{n}", self.name)));
        let seq = self
            .store
            .record_content_change(batch, patch)
            .await
            .unwrap_or_else(|e| panic!("{}: content change of {batch}: {e}", self.name));
        self.ack(seq, batch, "content", n);
    }

    /// Test 1: `ops` random writes on the hot batches, on batches it creates, and one append
    /// to each batch it created (a change no later change of its batch hides from the check).
    async fn feed_workload(mut self, ops: usize) {
        let mut fresh: Vec<BatchId> = Vec::new();
        for n in 0..ops {
            let batch = hot_batch(self.rng.below(self.hot));
            match self.rng.below(100) {
                0..30 => self.append(&batch, "append", n).await,
                30..50 => self.claim_and_record(&batch, n).await,
                50..60 => self.content_change(&batch, n).await,
                60..65 => {
                    let seq = self
                        .store
                        .set_priority(&batch, n as i32)
                        .await
                        .unwrap_or_else(|e| panic!("{}: priority of {batch}: {e}", self.name));
                    self.ack(seq, &batch, "priority", n);
                }
                65..82 => {
                    let id = BatchId::new(format!("F.{}.{n}", self.name)).unwrap();
                    let created = self
                        .store
                        .create_batch(NewBatch::new(id.clone(), BatchType::new("Fresh").unwrap()))
                        .await
                        .unwrap_or_else(|e| panic!("{}: create {id}: {e}", self.name));
                    let CreateOutcome::Created(created) = created else { panic!("{id} existed before") };
                    self.ack(created.created_seq, &id, "create", n);
                    fresh.push(id);
                }
                _ => match fresh.pop() {
                    Some(id) => self.append(&id, "once", n).await,
                    None => self.append(&batch, "append", n).await,
                },
            }
        }
        say(&format!("DONE {} {ops}", self.name));
    }

    /// Test 5: claims with fenced appends, plain appends and content changes as fast as
    /// possible, until the parent kills the process.
    async fn victim_workload(mut self) {
        for n in 0.. {
            let batch = hot_batch(self.rng.below(self.hot));
            match self.rng.below(10) {
                0..5 => self.claim_and_record(&batch, n).await,
                5..8 => self.append(&batch, "append", n).await,
                _ => self.content_change(&batch, n).await,
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// The parent side: children, their output, the database's integrity.

/// A child process; SIGKILLed and reaped on drop if still running (a failing test leaves
/// nothing behind). Its stdout lines arrive through a reader thread.
struct ChildProcess {
    name: String,
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
}

impl ChildProcess {
    fn spawn(mode: &str, name: &str, env: &[(&str, String)]) -> Self {
        let mut command = autocomp_test_servers::this_binary_running!("child_process_entry");
        command
            .env(CHILD_MODE, mode)
            .stdin(if mode == "open" { Stdio::piped() } else { Stdio::null() })
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        for (key, value) in env {
            command.env(key, value);
        }
        let mut child = command.spawn().unwrap_or_else(|e| panic!("spawning child {name}: {e}"));
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let (send, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in stdout.lines().map_while(Result::ok) {
                if send.send(line).is_err() {
                    break;
                }
            }
        });
        let stdin = child.stdin.take();
        Self { name: name.to_owned(), child, stdin, lines }
    }

    /// The next line, or `None` at the end of its output; fails the test at `deadline`.
    fn next_line(&self, deadline: Instant) -> Option<String> {
        match self.lines.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(line) => Some(line),
            Err(mpsc::RecvTimeoutError::Disconnected) => None,
            Err(mpsc::RecvTimeoutError::Timeout) => panic!("child {}: no output before the deadline", self.name),
        }
    }

    /// Every remaining line, up to the end of its output.
    fn rest(&self, deadline: Instant) -> Vec<String> {
        std::iter::from_fn(|| self.next_line(deadline)).collect()
    }

    /// Waits (polling) for the process to exit.
    fn wait(&mut self, deadline: Instant) -> ExitStatus {
        let mut status = None;
        let exited = autocomp_test_servers::wait_until(deadline, || {
            status = self.child.try_wait().unwrap();
            status.is_some()
        });
        assert!(exited, "child {} still running at the deadline", self.name);
        status.unwrap()
    }

    /// SIGKILL (std's `kill` on Unix), then reaps it.
    fn kill(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
}

impl Drop for ChildProcess {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.child.kill().ok();
            self.child.wait().ok();
        }
    }
}

#[derive(Debug, Clone)]
struct Ack {
    seq: i64,
    batch: String,
    kind: String,
    writer: String,
    n: usize,
}

fn parse_ack(line: &str) -> Option<Ack> {
    let mut parts = line.strip_prefix("ACK ")?.split(' ');
    Some(Ack {
        seq: parts.next()?.parse().ok()?,
        batch: parts.next()?.to_owned(),
        kind: parts.next()?.to_owned(),
        writer: parts.next()?.to_owned(),
        n: parts.next()?.parse().ok()?,
    })
}

/// `psql` from async code without stalling the runtime's other tasks.
fn psql(server: &Postgres, database: &str, sql: &str) -> String {
    tokio::task::block_in_place(|| server.psql(database, sql))
}

/// The invariants of runs, claims, events and the feed columns, checked in SQL; each query
/// lists offenders (at most 20), which must be none. Valid while no run was cancelled.
fn check_integrity(server: &Postgres, database: &str, context: &str) {
    let checks: &[(&str, &str)] = &[
        (
            "events whose run is not closed as recorded",
            "SELECT e.seq, e.batch_id, e.run_component, e.run_generation, coalesce(r.state, 'no such run')
             FROM events e LEFT JOIN runs r ON r.batch_id = e.batch_id AND r.component = e.run_component
                                            AND r.generation = e.run_generation
             WHERE e.run_component IS NOT NULL AND r.state IS DISTINCT FROM 'recorded' ORDER BY e.seq LIMIT 20",
        ),
        (
            "recorded runs without exactly one event of their (component, generation)",
            "SELECT r.batch_id, r.component, r.generation, count(e.seq)
             FROM runs r LEFT JOIN events e ON e.batch_id = r.batch_id AND e.run_component = r.component
                                           AND e.run_generation = r.generation
             WHERE r.state = 'recorded' GROUP BY 1, 2, 3 HAVING count(e.seq) <> 1 LIMIT 20",
        ),
        (
            "(batch, component) with more than one open run",
            "SELECT batch_id, component, count(*) FROM runs WHERE state = 'open'
             GROUP BY 1, 2 HAVING count(*) > 1 LIMIT 20",
        ),
        (
            "runs without a claim, or above the claim's generation, or not generations 1..=claim each once",
            "SELECT r.batch_id, r.component, min(r.generation), max(r.generation), count(*), c.generation
             FROM runs r LEFT JOIN claims c USING (batch_id, component)
             GROUP BY r.batch_id, r.component, c.generation
             HAVING c.generation IS NULL OR max(r.generation) > c.generation
                 OR min(r.generation) <> 1 OR count(*) <> c.generation LIMIT 20",
        ),
        (
            "open runs that are not the current generation",
            "SELECT r.batch_id, r.component, r.generation, c.generation
             FROM runs r JOIN claims c USING (batch_id, component)
             WHERE r.state = 'open' AND r.generation <> c.generation LIMIT 20",
        ),
        (
            "checkpoints above the claim's generation or left after the current run recorded",
            "SELECT k.batch_id, k.component, k.generation, c.generation, r.state
             FROM checkpoints k JOIN claims c USING (batch_id, component)
             JOIN runs r ON r.batch_id = c.batch_id AND r.component = c.component AND r.generation = c.generation
             WHERE k.generation > c.generation OR r.state = 'recorded' LIMIT 20",
        ),
        (
            "seqs used twice (events and claims share the sequence)",
            "SELECT seq, count(*) FROM (SELECT seq FROM events UNION ALL SELECT claim_seq FROM runs) x
             GROUP BY seq HAVING count(*) > 1 LIMIT 20",
        ),
        (
            "batches whose changed_seq is below one of their events' or claims' seqs",
            "SELECT b.id, b.changed_seq, max(x.seq)
             FROM batches b JOIN (SELECT batch_id, seq FROM events
                                  UNION ALL SELECT batch_id, claim_seq FROM runs) x ON x.batch_id = b.id
             GROUP BY b.id, b.changed_seq HAVING max(x.seq) > b.changed_seq LIMIT 20",
        ),
        (
            "batches with created_seq <= modified_seq <= changed_seq <= the sequence broken",
            "SELECT id, created_seq, modified_seq, changed_seq FROM batches
             WHERE NOT (created_seq <= modified_seq AND modified_seq <= changed_seq)
                OR changed_seq > (SELECT last_value FROM store_seq) LIMIT 20",
        ),
    ];
    for (what, sql) in checks {
        let offenders = server.psql(database, sql);
        assert!(offenders.trim().is_empty(), "{context}: {what}:\n{offenders}");
    }
}

/// Every batch of the store, by id (paged).
async fn all_batches(store: &PgStore) -> BTreeMap<String, Batch> {
    let mut batches = BTreeMap::new();
    let mut after: Option<BatchId> = None;
    loop {
        let page = store.list_batches(after.as_ref(), 500).await.unwrap();
        let Some(last) = page.last() else { return batches };
        after = Some(last.id.clone());
        batches.extend(page.into_iter().map(|batch| (batch.id.as_str().to_owned(), batch)));
    }
}

// ---------------------------------------------------------------------------------------
// 1. The change feed under concurrent writers in two processes.

const FEED_PAGE: usize = 50;

/// What a follower saw.
#[derive(Default)]
struct Feed {
    name: &'static str,
    /// (page, seq, batch), in delivery order.
    deliveries: Vec<(usize, i64, String)>,
    /// Per page: (since, next, head).
    pages: Vec<(i64, i64, i64)>,
    /// The follower's index: batch -> the seq it last saw the batch at.
    index: HashMap<String, i64>,
    waits: usize,
}

/// Applies every page of the feed from 0 until `stop` (set to the final head once the
/// writers are done) is reached, checking each page as it comes. Once caught up, a `patient`
/// follower sleeps in `wait_for_change`; the other reads again at once (more reads racing
/// the writers' commits).
async fn follow(name: &'static str, patient: bool, store: PgStore, stop: Arc<AtomicI64>, deadline: Instant) -> Feed {
    let mut feed = Feed { name, ..Feed::default() };
    let (mut cursor, mut last_head) = (0i64, 0i64);
    loop {
        assert!(Instant::now() < deadline, "the {name} follower did not catch up in time (cursor {cursor})");
        let page = store.changes(Seq(cursor), FEED_PAGE).await.unwrap();
        let number = feed.pages.len();
        let (next, head) = (page.next.0, page.head.0);
        let at = format!("{name} follower, page {number} (since {cursor}, next {next}, head {head})");
        assert!(head >= last_head, "{at}: the head went back from {last_head}");
        assert!(next >= cursor && next <= head, "{at}: next outside [since, head]");
        assert!(page.changes.len() <= FEED_PAGE, "{at}: {} changes", page.changes.len());
        let mut in_page = HashSet::new();
        let mut previous = cursor;
        for (seq, batch) in &page.changes {
            let seq = seq.0;
            assert!(seq > previous, "{at}: seq {seq} of {batch} not above {previous}: not in order or not after since");
            assert!(seq <= next, "{at}: seq {seq} of {batch} after next");
            assert!(in_page.insert(batch.as_str().to_owned()), "{at}: {batch} listed twice");
            if let Some(seen) = feed.index.insert(batch.as_str().to_owned(), seq) {
                assert!(seen < seq, "{at}: {batch} delivered at {seq} after {seen}");
            }
            feed.deliveries.push((number, seq, batch.as_str().to_owned()));
            previous = seq;
        }
        if page.changes.len() == FEED_PAGE {
            assert_eq!(next, previous, "{at}: a full page continues from its last change");
        } else {
            assert_eq!(next, head, "{at}: an exhausted page continues from the head");
        }
        feed.pages.push((cursor, next, head));
        if !page.changes.is_empty() {
            assert!(next > cursor, "{at}: the cursor did not move past a non-empty page");
        }
        cursor = next;
        last_head = head;
        if page.changes.len() < FEED_PAGE {
            let target = stop.load(Ordering::SeqCst);
            if target >= 0 && cursor >= target {
                return feed;
            }
            if patient {
                let woke = store.wait_for_change(Seq(cursor), Duration::from_millis(250)).await.unwrap();
                assert!(woke.0 >= cursor, "{name}: wait_for_change({cursor}) answered an older head {woke}");
                feed.waits += 1;
            } else {
                tokio::task::yield_now().await;
            }
        }
    }
}

/// Checks what a follower saw against the acknowledged writes and the store's final state;
/// returns how many acks it saw as such and how many superseded by a later change.
fn check_feed(
    feed: &Feed,
    acks: &[Ack],
    ack_by_seq: &HashMap<i64, &Ack>,
    seqs_of: &HashMap<&str, Vec<i64>>,
    batches: &BTreeMap<String, Batch>,
) -> (usize, usize) {
    // (a) The follower's index ends equal to every batch's last change, which is its last
    // acknowledged write.
    let mut wrong = Vec::new();
    for (id, batch) in batches {
        let last = *seqs_of[id.as_str()].last().unwrap();
        assert_eq!(batch.changed_seq.0, last, "{id}: changed_seq is its last acknowledged write");
        let seen = feed.index.get(id).copied();
        if seen != Some(batch.changed_seq.0) {
            wrong.push(format!("{id}: follower saw {seen:?}, store says {}", batch.changed_seq));
        }
    }
    assert!(
        wrong.is_empty(),
        "the {} follower missed the last change of {} of {} batches (first 20):\n{}",
        feed.name,
        wrong.len(),
        batches.len(),
        wrong.iter().take(20).cloned().collect::<Vec<_>>().join("\n")
    );

    // (b) Every acknowledged write was delivered, or superseded by a later change of its
    // batch that was. A write superseded before the follower read it hides a skip of it;
    // the `once` appends (and the last change of every batch, above) are never superseded.
    let delivered: HashSet<(i64, &str)> = feed.deliveries.iter().map(|(_, seq, b)| (*seq, b.as_str())).collect();
    let (mut exact, mut superseded) = (0, 0);
    for ack in acks {
        if delivered.contains(&(ack.seq, ack.batch.as_str())) {
            exact += 1;
        } else {
            let seen = feed.index.get(&ack.batch).copied().unwrap_or(0);
            assert!(
                seen > ack.seq,
                "{}: {ack:?} neither delivered nor superseded (the follower last saw {seen})",
                feed.name
            );
            assert!(ack.kind != "once", "{}: {ack:?} is its batch's last change, yet it was not delivered", feed.name);
            superseded += 1;
        }
    }

    // (c) Nothing delivered twice, each seq for one batch, and only writes that happened.
    // Never stale either: every write of the batch at or below the page's head had
    // finished before the page was read, so the page shows that one or a later one.
    let mut delivered_seqs = HashMap::new();
    for (page, seq, batch) in &feed.deliveries {
        if let Some(other) = delivered_seqs.insert(*seq, batch) {
            panic!("{}: seq {seq} delivered for {other} and again (page {page}) for {batch}", feed.name);
        }
        let ack = ack_by_seq
            .get(seq)
            .unwrap_or_else(|| panic!("{}: page {page} delivered ({seq}, {batch}): no such write", feed.name));
        assert_eq!(
            &ack.batch, batch,
            "{}: page {page} delivered seq {seq} for {batch}; it was a write of {}",
            feed.name, ack.batch
        );
        let (since, _, head) = feed.pages[*page];
        let writes = &seqs_of[batch.as_str()];
        let finished = writes[..writes.partition_point(|s| *s <= head)].last().copied().unwrap_or(0);
        assert!(
            *seq >= finished,
            "{}: page {page} (since {since}, head {head}) delivered {batch} at {seq}, but its write {finished} had \
             finished before the page was read: a stale view past the horizon, or seqs not taken in commit order",
            feed.name
        );
    }
    (exact, superseded)
}

/// Two processes of eight writer tasks each write as fast as they can while two followers
/// (one sleeping in `wait_for_change` when caught up, one reading again at once) apply every
/// page of `changes(cursor, 50)` to an index. Checked: each page on its own (in order, each
/// batch once, within (since, head], next as the contract says, head never back); at the
/// end, each follower's index equals every batch's `changed_seq`, every acknowledged write
/// was delivered or superseded (and the `once` appends, never superseded, delivered), every
/// delivery is a write that happened and is never older than a write of its batch at or
/// below the page's head; each batch's log is exactly its acknowledged appends, its runs
/// exactly its acknowledged claims, and per batch seq order is commit order (store clock,
/// final priority and metadata).
#[tokio::test(flavor = "multi_thread")]
async fn the_change_feed_never_skips_under_concurrent_writers_in_two_processes() {
    const HOT: usize = 50;
    const PROCESSES: usize = 2;
    const TASKS: usize = 8;
    const OPS: usize = 500;
    let started = Instant::now();
    let deadline = started + TEST_LIMIT;
    let server = shared();
    let NamedDatabase { name: database, url } = server.unique_named_database();
    let store = PgStore::open(&url).await.unwrap();

    let mut acks = Vec::new();
    for n in 0..HOT {
        let created = store.create_batch(NewBatch::new(hot_batch(n), BatchType::new("Hot").unwrap())).await.unwrap();
        let batch = created.batch();
        acks.push(Ack {
            seq: batch.created_seq.0,
            batch: batch.id.as_str().into(),
            kind: "create".into(),
            writer: "setup".into(),
            n,
        });
    }

    let stop = Arc::new(AtomicI64::new(-1));
    let followers = [("patient", true), ("eager", false)].map(|(name, patient)| {
        let stop = Arc::clone(&stop);
        let url = url.clone();
        tokio::spawn(async move { follow(name, patient, PgStore::open(&url).await.unwrap(), stop, deadline).await })
    });

    let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64;
    eprintln!("feed test: SEED={seed}");
    let children: Vec<ChildProcess> = (0..PROCESSES)
        .map(|p| {
            let name = format!("p{p}");
            let env = [
                ("PG_URL", format!("{url}?pool_size={TASKS}")),
                ("PROC", name.clone()),
                ("TASKS", TASKS.to_string()),
                ("OPS", OPS.to_string()),
                ("HOT", HOT.to_string()),
                ("SEED", (seed.wrapping_add(p as u64 * 7919)).to_string()),
            ];
            ChildProcess::spawn("writers", &name, &env)
        })
        .collect();
    let outputs: Vec<_> = children
        .into_iter()
        .map(|mut child| {
            tokio::task::spawn_blocking(move || {
                let lines = child.rest(deadline);
                let status = child.wait(deadline);
                (child.name.clone(), lines, status)
            })
        })
        .collect();
    let mut fenced_refusals = Vec::new();
    let mut done = 0;
    for output in outputs {
        let (name, lines, status) = output.await.unwrap();
        assert!(status.success(), "writer process {name} failed: {status}");
        for line in lines {
            if let Some(ack) = parse_ack(&line) {
                acks.push(ack);
            } else if let Some(rest) = line.strip_prefix("FENCED ") {
                let parts: Vec<&str> = rest.split(' ').collect();
                fenced_refusals.push((parts[0].to_owned(), parts[1].to_owned(), parts[2].parse::<i64>().unwrap()));
            } else if line.starts_with("DONE ") {
                done += 1;
            } else if !line.trim_matches('.').trim().is_empty()
                && !line.starts_with("running")
                && !line.starts_with("test ")
            {
                // libtest's own lines aside, nothing else is expected.
                eprintln!("{name}: {line}");
            }
        }
    }
    assert_eq!(done, PROCESSES * TASKS, "every writer task finished all {OPS} operations");
    let writes_done = started.elapsed();

    let final_head = store.head().await.unwrap().0;
    stop.store(final_head, Ordering::SeqCst);
    let mut feeds = Vec::new();
    for follower in followers {
        feeds.push(follower.await.unwrap());
    }
    let followed = started.elapsed();

    // Every acknowledged write has its own seq.
    let mut ack_by_seq: HashMap<i64, &Ack> = HashMap::new();
    for ack in &acks {
        if let Some(other) = ack_by_seq.insert(ack.seq, ack) {
            panic!("seq {} acknowledged twice: {other:?} and {ack:?}", ack.seq);
        }
    }
    let mut seqs_of: HashMap<&str, Vec<i64>> = HashMap::new();
    for ack in &acks {
        seqs_of.entry(ack.batch.as_str()).or_default().push(ack.seq);
    }
    for seqs in seqs_of.values_mut() {
        seqs.sort_unstable();
    }
    let max_ack = acks.iter().map(|a| a.seq).max().unwrap();
    assert!(final_head >= max_ack, "head {final_head} below the last acknowledged seq {max_ack}");

    let batches = all_batches(&store).await;
    let stored: HashSet<&str> = batches.keys().map(String::as_str).collect();
    let acknowledged: HashSet<&str> = seqs_of.keys().copied().collect();
    assert_eq!(stored, acknowledged, "the store holds exactly the batches set up and created");

    let mut feed_stats = Vec::new();
    for feed in &feeds {
        let (exact, superseded) = check_feed(feed, &acks, &ack_by_seq, &seqs_of, &batches);
        feed_stats.push(format!(
            "{} follower: {} pages, {} deliveries, {} waits; acks delivered as such {exact}, superseded {superseded}",
            feed.name,
            feed.pages.len(),
            feed.deliveries.len(),
            feed.waits
        ));
    }

    // (d) Each batch's log: seqs increase in log order, and the events are exactly the
    // acknowledged appends of that batch (none lost, none doubled), each with its details.
    // Per batch, seq order is commit order: the store clock never goes back along it, and
    // the final priority and metadata are those of the highest-seq write.
    for (id, batch) in &batches {
        let seqs: Vec<i64> = batch.events.iter().map(|e| e.seq.0).collect();
        assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{id}: log not in seq order: {seqs:?}");
        let mine: Vec<&&Ack> = {
            let mut mine: Vec<&&Ack> = seqs_of[id.as_str()].iter().map(|s| &ack_by_seq[s]).collect();
            mine.retain(|a| matches!(a.kind.as_str(), "append" | "once" | "fenced"));
            mine
        };
        let expected: Vec<i64> = mine.iter().map(|a| a.seq).collect();
        assert_eq!(seqs, expected, "{id}: the events are exactly the acknowledged appends");
        for (event, ack) in batch.events.iter().zip(&mine) {
            assert_eq!(event.details["writer"], ack.writer.as_str(), "{id} event {}", event.seq);
            assert_eq!(event.details["n"], ack.n, "{id} event {}", event.seq);
            assert_eq!(event.run.is_some(), ack.kind == "fenced", "{id} event {}: run {:?}", event.seq, event.run);
        }
        let last_of =
            |kind: &str| seqs_of[id.as_str()].iter().rev().map(|s| ack_by_seq[s]).find(|a| a.kind == kind).cloned();
        if let Some(ack) = last_of("priority") {
            assert_eq!(batch.priority, ack.n as i32, "{id}: the priority of its highest-seq priority change");
        }
        if let Some(ack) = last_of("content") {
            assert_eq!(batch.modified_seq.0, ack.seq, "{id}: modified_seq");
            assert_eq!(
                batch.metadata["touched_by"],
                format!("{}.{}", ack.writer, ack.n),
                "{id}: the metadata of its highest-seq content change"
            );
        }
    }
    let runs = psql(server, &database, "SELECT batch_id, claim_seq, component, generation, state FROM runs");
    let mut run_state: HashMap<(String, String, i64), String> = HashMap::new();
    let mut claims_stored: HashSet<(i64, String)> = HashSet::new();
    for line in runs.lines() {
        let cols: Vec<&str> = line.split('|').collect();
        claims_stored.insert((cols[1].parse().unwrap(), cols[0].to_owned()));
        run_state.insert((cols[0].into(), cols[2].into(), cols[3].parse().unwrap()), cols[4].into());
    }
    let claims_acked: HashSet<(i64, String)> =
        acks.iter().filter(|a| a.kind == "claim").map(|a| (a.seq, a.batch.clone())).collect();
    assert_eq!(claims_stored, claims_acked, "the runs are exactly the acknowledged claims");
    for (batch, component, generation) in &fenced_refusals {
        let state = run_state.get(&(batch.clone(), component.clone(), *generation));
        assert_eq!(
            state.map(String::as_str),
            Some("abandoned"),
            "run {generation} of {component} on {batch} was refused its append, so a later claim abandoned it"
        );
    }
    let open = run_state.values().filter(|state| *state == "open").count();
    assert_eq!(open, 0, "every last claim of a (batch, component) recorded its event");
    let timeline = psql(
        server,
        &database,
        "SELECT batch_id, seq, at FROM (SELECT batch_id, seq, at FROM events
                                       UNION ALL SELECT batch_id, claim_seq, started_at FROM runs) x
         ORDER BY batch_id, seq",
    );
    let mut previous: Option<(String, i64, i64)> = None;
    for line in timeline.lines() {
        let cols: Vec<&str> = line.split('|').collect();
        let (batch, seq, at) = (cols[0].to_owned(), cols[1].parse::<i64>().unwrap(), cols[2].parse::<i64>().unwrap());
        if let Some((prev_batch, prev_seq, prev_at)) = &previous
            && *prev_batch == batch
        {
            assert!(
                at >= *prev_at,
                "{batch}: seq {seq} at {at} ms is before seq {prev_seq} at {prev_at} ms: seq order is not commit order"
            );
        }
        previous = Some((batch, seq, at));
    }
    tokio::task::block_in_place(|| check_integrity(server, &database, "after the writers"));

    let writes = acks.len() - HOT;
    eprintln!(
        "feed test: {writes} writes by {} tasks in {:.1?} ({} fenced refusals); followers caught up at {:.1?}; \
         total {:.1?}\n  {}",
        PROCESSES * TASKS,
        writes_done,
        fenced_refusals.len(),
        followed,
        started.elapsed(),
        feed_stats.join("\n  ")
    );
    for feed in &feeds {
        // Reading while the writers wrote, not only after them.
        let during = feed.pages.iter().filter(|(_, _, head)| *head < max_ack).count();
        assert!(during > 20, "the {} follower read only {during} pages while the writers wrote", feed.name);
    }
}

// ---------------------------------------------------------------------------------------
// 2. Processes racing to open (and so migrate) an empty database.

/// Four processes wait for a start signal, then open the same fresh, empty database at once
/// (three rounds): the migration lock lets one migrate while the others wait, so all open it
/// at the latest version, each version is recorded once, and migrating again applies nothing.
#[tokio::test(flavor = "multi_thread")]
async fn two_processes_opening_an_empty_database_at_once_one_migrates_the_other_waits() {
    const ROUNDS: usize = 3;
    const OPENERS: usize = 4;
    let deadline = Instant::now() + TEST_LIMIT;
    let server = shared();
    for round in 0..ROUNDS {
        let NamedDatabase { name: database, url } = server.unique_named_database();
        let mut children: Vec<ChildProcess> = (0..OPENERS)
            .map(|i| ChildProcess::spawn("open", &format!("opener{round}.{i}"), &[("PG_URL", url.clone())]))
            .collect();
        // All started and waiting: then all at once.
        for child in &children {
            // (libtest prints its own lines first.)
            let mut skipped = Vec::new();
            loop {
                match child.next_line(deadline) {
                    Some(line) if line == "READY" => break,
                    Some(line) => skipped.push(line),
                    None => panic!("round {round}: {} ended before it was ready: {skipped:?}", child.name),
                }
            }
        }
        for child in &mut children {
            let stdin = child.stdin.as_mut().unwrap();
            stdin.write_all(b"GO\n").unwrap();
            stdin.flush().unwrap();
        }
        let mut took = Vec::new();
        for child in &mut children {
            let lines = child.rest(deadline);
            let status = child.wait(deadline);
            assert!(status.success(), "round {round}: {} failed ({status}); it printed {lines:?}", child.name);
            let opened = lines.iter().find_map(|l| l.strip_prefix("OPENED ")).unwrap_or_else(|| {
                panic!("round {round}: {} printed no OPENED line: {lines:?}", child.name);
            });
            let fields: Vec<i64> = opened.split(' ').map(|f| f.parse().unwrap()).collect();
            assert_eq!(fields[0], i64::from(LATEST_VERSION), "round {round}: {} saw the schema version", child.name);
            assert_eq!(fields[1], 0, "round {round}: {}: an empty store's head", child.name);
            took.push(fields[2]);
        }
        let versions = psql(server, &database, "SELECT version, count(*) FROM schema_version GROUP BY 1 ORDER BY 1");
        let expected: String = (1..=LATEST_VERSION).map(|v| format!("{v}|1\n")).collect();
        assert_eq!(versions, expected, "round {round}: each version recorded exactly once");
        let (applied, now) = PgStore::migrate(&url).await.unwrap();
        assert!(applied.is_empty(), "round {round}: migrating again applied {applied:?}");
        assert_eq!(now, LATEST_VERSION);
        // The schema is whole: the store works.
        let store = PgStore::open(&url).await.unwrap();
        store.create_batch(NewBatch::new(hot_batch(round), BatchType::new("Hot").unwrap())).await.unwrap();
        assert_eq!(store.head().await.unwrap(), Seq(1));
        eprintln!("migration race round {round}: opens took {took:?} ms");
    }
}

// ---------------------------------------------------------------------------------------
// 3. and 4. Schema versions.

/// The numbers in an error message, leaving out the server's address.
fn numbers_in(message: &str, server: &Postgres) -> Vec<i64> {
    message
        .replace(&server.host_port(), "")
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|part| part.parse().ok())
        .collect()
}

/// A database some newer release migrated is refused by every way in (open, open with
/// migrate=false, open_store, migrate), naming both versions, and left as it was.
#[tokio::test(flavor = "multi_thread")]
async fn a_database_at_a_newer_schema_is_refused_naming_both_versions() {
    let server = shared();
    let NamedDatabase { name: database, url } = server.unique_named_database();
    let store = PgStore::open(&url).await.unwrap();
    for n in 0..3 {
        store.create_batch(NewBatch::new(hot_batch(n), BatchType::new("Hot").unwrap())).await.unwrap();
    }
    drop(store);
    let future = LATEST_VERSION + 7;
    psql(server, &database, &format!("INSERT INTO schema_version (version, applied_at) VALUES ({future}, 0)"));
    let count = |what: &str| psql(server, &database, &format!("SELECT count(*) FROM {what}")).trim().to_owned();
    let (batches, versions) = (count("batches"), count("schema_version"));

    let refusals = [
        ("open", PgStore::open(&url).await.err().map(|e| e.to_string())),
        ("open with migrate=false", PgStore::open(&format!("{url}?migrate=false")).await.err().map(|e| e.to_string())),
        ("open_store", open_store(&url).await.err().map(|e| e.to_string())),
        ("migrate", PgStore::migrate(&url).await.err().map(|e| e.to_string())),
    ];
    for (how, refusal) in refusals {
        let message = refusal.unwrap_or_else(|| panic!("{how} accepted a database at schema {future}"));
        let numbers = numbers_in(&message, server);
        assert!(numbers.contains(&i64::from(future)), "{how}: names the database's version {future}: {message}");
        assert!(
            numbers.contains(&i64::from(LATEST_VERSION)),
            "{how}: names this release's version {LATEST_VERSION}: {message}"
        );
    }
    assert_eq!(count("batches"), batches, "the batches are untouched");
    assert_eq!(count("schema_version"), versions, "no migration was recorded");
}

/// `migrate=false` refuses an empty database, touching nothing and naming the command; after
/// `PgStore::migrate` (every version applied) it opens.
#[tokio::test(flavor = "multi_thread")]
async fn migrate_false_refuses_an_old_schema_and_names_the_command() {
    let server = shared();
    let NamedDatabase { name: database, url } = server.unique_named_database();
    let strict = format!("{url}?migrate=false");
    let tables =
        || psql(server, &database, "SELECT count(*) FROM pg_class WHERE relnamespace = 'public'::regnamespace");

    let message = PgStore::open(&strict).await.err().expect("migrate=false opened an empty database").to_string();
    assert!(message.contains("autocomp-store migrate"), "the refusal names the command: {message}");
    assert!(numbers_in(&message, server).contains(&i64::from(LATEST_VERSION)), "names the version needed: {message}");
    assert_eq!(tables().trim(), "0", "the refused open created nothing");

    let (applied, now) = PgStore::migrate(&url).await.unwrap();
    assert_eq!(applied, (1..=LATEST_VERSION).collect::<Vec<_>>(), "migrate applies every version");
    assert_eq!(now, LATEST_VERSION);

    let store = PgStore::open(&strict).await.unwrap_or_else(|e| panic!("migrate=false after migrating: {e}"));
    assert_eq!(store.schema_version().await.unwrap(), LATEST_VERSION);
    store.create_batch(NewBatch::new(hot_batch(0), BatchType::new("Hot").unwrap())).await.unwrap();
    assert_eq!(store.head().await.unwrap(), Seq(1));
    assert_eq!(PgStore::migrate(&url).await.unwrap(), (Vec::new(), LATEST_VERSION), "nothing left to apply");
}

// ---------------------------------------------------------------------------------------
// 5. A client killed mid-write.

/// A process claiming, recording fenced results, appending and changing content on ten
/// batches with four tasks is SIGKILLed after 37, 211 and 503 acks (one database, three
/// rounds). Once its server backends are gone: runs, claims, events, checkpoints and the feed
/// columns are consistent, every acknowledged write is there, and claiming every (batch,
/// component) abandons exactly the open run the dead client left, whose generation is fenced.
#[tokio::test(flavor = "multi_thread")]
async fn a_client_killed_mid_write_leaves_nothing_half_written() {
    const BATCHES: usize = 10;
    let deadline = Instant::now() + TEST_LIMIT;
    let server = shared();
    let NamedDatabase { name: database, url } = server.unique_named_database();
    let store = PgStore::open(&url).await.unwrap();
    for n in 0..BATCHES {
        store.create_batch(NewBatch::new(hot_batch(n), BatchType::new("Hot").unwrap())).await.unwrap();
    }
    let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64;
    eprintln!("kill test: SEED={seed}");

    // A different point each round, on the same database.
    for (round, kill_after) in [37usize, 211, 503].into_iter().enumerate() {
        let application = format!("victim{round}");
        let env = [
            ("PG_URL", format!("{url}?application_name={application}&pool_size=4")),
            ("PROC", application.clone()),
            ("TASKS", "4".to_owned()),
            ("OPS", "0".to_owned()),
            ("HOT", BATCHES.to_string()),
            ("SEED", seed.wrapping_add(round as u64).to_string()),
        ];
        let mut victim = ChildProcess::spawn("victim", &application, &env);
        let mut acks = Vec::new();
        while acks.len() < kill_after {
            let line = victim.next_line(deadline).unwrap_or_else(|| {
                panic!("round {round}: the victim ended after {} acks: {}", acks.len(), victim.wait(deadline))
            });
            acks.extend(parse_ack(&line));
        }
        victim.kill();
        // Acks it printed before it died were acknowledged by the store too.
        acks.extend(victim.rest(deadline).iter().map(String::as_str).filter_map(parse_ack));

        // Its server backends finish (commit or roll back) what they were doing and exit.
        let gone = format!("SELECT count(*) FROM pg_stat_activity WHERE application_name = '{application}'");
        tokio::task::block_in_place(|| {
            autocomp_test_servers::wait_for(deadline, "the victim's backends to exit", || {
                server.psql(&database, &gone).trim() == "0"
            })
        });
        let context = format!("round {round}, killed after {} acks", acks.len());
        tokio::task::block_in_place(|| check_integrity(server, &database, &context));

        let events: HashSet<i64> =
            psql(server, &database, "SELECT seq FROM events").lines().map(|l| l.parse().unwrap()).collect();
        let claims: HashSet<i64> =
            psql(server, &database, "SELECT claim_seq FROM runs").lines().map(|l| l.parse().unwrap()).collect();
        let batches = all_batches(&store).await;
        for ack in &acks {
            match ack.kind.as_str() {
                "append" | "fenced" => assert!(events.contains(&ack.seq), "{context}: acknowledged {ack:?} lost"),
                "claim" => assert!(claims.contains(&ack.seq), "{context}: acknowledged {ack:?} lost"),
                _ => {}
            }
            let batch = &batches[&ack.batch];
            assert!(batch.changed_seq.0 >= ack.seq, "{context}: {} changed_seq below {ack:?}", ack.batch);
            if ack.kind == "content" {
                assert!(batch.modified_seq.0 >= ack.seq, "{context}: {} modified_seq below {ack:?}", ack.batch);
            }
        }

        // Anyone may claim again: a still-open run of the dead client is abandoned, and its
        // generation fenced; the new run records.
        let mut abandoned = 0;
        for n in 0..BATCHES {
            let id = hot_batch(n);
            let before = store.get_batch(&id).await.unwrap();
            for name in COMPONENTS {
                let comp = component(name);
                let open_before = before.open_run(&comp).cloned();
                let claim = store.claim(&id, &comp, &holder("rescuer")).await.unwrap();
                assert_eq!(
                    claim.abandoned.as_ref().map(|run| run.generation),
                    open_before.as_ref().map(|run| run.generation),
                    "{context}: claiming {id} {name} abandons exactly the open run"
                );
                if let Some(run) = &claim.abandoned {
                    assert_eq!(run.state, RunState::Abandoned, "{context}: {id} {name}");
                    abandoned += 1;
                    let late =
                        NewEvent::new(EventType::new("Late").unwrap(), Outcome::Success, Agent::new("x").unwrap())
                            .in_run(comp.clone(), run.generation);
                    let refused = store.append_event(&id, late).await.err();
                    assert!(
                        refused.as_ref().is_some_and(StoreError::is_fenced),
                        "{context}: the dead run {} of {name} on {id} is fenced: {refused:?}",
                        run.generation
                    );
                }
                let done =
                    NewEvent::new(EventType::new("Rescued").unwrap(), Outcome::Success, Agent::new("x").unwrap())
                        .in_run(comp.clone(), claim.run.generation);
                store.append_event(&id, done).await.unwrap();
            }
        }
        assert!(store.open_runs(None).await.unwrap().is_empty(), "{context}: every run closed");
        tokio::task::block_in_place(|| check_integrity(server, &database, &format!("{context}, after the rescue")));
        eprintln!("kill test {context}: {abandoned} open runs of the dead client abandoned");
    }
}
