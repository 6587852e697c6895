-- One sequence for the whole store: events, claims and batch changes share it, so any two
-- seqs compare across kinds. A seq is taken after the batch's row lock, so per batch seqs
-- follow commit order; store-wide a reader learns which seqs are final from the feed lock.
CREATE SEQUENCE store_seq AS bigint MINVALUE 1 START 1;

CREATE TABLE batches (
    id           text COLLATE "C" PRIMARY KEY,
    type         text NOT NULL,
    priority     integer NOT NULL,
    metadata     jsonb NOT NULL,
    created_seq  bigint NOT NULL,
    modified_seq bigint NOT NULL,
    changed_seq  bigint NOT NULL,
    created_at   bigint NOT NULL,
    modified_at  bigint NOT NULL
) WITH (fillfactor = 80);
CREATE UNIQUE INDEX batches_by_change ON batches (changed_seq);

CREATE TABLE events (
    seq             bigint PRIMARY KEY,
    batch_id        text COLLATE "C" NOT NULL REFERENCES batches (id),
    type            text NOT NULL,
    outcome         text NOT NULL CHECK (outcome IN ('success', 'failure')),
    agent           text NOT NULL,
    at              bigint NOT NULL,
    details         jsonb NOT NULL,
    run_component   text,
    run_generation  bigint,
    resets          jsonb,
    idempotency_key text UNIQUE
);
CREATE INDEX events_by_batch ON events (batch_id, seq);

-- The current claim generation of each (batch, component); bumped by every claim.
CREATE TABLE claims (
    batch_id   text COLLATE "C" NOT NULL REFERENCES batches (id),
    component  text COLLATE "C" NOT NULL,
    generation bigint NOT NULL,
    PRIMARY KEY (batch_id, component)
) WITH (fillfactor = 70);

CREATE TABLE runs (
    batch_id   text COLLATE "C" NOT NULL REFERENCES batches (id),
    component  text COLLATE "C" NOT NULL,
    generation bigint NOT NULL,
    agent      text NOT NULL,
    host       text NOT NULL,
    pid        bigint NOT NULL,
    started_at bigint NOT NULL,
    claim_seq  bigint NOT NULL,
    state      text NOT NULL CHECK (state IN ('open', 'recorded', 'released', 'abandoned', 'cancelled')),
    ended_at   bigint,
    transient  boolean NOT NULL DEFAULT false,
    claim_key  text,
    PRIMARY KEY (batch_id, component, generation)
) WITH (fillfactor = 80);
CREATE INDEX runs_open ON runs (component, batch_id) WHERE state = 'open';
CREATE UNIQUE INDEX runs_claim_key ON runs (batch_id, component, claim_key) WHERE claim_key IS NOT NULL;

-- A run's progress, written only by the current open run, removed when a run records its result.
CREATE TABLE checkpoints (
    batch_id   text COLLATE "C" NOT NULL REFERENCES batches (id),
    component  text COLLATE "C" NOT NULL,
    data       jsonb NOT NULL,
    generation bigint NOT NULL,
    saved_at   bigint NOT NULL,
    PRIMARY KEY (batch_id, component)
);

-- The store clock: the database server's, never a worker's.
CREATE FUNCTION autocomp_now() RETURNS bigint LANGUAGE sql VOLATILE AS $$
    SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint
$$;

-- Every write takes its seqs here, after locking its batch row, and holds the feed lock
-- (shared) until it commits or rolls back.
CREATE FUNCTION autocomp_next_seq() RETURNS bigint LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock_shared(@FEED_LOCK@);
    RETURN nextval('store_seq');
END $$;

-- The feed's horizon: once no writer holds the feed lock, every seq up to the sequence's
-- value belongs to a finished transaction, so a reader that stops there skips nothing.
-- The exclusive lock is held only for this statement.
CREATE FUNCTION autocomp_horizon() RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    h bigint;
BEGIN
    PERFORM pg_advisory_xact_lock(@FEED_LOCK@);
    SELECT CASE WHEN is_called THEN last_value ELSE 0 END INTO h FROM store_seq;
    RETURN h;
END $$;

CREATE FUNCTION autocomp_lock_batch(p_batch text) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM batches WHERE id = p_batch FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'AC404', MESSAGE = p_batch;
    END IF;
END $$;

-- The fence: only the newest generation of (batch, component), and only while open. NULL
-- when the run may write, else why not.
CREATE FUNCTION autocomp_fence_refusal(p_batch text, p_component text, p_generation bigint)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    current_generation bigint;
    run_state text;
