//! The floor of a trickle's stage handed from one process to the next over PostgreSQL, with
//! none of the framework around it: four worker processes in a relay, each woken by a
//! `NOTIFY` on a listening connection of its own (more processes only listen, as `sboi
//! serve` does), an item registered by the bench every 50 ms and taken through the four
//! stages; the end-to-end p50 and p99 per shape, the shapes in alternating turns in one run:
//!
//! - `look-claim-append`, a watcher's stage: the look (a read of what is ready for the
//!   stage), the claim (committed without waiting for its flush, notifying, as a claim that
//!   is not its batch's lock), and the result with the next stage's readiness and the
//!   notification (committed with its flush): three round trips, one process per stage.
//! - `look-durable-claim-append`: the same with the claim committed with its flush, as an
//!   exclusive claim is (it is the batch's lock, which a crash must not forget).
//! - `look-append-handoff`: the result's commit also claims the next stage for the process
//!   that works it (the row written claimed, not ready), so a stage is the look (of what was
//!   claimed for it) and the result: two round trips and one flush, the floor of a design
//!   where an append hands its batch to the next step's holder.
//! - `take-add`, a job queue's stage: the job found and taken on the server in one statement
//!   (committed with its flush), the next job added with the notification, then the job
//!   completed: two round trips before the next stage may start, one process per stage.
//! - `take-add-any`: the same calls, but every worker takes any stage's job and asks again at
//!   once after each (graphile-worker's layout), so the next stage often runs in the process
//!   that added it, without a notification's trip.
//!
//! The last stage's time is taken where the peers bench takes it: as the result is sent for
//! `look-claim-append` (the peers bench reads the time of autocomp's result, the store's
//! clock at the start of its transaction), in the job for the job queue's shapes (where
//! graphile-worker's last task writes its line).
//!
//!     cargo bench -p autocomp-e2e --bench handoff
//!
//! `AUTOCOMP_BENCH_ITEMS` (default 400) items a turn, the first 20 not counted;
//! `AUTOCOMP_BENCH_REPS` (default 2) turns of each shape; `AUTOCOMP_BENCH_LISTENERS` (one by
//! default; a comma-separated list is measured in turns) the processes that only listen:
//! PostgreSQL signals every listening server process of the database at each notifying
//! commit, whatever its channel, so each costs every stage a wake-up;
//! `AUTOCOMP_BENCH_SHAPES` (default all) the shapes, comma-separated. Without `--bench`
//! (`cargo test --all-targets`) a smoke run of 30 items, one turn each.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use autocomp_e2e::percentile;
use autocomp_test_servers::Postgres;
use autocomp_test_servers::bench::{load_average, machine_pace};
use tokio_postgres::{AsyncMessage, Client, NoTls, SimpleQueryMessage};

const STAGES: i32 = 4;
const GAP: Duration = Duration::from_millis(50);
const NOT_COUNTED: usize = 20;
const SHAPES: [&str; 5] =
    ["look-claim-append", "look-durable-claim-append", "look-append-handoff", "take-add", "take-add-any"];
/// How long a worker sleeps without a notification before it looks anyway.
const POLL: Duration = Duration::from_secs(1);
const WORKER_ARG: &str = "relay-worker";
const LISTENER_ARG: &str = "relay-listener";

const SCHEMA: &str = "
    DROP TABLE IF EXISTS items;
    CREATE TABLE items (id bigint, stage int, state text NOT NULL, PRIMARY KEY (id, stage));
    CREATE INDEX items_ready ON items (stage, id) WHERE state = 'ready';";

