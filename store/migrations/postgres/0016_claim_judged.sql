-- A claim round for batches the caller judged ready on their summaries (`claim_ready_judged`:
-- a watcher judged them from the change feed, so the store need not read and judge them
-- before it claims). Each is claimed only while it is exactly as judged: its `changed_seq`
-- still the stamp, no open run of the component but one this very request opened (a retry
-- after a lost answer carries the same claim key), and the steering still at the version the
-- caller judged by and holding neither the component nor the pipeline. Anything else: one
-- row, 'moved' or 'steering_moved', and nothing written; the caller then reads and judges as
-- `claim_ready` does. The failed attempts it answers count from the start: the caller counts
-- them from the batch's newest `Reset` on the read it sent before this call.
CREATE FUNCTION autocomp_claim_judged(p_batches text[], p_stamps bigint[], p_steering bigint,
    p_component text, p_agent text, p_host text, p_pid bigint, p_key text, p_liveness text)
RETURNS TABLE (r_index integer, r_kind text, r_run jsonb, r_abandoned jsonb, r_current bigint,
    r_failed bigint, r_checkpoint jsonb)
LANGUAGE plpgsql AS $$
DECLARE
    n integer := coalesce(array_length(p_batches, 1), 0);
BEGIN
    PERFORM 1 FROM batches WHERE id = ANY (p_batches) ORDER BY id FOR UPDATE;
    IF NOT EXISTS (SELECT 1 FROM steering WHERE id = 1 AND version = p_steering
                   AND NOT coalesce(state -> 'components' ? p_component, false)
                   AND coalesce(jsonb_typeof(state -> 'pipeline'), 'null') = 'null') THEN
        RETURN QUERY SELECT 0, 'steering_moved'::text, NULL::jsonb, NULL::jsonb, NULL::bigint, NULL::bigint,
            NULL::jsonb;
        RETURN;
    END IF;
    IF EXISTS (SELECT 1 FROM runs WHERE batch_id = ANY (p_batches) AND component = p_component AND state = 'open'
               AND claim_key IS DISTINCT FROM p_key) THEN
        RETURN QUERY SELECT 0, 'moved'::text, NULL::jsonb, NULL::jsonb, NULL::bigint, NULL::bigint, NULL::jsonb;
        RETURN;
    END IF;
    RETURN QUERY SELECT * FROM autocomp_claim_ready(p_batches, p_stamps, array_fill(0::bigint, ARRAY[n]), p_steering,
        array_fill(NULL::bigint, ARRAY[n]), array_fill(NULL::text, ARRAY[n]),
        p_component, p_agent, p_host, p_pid, p_key, p_liveness);
END $$;
