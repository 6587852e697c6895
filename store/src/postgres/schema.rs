//! The PostgreSQL schema, its versioned migrations, and the server-side functions every write
//! goes through. Migrating takes a transaction-scoped advisory lock, so of two processes
//! opening an empty database at once one migrates and the other waits, then finds it done.

use tokio_postgres::Client;

use crate::port::{StoreError, StoreResult};
use autocomp_model::{InvalidInput, WORK_MINUTES_IN_HOUR, WORK_MINUTES_KEPT};

/// Ordered migrations; never edit a released one, append a new one.
const MIGRATIONS: &[(i32, &str)] = &[(1, V1), (2, V2), (3, V3), (4, V4), (5, V5), (6, V6), (7, V7), (8, V8)];

pub const LATEST_VERSION: i32 = MIGRATIONS[MIGRATIONS.len() - 1].0;

/// Advisory lock keys (per database). The feed key is held shared by every writer from the
/// moment it takes a seq until it commits, and taken exclusively for an instant by a feed
/// reader: see `autocomp_next_seq` and `autocomp_horizon`.
pub const MIGRATION_LOCK: i64 = 0x6175_746f_636f_6d01; // "autocom" + 1
pub const FEED_LOCK: i64 = 0x6175_746f_636f_6d02;

const V1: &str = r#"
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
"#;

const V2: &str = r#"
-- The component registry: each component as its binary last described itself, and each
-- host's last pass of it. Not batch changes: no seq, no feed lock, no batch row touched.
CREATE TABLE components (
    name           text COLLATE "C" PRIMARY KEY,
    event_type     text COLLATE "C" NOT NULL,
    descriptor     jsonb NOT NULL,
    registered_at  bigint NOT NULL,
    changed_at     bigint NOT NULL,
    retired_at     bigint,
    retired_by     text,
    retired_reason text
);
-- One producer per event type among the components still in the pipeline.
CREATE UNIQUE INDEX components_by_event_type ON components (event_type) WHERE retired_at IS NULL;

-- Rewritten by every cron start of every component: room on each page for the new version of
-- a row, so the update stays on its page and touches no index.
CREATE TABLE component_hosts (
    component        text COLLATE "C" NOT NULL REFERENCES components (name),
    host             text COLLATE "C" NOT NULL,
    version          text NOT NULL,
    last_seen        bigint NOT NULL,
    pass_started_at  bigint,
    pass_ended_at    bigint,
    pass_outcome     text,
    pass_summary     text NOT NULL DEFAULT '',
    pass_duration_ms bigint,
    PRIMARY KEY (component, host)
) WITH (fillfactor = 70);

-- A component with its hosts by name, as the client reads it; NULL if unknown. STABLE: it
-- reads with its caller's snapshot, so a listing of every component is one consistent view.
CREATE FUNCTION autocomp_component(p_name text) RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT to_jsonb(c) || jsonb_build_object('hosts', COALESCE(
        (SELECT jsonb_agg(to_jsonb(h) ORDER BY h.host) FROM component_hosts h WHERE h.component = c.name),
        '[]'::jsonb))
    FROM components c WHERE c.name = p_name
$$;

-- A component's pass. The descriptor row is rewritten only when the descriptor differs (or
-- the component was retired); the host's row always. Returns NULL when recorded, else the
-- component in the pipeline that already records the event type (nothing written).
CREATE FUNCTION autocomp_record_pass(p_name text, p_event_type text, p_descriptor jsonb, p_host text,
    p_version text, p_ended boolean, p_outcome text, p_summary text, p_duration_ms bigint)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    t bigint := autocomp_now();
    other text;
