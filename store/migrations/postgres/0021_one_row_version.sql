-- One version of a batch's row for each claim and each append (issue 40). Until now a claim
-- wrote its batch's row twice (its `changed_seq`, then the open components the trigger on
-- `runs` kept) and an append three times (`changed_seq` with the size, then the effective
-- events and the open components the triggers kept): each a whole row version with its
-- metadata and kept summary in the write-ahead log, and each `changed_seq` a new entry in
-- both of the row's indexes. A 4-stage item wrote 15-18 KB of log against graphile-worker's
-- 4 KB; a claim 1,152 bytes, an append 1,800, a registration 1,576.
--
-- Now the claim (`autocomp_claim`, under every claim round) and the append group (under
-- every append and registration) write their runs and effective events first and their
-- batch's row last, once, with the summary parts recomputed from those tables in that same
-- statement. While they run, the setting `autocomp.summary_kept_by_writer` is 'on', and the
-- triggers of schema 18 skip the rows they write: each sets it with `set_config` as it
-- begins and gives back what it found at each of its returns (an error needs no giving
-- back: it rolls the setting back with the rest; local to the transaction, so nothing is
-- left on a pooled connection). Not a function `SET` clause, which would restore it by
-- itself: PostgreSQL 15 lets only a superuser, or a role a superuser granted SET ON
-- PARAMETER, name a parameter it does not know in one, and the store's role owns its
-- database without either. The three calls cost about 3-4 us a writer's call more than
-- the clause (a loop of 100,000 calls, PostgreSQL 15). Every other writer (a release, a
-- cancel, a pruning, a restore, a hand edit, a function of a release before still under
-- way) still has its rows kept by the triggers, as before: they remain the safety net. Why the single statement is as right as the triggers:
-- both functions lock their batch's row before they read or write anything of it, and each
-- statement of a PL/pgSQL function reads with a snapshot of its own, so the last one sees
-- every writer of the batch that committed before the lock was had, and the function's own
-- rows; a writer that does not take the lock first has its rows kept by its own trigger,
-- which locks the row and recomputes once this transaction ends.

-- The parts of a batch's kept summary, computed from the tables that hold them: what
-- `autocomp_keep_summary_part` writes and the writers above write. SQL set-returning
-- functions read in a FROM, so that the planner inlines them into the statement that reads
-- them (planned once per session, as a PL/pgSQL statement is).
CREATE FUNCTION autocomp_effective_parts(p_batch text)
RETURNS TABLE (types text[], outcomes text[], seqs bigint[], transients boolean[], skipped boolean[],
    content_seqs bigint[], acknowledged boolean[])
LANGUAGE sql STABLE AS $$
    SELECT array_agg(f.type ORDER BY f.type), array_agg(f.outcome ORDER BY f.type),
           array_agg(f.seq ORDER BY f.type), array_agg(f.transient ORDER BY f.type),
           array_agg(f.skipped ORDER BY f.type), array_agg(f.content_seq ORDER BY f.type),
           array_agg(f.acknowledged ORDER BY f.type)
    FROM batch_effective f WHERE f.batch_id = p_batch
$$;

CREATE FUNCTION autocomp_open_components(p_batch text) RETURNS TABLE (components text[])
LANGUAGE sql STABLE AS $$
    SELECT array_agg(DISTINCT r.component ORDER BY r.component) FROM runs r
    WHERE r.batch_id = p_batch AND r.state = 'open'
$$;

CREATE OR REPLACE FUNCTION autocomp_keep_summary_part(p_part text, p_batch text) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM batches WHERE id = p_batch FOR NO KEY UPDATE;
    IF p_part = 'effective' THEN
        UPDATE batches b SET (effective_types, effective_outcomes, effective_seqs, effective_transients,
                effective_skipped, effective_content_seqs, effective_acknowledged) = (SELECT * FROM autocomp_effective_parts(p_batch))
        WHERE b.id = p_batch;
    ELSE
        UPDATE batches b SET open_components = (SELECT o.components FROM autocomp_open_components(p_batch) o)
        WHERE b.id = p_batch;
    END IF;
END $$;

