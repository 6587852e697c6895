-- A hand-on opens its run inside the write that hands it on (issue 40), before the batch's
-- row is written, so the append group writes that row once with the handed run among its
-- open components. Schema 25 opened it through `autocomp_claim`, after the append had
-- written the row: a second version of the batch's row (a new entry in both of its indexes,
-- since `changed_seq` moved), a second statement-level notification trigger, and the claim's
-- checks the hand-on had already made (the batch locked, nobody's open run of the step on
-- it). Measured in the PostgreSQL-only trickle with the statements inside functions counted:
-- the claim under a hand-on 0.27 ms of the append group's 1.14 on the server.
--
-- The handed run still takes a seq of its own after the event's (a run's `claim_seq` is the
-- change that opened it: attempts since a reset are counted by it), and the batch's row
-- carries it as its `changed_seq`, so the run's next append finds the batch as its claim
-- read it exactly as before. Schema 25's `autocomp_hand_on` and `autocomp_hand_on_to_taker`
-- stay: a schema-25 body still running when this commits calls them by name.
--
-- The announcement to the taker carries what the taker would read of its handed run, when it
-- fits a notification (`autocomp_announce_handed`): the taker then works it without a read,
-- and a stage handed on is one round trip, its append (schema 25's taker read its run after
-- the announcement: 0.12 ms on the server, a round trip at the watcher, every stage).

-- Whether a taker is idle (no open run of its step holds its liveness) is asked by every
-- write that may hand a batch on, and in a backlog the taker is busy with a claimed round:
-- the answer is its newest open run. The index of schema 24 held a taker's open runs in no
-- useful order, among the entries of the runs it closed (dead, and each visited in the table
-- until vacuum removes it), so the probe walked them: 0.079 ms a call in the PostgreSQL-only
-- backlog, 2.44 calls an item, nearly all answered "busy". Newest first, it stops at the
-- first entry.
-- First in this migration, as a stage locks `runs` before `takers`; built under a name of its
-- own before the old one is dropped, so `runs` is held exclusively only from the drop on.
CREATE INDEX runs_open_by_liveness_newest ON runs (component, liveness, claim_seq DESC) WHERE state = 'open';
DROP INDEX runs_open_by_liveness;
ALTER INDEX runs_open_by_liveness_newest RENAME TO runs_open_by_liveness;

-- The run of `p_component` on `p_batch`, locked by the caller, for the taker of it that
-- offered first among those holding no open run of it, at time `p_at` and a seq of its own
-- (its `claim_seq`, after every seq the caller took); NULL (nothing written) when someone
-- has an open run of the step on the batch, the steering holds the step or the pipeline, or
-- no taker is idle. Writes the run and its claim; the caller writes the batch's row after it
-- (its `autocomp.summary_kept_by_writer` is 'on'; without it the triggers keep the row), then
-- announces the run to its taker (`autocomp_announce_handed`).
CREATE FUNCTION autocomp_open_handed_run(p_batch text, p_component text, p_at bigint)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    h jsonb;
    g bigint;
    s bigint;
    r jsonb;
BEGIN
    IF EXISTS (SELECT 1 FROM runs WHERE batch_id = p_batch AND component = p_component AND state = 'open')
       OR EXISTS (SELECT 1 FROM steering WHERE id = 1
                    AND (coalesce(state -> 'components' ? p_component, false)
                         OR coalesce(jsonb_typeof(state -> 'pipeline'), 'null') <> 'null')) THEN
        RETURN NULL;
    END IF;
    SELECT t.holder INTO h FROM takers t
        WHERE t.component = p_component
          AND NOT EXISTS (SELECT 1 FROM runs o WHERE o.component = t.component AND o.state = 'open'
                            AND o.liveness = t.liveness)
        ORDER BY t.offered_at LIMIT 1
        -- Locked to the commit: a withdrawal waits for it (and then finds the run handed),
        -- and a concurrent write hands this taker nothing (one run at a time).
        FOR UPDATE OF t SKIP LOCKED;
    -- Idle as this statement's snapshot saw it; a write that handed it a run and committed
    -- while the statement ran left its row unlocked and unchanged, so the lock did not look
    -- again: a new statement (a new snapshot) does, and the taker gets one run at a time.
    IF h IS NULL
       OR EXISTS (SELECT 1 FROM runs o WHERE o.component = p_component AND o.state = 'open'
                    AND o.liveness = h ->> 'liveness') THEN
        RETURN NULL;
    END IF;
    -- Held already by the caller's own write (a no-op then); taken here if it was not.
    PERFORM autocomp_feed_hold();
    s := nextval('store_seq');
    INSERT INTO claims AS c (batch_id, component, generation) VALUES (p_batch, p_component, 1)
        ON CONFLICT (batch_id, component) DO UPDATE SET generation = c.generation + 1
        RETURNING generation INTO g;
    INSERT INTO runs AS n (batch_id, component, generation, agent, host, pid, started_at, claim_seq, state, claim_key,
            liveness)
        VALUES (p_batch, p_component, g, h ->> 'agent', h ->> 'host', (h ->> 'pid')::bigint, p_at, s, 'open', NULL,
            h ->> 'liveness')
        RETURNING to_jsonb(n) INTO r;
    RETURN r;