BEGIN
    SELECT name INTO other FROM components
        WHERE event_type = p_event_type AND retired_at IS NULL AND name <> p_name;
    IF FOUND THEN
        RETURN other;
    END IF;
    INSERT INTO components AS c (name, event_type, descriptor, registered_at, changed_at)
        VALUES (p_name, p_event_type, p_descriptor, t, t)
        ON CONFLICT (name) DO UPDATE SET
            event_type = excluded.event_type,
            descriptor = excluded.descriptor,
            changed_at = CASE WHEN c.descriptor = excluded.descriptor THEN c.changed_at ELSE excluded.changed_at END,
            retired_at = NULL, retired_by = NULL, retired_reason = NULL
        WHERE c.descriptor <> excluded.descriptor OR c.retired_at IS NOT NULL;
    -- A start keeps the previous end (and its outcome) so a running pass still shows how the
    -- last one went; an end dates its start back by the duration the component measured.
    IF p_ended THEN
        INSERT INTO component_hosts AS h (component, host, version, last_seen, pass_started_at, pass_ended_at,
                pass_outcome, pass_summary, pass_duration_ms)
            VALUES (p_name, p_host, p_version, t, t - p_duration_ms, t, p_outcome, p_summary, p_duration_ms)
            ON CONFLICT (component, host) DO UPDATE SET
                version = excluded.version, last_seen = excluded.last_seen,
                pass_started_at = excluded.pass_started_at, pass_ended_at = excluded.pass_ended_at,
                pass_outcome = excluded.pass_outcome, pass_summary = excluded.pass_summary,
                pass_duration_ms = excluded.pass_duration_ms;
    ELSE
        INSERT INTO component_hosts AS h (component, host, version, last_seen, pass_started_at)
            VALUES (p_name, p_host, p_version, t, t)
            ON CONFLICT (component, host) DO UPDATE SET
                version = excluded.version, last_seen = excluded.last_seen,
                pass_started_at = excluded.pass_started_at;
    END IF;
    RETURN NULL;
END $$;

-- An operator's retirement. `r_outcome`: 'retired'; 'already' (nothing written; `r_component`
-- says when and by whom); 'unknown' (`r_component` is the names the registry holds).
CREATE FUNCTION autocomp_retire_component(p_name text, p_by text, p_reason text,
    OUT r_outcome text, OUT r_component jsonb) LANGUAGE plpgsql AS $$
DECLARE
    was_retired bigint;
BEGIN
    SELECT retired_at INTO was_retired FROM components WHERE name = p_name FOR UPDATE;
    IF NOT FOUND THEN
        r_outcome := 'unknown';
        SELECT COALESCE(jsonb_agg(name ORDER BY name), '[]'::jsonb) INTO r_component FROM components;
        RETURN;
    END IF;
    IF was_retired IS NOT NULL THEN
        r_outcome := 'already';
    ELSE
        UPDATE components SET retired_at = autocomp_now(), retired_by = p_by, retired_reason = p_reason
            WHERE name = p_name;
        r_outcome := 'retired';
    END IF;
    r_component := autocomp_component(p_name);
END $$;
"#;

const V3: &str = r#"
-- What each component's recorded work came to, per result (success, failure, transient):
-- since it was registered, and per minute of store time for the last two hours (metrics read
-- the last hour). `buckets`: counts per duration bucket, added element by element.
CREATE TABLE component_work_totals (
    component       text COLLATE "C" NOT NULL,
    result          text NOT NULL,
    results         bigint NOT NULL,
    duration_ms_sum bigint NOT NULL,
    buckets         bigint[] NOT NULL,
    PRIMARY KEY (component, result)
);
CREATE TABLE component_work_minutes (
    component       text COLLATE "C" NOT NULL,
    minute          bigint NOT NULL,
    result          text NOT NULL,
    results         bigint NOT NULL,
    duration_ms_sum bigint NOT NULL,
    buckets         bigint[] NOT NULL,
    PRIMARY KEY (component, minute, result)
);

CREATE FUNCTION autocomp_add_counts(a bigint[], b bigint[]) RETURNS bigint[] LANGUAGE sql IMMUTABLE AS $$
    SELECT array_agg(COALESCE(x, 0) + COALESCE(y, 0) ORDER BY i) FROM unnest(a, b) WITH ORDINALITY AS u(x, y, i)
$$;

-- A pass with its work: `p_work` holds one tally per result, `[{result, results,
-- duration_ms_sum, buckets}]`, added to the totals and to the current minute once the pass
-- itself is recorded (nothing is added when another component owns the event type).
CREATE FUNCTION autocomp_record_pass(p_name text, p_event_type text, p_descriptor jsonb, p_host text,
    p_version text, p_ended boolean, p_outcome text, p_summary text, p_duration_ms bigint, p_work jsonb)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    other text;
    this_minute bigint := autocomp_now() / 60000;
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
    DELETE FROM component_work_minutes WHERE component = p_name AND minute < this_minute - @WORK_MINUTES_KEPT@;
    RETURN NULL;
