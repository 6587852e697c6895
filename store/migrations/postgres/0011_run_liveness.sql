-- A run's holder may name its liveness record in the lock service (`zk:...`, `pg:...`,
-- `local:...`): what a claimer that finds the run open asks about before it takes the run
-- over (an exclusive `claim_ready`'s `takeovers`). NULL for a holder that keeps none, and for
-- every run claimed before this schema. Every read of a run (`to_jsonb(r)`) carries it.
ALTER TABLE runs ADD COLUMN liveness text;

-- The claim functions take the holder's liveness last; the ones without it (a process of the
-- release before, still running while this one migrated) claim through them with none.
CREATE FUNCTION autocomp_claim(p_batch text, p_component text, p_agent text, p_host text, p_pid bigint,
    p_key text, p_liveness text, OUT r_kind text, OUT r_run jsonb, OUT r_abandoned jsonb, OUT r_current bigint)
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
    INSERT INTO runs AS r (batch_id, component, generation, agent, host, pid, started_at, claim_seq, state, claim_key,
            liveness)
        VALUES (p_batch, p_component, r_current, p_agent, p_host, p_pid, t, s, 'open', p_key, p_liveness)
        RETURNING to_jsonb(r) INTO r_run;
    UPDATE batches SET changed_seq = s WHERE id = p_batch;
    r_kind := 'new';
END $$;

CREATE OR REPLACE FUNCTION autocomp_claim(p_batch text, p_component text, p_agent text, p_host text, p_pid bigint,
    p_key text, OUT r_kind text, OUT r_run jsonb, OUT r_abandoned jsonb, OUT r_current bigint)
LANGUAGE sql AS $$
    SELECT * FROM autocomp_claim(p_batch, p_component, p_agent, p_host, p_pid, p_key, NULL::text)
$$;

-- As 0004's, with the holder's liveness.
CREATE FUNCTION autocomp_claim_many(p_batches text[], p_component text, p_agent text, p_host text, p_pid bigint,
    p_key text, p_liveness text)
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
                FROM autocomp_claim(p_batches[i], p_component, p_agent, p_host, p_pid, p_key, p_liveness);
        END IF;
        RETURN NEXT;
    END LOOP;
END $$;

CREATE OR REPLACE FUNCTION autocomp_claim_many(p_batches text[], p_component text, p_agent text, p_host text,
    p_pid bigint, p_key text)
RETURNS TABLE (r_index integer, r_kind text, r_run jsonb, r_abandoned jsonb, r_current bigint)
LANGUAGE sql AS $$
    SELECT * FROM autocomp_claim_many(p_batches, p_component, p_agent, p_host, p_pid, p_key, NULL::text)
$$;

-- As 0009's, with the holder's liveness. An exclusive claim round sends only the batches it
-- may claim (no other claim's open run, or one taken over by its generation and liveness);
-- the batch's unmoved changed_seq is what proves that open run is still the one judged.
CREATE FUNCTION autocomp_claim_ready(p_batches text[], p_stamps bigint[], p_since bigint[], p_steering bigint,
    p_component text, p_agent text, p_host text, p_pid bigint, p_key text, p_liveness text)
RETURNS TABLE (r_index integer, r_kind text, r_run jsonb, r_abandoned jsonb, r_current bigint,
    r_failed bigint, r_checkpoint jsonb)
LANGUAGE plpgsql AS $$
DECLARE
    i integer;
    n integer := coalesce(array_length(p_batches, 1), 0);
BEGIN
    PERFORM 1 FROM batches WHERE id = ANY (p_batches) ORDER BY id FOR UPDATE;
    IF (SELECT version FROM steering WHERE id = 1) IS DISTINCT FROM p_steering THEN
        r_index := 0;
        r_kind := 'steering_moved';
        RETURN NEXT;
        RETURN;
    END IF;
    FOR i IN 1 .. n LOOP
        IF (SELECT changed_seq FROM batches WHERE id = p_batches[i]) IS DISTINCT FROM p_stamps[i]
           AND NOT EXISTS (SELECT 1 FROM runs WHERE batch_id = p_batches[i] AND component = p_component
                           AND claim_key = p_key) THEN
            r_index := i;
            r_kind := 'moved';
            RETURN NEXT;
            RETURN;
        END IF;
    END LOOP;
    FOR i IN 1 .. n LOOP
        r_index := i;
        SELECT COUNT(*) INTO r_failed FROM runs
            WHERE batch_id = p_batches[i] AND component = p_component AND claim_seq > p_since[i]
              AND (state = 'abandoned' OR transient);
        SELECT data INTO r_checkpoint FROM checkpoints WHERE batch_id = p_batches[i] AND component = p_component;
        IF NOT FOUND THEN
            r_checkpoint := NULL;
        END IF;
        SELECT * INTO r_kind, r_run, r_abandoned, r_current
            FROM autocomp_claim(p_batches[i], p_component, p_agent, p_host, p_pid, p_key, p_liveness);
        RETURN NEXT;
    END LOOP;
END $$;

CREATE OR REPLACE FUNCTION autocomp_claim_ready(p_batches text[], p_stamps bigint[], p_since bigint[],
    p_steering bigint, p_component text, p_agent text, p_host text, p_pid bigint, p_key text)
RETURNS TABLE (r_index integer, r_kind text, r_run jsonb, r_abandoned jsonb, r_current bigint,
    r_failed bigint, r_checkpoint jsonb)
LANGUAGE sql AS $$
    SELECT * FROM autocomp_claim_ready(p_batches, p_stamps, p_since, p_steering, p_component, p_agent, p_host,
        p_pid, p_key, NULL::text)
$$;
