//! Upgrading a store to the release of bounded reads: a SQLite file of schema 7 and a
//! PostgreSQL database of schema 4, filled as the release before left them, are counted and
//! summarized by the migration (each batch's stored bytes, log length and effective events),
//! and writes made the way the release before makes them keep those counts right.

use autocomp_model::*;
use autocomp_store::*;

fn id(text: &str) -> BatchId {
    BatchId::new(text).unwrap()
}
fn ty(text: &str) -> EventType {
    EventType::new(text).unwrap()
}

/// What a head must say of a batch, compared with the whole batch read the old way.
async fn head_agrees_with_the_whole_batch(store: &dyn ObjectStore, batch: &BatchId) -> BatchHead {
    let head = store.batch_head(batch).await.unwrap();
    let whole = store.get_batch(batch).await.unwrap();
    assert_eq!(head.summary, BatchSummary::of(&whole), "{batch}: summary");
    assert_eq!(head.effective, whole.effective().iter().cloned().collect::<Vec<_>>(), "{batch}: effective");
    assert_eq!(head.event_count, whole.events.len() as u64, "{batch}: log length");
    for kind in ["A_Done", "B_Done", "C_Done"] {
        assert_eq!(head.last_reset_of(&ty(kind)), whole.last_reset_of(&ty(kind)), "{batch}: reset of {kind}");
    }
    let page = store.log_page(batch, LogCursor::Newest, 2).await.unwrap();
    let from = whole.events.len().saturating_sub(2);
    assert_eq!(page.events, whole.events[from..], "{batch}: the newest page");
    head
}

const SQLITE_ROWS: &str = r#"
UPDATE store_head SET seq = 9;
INSERT INTO batches (id, type, priority, metadata, created_seq, modified_seq, changed_seq, created_at, modified_at, summary)
    VALUES ('B1', 'RoundTrip', 0, '{"location":"/in/B1"}', 1, 1, 8, 1000, 1000, ''),
           ('B2', 'RoundTrip', 0, '{}', 2, 2, 2, 1100, 1100, '');
INSERT INTO events (seq, batch_id, type, outcome, agent, at, details, run_component, run_generation, resets, idempotency_key)
    VALUES (3, 'B1', 'A_Done', 'success', 'a', 2000, '{"files":3}', NULL, NULL, NULL, NULL),
           (4, 'B1', 'B_Done', 'failure', 'b', 2100, '{"transient":true}', NULL, NULL, NULL, NULL),
           (5, 'B1', 'Reset', 'success', 'operator:x', 2200, '{"reason":"rerun"}', NULL, NULL, '["B_Done","C_Done"]', NULL),
           (6, 'B1', 'C_Done', 'success', 'c', 2300, '{"skipped":true}', NULL, NULL, NULL, NULL),
           (7, 'B1', 'Reset', 'success', 'operator:y', 2400, '{}', NULL, NULL, '["C_Done"]', NULL),
           (8, 'B1', 'C_Done', 'failure', 'c', 2500, '{"content_seq":1}', NULL, NULL, NULL, NULL);
"#;