BEGIN
    SELECT generation INTO current_generation FROM claims WHERE batch_id = p_batch AND component = p_component;
    IF NOT FOUND THEN
        RETURN 'was never claimed';
    END IF;
    IF current_generation <> p_generation THEN
        RETURN format('is not current: generation %s has claimed the batch since', current_generation);
    END IF;
    SELECT state INTO run_state FROM runs
        WHERE batch_id = p_batch AND component = p_component AND generation = p_generation;
    IF NOT FOUND THEN
        RETURN 'was never claimed';
    END IF;
    IF run_state <> 'open' THEN
        RETURN format('is already closed (%s)', run_state);
    END IF;
    RETURN NULL;
END $$;

CREATE FUNCTION autocomp_check_fence(p_batch text, p_component text, p_generation bigint)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    refusal text := autocomp_fence_refusal(p_batch, p_component, p_generation);
BEGIN
    IF refusal IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'AC410', MESSAGE = refusal;
    END IF;
END $$;

CREATE FUNCTION autocomp_create_batch(p_id text, p_type text, p_priority integer, p_metadata jsonb,
    OUT r_created boolean, OUT r_seq bigint, OUT r_at bigint) LANGUAGE plpgsql AS $$
BEGIN
    r_created := false;
    PERFORM 1 FROM batches WHERE id = p_id;
    IF FOUND THEN
        RETURN;
    END IF;
    r_seq := autocomp_next_seq();
    r_at := autocomp_now();
    INSERT INTO batches (id, type, priority, metadata, created_seq, modified_seq, changed_seq, created_at, modified_at)
        VALUES (p_id, p_type, p_priority, p_metadata, r_seq, r_seq, r_seq, r_at, r_at)
        ON CONFLICT (id) DO NOTHING;
    r_created := FOUND;
END $$;

CREATE FUNCTION autocomp_set_priority(p_id text, p_priority integer) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    s bigint;
BEGIN
    PERFORM autocomp_lock_batch(p_id);
    s := autocomp_next_seq();
    UPDATE batches SET priority = p_priority, changed_seq = s WHERE id = p_id;
    RETURN s;
END $$;

-- A content change computed by the client from the metadata as of `p_expected_modified_seq`;
-- NULL (nothing written) when the batch changed since, so the client merges again.
CREATE FUNCTION autocomp_replace_metadata(p_id text, p_expected_modified_seq bigint, p_metadata jsonb)
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
    UPDATE batches SET metadata = p_metadata, modified_seq = s, changed_seq = s, modified_at = autocomp_now()
        WHERE id = p_id;
    RETURN s;
END $$;

CREATE FUNCTION autocomp_insert_event(p_seq bigint, p_at bigint, p_batch text, p_type text, p_outcome text,
    p_agent text, p_details jsonb, p_run_component text, p_run_generation bigint, p_resets jsonb, p_key text)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO events (seq, batch_id, type, outcome, agent, at, details, run_component, run_generation, resets, idempotency_key)
        VALUES (p_seq, p_batch, p_type, p_outcome, p_agent, p_at, p_details, p_run_component, p_run_generation, p_resets, p_key);
    UPDATE batches SET changed_seq = p_seq WHERE id = p_batch;
END $$;

-- Appends in one transaction (a group commit: one call, one commit flush for all). Every
-- batch's row is locked first, in id order, so groups never deadlock with each other and no
-- row lock is awaited while the feed lock is held. Each append answers in its own row
-- (`r_index`, from 1): its seq and time; or, for an idempotency key already used, the event
-- it recorded (`r_earlier`, nothing written); or a refusal (`r_refused`: 'AC404' unknown
-- batch, 'AC410' fenced, with `r_reason`; nothing written for it).
CREATE FUNCTION autocomp_append_group(p_batches text[], p_types text[], p_outcomes text[], p_agents text[],
    p_details jsonb[], p_run_components text[], p_run_generations bigint[], p_resets jsonb[], p_keys text[])
RETURNS TABLE (r_index integer, r_seq bigint, r_at bigint, r_earlier jsonb, r_refused text, r_reason text)
LANGUAGE plpgsql AS $$
DECLARE
    locked text[];
    i integer;
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

-- A claim. With a claim key already used, nothing is written: `r_kind` is 'retry', `r_run`
-- that run and `r_current` the current generation, for the client to decide.
CREATE FUNCTION autocomp_claim(p_batch text, p_component text, p_agent text, p_host text, p_pid bigint,
    p_key text, OUT r_kind text, OUT r_run jsonb, OUT r_abandoned jsonb, OUT r_current bigint)
LANGUAGE plpgsql AS $$
DECLARE
    s bigint;
    t bigint;
