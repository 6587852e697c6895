//! A watcher wakes only for the store changes that concern it (issue 40): in a two-stage
//! pipeline of `--watch` processes, appends the second stage's trigger does not read leave it
//! asleep (its debug log shows no new look for work), while its first stage wakes for
//! each; registrations wake neither, but a step that requires nothing works each new batch
//! at once; a change that concerns a watcher still gets its batch worked within seconds.
//! Embedded, and over PostgreSQL.

use std::process::Child;
use std::time::{Duration, Instant};

use autocomp_e2e::{PROBED, Pipeline, finish, wait_until};
use autocomp_model::{Agent, EventType, NewEvent, Outcome};

const PROBE: &str = env!("CARGO_BIN_EXE_probe-component");
/// Far longer than the test: every wake-up below comes from the change feed.
const SLOW_HEARTBEAT: &str = "watch_heartbeat = \"10m\"";
const SECOND_DONE: &str = "Second_Done";
const GREETED: &str = "Greeted";

/// A `--watch` process of the probe whose debug log goes to `<name>.log`.
struct Watcher {
    child: Child,
    log: std::path::PathBuf,
}

impl Watcher {
    fn start(pipeline: &Pipeline, name: &str, event_type: &str, requires: &str) -> Self {
        let log = pipeline.path(&format!("{name}.log"));
        let child = pipeline
            .command(&["--watch"])
            .env("PROBE_NAME", name)
            .env("PROBE_EVENT_TYPE", event_type)
            .env("PROBE_REQUIRES", requires)
            .env("RUST_LOG", "info,autocomp_framework::watch=debug")
            .stderr(std::fs::File::create(&log).expect("the log file"))
            .spawn()
            .expect("the watcher starts");
        Self { child, log }
    }

    fn read_log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// How often it has looked for work so far (asked the index, or, since its look reads
    /// the change feed, looked there): once per wake-up.
    fn asked(&self) -> usize {
        let log = self.read_log();
        log.lines().filter(|line| line.contains("asked the index") || line.contains("looked for work")).count()
    }

    fn stop(self) {
        let pid = libc::pid_t::try_from(self.child.id()).expect("pid fits");
        // SAFETY: kill(2) on the pid of a child we spawned and have not reaped yet.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
        let finished = finish(self.child, Duration::from_secs(20));
        assert_eq!(finished.code, Some(0), "{}", finished.show());
    }
}

fn append(pipeline: &Pipeline, id: &autocomp_model::BatchId, event_type: &str, outcome: Outcome) {
    let agent = Agent::new("test/1@localhost#1").unwrap();
    let event = NewEvent::new(EventType::new(event_type).unwrap(), outcome, agent);
    pipeline.block_on(pipeline.any_store().append_event(id, event)).expect("appended");
}

fn wait_for(what: &str, condition: impl FnMut() -> bool) {
    assert!(wait_until(Instant::now() + Duration::from_secs(15), condition), "{what}");
}

fn only_concerning_changes_wake_a_watcher(pipeline: &Pipeline) {
    pipeline.configure(SLOW_HEARTBEAT);
    std::fs::write(pipeline.config_dir().join("second.toml"), SLOW_HEARTBEAT).unwrap();
    let first = Watcher::start(pipeline, "probe", PROBED, "Data_Received");
    let second = Watcher::start(pipeline, "second", SECOND_DONE, PROBED);
    // A step that requires nothing: a batch just registered is ready for it.
    std::fs::write(pipeline.config_dir().join("greeter.toml"), SLOW_HEARTBEAT).unwrap();
    let greeter = Watcher::start(pipeline, "greeter", GREETED, "");
    wait_for("the three watchers registered", || {
        pipeline.block_on(pipeline.any_store().components()).expect("registry readable").len() == 3
    });
    // A batch neither stage will work: its first step failed (the first stage is blocked by
    // its failure, the second requires a success). Its failure concerns both (the first's
    // own type, the second's requirement).
    let parked = pipeline.register_one("B0001", false);
    append(pipeline, &parked, PROBED, Outcome::Failure);
    let logs = || format!("--- first\n{}--- second\n{}", first.read_log(), second.read_log());
    let looked = wait_until(Instant::now() + Duration::from_secs(15), || first.asked() >= 2 && second.asked() >= 2);
    assert!(looked, "both watchers looked at the new batch\n{}", logs());
    // Past their looks at the set-up, both sleep in the change feed.
    let settled = |watcher: &Watcher| {
        let before = watcher.asked();
        std::thread::sleep(Duration::from_millis(500));
        watcher.asked() == before
    };
    wait_for("the watchers settled", || settled(&first) && settled(&second));
    let second_before = second.asked();
    // A batch registered without events can be ready only for a step that requires nothing:
    // registering batches wakes neither (it woke every watcher once per batch before).
    let first_before = first.asked();
    for number in 3..=5 {
        pipeline.register_one(&format!("B000{number}"), false);
    }
    // ... and wakes the step that requires nothing at once.
    for number in 3..=5 {
        let id = autocomp_model::BatchId::new(format!("B000{number}")).unwrap();
        wait_for(&format!("{id} greeted within seconds of its registration"), || {
            pipeline.events(&id, GREETED).len() == 1
        });
    }
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(first.asked(), first_before, "the first watcher woke for registrations\n{}", logs());
    for round in 1..=5 {
        // Data_Received concerns the first stage only (its trigger requires it): the first
        // watcher wakes and asks (nothing is ready: B0001 is blocked for it), the second not.
        let first_before = first.asked();
        append(pipeline, &parked, "Data_Received", Outcome::Success);
        wait_for(&format!("round {round}: the first watcher woke for an append it reads"), || {
            first.asked() > first_before
        });
    }
    assert_eq!(second.asked(), second_before, "the second watcher woke for appends its trigger does not read");
    // Work that concerns the second stage reaches it at once: a new batch through both.
    let through = pipeline.register_one("B0002", true);
    let started = Instant::now();
    let went_through =
        wait_until(Instant::now() + Duration::from_secs(15), || pipeline.events(&through, SECOND_DONE).len() == 1);
    assert!(went_through, "B0002 went through both watchers\n{}", logs());
    assert!(started.elapsed() < Duration::from_secs(10), "took {:?}", started.elapsed());
    first.stop();
    second.stop();
    greeter.stop();
}

#[test]
fn an_embedded_watcher_sleeps_through_appends_its_trigger_does_not_read() {
    only_concerning_changes_wake_a_watcher(&Pipeline::new(PROBE));
}

#[test]
fn a_watcher_on_postgres_sleeps_through_appends_its_trigger_does_not_read() {
    let url = autocomp_test_servers::postgres::shared().unique_database();
    only_concerning_changes_wake_a_watcher(&Pipeline::with_store(PROBE, &url));
}