-- The triggers of schema 18, skipping the rows of a writer that keeps the summary itself.
DROP TRIGGER batch_effective_kept ON batch_effective;
DROP TRIGGER runs_kept_opened ON runs;
DROP TRIGGER runs_kept_changed ON runs;
DROP TRIGGER runs_kept_deleted ON runs;
CREATE TRIGGER batch_effective_kept AFTER INSERT OR UPDATE OR DELETE ON batch_effective
    FOR EACH ROW WHEN (current_setting('autocomp.summary_kept_by_writer', true) IS DISTINCT FROM 'on')
    EXECUTE FUNCTION autocomp_summary_part_written('effective');
CREATE TRIGGER runs_kept_opened AFTER INSERT ON runs
    FOR EACH ROW WHEN (NEW.state = 'open'
        AND current_setting('autocomp.summary_kept_by_writer', true) IS DISTINCT FROM 'on')
    EXECUTE FUNCTION autocomp_summary_part_written('open_components');
CREATE TRIGGER runs_kept_changed AFTER UPDATE ON runs
    FOR EACH ROW WHEN ((OLD.state = 'open' OR NEW.state = 'open')
        AND (OLD.state, OLD.component, OLD.batch_id) IS DISTINCT FROM (NEW.state, NEW.component, NEW.batch_id)
        AND current_setting('autocomp.summary_kept_by_writer', true) IS DISTINCT FROM 'on')
    EXECUTE FUNCTION autocomp_summary_part_written('open_components');
CREATE TRIGGER runs_kept_deleted AFTER DELETE ON runs
    FOR EACH ROW WHEN (OLD.state = 'open'
        AND current_setting('autocomp.summary_kept_by_writer', true) IS DISTINCT FROM 'on')
    EXECUTE FUNCTION autocomp_summary_part_written('open_components');

-- An event and its effective row, without the batch's row: `autocomp_insert_event` (the
-- writers that leave the summary to the triggers) and the append group (which writes the row
-- itself, once) both write them here.
CREATE FUNCTION autocomp_record_event(p_seq bigint, p_at bigint, p_batch text, p_type text, p_outcome text,
    p_agent text, p_details jsonb, p_run_component text, p_run_generation bigint, p_resets jsonb, p_key text)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO events (seq, batch_id, type, outcome, agent, at, details, run_component, run_generation, resets, idempotency_key)
        VALUES (p_seq, p_batch, p_type, p_outcome, p_agent, p_at, p_details, p_run_component, p_run_generation, p_resets, p_key);
    IF p_type = 'Reset' THEN
        DELETE FROM batch_effective
            WHERE batch_id = p_batch AND type IN (SELECT jsonb_array_elements_text(COALESCE(p_resets, '[]'::jsonb)));
    ELSE
        INSERT INTO batch_effective AS f (batch_id, type, seq, outcome, transient, skipped, acknowledged, content_seq)
            VALUES (p_batch, p_type, p_seq, p_outcome,
                    p_outcome = 'failure' AND autocomp_flag(p_details, 'transient'),
                    p_outcome = 'success' AND autocomp_flag(p_details, 'skipped'),
                    p_outcome = 'failure' AND autocomp_flag(p_details, 'acknowledged'),
                    autocomp_content_seq(p_details))
            ON CONFLICT (batch_id, type) DO UPDATE SET
                seq = excluded.seq, outcome = excluded.outcome, transient = excluded.transient,
                skipped = excluded.skipped, acknowledged = excluded.acknowledged, content_seq = excluded.content_seq;
    END IF;
END $$;

CREATE OR REPLACE FUNCTION autocomp_insert_event(p_seq bigint, p_at bigint, p_batch text, p_type text, p_outcome text,
    p_agent text, p_details jsonb, p_run_component text, p_run_generation bigint, p_resets jsonb, p_key text)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM autocomp_record_event(p_seq, p_at, p_batch, p_type, p_outcome, p_agent, p_details, p_run_component,
        p_run_generation, p_resets, p_key);
    UPDATE batches SET changed_seq = p_seq, last_event_at = GREATEST(last_event_at, p_at),
            stored_bytes = stored_bytes + octet_length(p_details::text), event_count = event_count + 1
        WHERE id = p_batch;
