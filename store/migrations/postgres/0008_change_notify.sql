-- Pushed wake-ups: a commit that moves the head (a batch row written: created, appended to,
-- claimed, released, changed; or the steering) notifies `autocomp_store_changed`, so the
-- processes listening there (watchers, sboi, the store service) wake at once instead of
-- polling. Statement-level: one NOTIFY per statement, and PostgreSQL folds a transaction's
-- identical notifications into one, delivered when (and only if) it commits.
CREATE FUNCTION autocomp_notify_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('autocomp_store_changed', '');
    RETURN NULL;
END $$;
CREATE TRIGGER batches_notify AFTER INSERT OR UPDATE ON batches
    FOR EACH STATEMENT EXECUTE FUNCTION autocomp_notify_changed();
CREATE TRIGGER steering_notify AFTER UPDATE ON steering
    FOR EACH STATEMENT EXECUTE FUNCTION autocomp_notify_changed();
