-- What each batch stores, kept by triggers so that every writer keeps it (a process of an
-- older release too): the bytes of its metadata and of its events' details (the JSON text as
-- stored), which every event and content change is checked against (max_batch_bytes), and
-- the length of its log, which a page of the log reports. Counted for existing batches here.
ALTER TABLE batches ADD COLUMN stored_bytes INTEGER NOT NULL DEFAULT 0;
ALTER TABLE batches ADD COLUMN event_count INTEGER NOT NULL DEFAULT 0;
UPDATE batches SET
    stored_bytes = length(CAST(metadata AS BLOB))
        + COALESCE((SELECT SUM(length(CAST(details AS BLOB))) FROM events WHERE events.batch_id = batches.id), 0),
    event_count = (SELECT COUNT(*) FROM events WHERE events.batch_id = batches.id);
CREATE TRIGGER batches_stored_bytes_on_create AFTER INSERT ON batches BEGIN
    UPDATE batches SET stored_bytes = length(CAST(NEW.metadata AS BLOB)) WHERE id = NEW.id;
END;
CREATE TRIGGER batches_stored_bytes_on_content_change AFTER UPDATE OF metadata ON batches BEGIN
    UPDATE batches
    SET stored_bytes = stored_bytes - length(CAST(OLD.metadata AS BLOB)) + length(CAST(NEW.metadata AS BLOB))
    WHERE id = NEW.id;
END;
CREATE TRIGGER batches_stored_bytes_on_event AFTER INSERT ON events BEGIN
    UPDATE batches
    SET stored_bytes = stored_bytes + length(CAST(NEW.details AS BLOB)), event_count = event_count + 1
    WHERE id = NEW.batch_id;
END;
-- A batch's Reset markers alone, newest last: what `batch_head` reads for the newest Reset
-- of each type, without reading the rest of the log.
CREATE INDEX events_resets ON events (batch_id, seq) WHERE type = 'Reset';
