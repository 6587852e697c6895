-- A registration that hands its batch on writes the batch's row twice instead of three times
-- (issue 40). Schema 26's registration with hand-ons called schema 17's registration, which
-- created the row and then appended the first event through the append group (a row lock
-- on a row nobody else can see yet, the idempotency and fence checks of an event that has
-- neither, and an update of the row with the event's summary), and then updated the row a
-- second time for the handed runs (their seq, the open components). Each update moves
-- `changed_seq`, so each was a new version of the row with new entries in both of its
-- indexes, and each fired the statement trigger's notification again.
--
-- Here the row is inserted (`autocomp_create_batch`), the event recorded, the runs handed
-- opened, and the row updated once with all of it: the same seqs in the same order (the
-- batch's, the event's, then each handed run's), the same summary as the append group
-- writes, the same notifications, the same refusals (over the cap: AC413 before anything is
-- written, as schema 17 refuses, and again once the row is created, as its append did).
-- The registration without hand-ons (schema 17's, ten arguments) stays as it is, for the
-- releases that call it.
CREATE OR REPLACE FUNCTION autocomp_register_batch(p_id text, p_type text, p_priority integer, p_metadata jsonb,
    p_event_type text, p_outcome text, p_agent text, p_details jsonb, p_resets jsonb, p_max_batch_bytes bigint,
    p_hand_ons jsonb,
    OUT r_created boolean, OUT r_seq bigint, OUT r_at bigint, OUT r_event_seq bigint, OUT r_event_at bigint,
    OUT r_handed jsonb)
LANGUAGE plpgsql AS $$
DECLARE
    kept_before text := current_setting('autocomp.summary_kept_by_writer', true);
    holds bigint := octet_length(p_metadata::text);
    size bigint := octet_length(p_details::text);
    step text;
    handed jsonb;
    last_seq bigint;
BEGIN
    -- Before the batch takes a seq: a refused registration moves nothing, the head included.
    IF NOT EXISTS (SELECT 1 FROM batches WHERE id = p_id) AND holds + size > p_max_batch_bytes THEN
        RAISE EXCEPTION USING ERRCODE = 'AC413', MESSAGE = format('%s %s', holds, holds + size),
            DETAIL = 'this event';
    END IF;
    PERFORM set_config('autocomp.summary_kept_by_writer', 'on', true);
    SELECT c.r_created, c.r_seq, c.r_at INTO r_created, r_seq, r_at
        FROM autocomp_create_batch(p_id, p_type, p_priority, p_metadata) c;
    IF NOT r_created THEN
        PERFORM set_config('autocomp.summary_kept_by_writer', coalesce(kept_before, ''), true);
        RETURN;
    END IF;
    -- Created after all: a row that stood at the check above was deleted meanwhile (by
    -- hand; the store deletes none), and the cap holds for the new one as the append group
    -- held it (the error rolls the insert back).
    IF holds + size > p_max_batch_bytes THEN
        RAISE EXCEPTION USING ERRCODE = 'AC413', MESSAGE = format('%s %s', holds, holds + size),
            DETAIL = 'this event';
    END IF;
    -- The first event, as the append group records one with no run and no key; the row is
    -- this transaction's own, so nobody else holds it.
    PERFORM autocomp_feed_hold();
    r_event_seq := nextval('store_seq');
    r_event_at := autocomp_now();
    last_seq := r_event_seq;
    PERFORM autocomp_record_event(r_event_seq, r_event_at, p_id, p_event_type, p_outcome, p_agent, p_details,
        NULL, NULL, p_resets, NULL);
    IF p_hand_ons IS NOT NULL THEN
        FOR step IN SELECT jsonb_array_elements_text(p_hand_ons) LOOP
            handed := autocomp_open_handed_run(p_id, step, r_event_at);
            IF handed IS NOT NULL THEN
                r_handed := coalesce(r_handed, '[]'::jsonb) || jsonb_build_array(handed);
                last_seq := (handed ->> 'claim_seq')::bigint;
            END IF;
        END LOOP;
    END IF;
    UPDATE batches b SET changed_seq = last_seq, last_event_at = GREATEST(b.last_event_at, r_event_at),
            stored_bytes = b.stored_bytes + size, event_count = b.event_count + 1,
            (effective_types, effective_outcomes, effective_seqs, effective_transients, effective_skipped,
                effective_content_seqs, effective_acknowledged) = (SELECT * FROM autocomp_effective_parts(p_id)),
            open_components = CASE WHEN r_handed IS NULL THEN b.open_components
                ELSE (SELECT o.components FROM autocomp_open_components(p_id) o) END
        WHERE b.id = p_id;
    IF r_handed IS NOT NULL THEN
        FOR handed IN SELECT jsonb_array_elements(r_handed) LOOP
            PERFORM autocomp_announce_handed(handed);
        END LOOP;
    END IF;
    PERFORM set_config('autocomp.summary_kept_by_writer', coalesce(kept_before, ''), true);
END $$;

ALTER FUNCTION autocomp_register_batch(text, text, integer, jsonb, text, text, text, jsonb, jsonb, bigint, jsonb)
    SET plan_cache_mode = force_generic_plan SET enable_seqscan = off SET jit = off;