fn main() {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some(WORKER_ARG) => return worker(&args[2], args[3].parse().expect("a stage"), &args[4]),
        Some(LISTENER_ARG) => return listener(&args[2]),
        _ => {}
    }
    let full = args.iter().any(|arg| arg == "--bench");
    let setting = |name: &str, default: usize| {
        std::env::var(name).ok().and_then(|v| v.trim().parse().ok()).filter(|_| full).unwrap_or(default)
    };
    let items = setting("AUTOCOMP_BENCH_ITEMS", if full { 400 } else { 30 });
    let reps = setting("AUTOCOMP_BENCH_REPS", if full { 2 } else { 1 });
    // Comma-separated, each value measured in turns with the others.
    let list = |name: &str| std::env::var(name).ok().filter(|_| full).filter(|v| !v.trim().is_empty());
    let listeners: Vec<usize> = match list("AUTOCOMP_BENCH_LISTENERS") {
        Some(counts) => counts
            .split(',')
            .map(|count| {
                count.trim().parse().unwrap_or_else(|_| panic!("AUTOCOMP_BENCH_LISTENERS: no count {count:?}"))
            })
            .collect(),
        None => vec![1],
    };
    let chosen = list("AUTOCOMP_BENCH_SHAPES");
    let shapes: Vec<&str> = match &chosen {
        Some(chosen) => chosen.split(',').map(str::trim).collect(),
        None => SHAPES.to_vec(),
    };
    if let Some(unknown) = shapes.iter().find(|shape| !SHAPES.contains(shape)) {
        panic!("AUTOCOMP_BENCH_SHAPES: no shape {unknown:?}; the shapes are {SHAPES:?}");
    }
    let server = Postgres::start();
    let url = server.unique_database();
    println!(
        "handoff: {items} items a turn at one per {} ms, {STAGES} stages, {listeners:?} process(es) only listening, \
         {reps} turn(s) of each",
        GAP.as_millis()
    );
    println!("machine pace: {}, load average {}", machine_pace(), load_average());
    let mut rows = Vec::new();
    for rep in 1..=reps {
        for &count in &listeners {
            for &shape in &shapes {
                let latencies = turn(&url, shape, items, count);
                let mut counted: Vec<Duration> = latencies.into_iter().skip(NOT_COUNTED).collect();
                counted.sort();
                let ms = |p| percentile(&counted, p).as_secs_f64() * 1000.0;
                let (p50, p90, p99) = (ms(0.5), ms(0.9), ms(0.99));
                println!(
                    "{shape:>25}, {count} listening, rep {rep}: p50 {p50:.1} ms, p90 {p90:.1} ms, p99 {p99:.1} ms"
                );
                rows.push((shape, count, rep, p50, p99));
            }
        }
    }
    println!("\n| shape | only listening | rep | p50 ms | p99 ms | p50 a stage ms |\n|---|---:|---:|---:|---:|---:|");
    for (shape, count, rep, p50, p99) in rows {
        println!("| {shape} | {count} | {rep} | {p50:.1} | {p99:.1} | {:.2} |", p50 / f64::from(STAGES));
    }
    println!("load average after: {}", load_average());
}

/// One turn of a shape: a fresh table, the workers and the listeners started, the trickle
/// registered, each item's time from before its registration to its last stage.
fn turn(url: &str, shape: &str, items: usize, listeners: usize) -> Vec<Duration> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let client = runtime.block_on(connect(url));
    runtime.block_on(client.batch_execute(SCHEMA)).expect("the relay's table");
    let program = std::env::current_exe().expect("this bench's path");
    let spawn = |args: &[&str]| -> Child {
        Command::new(&program).args(args).stdout(Stdio::piped()).spawn().expect("a relay process")
    };
    let mut children: Vec<Child> = (0..listeners).map(|_| spawn(&[LISTENER_ARG, url])).collect();
    for stage in 1..=STAGES {
        children.push(spawn(&[WORKER_ARG, shape, &stage.to_string(), url]));
    }
    let (done_sender, done) = mpsc::channel::<(i64, u128)>();
    let mut ready = 0;
    let (ready_sender, ready_receiver) = mpsc::channel::<()>();
    for child in &mut children {
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let (done_sender, ready_sender) = (done_sender.clone(), ready_sender.clone());
        std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                let words: Vec<&str> = line.split(' ').collect();
                match words.as_slice() {
                    ["ready"] => ready_sender.send(()).unwrap(),
                    ["done", id, at] => done_sender.send((id.parse().unwrap(), at.parse().unwrap())).unwrap(),
                    _ => eprintln!("relay: {line}"),
                }
            }
        });
    }
    while ready < children.len() {
        ready_receiver.recv_timeout(Duration::from_secs(30)).expect("every relay process listening");
        ready += 1;
    }
    // A registration hands its item to the first stage as a result hands it to the next.
    let first = if shape == "look-append-handoff" { "claimed" } else { "ready" };
    let mut registered_at = vec![0u128; items];
    let started = Instant::now();
    for (n, at) in registered_at.iter_mut().enumerate() {
        let due = started + GAP * n as u32;
        std::thread::sleep(due.saturating_duration_since(Instant::now()));
        *at = now_us();
        let register = format!("BEGIN; INSERT INTO items VALUES ({n}, 1, '{first}'); NOTIFY relay, '1'; COMMIT");
        runtime.block_on(client.batch_execute(&register)).expect("a registration");
    }
    let mut latencies = vec![Duration::ZERO; items];
    let deadline = Instant::now() + Duration::from_secs(30);
    for _ in 0..items {
        let left = deadline.saturating_duration_since(Instant::now());
        let (id, at) = done.recv_timeout(left).expect("every item through the relay within 30 s");
        let id = usize::try_from(id).unwrap();
        latencies[id] = Duration::from_micros(u64::try_from(at - registered_at[id]).unwrap());
    }
    for child in &mut children {
        let _ = child.kill();
        let _ = child.wait();
    }
    latencies
}

fn now_us() -> u128 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_micros()
}

async fn connect(url: &str) -> Client {
    let (client, connection) = tokio_postgres::connect(url, NoTls).await.expect("a connection");
    tokio::spawn(connection);
    client
}