END $$;

-- A taker's key for the announcements of its handed runs (`announcement_key.rs`): any role
-- that may connect may NOTIFY, so the taker takes a carried answer only when it is sealed
-- with HMAC-SHA256 under its store handle's random key. The column holds the key's two
-- padded blocks (K XOR ipad, then K XOR opad: 128 bytes), so the seal needs the server's
-- `sha256` alone. NULL for an offer by a release before this one: its runs are announced
-- `h:`, and read.
ALTER TABLE takers ADD COLUMN announcement_key bytea;

-- Announces the handed run `p_run` (a row of `runs` as `to_jsonb` writes it) to its taker,
-- once the batch's row is written, on a channel of its own (`autocomp_handed`; the releases
-- before this one do not listen to it): `<component> <liveness> <seal> <answer>`, the answer
-- being what the taker's read of its handed runs would return for it (the batch's columns
-- in `BATCH_SELECT`'s order, the run, the claim seqs of the step's failed runs on the batch,
-- its checkpoint), so the taker works it without that read, a round trip a stage; the seal
-- is the taker's key's HMAC of `<component> <liveness> <answer>`, in hex. An answer that
-- would not fit a notification (the server's limit: its block size less 192 bytes, 8,000 as
-- built by default), or a taker that left no key, is announced as schema 25 did, `h:<component>
-- <liveness>` on the store's channel, and read. A batch whose stored bytes alone pass the
-- limit is not built into an answer at all. Nor is any while the server's notification queue
-- is past 1% full: a listener that stalls (a stopped process, a session left in a
-- transaction) holds the queue's tail, and once it is full (8 GB as built by default) every
-- commit that notifies fails; an answer is 10-100 times an `h:` announcement (1 KB for a
-- batch of four events), so past 1% the queue fills that much slower.
CREATE FUNCTION autocomp_announce_handed(p_run jsonb)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    taker text := (p_run ->> 'component') || ' ' || (p_run ->> 'liveness');
    payload_limit integer := current_setting('block_size')::integer
        - current_setting('max_identifier_length')::integer - 1 - 128;
    taker_key bytea;
    answer text;
    sealed text;
