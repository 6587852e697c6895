-- An operator's close-out of a failure (`autocomp acknowledge`): the failure stays a failure,
-- flagged `acknowledged`, and the summaries the index reads say so, so that the batch leaves
-- the failed counts for a state of its own. Every batch_effective row written before has no
-- acknowledged failure (the action is new with this version): false is their value.
ALTER TABLE batch_effective ADD COLUMN acknowledged boolean NOT NULL DEFAULT false;

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
        INSERT INTO batch_effective AS f (batch_id, type, seq, outcome, transient, skipped, acknowledged, content_seq)
            VALUES (p_batch, p_type, p_seq, p_outcome,
                    p_outcome = 'failure' AND autocomp_flag(p_details, 'transient'),
                    p_outcome = 'success' AND autocomp_flag(p_details, 'skipped'),
                    p_outcome = 'failure' AND autocomp_flag(p_details, 'acknowledged'),
                    autocomp_content_seq(p_details))
            ON CONFLICT (batch_id, type) DO UPDATE SET
                seq = excluded.seq, outcome = excluded.outcome, transient = excluded.transient,
                skipped = excluded.skipped, acknowledged = excluded.acknowledged, content_seq = excluded.content_seq;
    END IF;
    UPDATE batches SET changed_seq = p_seq, last_event_at = GREATEST(last_event_at, p_at),
            stored_bytes = stored_bytes + octet_length(p_details::text), event_count = event_count + 1
        WHERE id = p_batch;
END $$;
