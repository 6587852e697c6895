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