BEGIN
    SELECT t.announcement_key INTO taker_key FROM takers t
        WHERE t.component = p_run ->> 'component' AND t.liveness = p_run ->> 'liveness';
    IF taker_key IS NOT NULL AND octet_length(taker_key) = 128 AND pg_notification_queue_usage() < 0.01 THEN
        SELECT json_build_array(json_build_array(b.id, b.type, b.priority, b.metadata::text, b.created_seq,
                b.modified_seq, b.changed_seq, b.created_at, b.modified_at,
                e.seqs, e.types, e.outcomes, e.agents, e.ats, e.details, e.run_components, e.run_generations,
                e.resets,
                (SELECT jsonb_agg(to_jsonb(r) ORDER BY r.component, r.generation)::text
                   FROM runs r WHERE r.batch_id = b.id AND r.state = 'open'),
                autocomp_now()),
            p_run,
            (SELECT array_agg(f.claim_seq) FROM runs f WHERE f.batch_id = b.id
               AND f.component = p_run ->> 'component' AND (f.state = 'abandoned' OR f.transient)),
            (SELECT c.data::text FROM checkpoints c WHERE c.batch_id = b.id
               AND c.component = p_run ->> 'component'))::text
        INTO answer
        FROM batches b
        LEFT JOIN LATERAL (
            SELECT array_agg(seq) seqs, array_agg(type) types, array_agg(outcome) outcomes, array_agg(agent) agents,
                   array_agg(at) ats, array_agg(details::text) details, array_agg(run_component) run_components,
                   array_agg(run_generation) run_generations, array_agg(resets::text) resets
            FROM (SELECT * FROM events WHERE batch_id = b.id ORDER BY seq) ordered
        ) e ON true
        WHERE b.id = p_run ->> 'batch_id' AND b.stored_bytes < payload_limit;
    END IF;
    -- The seal (64 hex digits) and two spaces beside the taker and the answer.
    IF answer IS NOT NULL AND octet_length(taker) + 66 + octet_length(answer) < payload_limit THEN
        sealed := encode(sha256(substring(taker_key FROM 65 FOR 64)
                         || sha256(substring(taker_key FROM 1 FOR 64) || convert_to(taker || ' ' || answer, 'UTF8'))), 'hex');
        PERFORM pg_notify('autocomp_handed', taker || ' ' || sealed || ' ' || answer);
    ELSE
        PERFORM pg_notify('autocomp_store_changed', 'h:' || taker);
    END IF;
END $$;

-- Schema 24's append group with hand-ons, each hand-on opened before the batch's row is
-- written (by the same rule, `HandOn::rule`: only while the batch is as the appending run's
-- claim read it); the row's `changed_seq` is the last seq its append took, the event's or
-- its last handed run's.
CREATE OR REPLACE FUNCTION autocomp_append_group(p_batches text[], p_types text[], p_outcomes text[], p_agents text[],
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
    announced jsonb := '[]'::jsonb;
    last_seq bigint;
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
            last_seq := r_seq;
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
                IF p_hand_ons[i] IS NOT NULL
                   AND EXISTS (SELECT 1 FROM runs WHERE batch_id = p_batches[i] AND component = p_run_components[i]
                                 AND generation = p_run_generations[i] AND claim_seq = before) THEN
                    FOR step IN SELECT jsonb_array_elements_text(p_hand_ons[i]) LOOP
                        handed := autocomp_open_handed_run(p_batches[i], step, r_at);
                        IF handed IS NOT NULL THEN
                            r_handed := coalesce(r_handed, '[]'::jsonb) || jsonb_build_array(handed);
                            last_seq := (handed ->> 'claim_seq')::bigint;
                        END IF;
                    END LOOP;
                END IF;
            END IF;
            UPDATE batches b SET changed_seq = last_seq, last_event_at = GREATEST(b.last_event_at, r_at),
                    stored_bytes = b.stored_bytes + size, event_count = b.event_count + 1,
                    (effective_types, effective_outcomes, effective_seqs, effective_transients, effective_skipped,
                        effective_content_seqs, effective_acknowledged) =
                        (SELECT * FROM autocomp_effective_parts(p_batches[i])),
                    open_components = CASE WHEN p_run_components[i] IS NULL THEN b.open_components
                        ELSE (SELECT o.components FROM autocomp_open_components(p_batches[i]) o) END
                WHERE b.id = p_batches[i];
            announced := announced || coalesce(r_handed, '[]'::jsonb);
        END IF;
        RETURN NEXT;
    END LOOP;
    -- Once every append of the group is written: a later append to the same batch is in
    -- what an earlier one's hand-on carries.
    FOR handed IN SELECT jsonb_array_elements(announced) LOOP
        PERFORM autocomp_announce_handed(handed);
    END LOOP;
    PERFORM set_config('autocomp.summary_kept_by_writer', coalesce(kept_before, ''), true);
END $$;

-- The append group as the releases before schema 24 call it, now in PL/pgSQL: as an SQL
-- function its one statement was planned at every call (0.04 ms, under every registration
-- and every append that hands nothing on), a PL/pgSQL statement once a connection.
CREATE OR REPLACE FUNCTION autocomp_append_group(p_batches text[], p_types text[], p_outcomes text[], p_agents text[],
    p_details jsonb[], p_run_components text[], p_run_generations bigint[], p_resets jsonb[], p_keys text[],
    p_max_batch_bytes bigint)
RETURNS TABLE (r_index integer, r_seq bigint, r_at bigint, r_earlier jsonb, r_refused text, r_reason text)
LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY SELECT g.r_index, g.r_seq, g.r_at, g.r_earlier, g.r_refused, g.r_reason
        FROM autocomp_append_group(p_batches, p_types, p_outcomes, p_agents, p_details, p_run_components,
            p_run_generations, p_resets, p_keys, p_max_batch_bytes, NULL::jsonb[]) g;
END $$;

-- Schema 25's registration with hand-ons, each run opened at the registration's event's
-- time, the batch's row written once after them (its last run's seq, its open components).
CREATE OR REPLACE FUNCTION autocomp_register_batch(p_id text, p_type text, p_priority integer, p_metadata jsonb,
    p_event_type text, p_outcome text, p_agent text, p_details jsonb, p_resets jsonb, p_max_batch_bytes bigint,
    p_hand_ons jsonb,
    OUT r_created boolean, OUT r_seq bigint, OUT r_at bigint, OUT r_event_seq bigint, OUT r_event_at bigint,
    OUT r_handed jsonb)
