-- The feed's horizon without holding writers back (issue 40).
--
-- Before: every writer held the feed lock shared from its first seq to its end, and a horizon
-- read took it exclusively. PostgreSQL queues a lock request behind a waiting request it
-- conflicts with, so a horizon read waiting for the writers in flight (their commits' flush
-- included) also held back every writer that began after it, and the horizon reads behind
-- those: in the peers bench's backlog a horizon read waited 27-29 ms on average, an append
-- 33-35 ms, on 2 cores.
--
-- Now writers hold an epoch's key, and a horizon read ends the epoch; an ended epoch counts
-- once its key is free. A writer that begins meanwhile holds the next epoch's key and goes on.
-- * `autocomp_feed_hold()`, called where a writer took the feed lock: reads the epoch (the
--   `feed_epoch` sequence, CACHE 1, so a nextval shows in `last_value` at once), takes that
--   epoch's key shared, and reads the epoch again; if it moved meanwhile it takes the new
--   epoch's key too, until the epoch it read after taking a key is that key's. It then holds
--   the key of an epoch not yet ended, until it commits or rolls back.
-- * `autocomp_feed_horizon(p_wait)`: one read at a time (the readers' key). The epoch a read
--   before ended and left pending (its key was held) is confirmed first, once its key is
--   free; then the read reads the sequence, ends the epoch (nextval), and confirms that epoch
--   at once if its key is free, else leaves it pending. A read that may not wait (a watcher's
--   look) answers the last confirmed horizon at once when another read is under way or the
--   pending epoch's key is held; one that waits (`autocomp_horizon()`, the head a waiter
--   compares with) waits for the keys instead.
-- Why no seq at or below a confirmed horizon is still in flight: a writer takes its seqs
-- after its hold saw its epoch e unended. A horizon that counts such a seq was read after
-- that seq was taken, and its epoch ended after that, so it is e or later. Epochs are
-- confirmed one after another, each once its key is free: e's, which the writer holds to its
-- end, before any later one.
-- The keys of epochs (two integer keys, apart from the one-number keys) repeat every
-- 2^31 - 1 epochs: a key shared by two epochs only makes a read wait for more writers.
--
-- A process of the release before still running through the upgrade runs these functions
-- (they live in the database), except a call already under way when this commits, which
-- takes the old feed lock shared: a horizon read takes that lock exclusively too, at once
-- when no one holds it (so it waits for no one then); otherwise a read that waits waits for
-- it, and one that may not answers the last confirmed horizon.
CREATE SEQUENCE feed_epoch CACHE 1;
-- Called once, so that `nextval - 1` is always the epoch a horizon read ends.
SELECT nextval('feed_epoch');

CREATE FUNCTION autocomp_feed_hold() RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    held bigint;
    current bigint;
BEGIN
    SELECT last_value INTO current FROM feed_epoch;
    LOOP
        held := current;
        PERFORM pg_advisory_xact_lock_shared(@FEED_EPOCHS@, (held % 2147483647)::integer);
        SELECT last_value INTO current FROM feed_epoch;
        EXIT WHEN current = held;
    END LOOP;
END $$;

