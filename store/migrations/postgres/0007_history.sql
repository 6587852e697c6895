-- The registry's longer history, for the monitor's charts: result tallies per hour of store
-- time (kept 31 days, like the minutes' two hours), and each component's backlog (batches
-- ready for it) as the monitor samples it, the newest sample per minute and per hour.
CREATE TABLE component_work_hours (
    component       text COLLATE "C" NOT NULL,
    hour            bigint NOT NULL,
    result          text NOT NULL,
    results         bigint NOT NULL,
    duration_ms_sum bigint NOT NULL,
    buckets         bigint[] NOT NULL,
    PRIMARY KEY (component, hour, result)
);
CREATE TABLE component_backlog (
    component text COLLATE "C" NOT NULL,
    step      text NOT NULL,
    at        bigint NOT NULL,
    ready     bigint NOT NULL,
    PRIMARY KEY (component, step, at)
);

-- As before, and the pass's work added to the current hour too.
CREATE OR REPLACE FUNCTION autocomp_record_pass(p_name text, p_event_type text, p_descriptor jsonb, p_host text,
    p_version text, p_ended boolean, p_outcome text, p_summary text, p_duration_ms bigint, p_work jsonb)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    other text;
    this_minute bigint := autocomp_now() / 60000;
    this_hour bigint := autocomp_now() / 3600000;
BEGIN
    other := autocomp_record_pass(p_name, p_event_type, p_descriptor, p_host, p_version, p_ended, p_outcome,
        p_summary, p_duration_ms);
    IF other IS NOT NULL OR p_work IS NULL OR jsonb_array_length(p_work) = 0 THEN
        RETURN other;
    END IF;
    INSERT INTO component_work_totals AS w (component, result, results, duration_ms_sum, buckets)
        SELECT p_name, t.result, t.results, t.duration_ms_sum, t.buckets
        FROM jsonb_to_recordset(p_work) AS t(result text, results bigint, duration_ms_sum bigint, buckets bigint[])
        ON CONFLICT (component, result) DO UPDATE SET
            results = w.results + excluded.results,
            duration_ms_sum = w.duration_ms_sum + excluded.duration_ms_sum,
            buckets = autocomp_add_counts(w.buckets, excluded.buckets);
    INSERT INTO component_work_minutes AS w (component, minute, result, results, duration_ms_sum, buckets)
        SELECT p_name, this_minute, t.result, t.results, t.duration_ms_sum, t.buckets
        FROM jsonb_to_recordset(p_work) AS t(result text, results bigint, duration_ms_sum bigint, buckets bigint[])
        ON CONFLICT (component, minute, result) DO UPDATE SET
            results = w.results + excluded.results,
            duration_ms_sum = w.duration_ms_sum + excluded.duration_ms_sum,
            buckets = autocomp_add_counts(w.buckets, excluded.buckets);
    INSERT INTO component_work_hours AS w (component, hour, result, results, duration_ms_sum, buckets)
        SELECT p_name, this_hour, t.result, t.results, t.duration_ms_sum, t.buckets
        FROM jsonb_to_recordset(p_work) AS t(result text, results bigint, duration_ms_sum bigint, buckets bigint[])
        ON CONFLICT (component, hour, result) DO UPDATE SET
            results = w.results + excluded.results,
            duration_ms_sum = w.duration_ms_sum + excluded.duration_ms_sum,
            buckets = autocomp_add_counts(w.buckets, excluded.buckets);
    DELETE FROM component_work_minutes WHERE component = p_name AND minute < this_minute - @WORK_MINUTES_KEPT@;
    DELETE FROM component_work_hours WHERE component = p_name AND hour < this_hour - @WORK_HOURS_KEPT@;
    RETURN NULL;
END $$;

-- Each component's backlog as sampled now: the newest sample of the current minute and hour.
CREATE FUNCTION autocomp_record_backlog(p_components text[], p_ready bigint[]) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    this_minute bigint := autocomp_now() / 60000;
    this_hour bigint := autocomp_now() / 3600000;
BEGIN
    INSERT INTO component_backlog AS b (component, step, at, ready)
        SELECT s.component, steps.step, steps.at, s.ready
        FROM unnest(p_components, p_ready) AS s(component, ready),
             (VALUES ('minute', this_minute), ('hour', this_hour)) AS steps(step, at)
        ON CONFLICT (component, step, at) DO UPDATE SET ready = excluded.ready;
    DELETE FROM component_backlog WHERE step = 'minute' AND at < this_minute - @WORK_MINUTES_KEPT@;
    DELETE FROM component_backlog WHERE step = 'hour' AND at < this_hour - @WORK_HOURS_KEPT@;
END $$;

-- `autocomp_append_group` as before, except that a transient failure keeps the run's
-- checkpoint: the retry resumes from it, as it would after an abandoned run.
CREATE OR REPLACE FUNCTION autocomp_append_group(p_batches text[], p_types text[], p_outcomes text[], p_agents text[],
    p_details jsonb[], p_run_components text[], p_run_generations bigint[], p_resets jsonb[], p_keys text[],
    p_max_batch_bytes bigint)
RETURNS TABLE (r_index integer, r_seq bigint, r_at bigint, r_earlier jsonb, r_refused text, r_reason text)
LANGUAGE plpgsql AS $$
DECLARE
    locked text[];
    i integer;
    held bigint;
    size bigint;
BEGIN
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
            PERFORM pg_advisory_xact_lock_shared(@FEED_LOCK@);
            r_seq := nextval('store_seq');
            r_at := autocomp_now();
            PERFORM autocomp_insert_event(r_seq, r_at, p_batches[i], p_types[i], p_outcomes[i], p_agents[i],
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
        END IF;
        RETURN NEXT;
    END LOOP;
END $$;
