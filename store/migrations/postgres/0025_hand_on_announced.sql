-- A hand-on announces itself to its taker: `h:<component> <liveness>` on the channel every
-- commit notifies (`ChangeConcern::Handed`), delivered with the commit, after its own
-- concern. The taker's wake then says it was handed a run, and no other waiter reads for one
-- (schema 24 announced nothing: every taker read its handed runs at every wake). And a
-- registration hands its new batch on as a result does (`autocomp_register_batch` with
-- hand-ons).

-- The run of `p_component` on `p_batch` for the taker of it that offered first among those
-- holding no open run of it, unless the steering holds the component or the pipeline; NULL
-- (nothing written) without one. Opened by `autocomp_claim`, as any claim, and announced.
CREATE FUNCTION autocomp_hand_on_to_taker(p_batch text, p_component text)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    kept_before text := current_setting('autocomp.summary_kept_by_writer', true);
    h jsonb;
    c record;
BEGIN
    PERFORM set_config('autocomp.summary_kept_by_writer', 'on', true);
    IF EXISTS (SELECT 1 FROM steering WHERE id = 1
                 AND (coalesce(state -> 'components' ? p_component, false)
                      OR coalesce(jsonb_typeof(state -> 'pipeline'), 'null') <> 'null')) THEN
        PERFORM set_config('autocomp.summary_kept_by_writer', coalesce(kept_before, ''), true);
        RETURN NULL;
    END IF;
    SELECT t.holder INTO h FROM takers t
        WHERE t.component = p_component
          AND NOT EXISTS (SELECT 1 FROM runs r WHERE r.component = t.component AND r.state = 'open'
                            AND r.liveness = t.liveness)
        ORDER BY t.offered_at LIMIT 1
        -- Locked to the commit: a withdrawal waits for it (and then finds the run handed),
        -- and a concurrent append hands this taker nothing (one run at a time).
        FOR UPDATE OF t SKIP LOCKED;
    IF h IS NULL THEN
        PERFORM set_config('autocomp.summary_kept_by_writer', coalesce(kept_before, ''), true);
        RETURN NULL;
    END IF;
    SELECT * INTO c FROM autocomp_claim(p_batch, p_component, h ->> 'agent', h ->> 'host', (h ->> 'pid')::bigint,
        NULL, h ->> 'liveness', NULL, NULL);
    IF c.r_kind <> 'new' THEN
        PERFORM set_config('autocomp.summary_kept_by_writer', coalesce(kept_before, ''), true);
        RETURN NULL;
    END IF;
    PERFORM pg_notify('autocomp_store_changed', 'h:' || p_component || ' ' || (h ->> 'liveness'));
    PERFORM set_config('autocomp.summary_kept_by_writer', coalesce(kept_before, ''), true);
    RETURN c.r_run;
END $$;

-- Schema 24's hand-on by an append, by the same rule (`HandOn::rule`): only while the batch
-- is as the appending run's claim read it and nobody has an open run of the step on it.
CREATE OR REPLACE FUNCTION autocomp_hand_on(p_batch text, p_component text, p_run_component text,
    p_run_generation bigint, p_changed_before bigint)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    kept_before text := current_setting('autocomp.summary_kept_by_writer', true);
    h jsonb;
BEGIN
    PERFORM set_config('autocomp.summary_kept_by_writer', 'on', true);
    IF NOT EXISTS (SELECT 1 FROM runs WHERE batch_id = p_batch AND component = p_run_component
                     AND generation = p_run_generation AND claim_seq = p_changed_before)
       OR EXISTS (SELECT 1 FROM runs WHERE batch_id = p_batch AND component = p_component AND state = 'open') THEN
        PERFORM set_config('autocomp.summary_kept_by_writer', coalesce(kept_before, ''), true);
        RETURN NULL;
    END IF;
    h := autocomp_hand_on_to_taker(p_batch, p_component);
    PERFORM set_config('autocomp.summary_kept_by_writer', coalesce(kept_before, ''), true);
    RETURN h;
END $$;

-- A registration handing its new batch on: `autocomp_register_batch`, then, if it created the
-- batch (nothing else can have touched it), a run of each step of `p_hand_ons` (a JSON array
-- of component names, or NULL) for an idle taker; `r_handed` the runs opened.
CREATE FUNCTION autocomp_register_batch(p_id text, p_type text, p_priority integer, p_metadata jsonb,
    p_event_type text, p_outcome text, p_agent text, p_details jsonb, p_resets jsonb, p_max_batch_bytes bigint,
    p_hand_ons jsonb,
    OUT r_created boolean, OUT r_seq bigint, OUT r_at bigint, OUT r_event_seq bigint, OUT r_event_at bigint,
    OUT r_handed jsonb)
LANGUAGE plpgsql AS $$
DECLARE
    step text;
    handed jsonb;
BEGIN
    SELECT g.r_created, g.r_seq, g.r_at, g.r_event_seq, g.r_event_at
        INTO r_created, r_seq, r_at, r_event_seq, r_event_at
        FROM autocomp_register_batch(p_id, p_type, p_priority, p_metadata, p_event_type, p_outcome, p_agent,
            p_details, p_resets, p_max_batch_bytes) g;
    IF NOT r_created OR p_hand_ons IS NULL THEN
        RETURN;
    END IF;
    FOR step IN SELECT jsonb_array_elements_text(p_hand_ons) LOOP
        handed := autocomp_hand_on_to_taker(p_id, step);
        IF handed IS NOT NULL THEN
            r_handed := coalesce(r_handed, '[]'::jsonb) || jsonb_build_array(handed);
        END IF;
    END LOOP;
END $$;

-- Planned as every function of a stage since schema 22 (a replaced function keeps no setting
-- of the one it replaces).
ALTER FUNCTION autocomp_hand_on(text, text, text, bigint, bigint)
    SET plan_cache_mode = force_generic_plan SET enable_seqscan = off SET jit = off;
ALTER FUNCTION autocomp_hand_on_to_taker(text, text)
    SET plan_cache_mode = force_generic_plan SET enable_seqscan = off SET jit = off;
ALTER FUNCTION autocomp_register_batch(text, text, integer, jsonb, text, text, text, jsonb, jsonb, bigint, jsonb)
    SET plan_cache_mode = force_generic_plan SET enable_seqscan = off SET jit = off;
