-- Hand-ons (`HandOnStore`): watchers that offered to be handed batches, and the append group
-- that opens a ready step's run for one of them in the append's own transaction.
CREATE TABLE takers (
    component text NOT NULL,
    liveness text NOT NULL,
    holder jsonb NOT NULL,
    descriptor jsonb NOT NULL,
    offered_at bigint NOT NULL,
    PRIMARY KEY (component, liveness)
);
CREATE INDEX takers_by_liveness ON takers (liveness);
-- A taker's open runs of its step: what a hand-on checks it is idle by, and its wake reads.
CREATE INDEX runs_open_by_liveness ON runs (component, liveness) WHERE state = 'open';

-- The run of `p_component` on `p_batch` for the taker of it that offered first among those
-- holding no open run of it, after an append by run (`p_run_component`, `p_run_generation`)
-- that found the batch at `p_changed_before`; NULL (nothing written) unless the batch was as
-- that run's claim read it, neither the step nor the pipeline is held and nobody has an open
-- run of the step on the batch (the rule of `store/src/port/hand_on.rs`, `HandOn::rule`).
-- Opened by `autocomp_claim`, as any claim.
CREATE FUNCTION autocomp_hand_on(p_batch text, p_component text, p_run_component text, p_run_generation bigint,
    p_changed_before bigint)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    kept_before text := current_setting('autocomp.summary_kept_by_writer', true);
    h jsonb;
    c record;
BEGIN
    PERFORM set_config('autocomp.summary_kept_by_writer', 'on', true);
    SELECT t.holder INTO h FROM takers t
        WHERE t.component = p_component
          AND NOT EXISTS (SELECT 1 FROM runs r WHERE r.component = t.component AND r.state = 'open'
                            AND r.liveness = t.liveness)
        ORDER BY t.offered_at LIMIT 1
        -- Locked to the append's commit: a withdrawal waits for it (and then finds the run
        -- handed), and a concurrent append hands this taker nothing (one run at a time).
        FOR UPDATE OF t SKIP LOCKED;
    IF h IS NULL
       OR NOT EXISTS (SELECT 1 FROM runs WHERE batch_id = p_batch AND component = p_run_component
                        AND generation = p_run_generation AND claim_seq = p_changed_before)
       OR EXISTS (SELECT 1 FROM steering WHERE id = 1
                    AND (coalesce(state -> 'components' ? p_component, false)
                         OR coalesce(jsonb_typeof(state -> 'pipeline'), 'null') <> 'null'))
       OR EXISTS (SELECT 1 FROM runs WHERE batch_id = p_batch AND component = p_component AND state = 'open') THEN
        PERFORM set_config('autocomp.summary_kept_by_writer', coalesce(kept_before, ''), true);
        RETURN NULL;
    END IF;
    SELECT * INTO c FROM autocomp_claim(p_batch, p_component, h ->> 'agent', h ->> 'host', (h ->> 'pid')::bigint,
        NULL, h ->> 'liveness', NULL, NULL);
    PERFORM set_config('autocomp.summary_kept_by_writer', coalesce(kept_before, ''), true);
    RETURN CASE WHEN c.r_kind = 'new' THEN c.r_run END;
END $$;

-- Schema 21's append group with hand-ons: `p_hand_ons[i]`, a JSON array of component names
-- (or NULL), names the steps append i hands its batch on to; `r_handed` the runs it opened.
CREATE FUNCTION autocomp_append_group(p_batches text[], p_types text[], p_outcomes text[], p_agents text[],
    p_details jsonb[], p_run_components text[], p_run_generations bigint[], p_resets jsonb[], p_keys text[],
    p_max_batch_bytes bigint, p_hand_ons jsonb[])
RETURNS TABLE (r_index integer, r_seq bigint, r_at bigint, r_earlier jsonb, r_refused text, r_reason text,
    r_handed jsonb)
LANGUAGE plpgsql AS $$
DECLARE
    kept_before text := current_setting('autocomp.summary_kept_by_writer', true);
    locked text[];
    i integer;
    held bigint;
    size bigint;
    before bigint;
    step text;
    handed jsonb;
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
        r_handed := NULL;
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
                SELECT stored_bytes, changed_seq INTO held, before FROM batches WHERE id = p_batches[i];
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
            IF p_hand_ons[i] IS NOT NULL AND p_run_components[i] IS NOT NULL THEN
                FOR step IN SELECT jsonb_array_elements_text(p_hand_ons[i]) LOOP
                    handed := autocomp_hand_on(p_batches[i], step, p_run_components[i], p_run_generations[i],
                        before);
                    IF handed IS NOT NULL THEN
                        r_handed := coalesce(r_handed, '[]'::jsonb) || jsonb_build_array(handed);
                    END IF;
                END LOOP;
            END IF;
        END IF;
        RETURN NEXT;
    END LOOP;
    PERFORM set_config('autocomp.summary_kept_by_writer', coalesce(kept_before, ''), true);
END $$;

-- Planned as schema 21 and 22 plan a stage's functions: generic plans, looked up by key (a
-- plan made on a young, nearly empty store must not scan the grown one).
ALTER FUNCTION autocomp_append_group(text[], text[], text[], text[], jsonb[], text[], bigint[], jsonb[], text[], bigint,
    jsonb[]) SET plan_cache_mode = force_generic_plan SET enable_seqscan = off SET jit = off;
ALTER FUNCTION autocomp_hand_on(text, text, text, bigint, bigint)
    SET plan_cache_mode = force_generic_plan SET enable_seqscan = off SET jit = off;

-- A claimer that proves a holder dead takes its offers away with its run (`HandOnStore`).
-- Called by the store's client after a claim round with takeovers.
CREATE FUNCTION autocomp_forget_takers(p_livenesses text[]) RETURNS void LANGUAGE sql AS $$
    DELETE FROM takers WHERE liveness = ANY (p_livenesses);
$$;

-- The append group as the release before calls it: the one above with no hand-ons, so the
-- two releases share one body during a rolling upgrade.
CREATE OR REPLACE FUNCTION autocomp_append_group(p_batches text[], p_types text[], p_outcomes text[], p_agents text[],
    p_details jsonb[], p_run_components text[], p_run_generations bigint[], p_resets jsonb[], p_keys text[],
    p_max_batch_bytes bigint)
RETURNS TABLE (r_index integer, r_seq bigint, r_at bigint, r_earlier jsonb, r_refused text, r_reason text)
LANGUAGE sql AS $$
    SELECT g.r_index, g.r_seq, g.r_at, g.r_earlier, g.r_refused, g.r_reason
    FROM autocomp_append_group(p_batches, p_types, p_outcomes, p_agents, p_details, p_run_components,
        p_run_generations, p_resets, p_keys, p_max_batch_bytes, NULL::jsonb[]) g;
$$;
