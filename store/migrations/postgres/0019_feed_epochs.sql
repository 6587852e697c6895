-- The feed's horizon without holding writers back (issue 40).
--
-- Before: every writer held the feed lock shared from its first seq to its end, and a horizon
-- read took it exclusively. PostgreSQL queues a lock request behind a waiting request it
-- conflicts with, so a horizon read waiting for the writers in flight (their commits' flush
-- included) also held back every writer that began after it, and the horizon reads behind
-- those: in the peers bench's backlog a horizon read waited 27-29 ms on average, an append
-- 33-35 ms, on 2 cores.
--
-- Now writers hold an epoch's key, and a horizon read ends the epoch and waits for its
-- holders alone; a writer that begins meanwhile holds the next epoch's key and goes on.
-- * `autocomp_feed_hold()`, called where a writer took the feed lock: reads the epoch (the
--   `feed_epoch` sequence, CACHE 1, so a nextval shows in `last_value` at once), takes that
--   epoch's key shared, and reads the epoch again; if it moved meanwhile it takes the new
--   epoch's key too, until the epoch it read after taking a key is that key's. It then holds
--   the key of an epoch not yet ended, until it commits or rolls back.
-- * `autocomp_horizon()`: one read at a time (the readers' key), reads the sequence, ends
--   the epoch (nextval), then waits for the ended epoch's key exclusively.
-- Why no seq at or below the horizon is still in flight: a writer takes its seqs after its
-- hold saw its epoch e unended. A read whose horizon counts such a seq read the sequence
-- after that seq was taken, and ended an epoch after that. The first epoch ended after the
-- writer's hold is e: that read waits for e's key, which the writer holds to its end. Every
-- read after it began after it, the reads going one at a time.
-- The keys of epochs (two integer keys, apart from the one-number keys) repeat every
-- 2^31 - 1 epochs: a key shared by two epochs only makes a read wait for more writers.
--
-- A process of the release before still running through the upgrade runs these functions
-- (they live in the database), except a call already under way when this commits, which
-- takes the old feed lock shared: a horizon read takes that lock exclusively too, at once
-- when no one holds it (so it waits for no one then), and waits for it otherwise.
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

CREATE OR REPLACE FUNCTION autocomp_horizon() RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    h bigint;
    ended bigint;
BEGIN
    PERFORM pg_advisory_xact_lock(@FEED_READERS@);
    IF NOT pg_try_advisory_xact_lock(@FEED_LOCK@) THEN
        PERFORM pg_advisory_xact_lock(@FEED_LOCK@);
    END IF;
    SELECT CASE WHEN is_called THEN last_value ELSE 0 END INTO h FROM store_seq;
    ended := nextval('feed_epoch') - 1;
    PERFORM pg_advisory_xact_lock(@FEED_EPOCHS@, (ended % 2147483647)::integer);
    RETURN h;
END $$;

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
