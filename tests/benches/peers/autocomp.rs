//! autocomp under test: its store, index and locks as each system has them, and one
//! `--watch` process per stage; its observer reads the change feed and summaries, and whole
//! batches only of the items through stage 4.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

use autocomp_e2e::services::{Service, TOKEN};
use autocomp_e2e::zk::ZooKeeper;
use autocomp_e2e::{binary, without_pipeline_env};
use autocomp_framework::registration_hand_ons;
use autocomp_model::{Agent, BatchId, BatchType, ComponentDescriptor, EventType, NewBatch, NewEvent, Outcome, Seq};
use autocomp_store::{ObjectStore, open_store};

use super::processes::{Proc, children_named, now_ms};
use super::{Done, STAGES, STORE_POLL, System, phases};

/// autocomp: a config dir, the store (SQLite file or a PostgreSQL database, the bench's handle
/// on it registers the items and reads the results), for `autocomp-pg` `sboi serve` and
/// ZooKeeper, and one `--watch` process per stage.
pub(super) struct Autocomp {
    // Dropped first: the watchers, then the services, then ZooKeeper and the dir.
    workers: Vec<Proc>,
    services: Vec<Service>,
    zookeeper: Option<ZooKeeper>,
    exec: bool,
    /// `autocomp-exec` or the probe component, found (and built if need be) before any
    /// clock starts.
    program: PathBuf,
    store: Arc<dyn ObjectStore>,
    runtime: tokio::runtime::Runtime,
    /// The takers' descriptors as last read, and when: whom a registration hands its item on
    /// to, as a source's registration does.
    takers: Option<(Instant, Arc<Vec<ComponentDescriptor>>)>,
    /// Registration time of every item not seen finished yet.
    pending: HashMap<u64, i64>,
    /// Where the bench's reading of the change feed is.
    since: Seq,
    last_poll: Option<Instant>,
    dir: tempfile::TempDir,
}

fn batch_id(n: u64) -> BatchId {
    BatchId::new(format!("I{n:07}")).unwrap()
}

fn item_of(id: &BatchId) -> Option<u64> {
    id.as_str().strip_prefix('I')?.parse().ok()
}

fn stage_event(stage: usize) -> String {
    format!("Stage{stage}")
}

const RECEIVED: &str = "Data_Received";

impl Autocomp {
    pub(super) fn embedded(exec: bool) -> Autocomp {
        let dir = tempfile::tempdir().expect("a temp dir");
        let mut store = format!("sqlite://{}", dir.path().join("store.db").display());
        if let Ok(query) = std::env::var("AUTOCOMP_BENCH_SQLITE_QUERY") {
            store = format!("{store}?{query}");
        }
        let index = format!("local:{}", dir.path().join("index").display());
        let locks = format!("local:{}", dir.path().join("locks").display());
        Self::with_backends(dir, exec, &store, &index, &locks, Vec::new(), None)
    }

    /// The store on PostgreSQL, `sboi serve` following it; locks on ZooKeeper, or with
    /// `zookeeper = false` on the same PostgreSQL (a PostgreSQL-only site).
    pub(super) fn over_postgres(store: &str, zookeeper: bool) -> Autocomp {
        let dir = tempfile::tempdir().expect("a temp dir");
        let logs = dir.path().join("logs");
        std::fs::create_dir_all(&logs).unwrap();
        let index = Service::index(store, &dir.path().join("index"), &logs);
        let zookeeper = zookeeper.then(ZooKeeper::standalone);
        let locks = zookeeper.as_ref().map_or_else(|| store.to_string(), |zk| zk.url("autocomp", "10s"));
        let index_url = index.url();
        Self::with_backends(dir, false, store, &index_url, &locks, vec![index], zookeeper)
    }

