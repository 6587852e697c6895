-- What the batch index reads of each batch, kept by every write that changes the batch's
-- events or runs (see summary.rs); filled in for existing batches by the migration itself.
ALTER TABLE batches ADD COLUMN summary TEXT NOT NULL DEFAULT '';
