//! What a `--watch` watcher asks the index service, end to end: a two-stage pipeline of
//! probe watchers over PostgreSQL and `sboi serve` takes a trickle of batches, each through
//! both stages, while the watchers answer from the store's change feed between the index's
//! full answers: the service's own request counts say how often it was asked.

use std::process::Child;
use std::time::{Duration, Instant};

use autocomp_e2e::services::{Service, http_get};
use autocomp_e2e::{Pipeline, finish, wait_until};
use autocomp_model::BatchId;
use autocomp_test_servers::postgres;

const PROBE: &str = env!("CARGO_BIN_EXE_probe-component");
const STAGES: [(&str, &str, &str); 2] = [("stage1", "Stage1", "Data_Received"), ("stage2", "Stage2", "Stage1")];
/// The trickle: this many batches, one every `EVERY`.
const TRICKLE: usize = 30;
const EVERY: Duration = Duration::from_millis(100);

/// `sboi_requests_total` of the service at `url` for `operation`, every status summed.
fn requests(url: &str, operation: &str) -> f64 {
    let (_, text) = http_get(&format!("{url}/metrics")).expect("the index service answers /metrics");
    let label = format!("sboi_requests_total{{operation=\"{operation}\",");
    text.lines()
        .filter(|line| line.starts_with(&label))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn start_stage(pipeline: &Pipeline, (name, event_type, requires): (&str, &str, &str)) -> Child {
    // A heartbeat far past the test: whatever the watchers take comes from their looks.
    std::fs::write(pipeline.config_dir().join(format!("{name}.toml")), "watch_heartbeat = \"10m\"\n").unwrap();
    let log = std::fs::File::create(pipeline.path(&format!("{name}.log"))).unwrap();
    let mut command = pipeline.command(&["--watch", "-vv"]);
    command.env("PROBE_NAME", name).env("PROBE_EVENT_TYPE", event_type).env("PROBE_REQUIRES", requires);
    command.stderr(log).spawn().expect("the probe starts")
}

fn stage2_done(pipeline: &Pipeline, ids: &[BatchId]) -> usize {
    ids.iter().filter(|id| !pipeline.events(id, "Stage2").is_empty()).count()
}

#[test]
fn a_trickle_through_two_watched_stages_asks_the_index_service_a_few_times_not_per_batch() {
    let url = postgres::shared().unique_database();
    let pipeline = Pipeline::with_store(PROBE, &url);
    std::fs::create_dir_all(pipeline.path("logs")).unwrap();
    let index = Service::index(&url, &pipeline.path("sboi-index"), &pipeline.path("logs"));
    pipeline.use_backend("index", &index.url());
    let mut watchers: Vec<Child> = STAGES.iter().map(|stage| start_stage(&pipeline, *stage)).collect();
    let registered = wait_until(Instant::now() + Duration::from_secs(30), || {
        pipeline.block_on(pipeline.any_store().components()).expect("registry readable").len() == STAGES.len()
    });
    assert!(registered, "the watchers' first passes never registered both stages");

    let before = requests(&index.url(), "query");
    let mut ids = Vec::new();
    for n in 1..=TRICKLE {
        ids.push(pipeline.register_one(&format!("T{n:04}"), true));
        std::thread::sleep(EVERY);
    }
    let through = wait_until(Instant::now() + Duration::from_secs(60), || stage2_done(&pipeline, &ids) == TRICKLE);
    let asked = requests(&index.url(), "query") - before;
    let mut shown = String::new();
    for (mut watcher, (name, ..)) in watchers.drain(..).zip(STAGES) {
        watcher.kill().ok();
        let _ = finish(watcher, Duration::from_secs(20));
        let log = std::fs::read_to_string(pipeline.path(&format!("{name}.log"))).unwrap_or_default();
        let lines: Vec<&str> = log.lines().filter(|line| line.contains("looked for work")).collect();
        shown.push_str(&format!(
            "--- {name}: {} looks, the last:\n{}\n",
            lines.len(),
            lines[lines.len().saturating_sub(5)..].join("\n")
        ));
    }
    assert!(through, "{} of {TRICKLE} batches got through both stages\n{shown}", stage2_done(&pipeline, &ids));
    for id in &ids {
        assert_eq!(pipeline.events(id, "Stage1").len(), 1, "{id}");
        assert_eq!(pipeline.events(id, "Stage2").len(), 1, "{id}");
    }
    // Before the watchers answered from the feed each asked about five times per batch it
    // worked (ten per batch here). Now: each watcher's first full answer after its start-up
    // pass (two questions: the trigger and the retry trigger), and then none.
    assert!(asked <= 8.0, "the index service was asked {asked} times for {TRICKLE} batches\n{shown}");
}