#[tokio::test]
async fn a_version_7_file_is_counted_and_writes_around_the_store_keep_the_counts() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.db");
    SqliteStore::create_at_schema_version(&path, 7).unwrap();
    rusqlite::Connection::open(&path).unwrap().execute_batch(SQLITE_ROWS).unwrap();
    let store = SqliteStore::open(&path).await.unwrap();
    assert_eq!(store.schema_version().await.unwrap(), LATEST_SCHEMA_VERSION);
    let head = head_agrees_with_the_whole_batch(&store, &id("B1")).await;
    let details = ["{\"files\":3}", "{\"transient\":true}", "{\"reason\":\"rerun\"}", "{\"skipped\":true}", "{}"];
    let expected = details.iter().map(|d| d.len()).sum::<usize>()
        + "{\"content_seq\":1}".len()
        + "{\"location\":\"/in/B1\"}".len();
    assert_eq!(head.stored_bytes, expected as u64, "the JSON text of the details and metadata");
    assert_eq!((head.event_count, head.last_reset_of(&ty("C_Done"))), (6, Seq(7)));
    assert_eq!(store.batch_head(&id("B2")).await.unwrap().stored_bytes, 2, "{{}}");

    // A process of the release before writes around the new code: the schema's triggers
    // still count its event and its content change.
    rusqlite::Connection::open(&path)
        .unwrap()
        .execute_batch(
            r#"UPDATE store_head SET seq = 11;
               INSERT INTO events (seq, batch_id, type, outcome, agent, at, details)
                   VALUES (10, 'B2', 'A_Done', 'success', 'old', 3000, '{"n":1}');
               UPDATE batches SET metadata = '{"pages":12}', modified_seq = 11, changed_seq = 11 WHERE id = 'B2';"#,
        )
        .unwrap();
    let b2 = head_agrees_with_the_whole_batch(&store, &id("B2")).await;
    assert_eq!((b2.event_count, b2.stored_bytes), (1, ("{\"n\":1}".len() + "{\"pages\":12}".len()) as u64));
    store
        .append_event(&id("B2"), NewEvent::new(ty("B_Done"), Outcome::Success, Agent::new("new").unwrap()))
        .await
        .unwrap();
    assert_eq!(head_agrees_with_the_whole_batch(&store, &id("B2")).await.event_count, 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_version_4_postgresql_store_is_counted_and_summarized_and_older_clients_keep_it_so() {
    let server = autocomp_test_servers::postgres::shared();
    let database = format!("upgrade_{}", std::process::id());
    let url = server.create_database(&database);
    PgStore::create_at_schema_version(&url, 4).await.unwrap();
    let psql = |sql: &str| tokio::task::block_in_place(|| server.psql(&database, sql));
    psql(
        r#"SELECT setval('store_seq', 9);
           INSERT INTO batches (id, type, priority, metadata, created_seq, modified_seq, changed_seq, created_at, modified_at)
               VALUES ('B1', 'RoundTrip', 0, '{"location": "/in/B1"}', 1, 1, 8, 1000, 1000),
                      ('B2', 'RoundTrip', 0, '{}', 2, 2, 2, 1100, 1100);
           INSERT INTO events (seq, batch_id, type, outcome, agent, at, details, resets)
               VALUES (3, 'B1', 'A_Done', 'success', 'a', 2000, '{"files": 3}', NULL),
                      (4, 'B1', 'B_Done', 'failure', 'b', 2100, '{"transient": true}', NULL),
                      (5, 'B1', 'Reset', 'success', 'operator:x', 2200, '{"reason": "rerun"}', '["B_Done", "C_Done"]'),
                      (6, 'B1', 'C_Done', 'success', 'c', 2300, '{"skipped": true}', NULL),
                      (7, 'B1', 'Reset', 'success', 'operator:y', 2400, '{}', '["C_Done"]'),
                      (8, 'B1', 'C_Done', 'failure', 'c', 2500, '{"content_seq": 1, "transient": "yes"}', NULL);
           INSERT INTO claims (batch_id, component, generation) VALUES ('B1', 'archiver', 1);
           INSERT INTO runs (batch_id, component, generation, agent, host, pid, started_at, claim_seq, state)
               VALUES ('B1', 'archiver', 1, 'a/1@h#1', 'h', 1, 2600, 9, 'open');"#,
    );
    let store = PgStore::open(&url).await.unwrap();
    assert_eq!(store.schema_version().await.unwrap(), postgres::LATEST_VERSION);
    let head = head_agrees_with_the_whole_batch(&store, &id("B1")).await;
    assert_eq!((head.event_count, head.last_reset_of(&ty("C_Done"))), (6, Seq(7)));
    assert_eq!(head.summary.running, [ComponentName::new("archiver").unwrap()]);
    let stored: u64 = psql(
        "SELECT octet_length(metadata::text) + (SELECT SUM(octet_length(details::text)) FROM events WHERE batch_id = 'B1')
         FROM batches WHERE id = 'B1'",
    )
    .trim()
    .parse()
    .unwrap();
    assert_eq!(head.stored_bytes, stored);
    let summaries = store.list_summaries(None, 10).await.unwrap();
    let whole: Vec<BatchSummary> = store.list_batches(None, 10).await.unwrap().iter().map(BatchSummary::of).collect();
    assert_eq!(summaries, whole);

    // A client of the release before appends and edits through the functions it knows:
    // they keep the counts and the effective events too.
    psql(
        r#"SELECT * FROM autocomp_append_group(ARRAY['B2', 'B1'], ARRAY['A_Done', 'Reset'], ARRAY['success', 'success'],
               ARRAY['old', 'old'], ARRAY['{"skipped": true}'::jsonb, '{}'::jsonb], ARRAY[NULL, NULL]::text[],
               ARRAY[NULL, NULL]::bigint[], ARRAY[NULL, '["A_Done"]'::jsonb], ARRAY[NULL, NULL]::text[]);
           SELECT autocomp_replace_metadata('B2', 2, '{"pages": 12}'::jsonb);"#,
    );
    for batch in ["B1", "B2"] {
        head_agrees_with_the_whole_batch(&store, &id(batch)).await;
    }
    let b2 = store.batch_head(&id("B2")).await.unwrap();
    assert!(b2.summary.effective[0].skipped);
    assert_eq!(b2.event_count, 1);
    assert!(b2.stored_bytes >= (r#"{"skipped":true}"#.len() + r#"{"pages":12}"#.len()) as u64);
    let listed = store.list_summaries(None, 10).await.unwrap();
    let whole: Vec<BatchSummary> = store.list_batches(None, 10).await.unwrap().iter().map(BatchSummary::of).collect();
    assert_eq!(listed, whole);
}
