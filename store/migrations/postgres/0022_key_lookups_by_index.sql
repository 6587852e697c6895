-- The functions a registration, a claim and an append call read and lock batches, runs and
-- events by key, and their statements are planned once per connection (PL/pgSQL keeps a
-- statement's plan for the session; schema 21 made them generic): a plan made while the store
-- was young stayed with the connection. On an empty `batches`, the lock of
-- `id = ANY (p_batches)` was planned as a sequential scan, and every later registration on
-- that connection read the whole table: 3,000 registrations on one connection read 4.5
-- million rows, the last thousand 0.37 ms each against 0.12 on a fresh connection, growing
-- with the table until an ANALYZE happened to replan it (issue 40).
--
-- Each of these functions now plans with sequential scans disabled: every table they read has
-- the index for its key, so the plan is the index's at any size; a relation without one (the
-- feed epoch's sequence) is still scanned, the setting only making a scan the last resort.
-- Such a scan's plan then costs more than 10^10, far past `jit_above_cost`, and PostgreSQL
-- (JIT is on by default from 12; measured on 15) compiled it with LLVM at every execution:
-- 3.8 ms for reading the epoch's sequence, 8-10 ms a claim or an append (measured, then
-- undone). So JIT is off in them too: nothing these key lookups run is worth compiling. The
-- batch trigger's metadata update and an operator's priority change look batches up by key
-- the same way and are planned the same. Like a function's other `SET` clauses, these are
-- dropped by a `CREATE OR REPLACE` that does not repeat them: a migration replacing one of
-- these functions applies them again (the store's test
-- `young_plans::every_function_of_a_stage_plans_by_index` names them and fails until it does).
-- The functions are found in the schema that holds the store's (as migration 19 finds them),
-- whatever the search path says now.
DO $$
DECLARE
    f regprocedure;
    home oid := (SELECT pronamespace FROM pg_proc WHERE oid = 'autocomp_horizon'::regproc);
BEGIN
    FOR f IN
        SELECT p.oid::regprocedure FROM pg_proc p
        WHERE p.pronamespace = home
          AND p.prolang = (SELECT oid FROM pg_language WHERE lanname = 'plpgsql')
          AND p.proname IN ('autocomp_register_batch', 'autocomp_create_batch', 'autocomp_append_group',
              'autocomp_insert_event', 'autocomp_record_event', 'autocomp_claim', 'autocomp_claim_ready',
              'autocomp_claim_judged', 'autocomp_claim_many', 'autocomp_fence_refusal', 'autocomp_check_fence',
              'autocomp_lock_batch', 'autocomp_release', 'autocomp_save_checkpoint', 'autocomp_cancel_run',
              'autocomp_keep_summary_part', 'autocomp_summary_part_written', 'autocomp_check_batch_bytes',
              'autocomp_replace_metadata', 'autocomp_set_priority', 'autocomp_prioritize')
    LOOP
        EXECUTE format('ALTER FUNCTION %s SET enable_seqscan = off SET jit = off', f);
    END LOOP;
END $$;
