-- Two of the change notifications cheaper for every writer (issue 40), what they notify
-- unchanged. Measured on a store of 20,000 batches, a PL/pgSQL loop of 20,000 statements as
-- the writers' functions run them (PostgreSQL 15, the 2-core machine of BENCHMARKS.md).
--
-- A batch's row changing priority or content (`modified_seq`) concerns everyone. The row
-- trigger saying so fired on every update of `batches` and was judged by its `WHEN` clause,
-- which the server parses again for every statement that may fire it: a claim's and an
-- append's update of the row, neither of which sets either column, paid 6-8 us each
-- (26-28 us an update -> 20-22 with the trigger swapped by hand, 16-21 with this migration
-- applied), two to nine times an item. A trigger `OF` the two columns is
-- not even considered by an update that sets neither, and its `WHEN` is the same; nothing
-- else writes them (no `BEFORE` trigger on `batches`).
DROP TRIGGER batches_notify_changed ON batches;
CREATE TRIGGER batches_notify_changed AFTER UPDATE OF priority, modified_seq ON batches
    FOR EACH ROW WHEN (OLD.priority IS DISTINCT FROM NEW.priority OR OLD.modified_seq IS DISTINCT FROM NEW.modified_seq)
    EXECUTE FUNCTION autocomp_notify_changed('*');

-- An event concerns the watchers of its type and of the types its reset names. The statement
-- trigger of schema 10 kept every inserted row in a transition table and read it back with a
-- query (`string_agg` over a `UNION ALL`); an append inserts one event a statement, so a row
-- trigger says the same without either: the event's type, or with a reset the distinct types
-- in order, as before, and `*` past 4,000 bytes. A statement inserting several events (a
-- restore) now notifies each one's types apart rather than their union in one notification:
-- the same watchers are woken. An insert of no rows notified `t:` (nobody) and now notifies
-- nothing. 98-106 us an event recorded -> 90-99 in the loop above (79-89 with no trigger at
-- all), about five events an item.
CREATE FUNCTION autocomp_notify_appended_event() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    types text := NEW.type;
BEGIN
    IF jsonb_typeof(NEW.resets) = 'array' THEN
        SELECT string_agg(DISTINCT t, ' ') INTO types FROM (
            SELECT NEW.type AS t
            UNION ALL
            SELECT jsonb_array_elements_text(NEW.resets)
        ) named;
    END IF;
    PERFORM pg_notify('autocomp_store_changed',
        CASE WHEN octet_length(types) > 4000 THEN '*' ELSE 't:' || coalesce(types, '') END);
    RETURN NULL;
END $$;

DROP TRIGGER events_notify ON events;
CREATE TRIGGER events_notify AFTER INSERT ON events
    FOR EACH ROW EXECUTE FUNCTION autocomp_notify_appended_event();

-- Schema 10's statement trigger function, fired by nothing now.
DROP FUNCTION autocomp_notify_appended();
