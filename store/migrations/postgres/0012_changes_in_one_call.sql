-- The change feed in one round trip (`changes`): the horizon, then the batches changed after
-- `p_since` up to it, where a feed read took two statements (issue 40: a watcher's look read
-- the horizon, then the feed). Each statement of a plpgsql function reads with a snapshot of
-- its own under READ COMMITTED, so the query below sees every transaction the horizon waited
-- for; one SQL statement joining the two would read with a snapshot taken before that wait
-- and could miss a change the horizon already counts. The horizon's exclusive feed lock is
-- now held through the query too (an index range scan of at most `p_limit` rows, tens of
-- microseconds) instead of for the horizon alone. With no change the one row answers the
-- head alone (`r_seq` and `r_id` NULL).
CREATE FUNCTION autocomp_changes(p_since bigint, p_limit bigint)
RETURNS TABLE (r_head bigint, r_seq bigint, r_id text)
LANGUAGE plpgsql AS $$
DECLARE
    h bigint := autocomp_horizon();
BEGIN
    RETURN QUERY SELECT h, b.changed_seq, b.id FROM batches b
        WHERE b.changed_seq > p_since AND b.changed_seq <= h ORDER BY b.changed_seq LIMIT p_limit;
    IF NOT FOUND THEN
        r_head := h;
        RETURN NEXT;
    END IF;
END $$;
