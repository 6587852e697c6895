//! Backup and restore of the embedded store, drilled as an operator would after losing the
//! store file: `autocomp backup` while two watching workers run; the file replaced by the
//! copy (its `-wal` and `-shm` removed); `autocomp reindex`; the workers started again.
//! Every batch registered before the backup is finished, none worked twice at once (the
//! probe's ledger, written by every process), the runs open in the copy taken over; what was
//! recorded after the backup is gone (the restore point) and is done again.

use std::time::{Duration, Instant};

use autocomp_e2e::{PROBED, Pipeline, disjoint_by_batch, ledgered_batches, stop_watchers, two_watchers, wait_until};
use autocomp_model::{BatchId, Outcome};

const PROBE: &str = env!("CARGO_BIN_EXE_probe-component");

/// 60 batches for the probe (200 ms each, the ledger on), two threads a worker.
fn sixty_batches(pipeline: &Pipeline) -> Vec<BatchId> {
    ledgered_batches(pipeline, 60, "200ms")
}

/// How many of `ids` have their result.
fn done(pipeline: &Pipeline, ids: &[BatchId]) -> usize {
    ids.iter().filter(|id| !pipeline.events(id, PROBED).is_empty()).count()
}

/// After the restore: two workers again until every batch is done; then each batch has one
/// result, no two works on a batch overlapped across the restore, no run is left open.
/// Returns how many batches were worked again (`late`, registered after the restore point,
/// aside).
fn finish_after_restore(pipeline: &Pipeline, ids: &[BatchId], late: &BatchId) -> usize {
    let again = two_watchers(pipeline);
    let finished = wait_until(Instant::now() + Duration::from_secs(90), || done(pipeline, ids) == ids.len());
    stop_watchers(again);
    assert!(finished, "after the restore {} of {} batches were done", done(pipeline, ids), ids.len());
    for id in ids {
        let probed = pipeline.events(id, PROBED);
        assert_eq!(probed.iter().map(|e| e.outcome).collect::<Vec<_>>(), [Outcome::Success], "{id}: {probed:?}");
    }
    let by_batch = disjoint_by_batch(&pipeline.ledger());
    assert!(pipeline.open_runs().is_empty(), "runs left open: {:?}", pipeline.open_runs());
    by_batch.iter().filter(|(batch, works)| batch.as_str() != late.as_str() && works.len() > 1).count()
}

#[test]
fn a_backup_taken_while_components_run_restores_and_every_batch_is_finished_once_at_a_time() {
    let mut pipeline = Pipeline::new(PROBE);
    let ids = sixty_batches(&pipeline);
    let done = |pipeline: &Pipeline| done(pipeline, &ids);
    let first = two_watchers(&pipeline);
    assert!(wait_until(Instant::now() + Duration::from_secs(60), || done(&pipeline) >= 10), "the workers work");
    let backup = pipeline.path("backup.db");
    let backed = pipeline.autocomp(&["backup", "--to", backup.to_str().unwrap(), "--format", "json"]);
    assert_eq!(backed.code, Some(0), "{}", backed.show());
    let facts: serde_json::Value = serde_json::from_str(&backed.stdout).unwrap();
    assert_eq!(facts["batches"], 60, "{facts}");
    let again = pipeline.autocomp(&["backup", "--to", backup.to_str().unwrap()]);
    assert_eq!(again.code, Some(2), "a backup never overwrites: {}", again.show());
    let postgres = pipeline.autocomp(&["--store", "postgres://u@db.example/x", "backup", "--to", "/tmp/never.db"]);
    assert_eq!(postgres.code, Some(2), "{}", postgres.show());
    assert!(postgres.stderr.contains("backed up with PostgreSQL's own tools: pg_basebackup"), "{}", postgres.show());
    let text = pipeline.autocomp(&["backup", "--to", pipeline.path("another.db").to_str().unwrap()]);
    assert!(text.stdout.starts_with("backed up sqlite://") && text.stdout.contains("integrity ok"), "{}", text.show());

    // The store moves on past the backup: more results, and a batch registered after it.
    let late = pipeline.register_one("LATE1", true);
    let moved_on = wait_until(Instant::now() + Duration::from_secs(60), || done(&pipeline) == ids.len());
    assert!(moved_on, "the workers finished after the backup");
    stop_watchers(first);
    let done_before_restore = done(&pipeline);

    // The store file is lost; the backup takes its place.
    let store = pipeline.store().path().to_path_buf();
    for suffix in ["", "-wal", "-shm"] {
        let file = std::path::PathBuf::from(format!("{}{suffix}", store.display()));
        std::fs::remove_file(&file).ok();
    }
    std::fs::copy(&backup, &store).unwrap();
    pipeline.reconnect();
    let reindexed = pipeline.autocomp(&["reindex"]);
    assert_eq!(reindexed.code, Some(0), "{}", reindexed.show());
    let restored_done = done(&pipeline);
    // At most what was done (on a busy machine the workers may finish all before the backup
    // reads): the restore point is the backup's, which LATE1, registered after it, shows.
    assert!(restored_done <= done_before_restore, "the restore point is the backup's: {restored_done} done then");
    assert!(pipeline.all_batches().iter().all(|b| b.id != late), "a batch registered after the backup is not in it");

    // The work recorded after the backup is done again (the restore point).
    let redone = finish_after_restore(&pipeline, &ids, &late);
    eprintln!(
        "restore drill: 60 batches; backup as of seq {} ({} events, {} runs open); {done_before_restore} done \
         before the restore, {restored_done} after it; {redone} redone; 0 lost, 0 twice at once",
        facts["as_of_seq"], facts["events"], facts["open_runs"]
    );
}

