-- A commit that appends events announces the summaries of the batches it appended to, as
-- the commit leaves them, on a channel of their own (`autocomp_batch_summaries`): a watcher
-- woken by the commit judges those batches and claims them by their `changed_seq` without
-- first reading the change feed (one round trip fewer on a batch's path, issue 40). The
-- feed stays the truth: a watcher reads it after every pass that worked from an
-- announcement, and a stale summary only costs a claim the stamp refuses.
--
-- Built at commit (a deferred constraint trigger per event row), after every statement of
-- the transaction, so the summary is the batch as the commit leaves it; PostgreSQL folds the
-- identical notifications of one transaction (two events of one batch) into one. The columns
-- are those of the store's summary reads (`SUMMARY_COLUMNS`), which a contract test holds
-- equal. A summary past 7,900 bytes (a NOTIFY payload holds at most 8,000) and the
-- summaries past the 64th of one transaction are not announced: the waiters read the feed.
-- A listener of a release before does not listen on the channel.
CREATE FUNCTION autocomp_announce_summary() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    announced integer := coalesce(nullif(current_setting('autocomp.announced', true), ''), '0')::integer;
    payload text;
BEGIN
    IF announced >= 64 THEN
        RETURN NULL;
    END IF;
    SELECT row_to_json(s)::text INTO payload FROM (
        SELECT b.id, b.type, b.priority, b.created_seq, b.modified_seq, b.changed_seq, b.modified_at,
            b.last_event_at, f.types, f.outcomes, f.seqs, f.transients, f.skipped, f.content_seqs,
            (SELECT array_agg(DISTINCT r.component ORDER BY r.component) FROM runs r
               WHERE r.batch_id = b.id AND r.state = 'open') AS running, f.acknowledged
        FROM batches b
        LEFT JOIN LATERAL (
            SELECT array_agg(type ORDER BY type) types, array_agg(outcome ORDER BY type) outcomes,
                   array_agg(seq ORDER BY type) seqs, array_agg(transient ORDER BY type) transients,
                   array_agg(skipped ORDER BY type) skipped, array_agg(content_seq ORDER BY type) content_seqs,
                   array_agg(acknowledged ORDER BY type) acknowledged
            FROM batch_effective WHERE batch_id = b.id
        ) f ON true
        WHERE b.id = NEW.batch_id
    ) s;
    IF payload IS NOT NULL AND octet_length(payload) <= 7900 THEN
        PERFORM set_config('autocomp.announced', (announced + 1)::text, true);
        PERFORM pg_notify('autocomp_batch_summaries', payload);
    END IF;
    RETURN NULL;
END $$;

CREATE CONSTRAINT TRIGGER events_announce_summary AFTER INSERT ON events
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW EXECUTE FUNCTION autocomp_announce_summary();
