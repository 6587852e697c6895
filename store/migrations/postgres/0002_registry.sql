-- The component registry: each component as its binary last described itself, and each
-- host's last pass of it. Not batch changes: no seq, no feed lock, no batch row touched.
CREATE TABLE components (
    name           text COLLATE "C" PRIMARY KEY,
    event_type     text COLLATE "C" NOT NULL,
    descriptor     jsonb NOT NULL,
    registered_at  bigint NOT NULL,
    changed_at     bigint NOT NULL,
    retired_at     bigint,
    retired_by     text,
    retired_reason text
);
-- One producer per event type among the components still in the pipeline.
CREATE UNIQUE INDEX components_by_event_type ON components (event_type) WHERE retired_at IS NULL;

-- Rewritten by every cron start of every component: room on each page for the new version of
-- a row, so the update stays on its page and touches no index.
CREATE TABLE component_hosts (
    component        text COLLATE "C" NOT NULL REFERENCES components (name),
    host             text COLLATE "C" NOT NULL,
    version          text NOT NULL,
    last_seen        bigint NOT NULL,
    pass_started_at  bigint,
    pass_ended_at    bigint,
    pass_outcome     text,
    pass_summary     text NOT NULL DEFAULT '',
    pass_duration_ms bigint,
    PRIMARY KEY (component, host)
) WITH (fillfactor = 70);

-- A component with its hosts by name, as the client reads it; NULL if unknown. STABLE: it
-- reads with its caller's snapshot, so a listing of every component is one consistent view.
CREATE FUNCTION autocomp_component(p_name text) RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT to_jsonb(c) || jsonb_build_object('hosts', COALESCE(
        (SELECT jsonb_agg(to_jsonb(h) ORDER BY h.host) FROM component_hosts h WHERE h.component = c.name),
        '[]'::jsonb))
    FROM components c WHERE c.name = p_name
$$;

-- A component's pass. The descriptor row is rewritten only when the descriptor differs (or
-- the component was retired); the host's row always. Returns NULL when recorded, else the
-- component in the pipeline that already records the event type (nothing written).
CREATE FUNCTION autocomp_record_pass(p_name text, p_event_type text, p_descriptor jsonb, p_host text,
    p_version text, p_ended boolean, p_outcome text, p_summary text, p_duration_ms bigint)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    t bigint := autocomp_now();
    other text;
BEGIN
    SELECT name INTO other FROM components
        WHERE event_type = p_event_type AND retired_at IS NULL AND name <> p_name;
    IF FOUND THEN
        RETURN other;
    END IF;
    INSERT INTO components AS c (name, event_type, descriptor, registered_at, changed_at)
        VALUES (p_name, p_event_type, p_descriptor, t, t)
        ON CONFLICT (name) DO UPDATE SET
            event_type = excluded.event_type,
            descriptor = excluded.descriptor,
            changed_at = CASE WHEN c.descriptor = excluded.descriptor THEN c.changed_at ELSE excluded.changed_at END,
            retired_at = NULL, retired_by = NULL, retired_reason = NULL
        WHERE c.descriptor <> excluded.descriptor OR c.retired_at IS NOT NULL;
    -- A start keeps the previous end (and its outcome) so a running pass still shows how the
    -- last one went; an end dates its start back by the duration the component measured.
    IF p_ended THEN
        INSERT INTO component_hosts AS h (component, host, version, last_seen, pass_started_at, pass_ended_at,
                pass_outcome, pass_summary, pass_duration_ms)
            VALUES (p_name, p_host, p_version, t, t - p_duration_ms, t, p_outcome, p_summary, p_duration_ms)
            ON CONFLICT (component, host) DO UPDATE SET
                version = excluded.version, last_seen = excluded.last_seen,
                pass_started_at = excluded.pass_started_at, pass_ended_at = excluded.pass_ended_at,
                pass_outcome = excluded.pass_outcome, pass_summary = excluded.pass_summary,
                pass_duration_ms = excluded.pass_duration_ms;
    ELSE
        INSERT INTO component_hosts AS h (component, host, version, last_seen, pass_started_at)
            VALUES (p_name, p_host, p_version, t, t)
            ON CONFLICT (component, host) DO UPDATE SET
                version = excluded.version, last_seen = excluded.last_seen,
                pass_started_at = excluded.pass_started_at;
    END IF;
    RETURN NULL;
END $$;

-- An operator's retirement. `r_outcome`: 'retired'; 'already' (nothing written; `r_component`
-- says when and by whom); 'unknown' (`r_component` is the names the registry holds).
CREATE FUNCTION autocomp_retire_component(p_name text, p_by text, p_reason text,
    OUT r_outcome text, OUT r_component jsonb) LANGUAGE plpgsql AS $$
DECLARE
    was_retired bigint;
BEGIN
    SELECT retired_at INTO was_retired FROM components WHERE name = p_name FOR UPDATE;
    IF NOT FOUND THEN
        r_outcome := 'unknown';
        SELECT COALESCE(jsonb_agg(name ORDER BY name), '[]'::jsonb) INTO r_component FROM components;
        RETURN;
    END IF;
    IF was_retired IS NOT NULL THEN
        r_outcome := 'already';
    ELSE
        UPDATE components SET retired_at = autocomp_now(), retired_by = p_by, retired_reason = p_reason
            WHERE name = p_name;
        r_outcome := 'retired';
    END IF;
    r_component := autocomp_component(p_name);
END $$;
