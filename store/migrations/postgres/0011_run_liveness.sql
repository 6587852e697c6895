-- A run's holder may name its liveness record in the lock service (`zk:...`, `pg:...`,
-- `local:...`): what a claimer that finds the run open asks about before it takes the run
-- over (an exclusive `claim_ready`'s `takeovers`). NULL for a holder that keeps none, and for
-- every run claimed before this schema. Every read of a run (`to_jsonb(r)`) carries it.
ALTER TABLE runs ADD COLUMN liveness text;

-- The claim functions take the holder's liveness; the ones without it (a process of the
-- release before, still running while this one migrated) claim through them with none.
--
-- An open run whose holder names a liveness is its batch's lock (claim-as-lock, the rule of
-- `ready_claims::may_abandon` in the store's code, kept here again so that a client of any
-- release keeps it): only a claim naming that run's generation and liveness
-- (`p_takeover_generation`, `p_takeover_liveness`: an exclusive claim round's takeover of a
-- holder proven dead) abandons it. Any other claim of the batch is answered 'held' with that
-- run (`r_run`) and writes nothing; the functions of the release before raise AC409 instead.
CREATE FUNCTION autocomp_claim(p_batch text, p_component text, p_agent text, p_host text, p_pid bigint,
    p_key text, p_liveness text, p_takeover_generation bigint, p_takeover_liveness text,
    OUT r_kind text, OUT r_run jsonb, OUT r_abandoned jsonb, OUT r_current bigint)
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
    SELECT to_jsonb(r), r.generation INTO r_run, r_current FROM runs r
        WHERE batch_id = p_batch AND component = p_component AND state = 'open' AND liveness IS NOT NULL
          AND (generation IS DISTINCT FROM p_takeover_generation OR liveness IS DISTINCT FROM p_takeover_liveness);
    IF FOUND THEN
        r_kind := 'held';
        RETURN;
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

-- A batch whose open run is its lock refuses the claim of a process of the release before,
-- which knows no 'held' answer: an error it reports (SQLSTATE AC409, its words naming the
-- run and its holder), and the statement rolled back, so nothing it claimed in it is kept.
CREATE FUNCTION autocomp_unless_held(p_kind text, p_run jsonb) RETURNS text
LANGUAGE plpgsql AS $$
BEGIN
    IF p_kind = 'held' THEN
        RAISE EXCEPTION USING ERRCODE = 'AC409',
            MESSAGE = format('batch %s: run %s of %s is the batch''s lock, held by %s (liveness %s); only an '
                || 'exclusive claim that takes it over once that holder is proven dead may claim the batch',
                p_run->>'batch_id', p_run->>'generation', p_run->>'component', p_run->>'agent',
                p_run->>'liveness');
    END IF;
    RETURN p_kind;
END $$;

CREATE OR REPLACE FUNCTION autocomp_claim(p_batch text, p_component text, p_agent text, p_host text, p_pid bigint,
    p_key text, OUT r_kind text, OUT r_run jsonb, OUT r_abandoned jsonb, OUT r_current bigint)
LANGUAGE sql AS $$
    SELECT autocomp_unless_held(c.r_kind, c.r_run), c.r_run, c.r_abandoned, c.r_current
        FROM autocomp_claim(p_batch, p_component, p_agent, p_host, p_pid, p_key, NULL::text, NULL::bigint, NULL::text) c
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
                FROM autocomp_claim(p_batches[i], p_component, p_agent, p_host, p_pid, p_key, p_liveness, NULL, NULL);
        END IF;
        RETURN NEXT;
    END LOOP;
END $$;

CREATE OR REPLACE FUNCTION autocomp_claim_many(p_batches text[], p_component text, p_agent text, p_host text,
    p_pid bigint, p_key text)
RETURNS TABLE (r_index integer, r_kind text, r_run jsonb, r_abandoned jsonb, r_current bigint)
LANGUAGE sql AS $$
    SELECT c.r_index, autocomp_unless_held(c.r_kind, c.r_run), c.r_run, c.r_abandoned, c.r_current
        FROM autocomp_claim_many(p_batches, p_component, p_agent, p_host, p_pid, p_key, NULL::text) c
$$;

-- As 0009's, with the holder's liveness and each batch's takeover (`p_takeover_generations`,
-- `p_takeover_liveness`, in the order of `p_batches`; NULL or shorter: none). A claim round
-- sends only the batches it may claim (exclusive: no other claim's open run, or one taken
-- over by its generation and liveness; not exclusive: no open run that is its batch's lock);
-- the batch's unmoved changed_seq is what proves that open run is still the one judged.
CREATE FUNCTION autocomp_claim_ready(p_batches text[], p_stamps bigint[], p_since bigint[], p_steering bigint,
    p_takeover_generations bigint[], p_takeover_liveness text[],
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
            FROM autocomp_claim(p_batches[i], p_component, p_agent, p_host, p_pid, p_key, p_liveness,
                                p_takeover_generations[i], p_takeover_liveness[i]);
        RETURN NEXT;
    END LOOP;
END $$;

CREATE OR REPLACE FUNCTION autocomp_claim_ready(p_batches text[], p_stamps bigint[], p_since bigint[],
    p_steering bigint, p_component text, p_agent text, p_host text, p_pid bigint, p_key text)
RETURNS TABLE (r_index integer, r_kind text, r_run jsonb, r_abandoned jsonb, r_current bigint,
    r_failed bigint, r_checkpoint jsonb)
LANGUAGE sql AS $$
    SELECT c.r_index, autocomp_unless_held(c.r_kind, c.r_run), c.r_run, c.r_abandoned, c.r_current, c.r_failed,
            c.r_checkpoint
        FROM autocomp_claim_ready(p_batches, p_stamps, p_since, p_steering, NULL::bigint[], NULL::text[],
            p_component, p_agent, p_host, p_pid, p_key, NULL::text) c
$$;
