-- A batch registered with its first event in one statement and one commit
-- (`register_batch`): a delivery is recorded as it is registered, so no reader sees the batch
-- without it and the watchers concerned wake once. Nothing is written when the batch exists
-- (r_created false: the caller reads it and compares); an event over the batch's cap raises
-- AC413 as every capped write does, and the batch is not registered either.
CREATE FUNCTION autocomp_register_batch(p_id text, p_type text, p_priority integer, p_metadata jsonb,
    p_event_type text, p_outcome text, p_agent text, p_details jsonb, p_resets jsonb, p_max_batch_bytes bigint,
    OUT r_created boolean, OUT r_seq bigint, OUT r_at bigint, OUT r_event_seq bigint, OUT r_event_at bigint)
LANGUAGE plpgsql AS $$
DECLARE
    holds bigint;
    refused text;
    reason text;
BEGIN
    -- Before the batch takes a seq: a refused registration moves nothing, the head included.
    holds := octet_length(p_metadata::text);
    IF NOT EXISTS (SELECT 1 FROM batches WHERE id = p_id)
       AND holds + octet_length(p_details::text) > p_max_batch_bytes THEN
        RAISE EXCEPTION USING ERRCODE = 'AC413', MESSAGE = format('%s %s', holds, holds + octet_length(p_details::text)),
            DETAIL = 'this event';
    END IF;
    SELECT c.r_created, c.r_seq, c.r_at INTO r_created, r_seq, r_at
        FROM autocomp_create_batch(p_id, p_type, p_priority, p_metadata) c;
    IF NOT r_created THEN
        RETURN;
    END IF;
    SELECT g.r_seq, g.r_at, g.r_refused, g.r_reason INTO r_event_seq, r_event_at, refused, reason
        FROM autocomp_append_group(ARRAY[p_id], ARRAY[p_event_type], ARRAY[p_outcome], ARRAY[p_agent],
            ARRAY[p_details], ARRAY[NULL::text], ARRAY[NULL::bigint], ARRAY[p_resets], ARRAY[NULL::text],
            p_max_batch_bytes) g;
    IF refused IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = refused, MESSAGE = reason, DETAIL = 'this event';
    END IF;
END $$;
