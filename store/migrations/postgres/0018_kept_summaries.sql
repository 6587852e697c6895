-- Each batch's summary kept on its row (issue 40): its effective events as a summary reads
-- them (one array per field, in type order; NULL when it has none) and the components with an
-- open run (NULL when none). A summary read (a watcher's look at the change feed, the index's
-- catch-up, `get_summaries`) then reads one row per batch instead of aggregating its
-- effective events and runs again: a page of 1,000 batches took about 18 ms of the server's
-- time aggregated and 1.6 ms kept, and a 2,000-worker pipeline reads hundreds of summaries
-- per look.
--
-- Kept by triggers on `batch_effective` and `runs`, in the writing transaction, after the
-- row written: whatever writes them (every function here, a pruning that moves the batch's
-- `changed_seq` before it rewrites its effective events, a process of the previous release
-- still running through an upgrade) and in whatever order, the row holds what the two
-- tables hold when the transaction commits.
ALTER TABLE batches
    ADD COLUMN effective_types text[],
    ADD COLUMN effective_outcomes text[],
    ADD COLUMN effective_seqs bigint[],
    ADD COLUMN effective_transients boolean[],
    ADD COLUMN effective_skipped boolean[],
    ADD COLUMN effective_content_seqs bigint[],
    ADD COLUMN effective_acknowledged boolean[],
    ADD COLUMN open_components text[];

-- `autocomp_keep_summary_part(part, batch)` recomputes one part of a batch's kept summary:
-- 'effective' from `batch_effective`, 'open_components' from `runs`. PL/pgSQL, not SQL: a
-- session plans each statement once, where an SQL function called from a trigger is planned
-- at every call (measured: 0.35 ms more an append). It first locks the batch's row, then
-- reads the table in a statement of its own: under READ COMMITTED that statement's snapshot
-- holds every transaction that wrote the batch and committed before the lock was had, so of
-- two writers of one batch the later recomputes with the earlier's rows, whether or not the
-- writers lock the batch first (every function here does: `autocomp_lock_batch`). One
-- statement would not: an UPDATE blocked on the row goes on with the snapshot it started with.
CREATE FUNCTION autocomp_keep_summary_part(p_part text, p_batch text) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM batches WHERE id = p_batch FOR NO KEY UPDATE;
    IF p_part = 'effective' THEN
        UPDATE batches b SET (effective_types, effective_outcomes, effective_seqs, effective_transients,
                effective_skipped, effective_content_seqs, effective_acknowledged) = (
            SELECT array_agg(f.type ORDER BY f.type), array_agg(f.outcome ORDER BY f.type),
                   array_agg(f.seq ORDER BY f.type), array_agg(f.transient ORDER BY f.type),
                   array_agg(f.skipped ORDER BY f.type), array_agg(f.content_seq ORDER BY f.type),
                   array_agg(f.acknowledged ORDER BY f.type)
            FROM batch_effective f WHERE f.batch_id = p_batch)
        WHERE b.id = p_batch;
    ELSE
        UPDATE batches b SET open_components = (
            SELECT array_agg(DISTINCT r.component ORDER BY r.component) FROM runs r
            WHERE r.batch_id = p_batch AND r.state = 'open')
        WHERE b.id = p_batch;
    END IF;
END $$;

-- A row of `batch_effective` or `runs` written: the part of the summary its table holds
-- (TG_ARGV[0]) is recomputed for the batch it was and the batch it is.
CREATE FUNCTION autocomp_summary_part_written() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP <> 'INSERT' THEN
        PERFORM autocomp_keep_summary_part(TG_ARGV[0], OLD.batch_id);
    END IF;
    IF TG_OP = 'INSERT' OR (TG_OP = 'UPDATE' AND NEW.batch_id IS DISTINCT FROM OLD.batch_id) THEN
        PERFORM autocomp_keep_summary_part(TG_ARGV[0], NEW.batch_id);
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER batch_effective_kept AFTER INSERT OR UPDATE OR DELETE ON batch_effective
    FOR EACH ROW EXECUTE FUNCTION autocomp_summary_part_written('effective');
-- Only a run that is or was open changes which components run; a heartbeat's liveness does not.
CREATE TRIGGER runs_kept_opened AFTER INSERT ON runs
    FOR EACH ROW WHEN (NEW.state = 'open') EXECUTE FUNCTION autocomp_summary_part_written('open_components');
CREATE TRIGGER runs_kept_changed AFTER UPDATE ON runs
    FOR EACH ROW WHEN ((OLD.state = 'open' OR NEW.state = 'open')
        AND (OLD.state, OLD.component, OLD.batch_id) IS DISTINCT FROM (NEW.state, NEW.component, NEW.batch_id))
    EXECUTE FUNCTION autocomp_summary_part_written('open_components');
CREATE TRIGGER runs_kept_deleted AFTER DELETE ON runs
    FOR EACH ROW WHEN (OLD.state = 'open') EXECUTE FUNCTION autocomp_summary_part_written('open_components');

-- The batches an earlier release wrote, once: `autocomp_keep_summary_part`'s recompute, set
-- based (twice as fast as calling it per batch and part: 1.0 against 2.0 s for 21,000
-- batches of ten effective events; the store waits for the migration).
UPDATE batches b SET (effective_types, effective_outcomes, effective_seqs, effective_transients,
        effective_skipped, effective_content_seqs, effective_acknowledged) = (
    SELECT array_agg(f.type ORDER BY f.type), array_agg(f.outcome ORDER BY f.type),
           array_agg(f.seq ORDER BY f.type), array_agg(f.transient ORDER BY f.type),
           array_agg(f.skipped ORDER BY f.type), array_agg(f.content_seq ORDER BY f.type),
           array_agg(f.acknowledged ORDER BY f.type)
    FROM batch_effective f WHERE f.batch_id = b.id),
    open_components = (
    SELECT array_agg(DISTINCT r.component ORDER BY r.component) FROM runs r
    WHERE r.batch_id = b.id AND r.state = 'open')
WHERE EXISTS (SELECT 1 FROM batch_effective f WHERE f.batch_id = b.id)
   OR EXISTS (SELECT 1 FROM runs r WHERE r.batch_id = b.id AND r.state = 'open');
