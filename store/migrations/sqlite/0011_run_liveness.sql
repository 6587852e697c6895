-- A run's holder may name its liveness record in the lock service (`zk:...`, `pg:...`,
-- `local:...`): what a claimer that finds the run open asks about before it takes the run
-- over (an exclusive `claim_ready`'s `takeovers`). NULL for a holder that keeps none, and for
-- every run claimed before this schema.
ALTER TABLE runs ADD COLUMN liveness TEXT;
