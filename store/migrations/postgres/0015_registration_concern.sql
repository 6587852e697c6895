-- A batch registered has no events yet: it can be ready only for a trigger that requires
-- nothing, and such a trigger's waiters wake for every change (`Trigger::interest`). So a
-- registration no longer concerns everyone ('*', which woke every watcher of every step once
-- per batch registered, each for a look that found nothing) but `c:` (`ChangeConcern::Created`).
-- A listener of a release before reads `c:` as it reads any payload it does not know: as
-- concerning everyone, as before.
DROP TRIGGER batches_notify_created ON batches;
CREATE TRIGGER batches_notify_created AFTER INSERT ON batches
    FOR EACH STATEMENT EXECUTE FUNCTION autocomp_notify_changed('c:');