/// A connection that `LISTEN`s on the relay's channel, each notification's payload sent on.
async fn listen(url: &str) -> (Client, tokio::sync::mpsc::UnboundedReceiver<String>) {
    let (client, mut connection) = tokio_postgres::connect(url, NoTls).await.expect("a connection");
    let (sender, receiver) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(Ok(message)) = std::future::poll_fn(|cx| connection.poll_message(cx)).await {
            if let AsyncMessage::Notification(notification) = message
                && sender.send(notification.payload().to_owned()).is_err()
            {
                return;
            }
        }
    });
    client.batch_execute("LISTEN relay").await.expect("LISTEN");
    (client, receiver)
}

/// A process that only listens, as `sboi serve` does beside autocomp's watchers.
fn listener(url: &str) {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let (_client, mut notifications) = listen(url).await;
        println!("ready");
        while notifications.recv().await.is_some() {}
    });
}

/// A stage's worker on a runtime of one thread, as a component's is.
fn worker(shape: &str, stage: i32, url: &str) {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let (_listening, mut notifications) = listen(url).await;
        let work = connect(url).await;
        let any = shape == "take-add-any";
        // What the stage's look finds: ready rows, or the rows handed to it claimed.
        let found = if shape == "look-append-handoff" { "claimed" } else { "ready" };
        let look = work
            .prepare(&format!("SELECT id FROM items WHERE stage = $1 AND state = '{found}' ORDER BY id"))
            .await
            .unwrap();
        let take = work
            .prepare(
                "UPDATE items SET state = 'claimed' WHERE (id, stage) = (SELECT id, stage FROM items \
                 WHERE state = 'ready' AND ($1 OR stage = $2) ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED) \
                 RETURNING id, stage",
            )
            .await
            .unwrap();
        println!("ready");
        let concerns = |payload: &str| any || payload == stage.to_string();
        loop {
            // Woken by a notification that concerns this stage, or by the poll.
            let woken = tokio::time::timeout(POLL, async {
                while let Some(payload) = notifications.recv().await {
                    if concerns(&payload) {
                        return true;
                    }
                }
                false
            })
            .await;
            if woken == Ok(false) {
                return;
            }
            if shape == "look-append-handoff" {
                for row in work.query(&look, &[&stage]).await.unwrap() {
                    append(&work, row.get(0), stage, "claimed").await;
                }
            } else if shape.starts_with("look-") {
                let flush =
                    if shape == "look-durable-claim-append" { "" } else { "SET LOCAL synchronous_commit = off;" };
                for row in work.query(&look, &[&stage]).await.unwrap() {
                    let id: i64 = row.get(0);
                    let claim = format!(
                        "BEGIN; {flush} UPDATE items SET state = 'claimed' \
                         WHERE id = {id} AND stage = {stage} AND state = 'ready'; NOTIFY relay, 'claim'; COMMIT"
                    );
                    if changed(&work.simple_query(&claim).await.unwrap()) {
                        append(&work, id, stage, "ready").await;
                    }
                }
            } else {
                while let Some(row) = work.query_opt(&take, &[&any, &stage]).await.unwrap() {
                    let (id, taken): (i64, i32) = (row.get(0), row.get(1));
                    add_next(&work, id, taken).await;
                    let complete = format!("UPDATE items SET state = 'done' WHERE id = {id} AND stage = {taken}");
                    work.batch_execute(&complete).await.unwrap();
                }
            }
        }
    });
}

/// Whether the transaction's UPDATE changed a row (a claim that lost to another is none).
fn changed(messages: &[SimpleQueryMessage]) -> bool {
    messages.iter().any(|m| matches!(m, SimpleQueryMessage::CommandComplete(1)))
}

/// The result: the stage done, the next stage's row (`next_state`: ready, or claimed for its
/// worker) and its notification in one commit with its flush. The last stage's time is taken
/// as it is sent (the peers bench reads the result's time, the store's clock at the start of
/// its transaction).
async fn append(work: &Client, id: i64, stage: i32, next_state: &str) {
    let next = if stage < STAGES {
        format!("INSERT INTO items VALUES ({id}, {}, '{next_state}'); NOTIFY relay, '{}';", stage + 1, stage + 1)
    } else {
        println!("done {id} {}", now_us());
        String::new()
    };
    let result = format!("BEGIN; UPDATE items SET state = 'done' WHERE id = {id} AND stage = {stage}; {next} COMMIT");
    work.batch_execute(&result).await.unwrap();
}

/// The job's work: the next job added with its notification (the last stage's time instead).
async fn add_next(work: &Client, id: i64, stage: i32) {
    if stage == STAGES {
        println!("done {id} {}", now_us());
        return;
    }
    let add = format!(
        "BEGIN; INSERT INTO items VALUES ({id}, {}, 'ready'); NOTIFY relay, '{}'; COMMIT",
        stage + 1,
        stage + 1
    );
    work.batch_execute(&add).await.unwrap();
}
