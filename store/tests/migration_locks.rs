//! A PostgreSQL migration held up by a table's lock (a long transaction: a session left idle
//! in one, a dump) holds no writer up behind it for longer than one try's lock timeout: it is
//! rolled back and tried again meanwhile, `autocomp-store migrate` applies it once the
//! transaction ends (or, out of patience, names that transaction's session, or a prepared
//! transaction's gid), and a store opened meanwhile runs on the schema it finds.

use std::time::{Duration, Instant};

use autocomp_model::*;
use autocomp_store::postgres::LATEST_VERSION;
use autocomp_store::*;
use autocomp_test_servers::postgres::{NamedDatabase, Options, Postgres, shared};
use tokio_postgres::NoTls;

/// Far past one try's lock timeout (`deadlock_timeout` and half a second: 1.5 s here) for each
/// of the two tables and its pause: a write that takes this long waited behind the migration.
const WRITE_LIMIT: Duration = Duration::from_secs(20);
/// The newest migration that locks tables (27: a trigger on `batches`, then one on
/// `events`); the ones after it replace functions only, which waits for no table.
const LOCKING: i32 = 27;
/// What a migration from just before `LOCKING` applies.
fn applied_from_locking() -> Vec<i32> {
    (LOCKING..=LATEST_VERSION).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_migration_held_up_by_a_long_transaction_lets_the_writers_go_on() {
    let server = shared();
    let NamedDatabase { name: database, url } = server.unique_named_database();
    PgStore::create_at_schema_version(&url, LOCKING - 1).await.unwrap();
    let store = PgStore::open(&format!("{url}?migrate=false")).await.unwrap();
    let batch_type = BatchType::new("Delivery").unwrap();
    store.create_batch(NewBatch::new(BatchId::new("B0").unwrap(), batch_type.clone())).await.unwrap();

    // A long transaction that has read the store's two busiest tables, left open.
    let (long, connection) = tokio_postgres::connect(&url, NoTls).await.unwrap();
    tokio::spawn(connection);
    long.batch_execute("BEGIN; SELECT count(*) FROM batches; SELECT count(*) FROM events").await.unwrap();

    let migrating = tokio::spawn({
        let url = url.clone();
        async move { PgStore::migrate(&url).await }
    });
    let waiting_for_a_lock = || {
        let sql =
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'";
        tokio::task::block_in_place(|| server.psql(&database, sql)).trim() != "0"
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while !waiting_for_a_lock() {
        assert!(Instant::now() < deadline, "the migration never waited for the long transaction's tables");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    // Writers meanwhile, each held up by one try at most.
    for n in 1..=5 {
        let id = BatchId::new(format!("B{n}")).unwrap();
        let written = tokio::time::timeout(WRITE_LIMIT, store.create_batch(NewBatch::new(id, batch_type.clone())));
        written.await.unwrap_or_else(|_| panic!("write {n} waited behind the migration")).unwrap();
    }
    // A store opened meanwhile (a cron start) tries the migration once, or not at all while
    // the migration above holds the migration lock, and runs on the schema before `LOCKING`.
    let started = tokio::time::timeout(WRITE_LIMIT, PgStore::open(&url)).await;
    let opened = started.expect("an open waited behind the long transaction").unwrap();
    assert_eq!(opened.schema_version().await.unwrap(), LOCKING - 1);
    assert!(!migrating.is_finished(), "the migration gave up while the transaction was open");

    // A migration that gives up names the long transaction's session.
    let long_pid: i32 = long.query_one("SELECT pg_backend_pid()", &[]).await.unwrap().get(0);
    let gave_up = PgStore::migrate_trying_for(&url, Duration::from_secs(2)).await.unwrap_err().to_string();
    assert!(gave_up.contains(&format!("pid {long_pid} (client backend, in a transaction for ")), "{gave_up}");
    assert!(gave_up.contains(&format!("migration to schema {LOCKING} could not lock its tables")), "{gave_up}");
    assert!(!migrating.is_finished(), "the migration gave up while the transaction was open");

    long.batch_execute("COMMIT").await.unwrap();
    let migrated = tokio::time::timeout(Duration::from_secs(60), migrating).await.expect("migrated once it ended");
    assert_eq!(migrated.unwrap().unwrap(), (applied_from_locking(), LATEST_VERSION));
    assert_eq!(store.list_batches(None, 10).await.unwrap().len(), 6, "every write is kept");
}

/// A prepared transaction left behind (a transaction manager that died between its two
/// phases) holds its locks with no session: a give-up names it by its gid, which is text
/// someone else chose, neutralized; once it is rolled back the migration applies.
#[tokio::test(flavor = "multi_thread")]
async fn a_prepared_transaction_holding_a_table_is_named_by_its_gid() {
    let server = Postgres::start_with(Options::default().setting("max_prepared_transactions", "2"));
    let url = server.create_database("prepared");
    PgStore::create_at_schema_version(&url, LOCKING - 1).await.unwrap();
    server.psql("prepared", "BEGIN; SELECT count(*) FROM batches; PREPARE TRANSACTION 'xa-7\x1b[2J'");
    tokio::time::sleep(Duration::from_millis(1100)).await; // a holder is named once over a second old

    let gave_up = PgStore::migrate_trying_for(&url, Duration::from_secs(2)).await.unwrap_err().to_string();
    assert!(gave_up.contains("prepared transaction 'xa-7\\u001b[2J' (prepared "), "{gave_up}");
    assert!(gave_up.contains("ROLLBACK PREPARED"), "{gave_up}");
    assert!(!gave_up.contains('\x1b'), "the gid reaches no terminal raw: {gave_up}");

    server.psql("prepared", "ROLLBACK PREPARED 'xa-7\x1b[2J'");
    let (applied, now) = PgStore::migrate(&url).await.unwrap();
    assert_eq!((applied, now), (applied_from_locking(), LATEST_VERSION));
}
