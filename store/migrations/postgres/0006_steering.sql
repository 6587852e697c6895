-- Steering the pipeline: one record of the holds, pools and breaker counts (the model's
-- `Steering` as JSON) with its version, and the append-only log of the changes. A change is
-- computed by the client from the record it read and written only if the version is still
-- the one it read (one statement; a client that lost the race reads again).
CREATE TABLE steering (
    id      integer PRIMARY KEY CHECK (id = 1),
    version bigint NOT NULL,
    state   jsonb NOT NULL
);
INSERT INTO steering (id, version, state) VALUES (1, 0, '{"version": 0}');
CREATE TABLE steering_log (
    version bigint PRIMARY KEY,
    at      bigint NOT NULL,
    entry   jsonb NOT NULL
);
CREATE FUNCTION autocomp_steer(p_expected bigint, p_state jsonb, p_entry jsonb, p_at bigint)
    RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    UPDATE steering SET version = p_expected + 1, state = p_state WHERE id = 1 AND version = p_expected;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF p_entry IS NOT NULL THEN
        INSERT INTO steering_log (version, at, entry) VALUES (p_expected + 1, p_at, p_entry);
    END IF;
    -- The head moves, so watchers sleeping in the change feed wake and honour the change.
    PERFORM autocomp_next_seq();
    RETURN true;
END $$;

-- The notification outbox: each item once per channel (its key), leased to one notifier at a
-- time and marked sent once; and the notifiers' cursor in the change feed. Keys sort by their
-- bytes (COLLATE "C"), as the embedded store sorts them, whatever the database's locale.
CREATE TABLE notices (
    key         text COLLATE "C" PRIMARY KEY,
    channel     text NOT NULL,
    subject     text NOT NULL,
    body        jsonb NOT NULL,
    created_at  bigint NOT NULL,
    attempts    integer NOT NULL DEFAULT 0,
    last_error  text,
    due_at      bigint NOT NULL,
    holder      text,
    lease_until bigint,
    sent_at     bigint
);
CREATE INDEX notices_pending ON notices (due_at) WHERE sent_at IS NULL;
CREATE INDEX notices_recent ON notices (created_at);
CREATE TABLE notice_cursor (
    id  integer PRIMARY KEY CHECK (id = 1),
    seq bigint NOT NULL
);
-- -1: no notifier has run yet (the first one starts at the head, whatever it is).
INSERT INTO notice_cursor (id, seq) VALUES (1, -1);

CREATE FUNCTION autocomp_enqueue_notices(p_keys text[], p_channels text[], p_subjects text[], p_bodies jsonb[],
                                         p_from bigint, p_to bigint, OUT r_added bigint, OUT r_cursor bigint)
    LANGUAGE plpgsql AS $$
DECLARE
    -- One time for the whole call (autocomp_now is the clock's, per row): a call's notices
    -- were found together and sort by key among themselves, as on every backend.
    t bigint := autocomp_now();
BEGIN
    INSERT INTO notices (key, channel, subject, body, created_at, due_at)
    SELECT k, c, s, b, t, t
    FROM unnest(p_keys, p_channels, p_subjects, p_bodies) AS n (k, c, s, b)
    ON CONFLICT (key) DO NOTHING;
    GET DIAGNOSTICS r_added = ROW_COUNT;
    IF p_from IS NOT NULL THEN
        UPDATE notice_cursor SET seq = p_to WHERE id = 1 AND seq = p_from;
    END IF;
    SELECT seq INTO r_cursor FROM notice_cursor WHERE id = 1;
END $$;

-- Due notices leased to one holder; another notifier's transaction skips the rows this one
-- locked, so two never take the same notice.
CREATE FUNCTION autocomp_take_notices(p_holder text, p_limit integer, p_lease_ms bigint)
    RETURNS SETOF notices LANGUAGE sql AS $$
    UPDATE notices SET holder = p_holder, lease_until = autocomp_now() + p_lease_ms
    WHERE key IN (
        SELECT key FROM notices
        WHERE sent_at IS NULL AND due_at <= autocomp_now() AND (lease_until IS NULL OR lease_until <= autocomp_now())
        ORDER BY created_at, key LIMIT p_limit
        FOR UPDATE SKIP LOCKED
    )
    RETURNING *
$$;

-- 'ok', or why the notice cannot be settled by this holder.
CREATE FUNCTION autocomp_settle_notice(p_key text, p_holder text, p_sent boolean, p_error text, p_retry_ms bigint)
    RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    n notices;
BEGIN
    SELECT * INTO n FROM notices WHERE key = p_key FOR UPDATE;
    IF NOT FOUND THEN
        RETURN 'missing';
    ELSIF n.sent_at IS NOT NULL THEN
        RETURN 'sent';
    ELSIF n.holder IS DISTINCT FROM p_holder OR n.lease_until IS NULL OR n.lease_until <= autocomp_now() THEN
        RETURN 'not_leased';
    END IF;
    IF p_sent THEN
        UPDATE notices SET sent_at = autocomp_now(), holder = NULL, lease_until = NULL WHERE key = p_key;
    ELSE
        UPDATE notices SET attempts = attempts + 1, last_error = p_error, due_at = autocomp_now() + p_retry_ms,
                           holder = NULL, lease_until = NULL
        WHERE key = p_key;
    END IF;
    RETURN 'ok';
END $$;
