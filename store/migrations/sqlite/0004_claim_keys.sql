-- A claim may carry a client-chosen key: the same key again returns the run it opened (a
-- retry after a lost answer) instead of abandoning that run.
ALTER TABLE runs ADD COLUMN claim_key TEXT;
CREATE UNIQUE INDEX runs_claim_key ON runs (batch_id, component, claim_key) WHERE claim_key IS NOT NULL;
