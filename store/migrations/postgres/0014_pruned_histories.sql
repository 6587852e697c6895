-- Retention (`autocomp prune`, `autocomp import`): a finished batch's history, once exported,
-- is pruned down to its effective events (batch_effective keeps pointing at them) and one
-- `History_Pruned` event naming the export; importing the export puts every event and run
-- back and works the batch's effective events and sizes out from its whole log again.

-- Prunes each batch whose changed_seq is still the one its export read and on which no run
-- is open, in the calling statement's transaction; answers one row per batch in order:
-- `pruned` (with what was removed and the marker's seq), `moved` (with its changed_seq),
-- `already_pruned` or `not_found`.
CREATE FUNCTION autocomp_prune_histories(p_ids text[], p_changed bigint[], p_agents text[], p_details jsonb[])
RETURNS TABLE (r_index integer, r_outcome text, r_changed bigint, r_events bigint, r_runs bigint)
LANGUAGE plpgsql AS $$
DECLARE
    i integer;
    changed bigint;
    removed bigint;
    removed_bytes bigint;
    removed_runs bigint;
    s bigint;
BEGIN
    FOR i IN 1 .. coalesce(array_length(p_ids, 1), 0) LOOP
        SELECT b.changed_seq INTO changed FROM batches b WHERE b.id = p_ids[i] FOR UPDATE;
        IF NOT FOUND THEN
            RETURN QUERY SELECT i, 'not_found'::text, NULL::bigint, 0::bigint, 0::bigint;
            CONTINUE;
        END IF;
        IF EXISTS (SELECT 1 FROM batch_effective f WHERE f.batch_id = p_ids[i] AND f.type = 'History_Pruned') THEN
            RETURN QUERY SELECT i, 'already_pruned'::text, changed, 0::bigint, 0::bigint;
            CONTINUE;
        END IF;
        IF changed <> p_changed[i]
           OR EXISTS (SELECT 1 FROM runs r WHERE r.batch_id = p_ids[i] AND r.state = 'open') THEN
            RETURN QUERY SELECT i, 'moved'::text, changed, 0::bigint, 0::bigint;
            CONTINUE;
        END IF;
        WITH gone AS (
            DELETE FROM events e WHERE e.batch_id = p_ids[i]
                AND NOT EXISTS (SELECT 1 FROM batch_effective f WHERE f.batch_id = e.batch_id AND f.seq = e.seq)
            RETURNING octet_length(e.details::text) AS bytes
        ) SELECT count(*), coalesce(sum(bytes), 0) INTO removed, removed_bytes FROM gone;
        UPDATE batches SET stored_bytes = stored_bytes - removed_bytes, event_count = event_count - removed
            WHERE id = p_ids[i];
        DELETE FROM checkpoints c WHERE c.batch_id = p_ids[i];
        WITH gone AS (DELETE FROM runs r WHERE r.batch_id = p_ids[i] RETURNING 1)
            SELECT count(*) INTO removed_runs FROM gone;
        s := autocomp_next_seq();
        PERFORM autocomp_insert_event(s, autocomp_now(), p_ids[i], 'History_Pruned', 'success', p_agents[i],
            p_details[i], NULL, NULL, NULL, NULL);
        RETURN QUERY SELECT i, 'pruned'::text, s, removed, removed_runs;
    END LOOP;
END $$;

-- Puts a pruned batch's exported events (a JSON array of events as the store answers them)
-- and runs back, removes its `History_Pruned` event and works out its effective events,
-- sizes and last event from the whole log; `restored`, `not_pruned` or `not_found`.
CREATE FUNCTION autocomp_restore_history(p_id text, p_events jsonb, p_runs jsonb,
    OUT r_outcome text, OUT r_events bigint, OUT r_runs bigint) LANGUAGE plpgsql AS $$
DECLARE
    marker bigint;
BEGIN
    r_events := 0;
    r_runs := 0;
    PERFORM 1 FROM batches WHERE id = p_id FOR UPDATE;
    IF NOT FOUND THEN
        r_outcome := 'not_found';
        RETURN;
    END IF;
    SELECT f.seq INTO marker FROM batch_effective f WHERE f.batch_id = p_id AND f.type = 'History_Pruned';
    IF NOT FOUND THEN
        r_outcome := 'not_pruned';
        RETURN;
    END IF;
    DELETE FROM events WHERE seq = marker;
    INSERT INTO events (seq, batch_id, type, outcome, agent, at, details, run_component, run_generation, resets)
        SELECT (x ->> 'seq')::bigint, p_id, x ->> 'type', x ->> 'outcome', x ->> 'agent', (x ->> 'at')::bigint,
               x -> 'details', x -> 'run' ->> 'component', (x -> 'run' ->> 'generation')::bigint,
               CASE WHEN jsonb_array_length(coalesce(x -> 'resets', '[]'::jsonb)) > 0 THEN x -> 'resets' END
        FROM jsonb_array_elements(p_events) x
        WHERE NOT EXISTS (SELECT 1 FROM events h WHERE h.seq = (x ->> 'seq')::bigint)
        ORDER BY (x ->> 'seq')::bigint;
    GET DIAGNOSTICS r_events = ROW_COUNT;
    INSERT INTO runs (batch_id, component, generation, agent, host, pid, started_at, claim_seq, state, ended_at,
                      transient, claim_key, liveness)
        SELECT p_id, x ->> 'component', (x ->> 'generation')::bigint, x -> 'holder' ->> 'agent',
               x -> 'holder' ->> 'host', (x -> 'holder' ->> 'pid')::bigint, (x ->> 'started_at')::bigint,
               (x ->> 'claim_seq')::bigint, x ->> 'state', (x ->> 'ended_at')::bigint,
               coalesce((x ->> 'transient')::boolean, false), x -> 'holder' ->> 'claim_key',
               x -> 'holder' ->> 'liveness'
        FROM jsonb_array_elements(p_runs) x
        ON CONFLICT DO NOTHING;
    GET DIAGNOSTICS r_runs = ROW_COUNT;
    UPDATE batches b SET
        stored_bytes = octet_length(b.metadata::text)
            + coalesce((SELECT sum(octet_length(e.details::text)) FROM events e WHERE e.batch_id = p_id), 0),
        event_count = (SELECT count(*) FROM events e WHERE e.batch_id = p_id),
        last_event_at = coalesce((SELECT max(e.at) FROM events e WHERE e.batch_id = p_id), 0),
        changed_seq = autocomp_next_seq()
    WHERE b.id = p_id;
    DELETE FROM batch_effective WHERE batch_id = p_id;
    INSERT INTO batch_effective (batch_id, type, seq, outcome, transient, skipped, acknowledged, content_seq)
    SELECT e.batch_id, e.type, e.seq, e.outcome,
           e.outcome = 'failure' AND autocomp_flag(e.details, 'transient'),
           e.outcome = 'success' AND autocomp_flag(e.details, 'skipped'),
           e.outcome = 'failure' AND autocomp_flag(e.details, 'acknowledged'),
           autocomp_content_seq(e.details)
    FROM (
        SELECT DISTINCT ON (type) batch_id, type, seq, outcome, details
        FROM events WHERE batch_id = p_id AND type <> 'Reset' ORDER BY type, seq DESC
    ) e
    WHERE NOT EXISTS (
        SELECT 1 FROM events r
        WHERE r.batch_id = e.batch_id AND r.type = 'Reset' AND r.seq > e.seq AND r.resets ? e.type
    );
    -- Whatever a watcher waits for, the batch is back: wake them all.
    PERFORM pg_notify('autocomp_store_changed', '*');
    r_outcome := 'restored';
END $$;
