-- The feed's horizon without holding writers back (issue 40), first of two steps.
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
-- * `autocomp_feed_hold()`, called where a writer took the feed lock, once a transaction:
--   reads the epoch (the `feed_epoch` sequence, CACHE 1, so a nextval shows in `last_value`
--   at once), takes that epoch's key shared, and reads the epoch again; if it moved meanwhile
--   it takes the new epoch's key too, until the epoch it read after taking a key is that
--   key's. It then holds the key of an epoch not yet ended, until it commits or rolls back.
--   Later seqs of the same transaction are taken under that key too: an epoch is confirmed
--   only after every earlier one, so a horizon past a later seq waits for this key as well.
-- * `autocomp_feed_horizon(p_wait)`: one read at a time (the readers' key). It first confirms
--   the epochs ended since the last confirmed one, once their keys are free; then, when no
--   writer holds the current epoch's key, the sequence's value is the horizon as it stands
--   (no epoch ended, nothing written: a trickle's reads); else it reads the sequence, ends
--   the epoch (nextval), and confirms it at once if its key is free, else leaves it pending.
--   A read that may not wait (a watcher's look) answers the last confirmed horizon at once
--   when another read is under way or a key is held; one that waits (`autocomp_horizon()`,
--   the head a waiter compares with) waits for the keys instead.
-- Why no seq at or below a confirmed horizon is still in flight: a writer takes its seqs
-- after its hold saw its epoch e unended. A horizon that counts such a seq was read after
-- that seq was taken, and its epoch ended after that, so it is e or later. Epochs are
-- confirmed in order, each once its key is free: e's, which the writer holds to its end,
-- before any later one. Ending an epoch is a sequence step no rollback undoes, while the
-- record that it is pending is the row a read writes last: a read rolled back in between (a
-- cancel, a timeout, a deadlock, a serialization failure, all retried by the store) leaves an
-- ended epoch unrecorded, so a read confirms every epoch after `confirmed_epoch`, not only
-- the one it ended; and since it confirms them before it ends another, reads that keep
-- being cancelled leave at most one such epoch.
-- The row is the store's to keep: emptied by hand (or by a crash or failover, the only ways
-- the store expects) it is taken as a crash, after which no writer can be in flight; a
-- prepared transaction (two-phase commit, which the store never uses) that took a seq would
-- survive a crash and break that.
-- The keys of epochs (two integer keys, apart from the one-number keys) repeat every
-- 2^31 - 1 epochs: a key shared by two epochs only makes a read wait for more writers.
--
-- Through the upgrade: processes of the release before run these functions once this commits
-- (they live in the database), except calls already under way, which take the old feed lock
-- (a writer shared, a horizon read exclusively). So in this step a writer still takes the
-- feed lock shared as well as its epoch's key, and a horizon read still takes it exclusively
-- (a read that may not wait answers the last confirmed horizon when it is held): a horizon
-- read of the release before still queued for the lock counts no writer in flight. The next
-- migration (20), run once every transaction begun before this one commits has ended, drops
-- the feed lock from the writers' hold.
CREATE SEQUENCE feed_epoch CACHE 1;
-- Called once, so that `nextval - 1` is always the epoch a horizon read ends.
SELECT nextval('feed_epoch');

CREATE FUNCTION autocomp_feed_hold() RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    held bigint;
    current bigint;
BEGIN
    IF current_setting('autocomp.feed_held', true) = 'on' THEN
        RETURN;
    END IF;
    -- Until migration 20: a horizon read of the release before may still queue for it.
    PERFORM pg_advisory_xact_lock_shared(@FEED_LOCK@);
    SELECT last_value INTO current FROM feed_epoch;
    LOOP
        held := current;
        -- A key held exclusively is a horizon read's: of the current epoch for an instant, or
        -- of an ended one it confirms, perhaps while it waits for a writer this transaction
        -- holds up (a batch row): so wait only for the current epoch's.
        IF NOT pg_try_advisory_xact_lock_shared(@FEED_EPOCHS@, (held % 2147483647)::integer) THEN
            SELECT last_value INTO current FROM feed_epoch;
            CONTINUE WHEN current <> held;
            PERFORM pg_advisory_xact_lock_shared(@FEED_EPOCHS@, (held % 2147483647)::integer);
        END IF;
        SELECT last_value INTO current FROM feed_epoch;
        EXIT WHEN current = held;
    END LOOP;
    -- Until this transaction (or the subtransaction that took the key) ends, as the key.
    PERFORM set_config('autocomp.feed_held', 'on', true);
END $$;

-- Where the horizon reads stand, one row: `confirmed`, a horizon whose epochs have all ended
-- (every seq up to it finished), and at most one ended epoch whose writers may still be in
-- flight with the sequence's value read before it ended. Unlogged: after a crash or a
-- failover the row is gone with every writer that was in flight, and the next read starts
-- over from 0 (a look's cursor never moves back, it only waits one read to move on).
CREATE UNLOGGED TABLE feed_horizon (
    one             boolean PRIMARY KEY DEFAULT true CHECK (one),
    -- Every seq up to `confirmed` is final: every writer of the epochs up to
    -- `confirmed_epoch` has ended.
    confirmed       bigint NOT NULL,
    confirmed_epoch bigint NOT NULL,
    -- The last epoch a read ended whose writers (or an earlier epoch's after
    -- `confirmed_epoch`) may be in flight, and the sequence's value read before it ended.
    pending_epoch   bigint,
    pending_horizon bigint
);
-- So that a missing row means a crash or a failover emptied the table, and no writer of any
-- epoch before the current one survived it. Epoch 1 is current: none has ended.
INSERT INTO feed_horizon (confirmed, confirmed_epoch) VALUES (0, 0);

-- Whether every writer of the epochs after `p_after` up to `p_upto` has ended: each epoch's
-- key free now, or (`p_wait`) once it is. More than one epoch only after a read that ended
-- an epoch was rolled back (a cancel, a timeout, a deadlock): ending an epoch is a sequence
-- step, which no rollback undoes, while the record of it is the row the read writes last.
CREATE FUNCTION autocomp_feed_epochs_ended(p_after bigint, p_upto bigint, p_wait boolean)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    epoch bigint := p_after + 1;
BEGIN
    WHILE epoch <= p_upto LOOP
        IF p_wait THEN
            PERFORM pg_advisory_xact_lock(@FEED_EPOCHS@, (epoch % 2147483647)::integer);
        ELSIF NOT pg_try_advisory_xact_lock(@FEED_EPOCHS@, (epoch % 2147483647)::integer) THEN
            RETURN false;
        END IF;
        epoch := epoch + 1;
    END LOOP;
    RETURN true;
END $$;

-- The horizon, one read at a time (the readers' key). `p_wait`: wait for the writers in
-- flight (the head a waiter compares with); else never wait, answering the last confirmed
-- horizon, which may be behind the present: what a watcher's look moves its cursor to, its
-- page reading every change committed past it anyway.
-- First every epoch ended since the last confirmed one is confirmed (their keys free, or
-- once they are): the pending one, whose horizon then counts, and any a read rolled back
-- after ending it (a cancel, a timeout, a deadlock, a serialization failure). Only then does
-- a read end an epoch, so a read that waits and is cancelled leaves at most one epoch
-- unrecorded, however many are. Then, if no writer holds the current epoch's key, the
-- sequence's value is the horizon as it stands; else the read reads the sequence, ends the
-- epoch, and confirms it at once if its key is free, else leaves it pending.
CREATE FUNCTION autocomp_feed_horizon(p_wait boolean) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    state feed_horizon%ROWTYPE;
    stored feed_horizon%ROWTYPE;
    v_h bigint;
    v_current bigint;
    v_now bigint;
    v_ended bigint;
BEGIN
    IF p_wait THEN
        PERFORM pg_advisory_xact_lock(@FEED_READERS@);
    ELSIF NOT pg_try_advisory_xact_lock(@FEED_READERS@) THEN
        RETURN coalesce((SELECT f.confirmed FROM feed_horizon f), 0);
    END IF;
    -- A writer of the release before holds the feed lock shared.
    IF NOT pg_try_advisory_xact_lock(@FEED_LOCK@) THEN
        IF NOT p_wait THEN
            RETURN coalesce((SELECT f.confirmed FROM feed_horizon f), 0);
        END IF;
        PERFORM pg_advisory_xact_lock(@FEED_LOCK@);
    END IF;
    -- Statements are few on the way a trickle's reads take: each costs the call time.
    SELECT f.one, f.confirmed, f.confirmed_epoch, f.pending_epoch, f.pending_horizon, e.last_value
        INTO state.one, state.confirmed, state.confirmed_epoch, state.pending_epoch, state.pending_horizon, v_current
        FROM feed_epoch e LEFT JOIN feed_horizon f ON true;
    IF state.one IS NULL THEN
        state.confirmed := 0;
        state.confirmed_epoch := v_current - 1;
    END IF;
    IF state.pending_epoch IS NULL AND state.confirmed_epoch = v_current - 1
        AND pg_try_advisory_xact_lock(@FEED_EPOCHS@, (v_current % 2147483647)::integer) THEN
        -- Every earlier epoch confirmed and no writer holds the current one (one that comes
        -- now waits for this read to end before it takes a seq): nothing is in flight.
        SELECT e.last_value, CASE WHEN s.is_called THEN s.last_value ELSE 0 END INTO v_now, v_h
            FROM feed_epoch e, store_seq s;
        IF v_now = v_current THEN
            RETURN v_h;
        END IF;
    END IF;
    stored := state;
    IF NOT autocomp_feed_epochs_ended(state.confirmed_epoch, v_current - 1, p_wait) THEN
        RETURN state.confirmed;
    END IF;
    IF state.pending_epoch IS NOT NULL THEN
        state.confirmed := state.pending_horizon;
    END IF;
    state.confirmed_epoch := v_current - 1;
    state.pending_epoch := NULL;
    state.pending_horizon := NULL;
    IF pg_try_advisory_xact_lock(@FEED_EPOCHS@, (v_current % 2147483647)::integer)
        AND (SELECT last_value FROM feed_epoch) = v_current THEN
        -- The epochs before confirmed just now and no writer of the current one.
        state.confirmed := (SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM store_seq);
    ELSE
        SELECT CASE WHEN is_called THEN last_value ELSE 0 END INTO v_h FROM store_seq;
        v_ended := nextval('feed_epoch') - 1;
        IF autocomp_feed_epochs_ended(state.confirmed_epoch, v_ended, p_wait) THEN
            state.confirmed := v_h;
            state.confirmed_epoch := v_ended;
        ELSE
            state.pending_epoch := v_ended;
            state.pending_horizon := v_h;
        END IF;
    END IF;
    IF state IS DISTINCT FROM stored OR stored.one IS NULL THEN
        INSERT INTO feed_horizon AS f (confirmed, confirmed_epoch, pending_epoch, pending_horizon)
            VALUES (state.confirmed, state.confirmed_epoch, state.pending_epoch, state.pending_horizon)
            ON CONFLICT (one) DO UPDATE SET confirmed = excluded.confirmed,
                confirmed_epoch = excluded.confirmed_epoch, pending_epoch = excluded.pending_epoch,
                pending_horizon = excluded.pending_horizon;
    END IF;
    RETURN state.confirmed;
END $$;

CREATE OR REPLACE FUNCTION autocomp_horizon() RETURNS bigint LANGUAGE sql AS $$
    SELECT autocomp_feed_horizon(true)
$$;

-- Every function that took the feed lock shared (`autocomp_next_seq` and the claims and
-- appends that inline it) holds through `autocomp_feed_hold` instead; the rest of each is
-- unchanged.
DO $$
DECLARE
    f record;
    home oid := (SELECT pronamespace FROM pg_proc WHERE oid = 'autocomp_horizon'::regproc);
BEGIN
    FOR f IN SELECT p.oid FROM pg_proc p
             WHERE p.pronamespace = home AND p.proname <> 'autocomp_feed_hold'
               AND p.prosrc LIKE '%pg_advisory_xact_lock_shared(@FEED_LOCK@)%'
    LOOP
        EXECUTE replace(pg_get_functiondef(f.oid), 'pg_advisory_xact_lock_shared(@FEED_LOCK@)',
            'autocomp_feed_hold()');
    END LOOP;
END $$;