    fn with_backends(
        dir: tempfile::TempDir,
        exec: bool,
        store: &str,
        index: &str,
        locks: &str,
        services: Vec<Service>,
        zookeeper: Option<ZooKeeper>,
    ) -> Autocomp {
        let config = dir.path().join("config");
        std::fs::create_dir_all(&config).unwrap();
        std::fs::create_dir_all(dir.path().join("logs")).unwrap();
        std::fs::write(
            config.join("autocomp.toml"),
            format!("store = \"{store}\"\nindex = \"{index}\"\nlocks = \"{locks}\"\n"),
        )
        .unwrap();
        for stage in 1..=STAGES {
            // Empty: every setting at its default (max_threads 2, queue_size 10, ...).
            std::fs::write(config.join(format!("stage{stage}.toml")), "").unwrap();
        }
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let store = runtime
            .block_on(open_store(store))
            .unwrap_or_else(|e| panic!("the store {} opens: {e}", autocomp_toolkit::display_url(store)));
        let program = if exec { binary("autocomp-exec") } else { PathBuf::from(env!("CARGO_BIN_EXE_probe-component")) };
        Autocomp {
            workers: Vec::new(),
            services,
            zookeeper,
            exec,
            program,
            store,
            runtime,
            takers: None,
            pending: HashMap::new(),
            since: Seq::ZERO,
            last_poll: None,
            dir,
        }
    }

    /// The takers, read again once the ones read are a second old (as a runner reads them
    /// beside its passes; a source reads them once a pass).
    fn takers(&mut self) -> Arc<Vec<ComponentDescriptor>> {
        if let Some((read, takers)) = &self.takers
            && read.elapsed() < std::time::Duration::from_secs(1)
        {
            return Arc::clone(takers);
        }
        let takers = Arc::new(self.runtime.block_on(self.store.takers()).expect("the takers read"));
        self.takers = Some((Instant::now(), Arc::clone(&takers)));
        takers
    }

    fn register(&mut self, ids: &[u64]) {
        let store = Arc::clone(&self.store);
        let takers = self.takers();
        let stamped: Vec<(u64, i64)> = self.runtime.block_on(async move {
            // Up to 16 at once: the store's pool (PostgreSQL) or its writer (SQLite) decides.
            let mut tasks = tokio::task::JoinSet::new();
            let mut stamped = Vec::with_capacity(ids.len());
            for &n in ids {
                if tasks.len() >= 16 {
                    stamped.push(tasks.join_next().await.unwrap().expect("a registration task"));
                }
                let (store, takers) = (Arc::clone(&store), Arc::clone(&takers));
                tasks.spawn(async move {
                    let registered = now_ms();
                    let id = batch_id(n);
                    let new = NewBatch::new(id.clone(), BatchType::new("Item").unwrap());
                    let agent = Agent::new("bench-trigger/peers@localhost#1").unwrap();
                    let event = NewEvent::new(EventType::new(RECEIVED).unwrap(), Outcome::Success, agent);
                    // As the delivery trigger registers (`SourceContext::register_batch`): the
                    // batch and its delivery in one commit, handed on to stage 1's taker.
                    let hand_on = registration_hand_ons(&takers, &new, &event);
                    store.register_handing_on(new, event, &hand_on).await.expect("batch registered with Data_Received");
                    (n, registered)
                });
            }
            while let Some(result) = tasks.join_next().await {
                stamped.push(result.expect("a registration task"));
            }
            stamped
        });
        self.pending.extend(stamped);
    }
}

impl System for Autocomp {
    fn register_backlog(&mut self, first: u64, count: u64) {
        let ids: Vec<u64> = (first..first + count).collect();
        self.register(&ids);
    }

    fn register_one(&mut self, id: u64) {
        self.register(&[id]);
    }

    fn registered_all(&mut self) {}

    fn start_workers(&mut self) {
        let config = self.dir.path().join("config");
        for stage in 1..=STAGES {
            let name = format!("stage{stage}");
            let requires = if stage == 1 { RECEIVED.to_owned() } else { stage_event(stage - 1) };
            let mut command = Command::new(&self.program);
            without_pipeline_env(&mut command);
            if self.exec {
                command.args(["--name", &name, "--event-type", &stage_event(stage), "--requires", &requires]);
            } else {
                command
                    .env("PROBE_NAME", &name)
                    .env("PROBE_EVENT_TYPE", stage_event(stage))
                    .env("PROBE_REQUIRES", &requires);
            }
            command.arg("--config-dir").arg(&config).arg("--watch");
            if self.exec {
                command.args(["--", "true"]);
            }
            // What the test sboi service asks of readers; the embedded backends ignore it.
            command.env("AUTOCOMP_TOKEN", TOKEN);
            // AUTOCOMP_BENCH_WORKER_LOGS=DIR: the workers log at debug level into DIR, kept
            // after the run (where a stage's time goes; it slows them a little).
            let log = match std::env::var_os("AUTOCOMP_BENCH_WORKER_LOGS").map(PathBuf::from) {
                Some(dir) => {
                    std::fs::create_dir_all(&dir).expect("AUTOCOMP_BENCH_WORKER_LOGS is a directory");
                    command.arg("-vv");
                    dir.join(format!("{name}.log"))
                }
                None => self.dir.path().join("logs").join(format!("{name}.log")),
            };
            phases::configure(&mut command, std::env::var_os("AUTOCOMP_BENCH_WORKER_LOGS").is_some());
            self.workers.push(Proc::spawn(&name, command, &log));
        }
    }

