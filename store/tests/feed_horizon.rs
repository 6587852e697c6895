//! The change feed's horizon over PostgreSQL (schema 19): a horizon read waits for the writers
//! in flight when it began, and holds back no writer that begins after it; a writer of the
//! release before (the feed lock held shared, as a call under way through the upgrade holds
//! it) is waited for too. Each session is its own connection; waits are polled with a deadline.

use std::time::{Duration, Instant};

use autocomp_model::*;
use autocomp_store::postgres::FEED_LOCK;
use autocomp_store::*;
use autocomp_test_servers::postgres::shared;
use tokio_postgres::{Client, NoTls};

const LIMIT: Duration = Duration::from_secs(30);

async fn session(url: &str) -> Client {
    let (client, connection) = tokio_postgres::connect(url, NoTls).await.unwrap();
    tokio::spawn(connection);
    client
}

/// Polls until the backend `pid` waits for a lock.
async fn until_waiting_for_a_lock(observer: &Client, pid: i32) {
    let deadline = Instant::now() + LIMIT;
    loop {
        let row =
            observer.query_one("SELECT wait_event_type FROM pg_stat_activity WHERE pid = $1", &[&pid]).await.unwrap();
        if row.get::<_, Option<String>>(0).as_deref() == Some("Lock") {
            return;
        }
        assert!(Instant::now() < deadline, "backend {pid} never waited for a lock");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A write in flight in `writer`'s open transaction: as the store's functions take a seq.
async fn begin_a_write(writer: &Client, hold: &str) -> i64 {
    writer.batch_execute("BEGIN").await.unwrap();
    writer.execute(hold, &[]).await.unwrap();
    writer.query_one("SELECT nextval('store_seq')", &[]).await.unwrap().get(0)
}

/// What `reader` answers for the horizon, read in a task of its own: it may wait.
fn read_horizon(reader: Client) -> tokio::task::JoinHandle<i64> {
    tokio::spawn(async move { reader.query_one("SELECT autocomp_horizon()", &[]).await.unwrap().get(0) })
}

#[tokio::test(flavor = "multi_thread")]
async fn a_horizon_read_waits_for_the_writer_in_flight_and_holds_back_no_writer_that_begins_after_it() {
    let url = shared().unique_database();
    let store = PgStore::open(&url).await.unwrap();
    store.create_batch(NewBatch::new(BatchId::new("B0").unwrap(), BatchType::new("T").unwrap())).await.unwrap();
    let (writer, reader, observer) = (session(&url).await, session(&url).await, session(&url).await);
    let taken = begin_a_write(&writer, "SELECT autocomp_feed_hold()").await;
    let reader_pid: i32 = reader.query_one("SELECT pg_backend_pid()", &[]).await.unwrap().get(0);
    let horizon = read_horizon(reader);
    until_waiting_for_a_lock(&observer, reader_pid).await;

    // A writer that begins now, through the store: it neither waits for the read nor for the
    // write the read waits for.
    let began = Instant::now();
    let created = tokio::time::timeout(
        LIMIT,
        store.create_batch(NewBatch::new(BatchId::new("B1").unwrap(), BatchType::new("T").unwrap())),
    )
    .await
    .expect("a write that began after the horizon read was held back by it")
    .unwrap();
    assert!(created.batch().created_seq.0 > taken);
    assert!(!horizon.is_finished(), "the horizon read answered while a seq it counts was in flight");

    writer.batch_execute("COMMIT").await.unwrap();
    let answered = tokio::time::timeout(LIMIT, horizon).await.expect("the horizon read still waits").unwrap();
    assert_eq!(answered, taken, "the horizon is the last seq taken when the read began");
    eprintln!("the write after the read took {:?}", began.elapsed());

    // The store's writers all take the epoch's key now; none takes the feed lock shared.
    let old_way = format!("%pg_advisory_xact_lock_shared({FEED_LOCK})%");
    let left = observer.query_one("SELECT count(*) FROM pg_proc WHERE prosrc LIKE $1", &[&old_way]).await.unwrap();
    assert_eq!(left.get::<_, i64>(0), 0, "a function still takes the feed lock shared");
    for function in ["autocomp_next_seq", "autocomp_claim", "autocomp_append_group"] {
        let holds: i64 = observer
            .query_one(
                "SELECT count(*) FROM pg_proc WHERE proname = $1 AND prosrc LIKE '%autocomp_feed_hold()%'",
                &[&function],
            )
            .await
            .unwrap()
            .get(0);
        assert!(holds > 0, "{function} takes no epoch's key");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_horizon_read_waits_for_a_writer_holding_the_feed_lock_as_the_release_before_did() {
    let url = shared().unique_database();
    let store = PgStore::open(&url).await.unwrap();
    store.create_batch(NewBatch::new(BatchId::new("B0").unwrap(), BatchType::new("T").unwrap())).await.unwrap();
    let (writer, reader, observer) = (session(&url).await, session(&url).await, session(&url).await);
    let taken = begin_a_write(&writer, &format!("SELECT pg_advisory_xact_lock_shared({FEED_LOCK})")).await;
    let reader_pid: i32 = reader.query_one("SELECT pg_backend_pid()", &[]).await.unwrap().get(0);
    let horizon = read_horizon(reader);
    until_waiting_for_a_lock(&observer, reader_pid).await;
    assert!(!horizon.is_finished());
    writer.batch_execute("COMMIT").await.unwrap();
    let answered = tokio::time::timeout(LIMIT, horizon).await.expect("the horizon read still waits").unwrap();
    assert!(answered >= taken, "the horizon {answered} is below the seq {taken} the write took");
}

#[tokio::test(flavor = "multi_thread")]
async fn horizon_reads_one_after_another_wait_for_every_writer_of_the_epochs_they_end() {
    // A writer holds an epoch's key; two reads end two epochs. The second read must not
    // answer a horizon counting the first writer's seq before that writer ends, although the
    // key it waits for is the next epoch's.
    let url = shared().unique_database();
    let store = PgStore::open(&url).await.unwrap();
    store.create_batch(NewBatch::new(BatchId::new("B0").unwrap(), BatchType::new("T").unwrap())).await.unwrap();
    let (writer, observer) = (session(&url).await, session(&url).await);
    let (first, second) = (session(&url).await, session(&url).await);
    let taken = begin_a_write(&writer, "SELECT autocomp_feed_hold()").await;
    let first_pid: i32 = first.query_one("SELECT pg_backend_pid()", &[]).await.unwrap().get(0);
    let second_pid: i32 = second.query_one("SELECT pg_backend_pid()", &[]).await.unwrap().get(0);
    let first = read_horizon(first);
    until_waiting_for_a_lock(&observer, first_pid).await;
    let second = read_horizon(second);
    until_waiting_for_a_lock(&observer, second_pid).await;
    assert!(!first.is_finished() && !second.is_finished(), "a read answered while the write was in flight");
    writer.batch_execute("COMMIT").await.unwrap();
    for read in [first, second] {
        let answered = tokio::time::timeout(LIMIT, read).await.expect("a horizon read still waits").unwrap();
        assert!(answered >= taken);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_look_s_horizon_never_waits_and_never_passes_a_seq_in_flight() {
    let url = shared().unique_database();
    let store = PgStore::open(&url).await.unwrap();
    store.create_batch(NewBatch::new(BatchId::new("B0").unwrap(), BatchType::new("T").unwrap())).await.unwrap();
    let (writer, reader) = (session(&url).await, session(&url).await);
    let taken = begin_a_write(&writer, "SELECT autocomp_feed_hold()").await;
    // Reads while the write is in flight answer at once, below its seq, however many.
    for _ in 0..3 {
        let answered: i64 = tokio::time::timeout(LIMIT, reader.query_one("SELECT autocomp_feed_horizon(false)", &[]))
            .await
            .expect("a look's horizon waited for a writer in flight")
            .unwrap()
            .get(0);
        assert!(answered < taken, "the horizon {answered} passed the seq {taken} still in flight");
    }
    writer.batch_execute("COMMIT").await.unwrap();
    // Once it ended, the horizon reaches it within two reads (one confirms the epoch it was in).
    let mut answered = 0;
    for _ in 0..2 {
        answered = reader.query_one("SELECT autocomp_feed_horizon(false)", &[]).await.unwrap().get(0);
    }
    assert!(answered >= taken, "the horizon {answered} never reached the ended write's seq {taken}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_watcher_sleeping_from_a_look_behind_a_write_in_flight_wakes_when_it_commits() {
    // The look's horizon stays below a write in flight, and its page cannot show that write:
    // the watcher sleeps from the look (its mark and cursor) and wakes at the write's commit,
    // and its next look names the batch.
    let url = shared().unique_database();
    let store = PgStore::open(&url).await.unwrap();
    for id in ["B0", "B1"] {
        store.create_batch(NewBatch::new(BatchId::new(id).unwrap(), BatchType::new("T").unwrap())).await.unwrap();
    }
    let interest = ChangeInterest::Types([EventType::new("Checksums_Verified").unwrap()].into());
    // The first wait starts the handle's listening; a mark exists once it listens.
    let head = store.head().await.unwrap();
    store.wait_for_concerning_change(head, None, &interest, Duration::from_millis(1)).await.unwrap();
    let deadline = Instant::now() + LIMIT;
    while store.announcement_mark().await.is_none() {
        assert!(Instant::now() < deadline, "the store never listened");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (_, _) = store.changed_summaries(Seq(0), 100).await.unwrap();

    let writer = session(&url).await;
    writer.batch_execute("BEGIN").await.unwrap();
    writer.execute("SELECT autocomp_feed_hold()", &[]).await.unwrap();
    let taken: i64 = writer
        .query_one(
            "UPDATE batches SET priority = priority + 1, changed_seq = nextval('store_seq') WHERE id = 'B1'
             RETURNING changed_seq",
            &[],
        )
        .await
        .unwrap()
        .get(0);

    let read_after = store.announcement_mark().await;
    let (page, _) = tokio::time::timeout(LIMIT, store.changed_summaries(Seq(0), 100))
        .await
        .expect("the look waited for the write in flight")
        .unwrap();
    assert!(page.head.0 < taken, "the look's horizon {:?} passed the seq {taken} in flight", page.head);
    let seen = page.next.min(page.head);
    let waiter = {
        let (store, interest) = (store.clone(), interest.clone());
        tokio::spawn(async move { store.wait_for_concerning_change(seen, read_after, &interest, LIMIT).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiter.is_finished(), "the watcher woke with nothing new committed");
    writer.batch_execute("COMMIT").await.unwrap();
    tokio::time::timeout(LIMIT / 2, waiter).await.expect("the commit did not wake the watcher").unwrap().unwrap();
    let (next, _) = store.changed_summaries(seen, 100).await.unwrap();
    assert!(
        next.changes.iter().any(|(seq, id)| id.as_str() == "B1" && seq.0 == taken),
        "the next look does not name the committed change: {next:?}"
    );
}