LANGUAGE plpgsql AS $$
DECLARE
    kept_before text := current_setting('autocomp.summary_kept_by_writer', true);
    step text;
    handed jsonb;
    last_seq bigint;
BEGIN
    PERFORM set_config('autocomp.summary_kept_by_writer', 'on', true);
    SELECT g.r_created, g.r_seq, g.r_at, g.r_event_seq, g.r_event_at
        INTO r_created, r_seq, r_at, r_event_seq, r_event_at
        FROM autocomp_register_batch(p_id, p_type, p_priority, p_metadata, p_event_type, p_outcome, p_agent,
            p_details, p_resets, p_max_batch_bytes) g;
    IF NOT r_created OR p_hand_ons IS NULL THEN
        PERFORM set_config('autocomp.summary_kept_by_writer', coalesce(kept_before, ''), true);
        RETURN;
    END IF;
    FOR step IN SELECT jsonb_array_elements_text(p_hand_ons) LOOP
        handed := autocomp_open_handed_run(p_id, step, r_event_at);
        IF handed IS NOT NULL THEN
            r_handed := coalesce(r_handed, '[]'::jsonb) || jsonb_build_array(handed);
            last_seq := (handed ->> 'claim_seq')::bigint;
        END IF;
    END LOOP;
    IF r_handed IS NOT NULL THEN
        UPDATE batches SET changed_seq = last_seq,
                open_components = (SELECT o.components FROM autocomp_open_components(p_id) o)
            WHERE id = p_id;
        FOR handed IN SELECT jsonb_array_elements(r_handed) LOOP
            PERFORM autocomp_announce_handed(handed);
        END LOOP;
    END IF;
    PERFORM set_config('autocomp.summary_kept_by_writer', coalesce(kept_before, ''), true);
END $$;

-- Planned as every function of a stage since schema 22 (a replaced function keeps no setting
-- of the one it replaces).
ALTER FUNCTION autocomp_open_handed_run(text, text, bigint)
    SET plan_cache_mode = force_generic_plan SET enable_seqscan = off SET jit = off;
ALTER FUNCTION autocomp_announce_handed(jsonb)
    SET plan_cache_mode = force_generic_plan SET enable_seqscan = off SET jit = off;
ALTER FUNCTION autocomp_append_group(text[], text[], text[], text[], jsonb[], text[], bigint[], jsonb[], text[], bigint,
    jsonb[]) SET plan_cache_mode = force_generic_plan SET enable_seqscan = off SET jit = off;
ALTER FUNCTION autocomp_append_group(text[], text[], text[], text[], jsonb[], text[], bigint[], jsonb[], text[], bigint)
    SET plan_cache_mode = force_generic_plan SET enable_seqscan = off SET jit = off;
ALTER FUNCTION autocomp_register_batch(text, text, integer, jsonb, text, text, text, jsonb, jsonb, bigint, jsonb)
    SET plan_cache_mode = force_generic_plan SET enable_seqscan = off SET jit = off;