-- Where the horizon reads stand, one row: `confirmed`, a horizon whose epochs have all ended
-- (every seq up to it finished), and at most one ended epoch whose writers may still be in
-- flight with the sequence's value read before it ended. Unlogged: after a crash or a
-- failover the row is gone with every writer that was in flight, and the next read starts
-- over from 0 (a look's cursor never moves back, it only waits one read to move on).
CREATE UNLOGGED TABLE feed_horizon (
    one             boolean PRIMARY KEY DEFAULT true CHECK (one),
    confirmed       bigint NOT NULL,
    pending_epoch   bigint,
    pending_horizon bigint
);

-- The horizon, one read at a time (the readers' key). `p_wait`: wait for the writers in
-- flight (the head a waiter compares with); else never wait, answering the last confirmed
-- horizon, which may be behind the present: what a watcher's look moves its cursor to, its
-- page reading every change committed past it anyway.
-- A read ends the current epoch after reading the sequence; the ended epoch is confirmed
-- once its key is free (no writer holds it: every writer of it has ended), then the value
-- read before it ended is the horizon. Epochs are confirmed in order, one pending at a time,
-- so a confirmed epoch's writers and every earlier one's have all ended.
CREATE FUNCTION autocomp_feed_horizon(p_wait boolean) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    state feed_horizon%ROWTYPE;
    v_confirmed bigint;
    v_h bigint;
    v_ended bigint;
BEGIN
    IF p_wait THEN
        PERFORM pg_advisory_xact_lock(@FEED_READERS@);
    ELSIF NOT pg_try_advisory_xact_lock(@FEED_READERS@) THEN
        RETURN coalesce((SELECT f.confirmed FROM feed_horizon f), 0);
    END IF;
    SELECT * INTO state FROM feed_horizon;
    v_confirmed := coalesce(state.confirmed, 0);
    -- A writer of the release before holds the feed lock shared.
    IF NOT pg_try_advisory_xact_lock(@FEED_LOCK@) THEN
        IF NOT p_wait THEN
            RETURN v_confirmed;
        END IF;
        PERFORM pg_advisory_xact_lock(@FEED_LOCK@);
    END IF;
    IF state.pending_epoch IS NOT NULL THEN
        IF NOT pg_try_advisory_xact_lock(@FEED_EPOCHS@, (state.pending_epoch % 2147483647)::integer) THEN
            IF NOT p_wait THEN
                RETURN v_confirmed;
            END IF;
            PERFORM pg_advisory_xact_lock(@FEED_EPOCHS@, (state.pending_epoch % 2147483647)::integer);
        END IF;
        v_confirmed := state.pending_horizon;
    END IF;
    SELECT CASE WHEN is_called THEN last_value ELSE 0 END INTO v_h FROM store_seq;
    v_ended := nextval('feed_epoch') - 1;
    IF pg_try_advisory_xact_lock(@FEED_EPOCHS@, (v_ended % 2147483647)::integer) THEN
        v_confirmed := v_h;
        v_ended := NULL;
    ELSIF p_wait THEN
        PERFORM pg_advisory_xact_lock(@FEED_EPOCHS@, (v_ended % 2147483647)::integer);
        v_confirmed := v_h;
        v_ended := NULL;
    END IF;
    INSERT INTO feed_horizon AS f (confirmed, pending_epoch, pending_horizon)
        VALUES (v_confirmed, v_ended, CASE WHEN v_ended IS NULL THEN NULL ELSE v_h END)
        ON CONFLICT (one) DO UPDATE SET confirmed = excluded.confirmed,
            pending_epoch = excluded.pending_epoch, pending_horizon = excluded.pending_horizon;
    RETURN v_confirmed;
END $$;

CREATE OR REPLACE FUNCTION autocomp_horizon() RETURNS bigint LANGUAGE sql AS $$
    SELECT autocomp_feed_horizon(true)
$$;

-- Every function that took the feed lock shared (`autocomp_next_seq` and the claims and
-- appends that inline it) takes the epoch's key instead; the rest of each is unchanged.
DO $$
DECLARE
    f record;
    home oid := (SELECT pronamespace FROM pg_proc WHERE oid = 'autocomp_horizon'::regproc);
BEGIN
    FOR f IN SELECT p.oid FROM pg_proc p
             WHERE p.pronamespace = home AND p.prosrc LIKE '%pg_advisory_xact_lock_shared(@FEED_LOCK@)%'
    LOOP
        EXECUTE replace(pg_get_functiondef(f.oid), 'pg_advisory_xact_lock_shared(@FEED_LOCK@)',
            'autocomp_feed_hold()');
    END LOOP;
END $$;
