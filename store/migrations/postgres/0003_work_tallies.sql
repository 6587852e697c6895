-- What each component's recorded work came to, per result (success, failure, transient):
-- since it was registered, and per minute of store time for the last two hours (metrics read
-- the last hour). `buckets`: counts per duration bucket, added element by element.
CREATE TABLE component_work_totals (
    component       text COLLATE "C" NOT NULL,
    result          text NOT NULL,
    results         bigint NOT NULL,
    duration_ms_sum bigint NOT NULL,
    buckets         bigint[] NOT NULL,
    PRIMARY KEY (component, result)
);
CREATE TABLE component_work_minutes (
    component       text COLLATE "C" NOT NULL,
    minute          bigint NOT NULL,
    result          text NOT NULL,
    results         bigint NOT NULL,
    duration_ms_sum bigint NOT NULL,
    buckets         bigint[] NOT NULL,
    PRIMARY KEY (component, minute, result)
);

CREATE FUNCTION autocomp_add_counts(a bigint[], b bigint[]) RETURNS bigint[] LANGUAGE sql IMMUTABLE AS $$
    SELECT array_agg(COALESCE(x, 0) + COALESCE(y, 0) ORDER BY i) FROM unnest(a, b) WITH ORDINALITY AS u(x, y, i)
$$;

-- A pass with its work: `p_work` holds one tally per result, `[{result, results,
-- duration_ms_sum, buckets}]`, added to the totals and to the current minute once the pass
-- itself is recorded (nothing is added when another component owns the event type).
CREATE FUNCTION autocomp_record_pass(p_name text, p_event_type text, p_descriptor jsonb, p_host text,
    p_version text, p_ended boolean, p_outcome text, p_summary text, p_duration_ms bigint, p_work jsonb)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    other text;
    this_minute bigint := autocomp_now() / 60000;
BEGIN
    other := autocomp_record_pass(p_name, p_event_type, p_descriptor, p_host, p_version, p_ended, p_outcome,
        p_summary, p_duration_ms);
    IF other IS NOT NULL OR p_work IS NULL OR jsonb_array_length(p_work) = 0 THEN
        RETURN other;
    END IF;
    INSERT INTO component_work_totals AS w (component, result, results, duration_ms_sum, buckets)
        SELECT p_name, t.result, t.results, t.duration_ms_sum, t.buckets
        FROM jsonb_to_recordset(p_work) AS t(result text, results bigint, duration_ms_sum bigint, buckets bigint[])
        ON CONFLICT (component, result) DO UPDATE SET
            results = w.results + excluded.results,
            duration_ms_sum = w.duration_ms_sum + excluded.duration_ms_sum,
            buckets = autocomp_add_counts(w.buckets, excluded.buckets);
    INSERT INTO component_work_minutes AS w (component, minute, result, results, duration_ms_sum, buckets)
        SELECT p_name, this_minute, t.result, t.results, t.duration_ms_sum, t.buckets
        FROM jsonb_to_recordset(p_work) AS t(result text, results bigint, duration_ms_sum bigint, buckets bigint[])
        ON CONFLICT (component, minute, result) DO UPDATE SET
            results = w.results + excluded.results,
            duration_ms_sum = w.duration_ms_sum + excluded.duration_ms_sum,
            buckets = autocomp_add_counts(w.buckets, excluded.buckets);
    DELETE FROM component_work_minutes WHERE component = p_name AND minute < this_minute - @WORK_MINUTES_KEPT@;
    RETURN NULL;
END $$;

-- A component with its hosts by name and its work (totals, and the minutes of the last hour
-- by the transaction's clock), as the client reads it; NULL if unknown.
CREATE OR REPLACE FUNCTION autocomp_component(p_name text) RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT to_jsonb(c) || jsonb_build_object(
        'hosts', COALESCE(
            (SELECT jsonb_agg(to_jsonb(h) ORDER BY h.host) FROM component_hosts h WHERE h.component = c.name),
            '[]'::jsonb),
        'work_totals', COALESCE(
            (SELECT jsonb_agg(to_jsonb(w)) FROM component_work_totals w WHERE w.component = c.name),
            '[]'::jsonb),
        'work_last_hour', COALESCE(
            (SELECT jsonb_agg(to_jsonb(w)) FROM component_work_minutes w
             WHERE w.component = c.name
               AND w.minute >= (extract(epoch FROM now()) * 1000)::bigint / 60000 - (@WORK_MINUTES_IN_HOUR@ - 1)),
            '[]'::jsonb))
    FROM components c WHERE c.name = p_name
$$;
