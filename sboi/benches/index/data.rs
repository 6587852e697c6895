//! The index bench's data set: a deterministic pipeline history per batch (`script`), written through the store port into a cached SQLite store (`ensure_store`).

use super::*;

/// splitmix64: deterministic, so a batch's history depends only on its number.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0xA076_1D64_78BD_642F))
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn chance(&mut self, p: f64) -> bool {
        ((self.next() >> 11) as f64 / (1u64 << 53) as f64) < p
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// One write of a batch's history.
enum Op {
    Create {
        priority: i32,
        rare: bool,
    },
    Append {
        step: usize,
        success: bool,
        duration_ms: u64,
    },
    /// The runner's path: claim, then an append in that run.
    RunAppend {
        step: usize,
        success: bool,
        duration_ms: u64,
    },
    Reset {
        steps: Vec<usize>,
    },
    ContentChange,
    Prioritize(i32),
    /// A claim still open (a component is working on the batch right now).
    OpenClaim {
        step: usize,
    },
}

fn priority(rng: &mut Rng) -> i32 {
    [1, 2, 5, -1][rng.below(4) as usize]
}

/// The history of batch `n` of `total`: the newest 5% are the backlog, still in progress.
fn script(n: usize, total: usize) -> Vec<Op> {
    let mut rng = Rng::new(n as u64 + 1);
    let mut ops = Vec::with_capacity(16);
    let initial = if rng.chance(0.01) { priority(&mut rng) } else { 0 };
    ops.push(Op::Create { priority: initial, rare: rng.chance(0.02) });
    ops.push(Op::Append { step: 0, success: true, duration_ms: 200 + rng.below(2_000) });
    if rng.chance(0.0025) {
        ops.push(Op::Append { step: MANUAL, success: true, duration_ms: 60_000 + rng.below(600_000) });
    }
    let backlog = n >= total - total / 20;
    let depth = if backlog { 1 + rng.below(PIPELINE as u64 - 1) as usize } else { PIPELINE };
    let mut stopped = false;
    for step in 1..depth {
        let success = rng.chance(0.95);
        let duration_ms = 100 + rng.below(30_000);
        ops.push(if step == ARCHIVE {
            Op::RunAppend { step, success, duration_ms }
        } else {
            Op::Append { step, success, duration_ms }
        });
        if !success {
            if !rng.chance(0.7) {
                stopped = true;
                break;
            }
            // An operator resets the failed step and it runs again.
            ops.push(Op::Reset { steps: vec![step] });
            let success = rng.chance(0.9);
            ops.push(Op::Append { step, success, duration_ms });
            if !success {
                stopped = true;
                break;
            }
        }
    }
    if !backlog && !stopped {
        if rng.chance(0.03) {
            // Re-delivery: the content changed, metadata is extracted again.
            ops.push(Op::ContentChange);
            ops.push(Op::Append { step: METADATA, success: true, duration_ms: 100 + rng.below(5_000) });
        }
        if rng.chance(0.01) {
            ops.push(Op::Reset { steps: vec![PUBLISHED, PUBLISHED + 1] });
            ops.push(Op::Append { step: PUBLISHED, success: true, duration_ms: 100 + rng.below(5_000) });
            ops.push(Op::Append { step: PUBLISHED + 1, success: true, duration_ms: 100 + rng.below(5_000) });
        }
    }
    if backlog && !stopped && rng.chance(0.1) {
        ops.push(Op::OpenClaim { step: depth });
    }
    if rng.chance(0.005) {
        ops.push(Op::Prioritize(priority(&mut rng)));
    }
    ops
}

fn lanes() -> usize {
    std::env::var("AUTOCOMP_BENCH_LANES").ok().and_then(|l| l.parse().ok()).unwrap_or(4).max(1)
}

pub(super) fn batch_id(n: usize, rare: bool) -> BatchId {
    BatchId::new(format!("B{n:09}-{}", if rare { "FILM" } else { "RT" })).expect("valid batch id")
}

pub(super) struct Names {
    pub(super) events: Vec<EventType>,
    pub(super) components: Vec<ComponentName>,
    pub(super) agents: Vec<Agent>,
    pub(super) operator: Agent,
    pub(super) holder: RunHolder,
    pub(super) main_type: BatchType,
    pub(super) rare_type: BatchType,
}

impl Names {
    pub(super) fn new() -> Self {
        let agent = |component: &str| Agent::new(format!("{component}/1.4.2@worker-3#4242")).expect("agent");
        Self {
            events: STEPS.iter().map(|(event, _)| EventType::new(*event).expect("event type")).collect(),
            components: STEPS.iter().map(|(_, c)| ComponentName::new(*c).expect("component")).collect(),
            agents: STEPS.iter().map(|(_, c)| agent(c)).collect(),
            operator: Agent::new("operator:bench").expect("agent"),
            holder: RunHolder {
                agent: agent("archiver"),
                host: "worker-3".into(),
                pid: 4242,
                claim_key: None,
                liveness: None,
            },
            main_type: BatchType::new(MAIN_TYPE).expect("batch type"),
            rare_type: BatchType::new(RARE_TYPE).expect("batch type"),
        }
    }

    pub(super) fn details(step: usize, success: bool, duration_ms: u64) -> Value {
        if success {
            json!({"outcome": "success", "duration_ms": duration_ms, "summary": format!("{} ok", STEPS[step].0)})
        } else {
            json!({
                "outcome": "failure",
                "duration_ms": duration_ms,
                "failures": [{
                    "reference": "pages/0042.tif",
                    "type": "mismatch",
                    "description": format!("{} failed on 1 file", STEPS[step].0),
                    "details": {}
                }],
                "failures_cap": 100,
                // About a third of the failures are transient (a timeout, a busy service).
                "transient": duration_ms.is_multiple_of(3)
            })
        }
    }
}

#[derive(Default, Clone, Copy)]
struct Written {
    events: u64,
    transactions: u64,
}

async fn apply(store: &SqliteStore, names: &Names, id: &BatchId, op: &Op) -> StoreResult<Written> {
    let outcome = |success: bool| if success { Outcome::Success } else { Outcome::Failure };
    Ok(match op {
        Op::Create { priority, rare } => {
            let batch_type = if *rare { &names.rare_type } else { &names.main_type };
            let new = NewBatch::new(id.clone(), batch_type.clone())
                .with_priority(*priority)
                .with_location(format!("/data/incoming/{id}"));
            store.create_batch(new).await?;
            Written { events: 0, transactions: 1 }
        }
        Op::Append { step, success, duration_ms } => {
            let event = NewEvent::new(names.events[*step].clone(), outcome(*success), names.agents[*step].clone())
                .with_details(Names::details(*step, *success, *duration_ms));
            store.append_event(id, event).await?;
            Written { events: 1, transactions: 1 }
        }
        Op::RunAppend { step, success, duration_ms } => {
            let claim = store.claim(id, &names.components[*step], &names.holder).await?;
            let event = NewEvent::new(names.events[*step].clone(), outcome(*success), names.agents[*step].clone())
                .with_details(Names::details(*step, *success, *duration_ms))
                .in_run(names.components[*step].clone(), claim.generation());
            store.append_event(id, event).await?;
            Written { events: 1, transactions: 2 }
        }
        Op::Reset { steps } => {
            let types = steps.iter().map(|s| names.events[*s].clone()).collect();
            let details = json!({"reason": "re-run after inspection", "operator": "bench"});
            store.append_event(id, NewEvent::reset(types, names.operator.clone(), details)).await?;
            Written { events: 1, transactions: 1 }
        }
        Op::ContentChange => {
            let mut patch = Map::new();
            patch.insert("redelivered".into(), json!(true));
            store.record_content_change(id, patch).await?;
            Written { events: 0, transactions: 1 }
        }
        Op::Prioritize(priority) => {
            store.set_priority(id, *priority).await?;
            Written { events: 0, transactions: 1 }
        }
        Op::OpenClaim { step } => {
            store.claim(id, &names.components[*step], &names.holder).await?;
            Written { events: 0, transactions: 1 }
        }
    })
}

#[derive(serde::Serialize, serde::Deserialize)]
pub(super) struct Generated {
    pub(super) generator: u32,
    pub(super) batches: usize,
    pub(super) events: u64,
    pub(super) transactions: u64,
    pub(super) seconds: f64,
    pub(super) head: i64,
    pub(super) store_bytes: u64,
}

/// Writes the store through the port, or reuses the cached one.
pub(super) async fn ensure_store(config: &Config) -> (Generated, bool) {
    let (path, marker) = (config.store_path(), config.marker_path());
    if path.exists()
        && let Ok(text) = std::fs::read_to_string(&marker)
        && let Ok(generated) = serde_json::from_str::<Generated>(&text)
        && generated.generator == GENERATOR_VERSION
        && generated.batches == config.batches
    {
        eprintln!("reusing the store {} (generated in {:.0} s)", path.display(), generated.seconds);
        return (generated, true);
    }
    for suffix in ["", "-wal", "-shm"] {
        let stale = PathBuf::from(format!("{}{suffix}", path.display()));
        if stale.exists() {
            std::fs::remove_file(&stale).expect("remove an incomplete store");
        }
    }
    eprintln!("generating {} batches into {} ...", config.batches, path.display());
    let store = SqliteStore::open_with(&path, store_options()).await.expect("open the store");
    let names = Arc::new(Names::new());
    let start = Instant::now();
    let mut total = Written::default();
    let mut last_report = Instant::now();
    for chunk_start in (0..config.batches).step_by(CHUNK) {
        let chunk_end = (chunk_start + CHUNK).min(config.batches);
        let work: Vec<(BatchId, Vec<Op>)> = (chunk_start..chunk_end)
            .map(|n| {
                let ops = script(n, config.batches);
                let rare = matches!(ops[0], Op::Create { rare: true, .. });
                (batch_id(n, rare), ops)
            })
            .collect();
        // Round-robin over the chunk: a batch's events are spread over the log, as in a pipeline.
        // Several lanes share the one connection: while one waits for SQLite, another is queued.
        let lanes = lanes();
        let mut work: Vec<Vec<(BatchId, Vec<Op>)>> = {
            let mut split: Vec<Vec<_>> = (0..lanes).map(|_| Vec::new()).collect();
            for (i, item) in work.into_iter().enumerate() {
                split[i % lanes].push(item);
            }
            split
        };
        let mut tasks = tokio::task::JoinSet::new();
        for lane in work.drain(..) {
            let (store, names) = (store.clone(), Arc::clone(&names));
            tasks.spawn(async move {
                let mut written = Written::default();
                let rounds = lane.iter().map(|(_, ops)| ops.len()).max().unwrap_or(0);
                for round in 0..rounds {
                    for (id, ops) in &lane {
                        if let Some(op) = ops.get(round) {
                            let w = apply(&store, &names, id, op).await.expect("write to the store");
                            written.events += w.events;
                            written.transactions += w.transactions;
                        }
                    }
                }
                written
            });
        }
        while let Some(written) = tasks.join_next().await {
            let written = written.expect("lane task");
            total.events += written.events;
            total.transactions += written.transactions;
        }
        if last_report.elapsed() >= Duration::from_secs(15) || chunk_end == config.batches {
            last_report = Instant::now();
            let secs = start.elapsed().as_secs_f64();
            let rate = chunk_end as f64 / secs;
            eprintln!(
                "  {chunk_end}/{} batches, {} events, {:.0} transactions/s, {:.0} s elapsed, ~{:.0} s left",
                config.batches,
                total.events,
                total.transactions as f64 / secs,
                secs,
                (config.batches - chunk_end) as f64 / rate
            );
        }
    }
    let head = store.head().await.expect("head").0;
    drop(store);
    let generated = Generated {
        generator: GENERATOR_VERSION,
        batches: config.batches,
        events: total.events,
        transactions: total.transactions,
        seconds: start.elapsed().as_secs_f64(),
        head,
        store_bytes: file_size(&path),
    };
    if !config.smoke {
        std::fs::write(&marker, serde_json::to_string_pretty(&generated).expect("json")).expect("write the marker");
    }
    (generated, false)
}

pub(super) fn file_size(path: &Path) -> u64 {
    let with = |suffix: &str| std::fs::metadata(format!("{}{suffix}", path.display())).map(|m| m.len()).unwrap_or(0);
    with("") + with("-wal")
}

pub(super) fn dir_size(dir: &Path) -> u64 {
    let mut total = 0;
    for entry in std::fs::read_dir(dir).expect("read the index directory").flatten() {
        let meta = entry.metadata().expect("metadata");
        total += if meta.is_dir() { dir_size(&entry.path()) } else { meta.len() };
    }
    total
}