END $$;

-- Schema 19's claim, its batch's row written last and once.
CREATE OR REPLACE FUNCTION autocomp_claim(p_batch text, p_component text, p_agent text, p_host text, p_pid bigint,
    p_key text, p_liveness text, p_takeover_generation bigint, p_takeover_liveness text,
    OUT r_kind text, OUT r_run jsonb, OUT r_abandoned jsonb, OUT r_current bigint)
LANGUAGE plpgsql AS $$
DECLARE
    kept_before text := current_setting('autocomp.summary_kept_by_writer', true);
    s bigint;
    t bigint;
BEGIN
    PERFORM set_config('autocomp.summary_kept_by_writer', 'on', true);
    PERFORM 1 FROM batches WHERE id = p_batch FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'AC404', MESSAGE = p_batch;
    END IF;
    IF p_key IS NOT NULL THEN
        SELECT to_jsonb(r) INTO r_run FROM runs r
            WHERE batch_id = p_batch AND component = p_component AND claim_key = p_key;
        IF FOUND THEN
            r_kind := 'retry';
            SELECT generation INTO r_current FROM claims WHERE batch_id = p_batch AND component = p_component;
            PERFORM set_config('autocomp.summary_kept_by_writer', coalesce(kept_before, ''), true);
            RETURN;
        END IF;
    END IF;
    SELECT to_jsonb(r), r.generation INTO r_run, r_current FROM runs r
        WHERE batch_id = p_batch AND component = p_component AND state = 'open' AND liveness IS NOT NULL
          AND (generation IS DISTINCT FROM p_takeover_generation OR liveness IS DISTINCT FROM p_takeover_liveness);
    IF FOUND THEN
        r_kind := 'held';
        PERFORM set_config('autocomp.summary_kept_by_writer', coalesce(kept_before, ''), true);
        RETURN;
    END IF;
    -- autocomp_next_seq and autocomp_now, inline: claims are hot.
    PERFORM autocomp_feed_hold();
    s := nextval('store_seq');
    t := (extract(epoch FROM clock_timestamp()) * 1000)::bigint;
    INSERT INTO claims AS c (batch_id, component, generation) VALUES (p_batch, p_component, 1)
        ON CONFLICT (batch_id, component) DO UPDATE SET generation = c.generation + 1
        RETURNING generation INTO r_current;
    UPDATE runs r SET state = 'abandoned', ended_at = t
        WHERE batch_id = p_batch AND component = p_component AND state = 'open'
        RETURNING to_jsonb(r) INTO r_abandoned;
    INSERT INTO runs AS r (batch_id, component, generation, agent, host, pid, started_at, claim_seq, state, claim_key,
            liveness)
        VALUES (p_batch, p_component, r_current, p_agent, p_host, p_pid, t, s, 'open', p_key, p_liveness)
        RETURNING to_jsonb(r) INTO r_run;
    UPDATE batches SET changed_seq = s,
            open_components = (SELECT o.components FROM autocomp_open_components(p_batch) o)
        WHERE id = p_batch;
    r_kind := 'new';
    PERFORM set_config('autocomp.summary_kept_by_writer', coalesce(kept_before, ''), true);
END $$;

-- Schema 7's append group (with the cap), each append's batch row written last and once.
CREATE OR REPLACE FUNCTION autocomp_append_group(p_batches text[], p_types text[], p_outcomes text[], p_agents text[],
    p_details jsonb[], p_run_components text[], p_run_generations bigint[], p_resets jsonb[], p_keys text[],
    p_max_batch_bytes bigint)
RETURNS TABLE (r_index integer, r_seq bigint, r_at bigint, r_earlier jsonb, r_refused text, r_reason text)
LANGUAGE plpgsql AS $$
DECLARE
    kept_before text := current_setting('autocomp.summary_kept_by_writer', true);
    locked text[];
    i integer;
    held bigint;
    size bigint;