    fn poll_done(&mut self) -> Vec<Done> {
        if self.last_poll.is_some_and(|at| at.elapsed() < STORE_POLL) {
            return Vec::new();
        }
        self.last_poll = Some(Instant::now());
        let store = Arc::clone(&self.store);
        let (since, pending) = (self.since, &self.pending);
        let (next, finished) = self.runtime.block_on(async move {
            // The batches changed since the last poll, each once; of those still pending,
            // the ones whose Stage4 is recorded.
            let mut cursor = since;
            let mut changed = Vec::new();
            loop {
                let page = store.changes(cursor, 1_000).await.expect("the change feed reads");
                let empty = page.changes.is_empty();
                changed.extend(
                    page.changes
                        .into_iter()
                        .map(|(_, id)| id)
                        .filter(|id| item_of(id).is_some_and(|n| pending.contains_key(&n))),
                );
                cursor = page.next;
                if empty || cursor >= page.head {
                    break;
                }
            }
            let stages: Vec<EventType> = (1..=STAGES).map(|k| EventType::new(stage_event(k)).unwrap()).collect();
            // Whole batches (every event) only of the items through stage 4, by their
            // summaries (the batch row): read at every change, a whole batch is read four
            // or five times over an item's life, load on the server that the peers'
            // observer (a file their last stage appends to) does not put on theirs.
            let last = stages.last().expect("stages");
            let mut through = Vec::new();
            for chunk in changed.chunks(1_000) {
                let summaries = store.get_summaries(chunk).await.expect("summaries read");
                through.extend(summaries.into_iter().filter_map(|summary| {
                    let done = summary.effective_of(last).is_some_and(|e| e.outcome == Outcome::Success);
                    done.then_some(summary.id)
                }));
            }
            let mut finished = Vec::new();
            for chunk in through.chunks(200) {
                for batch in store.get_batches(chunk).await.expect("batches read") {
                    let at = |stage: &EventType| {
                        batch.events.iter().find(|e| e.event_type == *stage && e.outcome == Outcome::Success)
                    };
                    let times: Option<Vec<i64>> = stages.iter().map(|stage| at(stage).map(|e| e.at.millis())).collect();
                    if let (Some(times), Some(n)) = (times, item_of(&batch.id)) {
                        finished.push((n, times));
                    }
                }
            }
            (cursor, finished)
        });
        self.since = next;
        finished
            .into_iter()
            .filter_map(|(id, stages)| {
                let registered = self.pending.remove(&id)?;
                Some(Done { id, registered, finished: *stages.last()?, stages })
            })
            .collect()
    }

    fn worker_pids(&self) -> Vec<u32> {
        self.workers.iter().map(Proc::pid).collect()
    }

    fn server_pids(&self) -> Vec<u32> {
        let mut pids = children_named("sboi");
        if self.zookeeper.is_some() {
            pids.extend(children_named("java"));
        }
        pids
    }

    fn dead(&mut self) -> Option<String> {
        self.workers.iter_mut().find_map(Proc::exited)
    }

    fn phase_logs(&self) -> Vec<(String, PathBuf)> {
        self.workers.iter().map(|worker| (worker.name.clone(), worker.log.clone())).collect()
    }

    fn logs(&self) -> String {
        let mut text: String = self.workers.iter().map(Proc::log_tail).collect();
        for service in &self.services {
            let log = service.logs();
            let lines: Vec<&str> = log.lines().collect();
            text.push_str(&format!("--- service\n{}\n", lines[lines.len().saturating_sub(20)..].join("\n")));
        }
        text
    }
}
