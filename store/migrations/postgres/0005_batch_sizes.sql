-- What each batch stores, and the parts of its summary its events change, kept by the
-- functions every write goes through (so also by clients of the release before, which call
-- the same functions): the bytes of its metadata and of its events' details (their JSON
-- text), which writes are checked against (the client's max_batch_bytes); the length of its
-- log; when its newest event was recorded; and its effective events, one row per type
-- without details. Summaries, a batch's head and a page of its log are then read without
-- reading the log.
ALTER TABLE batches
    ADD COLUMN stored_bytes bigint NOT NULL DEFAULT 0,
    ADD COLUMN event_count bigint NOT NULL DEFAULT 0,
    ADD COLUMN last_event_at bigint NOT NULL DEFAULT 0;

CREATE TABLE batch_effective (
    batch_id    text COLLATE "C" NOT NULL REFERENCES batches (id),
    type        text COLLATE "C" NOT NULL,
    seq         bigint NOT NULL,
    outcome     text NOT NULL,
    transient   boolean NOT NULL,
    skipped     boolean NOT NULL,
    content_seq bigint,
    PRIMARY KEY (batch_id, type)
);

-- A batch's Reset markers alone, and its open runs alone: what a head and a summary read.
CREATE INDEX events_resets ON events (batch_id, seq) WHERE type = 'Reset';
CREATE INDEX runs_open_by_batch ON runs (batch_id) WHERE state = 'open';

-- A flag of an event's details as `Event::flag` reads it: true only for JSON true.
CREATE FUNCTION autocomp_flag(p_details jsonb, p_name text) RETURNS boolean LANGUAGE sql IMMUTABLE AS $$
    SELECT COALESCE(p_details -> p_name = 'true'::jsonb, false)
$$;

-- `details.content_seq` as `Event::content_seq` reads it back: a seq (an integer from 1 within
-- bigint), else NULL.
CREATE FUNCTION autocomp_content_seq(p_details jsonb) RETURNS bigint LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN jsonb_typeof(p_details -> 'content_seq') = 'number'
                     AND (p_details ->> 'content_seq') ~ '^-?[0-9]{1,19}$' THEN
                CASE WHEN (p_details ->> 'content_seq')::numeric BETWEEN 1 AND 9223372036854775807
                     THEN (p_details ->> 'content_seq')::bigint END
           END
$$;

-- Counted for the batches there are.
UPDATE batches b SET
    stored_bytes = octet_length(b.metadata::text) + COALESCE(e.bytes, 0),
    event_count = COALESCE(e.events, 0),
    last_event_at = COALESCE(e.last_at, 0)
FROM batches b2 LEFT JOIN (
    SELECT batch_id, SUM(octet_length(details::text))::bigint bytes, COUNT(*) events, MAX(at) last_at
    FROM events GROUP BY batch_id
) e ON e.batch_id = b2.id
WHERE b2.id = b.id;

-- The effective view: per type the newest event, unless a later Reset covers the type.
INSERT INTO batch_effective (batch_id, type, seq, outcome, transient, skipped, content_seq)
SELECT e.batch_id, e.type, e.seq, e.outcome,
       e.outcome = 'failure' AND autocomp_flag(e.details, 'transient'),
       e.outcome = 'success' AND autocomp_flag(e.details, 'skipped'),
       autocomp_content_seq(e.details)
FROM (
    SELECT DISTINCT ON (batch_id, type) batch_id, type, seq, outcome, details
    FROM events WHERE type <> 'Reset' ORDER BY batch_id, type, seq DESC
) e
WHERE NOT EXISTS (
    SELECT 1 FROM events r
    WHERE r.batch_id = e.batch_id AND r.type = 'Reset' AND r.seq > e.seq AND r.resets ? e.type
);

CREATE OR REPLACE FUNCTION autocomp_create_batch(p_id text, p_type text, p_priority integer, p_metadata jsonb,
    OUT r_created boolean, OUT r_seq bigint, OUT r_at bigint) LANGUAGE plpgsql AS $$
BEGIN
    r_created := false;
    PERFORM 1 FROM batches WHERE id = p_id;
    IF FOUND THEN
        RETURN;
    END IF;
    r_seq := autocomp_next_seq();
    r_at := autocomp_now();
    INSERT INTO batches (id, type, priority, metadata, created_seq, modified_seq, changed_seq, created_at, modified_at,
            stored_bytes)
        VALUES (p_id, p_type, p_priority, p_metadata, r_seq, r_seq, r_seq, r_at, r_at, octet_length(p_metadata::text))
        ON CONFLICT (id) DO NOTHING;
    r_created := FOUND;
END $$;

CREATE OR REPLACE FUNCTION autocomp_replace_metadata(p_id text, p_expected_modified_seq bigint, p_metadata jsonb)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    s bigint;
BEGIN
    PERFORM autocomp_lock_batch(p_id);
    PERFORM 1 FROM batches WHERE id = p_id AND modified_seq = p_expected_modified_seq;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    s := autocomp_next_seq();
    UPDATE batches
        SET stored_bytes = stored_bytes - octet_length(metadata::text) + octet_length(p_metadata::text),
            metadata = p_metadata, modified_seq = s, changed_seq = s, modified_at = autocomp_now()
        WHERE id = p_id;
    RETURN s;
END $$;

CREATE OR REPLACE FUNCTION autocomp_insert_event(p_seq bigint, p_at bigint, p_batch text, p_type text, p_outcome text,
    p_agent text, p_details jsonb, p_run_component text, p_run_generation bigint, p_resets jsonb, p_key text)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO events (seq, batch_id, type, outcome, agent, at, details, run_component, run_generation, resets, idempotency_key)
        VALUES (p_seq, p_batch, p_type, p_outcome, p_agent, p_at, p_details, p_run_component, p_run_generation, p_resets, p_key);
    IF p_type = 'Reset' THEN
        DELETE FROM batch_effective
            WHERE batch_id = p_batch AND type IN (SELECT jsonb_array_elements_text(COALESCE(p_resets, '[]'::jsonb)));
    ELSE
        INSERT INTO batch_effective AS f (batch_id, type, seq, outcome, transient, skipped, content_seq)
            VALUES (p_batch, p_type, p_seq, p_outcome,
                    p_outcome = 'failure' AND autocomp_flag(p_details, 'transient'),
                    p_outcome = 'success' AND autocomp_flag(p_details, 'skipped'),
                    autocomp_content_seq(p_details))
            ON CONFLICT (batch_id, type) DO UPDATE SET
                seq = excluded.seq, outcome = excluded.outcome, transient = excluded.transient,
                skipped = excluded.skipped, content_seq = excluded.content_seq;
    END IF;
    UPDATE batches SET changed_seq = p_seq, last_event_at = GREATEST(last_event_at, p_at),
            stored_bytes = stored_bytes + octet_length(p_details::text), event_count = event_count + 1
        WHERE id = p_batch;
END $$;

-- Refuses (AC413) a write that would take the batch's stored bytes over `p_max`: the message
-- holds what the batch stores now and what it would store, the detail what the write is.
CREATE FUNCTION autocomp_check_batch_bytes(p_batch text, p_removes bigint, p_adds bigint, p_max bigint,
    p_what text) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    holds bigint;
BEGIN
    SELECT stored_bytes INTO holds FROM batches WHERE id = p_batch;
    IF p_adds > p_removes AND holds - p_removes + p_adds > p_max THEN
        RAISE EXCEPTION USING ERRCODE = 'AC413', MESSAGE = format('%s %s', holds, holds - p_removes + p_adds),
            DETAIL = p_what;
    END IF;
END $$;

-- The capped writes: what the uncapped functions above do, once the batch's bytes are checked.
CREATE FUNCTION autocomp_replace_metadata(p_id text, p_expected_modified_seq bigint, p_metadata jsonb,
    p_max_batch_bytes bigint) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    old_bytes bigint;
BEGIN
    PERFORM autocomp_lock_batch(p_id);
    SELECT octet_length(metadata::text) INTO old_bytes FROM batches
        WHERE id = p_id AND modified_seq = p_expected_modified_seq;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    PERFORM autocomp_check_batch_bytes(p_id, old_bytes, octet_length(p_metadata::text), p_max_batch_bytes,
        'this content change');
    RETURN autocomp_replace_metadata(p_id, p_expected_modified_seq, p_metadata);
END $$;

CREATE FUNCTION autocomp_cancel_run(p_batch text, p_component text, p_expected_generation bigint,
    p_type text, p_outcome text, p_agent text, p_details jsonb, p_max_batch_bytes bigint,
    OUT r_seq bigint, OUT r_at bigint) LANGUAGE plpgsql AS $$
BEGIN
    PERFORM autocomp_lock_batch(p_batch);
    PERFORM autocomp_check_batch_bytes(p_batch, 0, octet_length(p_details::text), p_max_batch_bytes, 'this event');
    SELECT c.r_seq, c.r_at INTO r_seq, r_at
        FROM autocomp_cancel_run(p_batch, p_component, p_expected_generation, p_type, p_outcome, p_agent, p_details) c;
END $$;

CREATE FUNCTION autocomp_prioritize(p_id text, p_priority integer, p_expected_previous integer,
    p_type text, p_outcome text, p_agent text, p_details jsonb, p_max_batch_bytes bigint,
    OUT r_seq bigint, OUT r_at bigint) LANGUAGE plpgsql AS $$
BEGIN
    PERFORM autocomp_lock_batch(p_id);
    PERFORM autocomp_check_batch_bytes(p_id, 0, octet_length(p_details::text), p_max_batch_bytes, 'this event');
    SELECT c.r_seq, c.r_at INTO r_seq, r_at
        FROM autocomp_prioritize(p_id, p_priority, p_expected_previous, p_type, p_outcome, p_agent, p_details) c;
END $$;

-- `autocomp_append_group` with the cap: an append that would take its batch over it is
-- refused (`r_refused` 'AC413', `r_reason` what the batch stores and would store; nothing
-- written for it).
CREATE FUNCTION autocomp_append_group(p_batches text[], p_types text[], p_outcomes text[], p_agents text[],
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
                DELETE FROM checkpoints WHERE batch_id = p_batches[i] AND component = p_run_components[i];
            END IF;
        END IF;
        RETURN NEXT;
    END LOOP;
END $$;