END $$;

-- A component with its hosts by name and its work (totals, and the minutes of the last hour
-- by the transaction's clock), as the client reads it; NULL if unknown.
CREATE OR REPLACE FUNCTION autocomp_component(p_name text) RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT to_jsonb(c) || jsonb_build_object(
        'hosts', COALESCE(
            (SELECT jsonb_agg(to_jsonb(h) ORDER BY h.host) FROM component_hosts h WHERE h.component = c.name),
            '[]'::jsonb),
        'work_totals', COALESCE(
            (SELECT jsonb_agg(to_jsonb(w)) FROM component_work_totals w WHERE w.component = c.name),
            '[]'::jsonb),
        'work_last_hour', COALESCE(
            (SELECT jsonb_agg(to_jsonb(w)) FROM component_work_minutes w
             WHERE w.component = c.name
               AND w.minute >= (extract(epoch FROM now()) * 1000)::bigint / 60000 - (@WORK_MINUTES_IN_HOUR@ - 1)),
            '[]'::jsonb))
    FROM components c WHERE c.name = p_name
$$;
"#;

const V4: &str = r#"
-- A pass's claims in one call: one transaction, one commit flush. Every batch's row is locked
-- first, in id order, so passes claiming overlapping batches never deadlock. Each batch
-- answers in its own row (`r_index`, from 1) as `autocomp_claim` answers; an unknown batch is
-- `r_kind` 'missing' and nothing is written for it.
CREATE FUNCTION autocomp_claim_many(p_batches text[], p_component text, p_agent text, p_host text, p_pid bigint,
    p_key text)
RETURNS TABLE (r_index integer, r_kind text, r_run jsonb, r_abandoned jsonb, r_current bigint)
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
        IF locked IS NULL OR NOT p_batches[i] = ANY (locked) THEN
            r_kind := 'missing';
            r_run := NULL;
            r_abandoned := NULL;
            r_current := NULL;
        ELSE
            SELECT * INTO r_kind, r_run, r_abandoned, r_current
                FROM autocomp_claim(p_batches[i], p_component, p_agent, p_host, p_pid, p_key);
        END IF;
        RETURN NEXT;
    END LOOP;
END $$;
"#;

const V5: &str = r#"
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
"#;

fn unavailable(error: tokio_postgres::Error) -> StoreError {
    StoreError::Unavailable(super::describe_error(&error))
}

/// The schema version the database is at (0: empty). One round trip: this runs at every
/// cron start.
pub async fn schema_version(client: &Client) -> StoreResult<i32> {
    match client.query_one("SELECT COALESCE(MAX(version), 0) FROM schema_version", &[]).await {
        Ok(row) => Ok(row.get(0)),
        Err(error) if error.code() == Some(&tokio_postgres::error::SqlState::UNDEFINED_TABLE) => Ok(0),
        Err(error) => Err(unavailable(error)),
    }
}

/// Refuses a database a newer release has migrated.
pub fn check_not_newer(current: i32) -> StoreResult<()> {
    if current > LATEST_VERSION {
        return Err(StoreError::Unavailable(format!(
            "the PostgreSQL store has schema version {current}, newer than this release knows \
             ({LATEST_VERSION}); upgrade autocomp before using it"
        )));
    }
    Ok(())
}

const V6: &str = r#"
-- Steering the pipeline: one record of the holds, pools and breaker counts (the model's
-- `Steering` as JSON) with its version, and the append-only log of the changes. A change is
-- computed by the client from the record it read and written only if the version is still
-- the one it read (one statement; a client that lost the race reads again).
CREATE TABLE steering (
    id      integer PRIMARY KEY CHECK (id = 1),
    version bigint NOT NULL,
    state   jsonb NOT NULL
);
INSERT INTO steering (id, version, state) VALUES (1, 0, '{"version": 0}');
CREATE TABLE steering_log (
    version bigint PRIMARY KEY,
    at      bigint NOT NULL,
    entry   jsonb NOT NULL
);
CREATE FUNCTION autocomp_steer(p_expected bigint, p_state jsonb, p_entry jsonb, p_at bigint)
    RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    UPDATE steering SET version = p_expected + 1, state = p_state WHERE id = 1 AND version = p_expected;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF p_entry IS NOT NULL THEN
        INSERT INTO steering_log (version, at, entry) VALUES (p_expected + 1, p_at, p_entry);
    END IF;
    -- The head moves, so watchers sleeping in the change feed wake and honour the change.
    PERFORM autocomp_next_seq();
    RETURN true;
END $$;

-- The notification outbox: each item once per channel (its key), leased to one notifier at a
-- time and marked sent once; and the notifiers' cursor in the change feed. Keys sort by their
-- bytes (COLLATE "C"), as the embedded store sorts them, whatever the database's locale.
CREATE TABLE notices (
    key         text COLLATE "C" PRIMARY KEY,
    channel     text NOT NULL,
    subject     text NOT NULL,
    body        jsonb NOT NULL,
    created_at  bigint NOT NULL,
    attempts    integer NOT NULL DEFAULT 0,
    last_error  text,
    due_at      bigint NOT NULL,
    holder      text,
    lease_until bigint,
    sent_at     bigint
);
CREATE INDEX notices_pending ON notices (due_at) WHERE sent_at IS NULL;
CREATE INDEX notices_recent ON notices (created_at);
CREATE TABLE notice_cursor (
    id  integer PRIMARY KEY CHECK (id = 1),
    seq bigint NOT NULL
);
-- -1: no notifier has run yet (the first one starts at the head, whatever it is).
INSERT INTO notice_cursor (id, seq) VALUES (1, -1);

CREATE FUNCTION autocomp_enqueue_notices(p_keys text[], p_channels text[], p_subjects text[], p_bodies jsonb[],
                                         p_from bigint, p_to bigint, OUT r_added bigint, OUT r_cursor bigint)
    LANGUAGE plpgsql AS $$
DECLARE
    -- One time for the whole call (autocomp_now is the clock's, per row): a call's notices
    -- were found together and sort by key among themselves, as on every backend.
    t bigint := autocomp_now();
BEGIN
    INSERT INTO notices (key, channel, subject, body, created_at, due_at)
    SELECT k, c, s, b, t, t
    FROM unnest(p_keys, p_channels, p_subjects, p_bodies) AS n (k, c, s, b)
    ON CONFLICT (key) DO NOTHING;
    GET DIAGNOSTICS r_added = ROW_COUNT;
    IF p_from IS NOT NULL THEN
        UPDATE notice_cursor SET seq = p_to WHERE id = 1 AND seq = p_from;
    END IF;
    SELECT seq INTO r_cursor FROM notice_cursor WHERE id = 1;
END $$;

-- Due notices leased to one holder; another notifier's transaction skips the rows this one
-- locked, so two never take the same notice.
CREATE FUNCTION autocomp_take_notices(p_holder text, p_limit integer, p_lease_ms bigint)
    RETURNS SETOF notices LANGUAGE sql AS $$
    UPDATE notices SET holder = p_holder, lease_until = autocomp_now() + p_lease_ms
    WHERE key IN (
        SELECT key FROM notices
        WHERE sent_at IS NULL AND due_at <= autocomp_now() AND (lease_until IS NULL OR lease_until <= autocomp_now())
        ORDER BY created_at, key LIMIT p_limit
        FOR UPDATE SKIP LOCKED
    )
    RETURNING *
$$;

-- 'ok', or why the notice cannot be settled by this holder.
CREATE FUNCTION autocomp_settle_notice(p_key text, p_holder text, p_sent boolean, p_error text, p_retry_ms bigint)
    RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    n notices;
BEGIN
    SELECT * INTO n FROM notices WHERE key = p_key FOR UPDATE;
    IF NOT FOUND THEN
        RETURN 'missing';
    ELSIF n.sent_at IS NOT NULL THEN
        RETURN 'sent';
    ELSIF n.holder IS DISTINCT FROM p_holder OR n.lease_until IS NULL OR n.lease_until <= autocomp_now() THEN
        RETURN 'not_leased';
    END IF;
    IF p_sent THEN
        UPDATE notices SET sent_at = autocomp_now(), holder = NULL, lease_until = NULL WHERE key = p_key;
    ELSE
        UPDATE notices SET attempts = attempts + 1, last_error = p_error, due_at = autocomp_now() + p_retry_ms,
                           holder = NULL, lease_until = NULL
        WHERE key = p_key;
    END IF;
    RETURN 'ok';
END $$;
"#;

const V7: &str = r#"
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
"#;

const V8: &str = r#"
-- Pushed wake-ups: a commit that moves the head (a batch row written: created, appended to,
-- claimed, released, changed; or the steering) notifies `autocomp_store_changed`, so the
-- processes listening there (watchers, sboi, the store service) wake at once instead of
-- polling. Statement-level: one NOTIFY per statement, and PostgreSQL folds a transaction's
-- identical notifications into one, delivered when (and only if) it commits.
CREATE FUNCTION autocomp_notify_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('autocomp_store_changed', '');
    RETURN NULL;
END $$;
CREATE TRIGGER batches_notify AFTER INSERT OR UPDATE ON batches
    FOR EACH STATEMENT EXECUTE FUNCTION autocomp_notify_changed();
CREATE TRIGGER steering_notify AFTER UPDATE ON steering
    FOR EACH STATEMENT EXECUTE FUNCTION autocomp_notify_changed();
"#;

/// Applies the missing migrations in one transaction under the migration lock; returns the
/// versions applied (none when another process got there first).
pub async fn migrate(client: &mut Client, target: &str) -> StoreResult<Vec<i32>> {
    migrate_up_to(client, target, LATEST_VERSION).await
}

/// Applies the missing migrations up to `version` (a lower one builds the database an older
/// release left, for upgrade tests).
pub async fn migrate_up_to(client: &mut Client, target: &str, version: i32) -> StoreResult<Vec<i32>> {
    let tx = client.transaction().await.map_err(unavailable)?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK]).await.map_err(unavailable)?;
    tx.batch_execute(
        "CREATE TABLE IF NOT EXISTS schema_version (
             version    integer PRIMARY KEY,
             applied_at bigint NOT NULL
         )",
    )
    .await
    .map_err(|e| privileges(e, target, "create tables"))?;
    let current: i32 =
        tx.query_one("SELECT COALESCE(MAX(version), 0) FROM schema_version", &[]).await.map_err(unavailable)?.get(0);
    check_not_newer(current)?;
    let mut applied = Vec::new();
    let up_to = version;
    for (version, sql) in MIGRATIONS.iter().filter(|(version, _)| *version > current && *version <= up_to) {
        let sql = sql
            .replace("@FEED_LOCK@", &FEED_LOCK.to_string())
            .replace("@WORK_MINUTES_KEPT@", &WORK_MINUTES_KEPT.to_string())
            .replace("@WORK_MINUTES_IN_HOUR@", &WORK_MINUTES_IN_HOUR.to_string())
            .replace("@WORK_HOURS_KEPT@", &autocomp_model::WORK_HOURS_KEPT.to_string());
        tx.batch_execute(&sql).await.map_err(|e| {
            StoreError::Unavailable(format!("migration to schema {version} failed: {}", super::describe_error(&e)))
        })?;
        tx.execute(
            "INSERT INTO schema_version (version, applied_at) VALUES ($1, (extract(epoch FROM now()) * 1000)::bigint)",
            &[version],
        )
        .await
        .map_err(unavailable)?;
        applied.push(*version);
    }
    tx.commit().await.map_err(unavailable)?;
    Ok(applied)
}

fn privileges(error: tokio_postgres::Error, target: &str, what: &str) -> StoreError {
    if error.code() == Some(&tokio_postgres::error::SqlState::INSUFFICIENT_PRIVILEGE) {
        return InvalidInput::new(
            "store url",
            target,
            format!(
                "the role may not {what} in the database ({}); make it the database's owner",
                super::describe_error(&error)
            ),
        )
        .into();
    }
    unavailable(error)
}
