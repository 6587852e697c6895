-- A pass's claim round (`claim_ready`): the client read the steering and the batches in one
-- statement and judged each batch's readiness; this claims the ones it judged ready, in one
-- transaction, only if nothing it judged on moved since: every batch's row still at the
-- changed_seq read (or holding a run this claim key opened: a retry after a lost answer) and
-- the steering still at the version read. Otherwise nothing is written and one row (r_index 0
-- 'steering_moved', or the batch's index 'moved') says so, and the client reads again. Rows
-- are locked in id order first, as autocomp_claim_many locks them, so passes never deadlock.
-- Each claimed batch answers as autocomp_claim does, with its failed attempts since p_since
-- (what max_attempts counts) and its checkpoint, both read before its claim.
CREATE FUNCTION autocomp_claim_ready(p_batches text[], p_stamps bigint[], p_since bigint[], p_steering bigint,
    p_component text, p_agent text, p_host text, p_pid bigint, p_key text)
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
            FROM autocomp_claim(p_batches[i], p_component, p_agent, p_host, p_pid, p_key);
        RETURN NEXT;
    END LOOP;
END $$;
