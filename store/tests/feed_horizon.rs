//! The change feed's horizon over PostgreSQL (schemas 19 and 20): a horizon read waits for
//! the writers in flight when it began, and holds back no writer that begins after it; a look's
//! read never waits and never passes a seq in flight; with nothing in flight a read answers the
//! head and ends no epoch; a writer of the release before (the feed lock held shared, as a call
//! under way through the upgrade holds it) is waited for too, and a horizon read of the release
//! before queued through the upgrade passes no writer of the new functions. Each session is its
//! own connection; waits are polled with a deadline.

use std::time::{Duration, Instant};

use autocomp_model::*;
use autocomp_store::postgres::{FEED_LOCK, LATEST_VERSION};
use autocomp_store::*;
use autocomp_test_servers::postgres::shared;
use tokio_postgres::{Client, NoTls};

const LIMIT: Duration = Duration::from_secs(30);

async fn session(url: &str) -> Client {
    let (client, connection) = tokio_postgres::connect(url, NoTls).await.unwrap();
    tokio::spawn(connection);
    client
}

/// Until `store` listens for its commits' announcements (its looks then take the horizon that
/// never waits): the first wait starts the listening, and a mark exists once it listens.
async fn listening(store: &PgStore) {
    let head = store.head().await.unwrap();
    store.wait_for_concerning_change(head, None, &ChangeInterest::Everything, Duration::from_millis(1)).await.unwrap();
    let deadline = Instant::now() + LIMIT;
    while store.announcement_mark().await.is_none() {
        assert!(Instant::now() < deadline, "the store never listened");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
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

/// What a look's read answers: the horizon as last confirmed, never waiting for a writer.
async fn look_s_horizon(reader: &Client) -> i64 {
    reader.query_one("SELECT autocomp_feed_horizon(false)", &[]).await.unwrap().get(0)
}

/// Commits `writer`'s write of seq `taken`: a look's horizon then reaches it within two reads
/// (one confirms the epoch it was in).
async fn commit_and_reach(writer: &Client, reader: &Client, taken: i64) {
    writer.batch_execute("COMMIT").await.unwrap();
    let mut answered = 0;
    for _ in 0..2 {
        answered = look_s_horizon(reader).await;
    }
    assert!(answered >= taken, "the horizon {answered} never reached the ended write's seq {taken}");
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
        let answered =
            tokio::time::timeout(LIMIT, look_s_horizon(&reader)).await.expect("a look's horizon waited for a writer");
        assert!(answered < taken, "the horizon {answered} passed the seq {taken} still in flight");
    }
    commit_and_reach(&writer, &reader, taken).await;
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
    listening(&store).await;
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

#[tokio::test(flavor = "multi_thread")]
async fn a_horizon_read_aborted_after_ending_an_epoch_lets_no_later_read_pass_its_writer() {
    // Ending an epoch is a sequence step no rollback undoes: a read that ends the epoch of a
    // write in flight and is then cancelled (here by its statement timeout while it waits for
    // that write) must leave the next reads below the write's seq until it ends.
    let url = shared().unique_database();
    let store = PgStore::open(&url).await.unwrap();
    store.create_batch(NewBatch::new(BatchId::new("B0").unwrap(), BatchType::new("T").unwrap())).await.unwrap();
    let (writer, cancelled, reader) = (session(&url).await, session(&url).await, session(&url).await);
    let taken = begin_a_write(&writer, "SELECT autocomp_feed_hold()").await;
    cancelled.batch_execute("SET statement_timeout = '300ms'").await.unwrap();
    let aborted = cancelled.query_one("SELECT autocomp_feed_horizon(true)", &[]).await;
    assert!(aborted.is_err(), "the waiting read answered while the write was in flight: {aborted:?}");
    for _ in 0..3 {
        let answered = look_s_horizon(&reader).await;
        assert!(answered < taken, "the horizon {answered} passed the seq {taken} still in flight");
    }
    commit_and_reach(&writer, &reader, taken).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_look_s_horizon_starts_over_when_its_unlogged_row_is_gone() {
    // A crash or a failover empties the unlogged `feed_horizon` (and ends every writer): the
    // next look confirms a horizon again and reaches the store's head.
    let url = shared().unique_database();
    let store = PgStore::open(&url).await.unwrap();
    listening(&store).await;
    let observer = session(&url).await;
    store.changed_summaries(Seq(0), 100).await.unwrap();
    observer.batch_execute("TRUNCATE feed_horizon").await.unwrap();
    store.create_batch(NewBatch::new(BatchId::new("B1").unwrap(), BatchType::new("T").unwrap())).await.unwrap();
    let taken: i64 = observer.query_one("SELECT last_value FROM store_seq", &[]).await.unwrap().get(0);
    let (page, _) = store.changed_summaries(Seq(0), 100).await.unwrap();
    assert!(page.changes.iter().any(|(_, id)| id.as_str() == "B1"), "the look missed a batch: {page:?}");
    assert_eq!(page.head.0, taken, "the look's horizon did not start over: {page:?}");
}

/// The schema version the database stands at now.
async fn schema_version(observer: &Client) -> i32 {
    observer.query_one("SELECT COALESCE(MAX(version), 0) FROM schema_version", &[]).await.unwrap().get(0)
}

#[tokio::test(flavor = "multi_thread")]
async fn through_the_upgrade_a_horizon_read_of_the_release_before_passes_no_writer_of_the_new_one() {
    // A database of the release before (schema 18): a writer holds the feed lock shared, and a
    // horizon read (the old body: the feed lock exclusively, then the sequence) queues for it
    // when the migration commits. A writer of the new functions that begins then must not take
    // a seq the old read's answer counts while it is in flight; and schema 20 (the writers
    // without the feed lock) waits until both old transactions have ended.
    let url = shared().unique_database();
    PgStore::create_at_schema_version(&url, 18).await.unwrap();
    let (old_writer, old_reader, observer) = (session(&url).await, session(&url).await, session(&url).await);
    let old_taken = begin_a_write(&old_writer, &format!("SELECT pg_advisory_xact_lock_shared({FEED_LOCK})")).await;
    let old_reader_pid: i32 = old_reader.query_one("SELECT pg_backend_pid()", &[]).await.unwrap().get(0);
    let old_read = read_horizon(old_reader);
    until_waiting_for_a_lock(&observer, old_reader_pid).await;

    let migration = tokio::spawn({
        let url = url.clone();
        async move { PgStore::migrate(&url).await }
    });
    let deadline = Instant::now() + LIMIT;
    while schema_version(&observer).await < 19 {
        assert!(Instant::now() < deadline, "migration 19 never committed");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let writer = session(&url).await;
    let new_writer_pid: i32 = writer.query_one("SELECT pg_backend_pid()", &[]).await.unwrap().get(0);
    let new_writer = tokio::spawn(async move {
        let taken = begin_a_write(&writer, "SELECT autocomp_feed_hold()").await;
        (writer, taken)
    });
    // The new writer has taken its seq, or waits for a lock before it takes one.
    let deadline = Instant::now() + LIMIT;
    loop {
        let row = observer
            .query_one("SELECT wait_event_type FROM pg_stat_activity WHERE pid = $1", &[&new_writer_pid])
            .await
            .unwrap();
        if new_writer.is_finished() || row.get::<_, Option<String>>(0).as_deref() == Some("Lock") {
            break;
        }
        assert!(Instant::now() < deadline, "the new writer neither wrote nor waited");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(schema_version(&observer).await, 19, "schema 20 came while an old transaction was open");
    old_writer.batch_execute("COMMIT").await.unwrap();
    let old_answer = tokio::time::timeout(LIMIT, old_read).await.expect("the old horizon read still waits").unwrap();
    assert!(old_answer >= old_taken, "the old read {old_answer} is below the old write's seq {old_taken}");
    let (new_writer, new_taken) = tokio::time::timeout(LIMIT, new_writer).await.expect("the new writer waits").unwrap();
    assert!(
        old_answer < new_taken,
        "the old horizon read answered {old_answer} while the new writer's seq {new_taken} was in flight"
    );
    new_writer.batch_execute("COMMIT").await.unwrap();
    let (applied, version) =
        tokio::time::timeout(LIMIT, migration).await.expect("the migration still waits").unwrap().unwrap();
    assert_eq!((applied, version), ((19..=LATEST_VERSION).collect(), LATEST_VERSION));

    // Schema 20's writers hold their epoch's key alone.
    observer.batch_execute("BEGIN").await.unwrap();
    observer.execute("SELECT autocomp_feed_hold()", &[]).await.unwrap();
    let feed_lock_held: i64 = observer
        .query_one(
            "SELECT count(*) FROM pg_locks WHERE pid = pg_backend_pid() AND locktype = 'advisory'
               AND objsubid = 1 AND ((classid::bigint << 32) | objid::bigint) = $1",
            &[&FEED_LOCK],
        )
        .await
        .unwrap()
        .get(0);
    observer.batch_execute("COMMIT").await.unwrap();
    assert_eq!(feed_lock_held, 0, "a writer of schema 20 still takes the old feed lock");
}

#[tokio::test(flavor = "multi_thread")]
async fn with_no_writer_in_flight_a_horizon_read_answers_the_head_and_ends_no_epoch() {
    let url = shared().unique_database();
    let store = PgStore::open(&url).await.unwrap();
    let observer = session(&url).await;
    for (round, id) in ["B0", "B1", "B2"].into_iter().enumerate() {
        store.create_batch(NewBatch::new(BatchId::new(id).unwrap(), BatchType::new("T").unwrap())).await.unwrap();
        let epoch: i64 = observer.query_one("SELECT last_value FROM feed_epoch", &[]).await.unwrap().get(0);
        let head: i64 = observer.query_one("SELECT last_value FROM store_seq", &[]).await.unwrap().get(0);
        let wait = round % 2 == 0;
        let answered: i64 = observer.query_one("SELECT autocomp_feed_horizon($1)", &[&wait]).await.unwrap().get(0);
        assert_eq!(answered, head, "the horizon is not the head with nothing in flight");
        let after: i64 = observer.query_one("SELECT last_value FROM feed_epoch", &[]).await.unwrap().get(0);
        assert_eq!(after, epoch, "a read with nothing in flight ended an epoch");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_transaction_taking_many_seqs_holds_one_epoch_key() {
    // Horizon reads end epochs while the transaction takes seq after seq: it holds the key of
    // the epoch of its first seq alone (one lock slot), and no horizon passes that seq.
    let url = shared().unique_database();
    let _store = PgStore::open(&url).await.unwrap();
    let (writer, reader) = (session(&url).await, session(&url).await);
    writer.batch_execute("BEGIN").await.unwrap();
    let writer_pid: i32 = writer.query_one("SELECT pg_backend_pid()", &[]).await.unwrap().get(0);
    let first: i64 = writer.query_one("SELECT autocomp_next_seq()", &[]).await.unwrap().get(0);
    for _ in 0..20 {
        writer.query_one("SELECT autocomp_next_seq()", &[]).await.unwrap();
        let answered = look_s_horizon(&reader).await;
        assert!(answered < first, "the horizon {answered} passed the seq {first} still in flight");
        // Another epoch ended under the writer: each later read may end one.
        reader.batch_execute("SELECT nextval('feed_epoch')").await.unwrap();
    }
    let keys: i64 = reader
        .query_one(
            "SELECT count(*) FROM pg_locks WHERE pid = $1 AND locktype = 'advisory' AND objsubid = 2
               AND classid = $2::bigint::oid",
            &[&writer_pid, &i64::from(autocomp_store::postgres::FEED_EPOCHS)],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(keys, 1, "the writer holds {keys} epoch keys");
    writer.batch_execute("COMMIT").await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn waiting_horizon_reads_cancelled_one_after_another_leave_at_most_one_epoch_unconfirmed() {
    // Each cancelled read would otherwise end an epoch nobody records, and the read after the
    // writer ends would take a lock for each: a read confirms the ended epochs before it ends
    // another, so the ended ones stay at most one.
    let url = shared().unique_database();
    let _store = PgStore::open(&url).await.unwrap();
    let (writer, cancelled, observer) = (session(&url).await, session(&url).await, session(&url).await);
    let taken = begin_a_write(&writer, "SELECT autocomp_feed_hold()").await;
    let before: i64 = observer.query_one("SELECT last_value FROM feed_epoch", &[]).await.unwrap().get(0);
    cancelled.batch_execute("SET statement_timeout = '100ms'").await.unwrap();
    for _ in 0..5 {
        let aborted = cancelled.query_one("SELECT autocomp_feed_horizon(true)", &[]).await;
        assert!(aborted.is_err(), "the waiting read answered while the write was in flight: {aborted:?}");
    }
    let after: i64 = observer.query_one("SELECT last_value FROM feed_epoch", &[]).await.unwrap().get(0);
    assert!(after - before <= 1, "five cancelled reads ended {} epochs", after - before);
    writer.batch_execute("COMMIT").await.unwrap();
    let answered: i64 = observer.query_one("SELECT autocomp_horizon()", &[]).await.unwrap().get(0);
    assert!(answered >= taken, "the horizon {answered} never reached the ended write's seq {taken}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sleeping_watcher_s_silent_poll_waits_for_no_writer_in_flight() {
    // No announcement for longer than the listening poll (2 s) while a write is in flight: the
    // sleeping watcher's head read then must not wait for that write, or a concerning commit
    // meanwhile would not wake it until the write ended.
    let url = shared().unique_database();
    let store = PgStore::open(&url).await.unwrap();
    let batch = BatchId::new("B0").unwrap();
    store.create_batch(NewBatch::new(batch.clone(), BatchType::new("T").unwrap())).await.unwrap();
    listening(&store).await;
    let verified = EventType::new("Checksums_Verified").unwrap();
    let interest = ChangeInterest::Types([verified.clone()].into());
    let head = store.head().await.unwrap();
    let writer = session(&url).await;
    begin_a_write(&writer, "SELECT autocomp_feed_hold()").await;
    let waiter = {
        let (store, interest) = (store.clone(), interest.clone());
        tokio::spawn(async move { store.wait_for_concerning_change(head, None, &interest, LIMIT).await })
    };
    // A pace, not a condition: past the listening poll, so the silent head read has begun.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(!waiter.is_finished(), "the watcher woke with nothing committed");
    store.append_event(&batch, NewEvent::new(verified, Outcome::Success, Agent::new("t").unwrap())).await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the commit's announcement waited for the silent poll's head read")
        .unwrap()
        .unwrap();
    writer.batch_execute("ROLLBACK").await.unwrap();
}