/// The same drill on PostgreSQL: a base backup (`pg_basebackup`) taken while two watching
/// workers run, WAL archived (`archive_mode=on`), a named restore point made while they still
/// run; a new server recovered to that point and promoted, the pipeline pointed at it, the
/// index rebuilt, the workers started again.
#[test]
fn a_postgresql_base_backup_restored_to_a_point_in_time_finishes_every_batch_once_at_a_time() {
    use autocomp_test_servers::postgres::{Options, Postgres, ServerScratch};
    let archive = ServerScratch::new();
    let archive_command = format!("cp %p {}/%f", archive.path().display());
    let primary = Postgres::start_with(
        Options::default().setting("archive_mode", "on").setting("archive_command", &archive_command),
    );
    let database = primary.unique_database();
    let mut pipeline = Pipeline::with_store(PROBE, &format!("{database}?retry_for=5s"));
    let ids = sixty_batches(&pipeline);
    let done = |pipeline: &Pipeline| done(pipeline, &ids);

    let first = two_watchers(&pipeline);
    assert!(wait_until(Instant::now() + Duration::from_secs(60), || done(&pipeline) >= 5), "the workers work");
    let backup = primary.base_backup();
    assert!(wait_until(Instant::now() + Duration::from_secs(60), || done(&pipeline) >= 20), "they go on");
    primary.restore_point("drill");
    let at_the_point = done(&pipeline);
    let late = pipeline.register_one("LATE1", true);
    assert!(wait_until(Instant::now() + Duration::from_secs(60), || done(&pipeline) == ids.len()), "they finish");
    stop_watchers(first);
    primary.stop_fast();

    // The database is lost; a new server is recovered to the restore point.
    let restored = Postgres::restore_from(&backup, archive.path(), "drill", Options::default());
    let name = database.rsplit('/').next().unwrap().to_owned();
    pipeline.move_store(&format!("{}?retry_for=5s", restored.url(&name)));
    let reindexed = pipeline.autocomp(&["reindex"]);
    assert_eq!(reindexed.code, Some(0), "{}", reindexed.show());
    let restored_done = done(&pipeline);
    // The restore point was made after 20 were done, and before `at_the_point` was counted.
    assert!((20..=at_the_point).contains(&restored_done), "{restored_done} done at the restore point ({at_the_point})");
    assert!(pipeline.all_batches().iter().all(|b| b.id != late), "registered after the point: not restored");

    let redone = finish_after_restore(&pipeline, &ids, &late);
    eprintln!(
        "PostgreSQL restore drill: 60 batches; {at_the_point} done at the restore point, {restored_done} in the \
         restored database; {redone} redone; 0 lost, 0 twice at once"
    );
}
