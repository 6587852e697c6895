-- Wake-ups that say whom a commit concerns, so a watcher sleeps through the commits of other
-- stages (issue 40). Every commit moving the head still notifies `autocomp_store_changed`
-- (plain waiters wake for any), now with a payload a waiter for some event types reads
-- (`ChangeConcern::from_payload`):
--   `t:` and the event types appended, space-separated: events of those types were appended
--        (an event's own type and every type its `resets` covers); `t:` alone: nothing that
--        makes a batch ready for anyone (a claim, a checkpoint);
--   `*` (or anything else, like the empty payload of schema 8): concerns everyone: a batch
--        created, a priority or content change, a run released or cancelled, the steering.
-- PostgreSQL folds a transaction's identical notifications into one and delivers them when
-- (and only if) it commits.
CREATE OR REPLACE FUNCTION autocomp_notify_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('autocomp_store_changed', coalesce(TG_ARGV[0], '*'));
    RETURN NULL;
END $$;

-- One notification per appending statement, naming its distinct types; past 4000 bytes
-- (a NOTIFY payload holds at most 8000) it concerns everyone instead.
CREATE FUNCTION autocomp_notify_appended() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    types text;
BEGIN
    SELECT string_agg(DISTINCT t, ' ') INTO types FROM (
        SELECT type AS t FROM appended
        UNION ALL
        SELECT jsonb_array_elements_text(resets) FROM appended WHERE jsonb_typeof(resets) = 'array'
    ) named;
    PERFORM pg_notify('autocomp_store_changed',
        CASE WHEN octet_length(types) > 4000 THEN '*' ELSE 't:' || coalesce(types, '') END);
    RETURN NULL;
END $$;

DROP TRIGGER batches_notify ON batches;
-- Any batch row written moves the head (an append, a claim, a release...): wakes plain waiters.
CREATE TRIGGER batches_notify AFTER UPDATE ON batches
    FOR EACH STATEMENT EXECUTE FUNCTION autocomp_notify_changed('t:');
CREATE TRIGGER batches_notify_created AFTER INSERT ON batches
    FOR EACH STATEMENT EXECUTE FUNCTION autocomp_notify_changed('*');
CREATE TRIGGER batches_notify_changed AFTER UPDATE ON batches
    FOR EACH ROW WHEN (OLD.priority IS DISTINCT FROM NEW.priority OR OLD.modified_seq IS DISTINCT FROM NEW.modified_seq)
    EXECUTE FUNCTION autocomp_notify_changed('*');
CREATE TRIGGER events_notify AFTER INSERT ON events REFERENCING NEW TABLE AS appended
    FOR EACH STATEMENT EXECUTE FUNCTION autocomp_notify_appended();
-- A run closed without a result of its own: its batch is free to be claimed again.
CREATE TRIGGER runs_notify_freed AFTER UPDATE ON runs
    FOR EACH ROW WHEN (OLD.state = 'open' AND NEW.state IN ('released', 'cancelled'))
    EXECUTE FUNCTION autocomp_notify_changed('*');
DROP TRIGGER steering_notify ON steering;
CREATE TRIGGER steering_notify AFTER UPDATE ON steering
    FOR EACH STATEMENT EXECUTE FUNCTION autocomp_notify_changed('*');
