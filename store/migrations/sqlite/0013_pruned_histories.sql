-- Pruning (`autocomp prune`) removes a finished batch's superseded events once they are
-- exported; what the batch stores is kept as the insert's trigger keeps it, so its size and
-- log length stay true for every writer.
CREATE TRIGGER batches_stored_bytes_on_event_removed AFTER DELETE ON events BEGIN
    UPDATE batches
    SET stored_bytes = stored_bytes - length(CAST(OLD.details AS BLOB)), event_count = event_count - 1
    WHERE id = OLD.batch_id;
END;
