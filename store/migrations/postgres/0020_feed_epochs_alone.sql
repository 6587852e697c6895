-- The feed's horizon without holding writers back (issue 40), second step: writers hold their
-- epoch's key alone, no longer the old feed lock, so no horizon read queues them.
--
-- Applied only once every transaction begun before it started has ended (`migrate_up_to`
-- waits for them after committing migration 19): a horizon read of the release before 19,
-- which takes the feed lock exclusively and counts no epoch, is a call that began before 19
-- committed. Calls of 19's hold still under way when this commits hold both the lock and
-- their epoch's key; 19's horizon reads wait for the epochs' keys either way.
CREATE OR REPLACE FUNCTION autocomp_feed_hold() RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    held bigint;
    current bigint;
BEGIN
    IF current_setting('autocomp.feed_held', true) = 'on' THEN
        RETURN;
    END IF;
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