BEGIN
    PERFORM set_config('autocomp.summary_kept_by_writer', 'on', true);
    SELECT array_agg(id) INTO locked FROM (
        SELECT id FROM batches WHERE id = ANY (p_batches) ORDER BY id FOR UPDATE
    ) ids;
    FOR i IN 1 .. coalesce(array_length(p_batches, 1), 0) LOOP
        r_index := i;
        r_seq := NULL;
        r_at := NULL;
        r_earlier := NULL;
        r_refused := NULL;
        r_reason := NULL;
        IF p_keys[i] IS NOT NULL THEN
            -- A retry of an append that committed (maybe earlier in this very group).
            SELECT to_jsonb(e) - 'idempotency_key' INTO r_earlier FROM events e WHERE idempotency_key = p_keys[i];
        END IF;
        IF r_earlier IS NULL THEN
            IF locked IS NULL OR NOT p_batches[i] = ANY (locked) THEN
                r_refused := 'AC404';
                r_reason := p_batches[i];
            ELSIF p_run_components[i] IS NOT NULL THEN
                r_reason := autocomp_fence_refusal(p_batches[i], p_run_components[i], p_run_generations[i]);
                IF r_reason IS NOT NULL THEN
                    r_refused := 'AC410';
                END IF;
            END IF;
            IF r_refused IS NULL THEN
                SELECT stored_bytes INTO held FROM batches WHERE id = p_batches[i];
                size := octet_length(p_details[i]::text);
                IF held + size > p_max_batch_bytes THEN
                    r_refused := 'AC413';
                    r_reason := format('%s %s', held, held + size);
                END IF;
            END IF;
        END IF;
        IF r_earlier IS NULL AND r_refused IS NULL THEN
            PERFORM autocomp_feed_hold();
            r_seq := nextval('store_seq');
            r_at := autocomp_now();
            PERFORM autocomp_record_event(r_seq, r_at, p_batches[i], p_types[i], p_outcomes[i], p_agents[i],
                p_details[i], p_run_components[i], p_run_generations[i], p_resets[i], p_keys[i]);
            IF p_run_components[i] IS NOT NULL THEN
                UPDATE runs SET state = 'recorded', ended_at = r_at,
                        transient = COALESCE((p_details[i] ->> 'transient')::boolean, false)
                    WHERE batch_id = p_batches[i] AND component = p_run_components[i]
                      AND generation = p_run_generations[i];
                IF NOT COALESCE((p_details[i] ->> 'transient')::boolean, false) THEN
                    DELETE FROM checkpoints WHERE batch_id = p_batches[i] AND component = p_run_components[i];
                END IF;
            END IF;
            UPDATE batches b SET changed_seq = r_seq, last_event_at = GREATEST(b.last_event_at, r_at),
                    stored_bytes = b.stored_bytes + size, event_count = b.event_count + 1,
                    (effective_types, effective_outcomes, effective_seqs, effective_transients, effective_skipped,
                        effective_content_seqs, effective_acknowledged) =
                        (SELECT * FROM autocomp_effective_parts(p_batches[i])),
                    open_components = CASE WHEN p_run_components[i] IS NULL THEN b.open_components
                        ELSE (SELECT o.components FROM autocomp_open_components(p_batches[i]) o) END
                WHERE b.id = p_batches[i];
        END IF;
        RETURN NEXT;
    END LOOP;
    PERFORM set_config('autocomp.summary_kept_by_writer', coalesce(kept_before, ''), true);
END $$;

-- The statements inside the claim, append and registration functions read and lock rows by
-- key, so their generic plans are the plans: left to choose, PostgreSQL planned the lock of
-- `id = ANY (p_batches)` again at every call (about 0.04 ms each, measured with
-- pg_stat_statements' `track_planning`: 2,529 plans in 4,560 calls), once or twice a call.
ALTER FUNCTION autocomp_append_group(text[], text[], text[], text[], jsonb[], text[], bigint[], jsonb[], text[], bigint)
    SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION autocomp_claim_ready(text[], bigint[], bigint[], bigint, bigint[], text[], text, text, text, bigint, text,
    text) SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION autocomp_claim_judged(text[], bigint[], bigint, text, text, text, bigint, text, text)
    SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION autocomp_register_batch(text, text, integer, jsonb, text, text, text, jsonb, jsonb, bigint)
    SET plan_cache_mode = force_generic_plan;