BEGIN
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
            RETURN;
        END IF;
    END IF;
    -- autocomp_next_seq and autocomp_now, inline: claims are hot.
    PERFORM pg_advisory_xact_lock_shared(@FEED_LOCK@);
    s := nextval('store_seq');
    t := (extract(epoch FROM clock_timestamp()) * 1000)::bigint;
    INSERT INTO claims AS c (batch_id, component, generation) VALUES (p_batch, p_component, 1)
        ON CONFLICT (batch_id, component) DO UPDATE SET generation = c.generation + 1
        RETURNING generation INTO r_current;
    UPDATE runs r SET state = 'abandoned', ended_at = t
        WHERE batch_id = p_batch AND component = p_component AND state = 'open'
        RETURNING to_jsonb(r) INTO r_abandoned;
    INSERT INTO runs AS r (batch_id, component, generation, agent, host, pid, started_at, claim_seq, state, claim_key)
        VALUES (p_batch, p_component, r_current, p_agent, p_host, p_pid, t, s, 'open', p_key)
        RETURNING to_jsonb(r) INTO r_run;
    UPDATE batches SET changed_seq = s WHERE id = p_batch;
    r_kind := 'new';
END $$;

CREATE FUNCTION autocomp_release(p_batch text, p_component text, p_generation bigint)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    s bigint;
BEGIN
    PERFORM autocomp_lock_batch(p_batch);
    -- Releasing twice is a no-op, so a client may retry a release whose answer it lost.
    PERFORM 1 FROM runs r JOIN claims c USING (batch_id, component)
        WHERE r.batch_id = p_batch AND r.component = p_component AND r.generation = p_generation
          AND c.generation = p_generation AND r.state = 'released';
    IF FOUND THEN
        RETURN;
    END IF;
    PERFORM autocomp_check_fence(p_batch, p_component, p_generation);
    s := autocomp_next_seq();
    UPDATE runs SET state = 'released', ended_at = autocomp_now()
        WHERE batch_id = p_batch AND component = p_component AND generation = p_generation;
    UPDATE batches SET changed_seq = s WHERE id = p_batch;
END $$;

CREATE FUNCTION autocomp_save_checkpoint(p_batch text, p_component text, p_generation bigint, p_data jsonb)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM autocomp_lock_batch(p_batch);
    PERFORM autocomp_check_fence(p_batch, p_component, p_generation);
    INSERT INTO checkpoints (batch_id, component, data, generation, saved_at)
        VALUES (p_batch, p_component, p_data, p_generation, autocomp_now())
        ON CONFLICT (batch_id, component) DO UPDATE
        SET data = excluded.data, generation = excluded.generation, saved_at = excluded.saved_at;
END $$;

-- An operator's cancel, with the details the client built from the open run it saw
-- (`p_expected_generation`, NULL for none); `r_seq` NULL (nothing written) when that is no
-- longer the open run, so the client looks again.
CREATE FUNCTION autocomp_cancel_run(p_batch text, p_component text, p_expected_generation bigint,
    p_type text, p_outcome text, p_agent text, p_details jsonb,
    OUT r_seq bigint, OUT r_at bigint) LANGUAGE plpgsql AS $$
DECLARE
    open_generation bigint;
BEGIN
    PERFORM autocomp_lock_batch(p_batch);
    SELECT generation INTO open_generation FROM runs
        WHERE batch_id = p_batch AND component = p_component AND state = 'open';
    IF open_generation IS DISTINCT FROM p_expected_generation THEN
        RETURN;
    END IF;
    r_seq := autocomp_next_seq();
    r_at := autocomp_now();
    IF open_generation IS NOT NULL THEN
        UPDATE runs SET state = 'cancelled', ended_at = r_at
            WHERE batch_id = p_batch AND component = p_component AND generation = open_generation;
        -- The fence: the holder's generation is no longer current, whatever it tries.
        UPDATE claims SET generation = generation + 1 WHERE batch_id = p_batch AND component = p_component;
    END IF;
    PERFORM autocomp_insert_event(r_seq, r_at, p_batch, p_type, p_outcome, p_agent, p_details,
        NULL, NULL, NULL, NULL);
END $$;

-- An operator's prioritize, with details built by the client from `p_expected_previous`;
-- `r_seq` NULL (nothing written) when the priority changed since.
CREATE FUNCTION autocomp_prioritize(p_id text, p_priority integer, p_expected_previous integer,
    p_type text, p_outcome text, p_agent text, p_details jsonb,
    OUT r_seq bigint, OUT r_at bigint) LANGUAGE plpgsql AS $$
BEGIN
    PERFORM autocomp_lock_batch(p_id);
    PERFORM 1 FROM batches WHERE id = p_id AND priority = p_expected_previous;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    r_seq := autocomp_next_seq();
    r_at := autocomp_now();
    UPDATE batches SET priority = p_priority WHERE id = p_id;
    PERFORM autocomp_insert_event(r_seq, r_at, p_id, p_type, p_outcome, p_agent, p_details, NULL, NULL, NULL, NULL);
END $$;
