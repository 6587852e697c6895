//! Where a pass's time went: each phase of a pass (and, for a watcher, of the wake and the
//! look before it) timed with a monotonic clock and told, once the pass took up work, in one
//! debug line on the `autocomp::phases` target; a watcher's idle wake-ups (it woke, looked,
//! and took up nothing) are counted on the same target. Off by default: nothing is timed
//! unless that target logs at debug.
//!
//! The clock is a task-local the runner marks at phase boundaries (`mark`): the time since
//! the previous mark goes to the phase named, so every instant of a pass counts once and a
//! mark is one line in the phase's code. The pass's own task marks its sequential phases;
//! each batch's work task has a clock of its own (`for_batch`) adding to the same totals,
//! so `work`, `append` and `release` are sums over the pass's batches, which run in parallel.

use std::cell::Cell;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use autocomp_model::ComponentName;

/// The tracing target of the phase lines: `RUST_LOG=autocomp::phases=debug` shows them alone.
pub const TARGET: &str = "autocomp::phases";

/// A phase of a pass, or of a watcher's wake before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// A watcher: from the store's wake-up (the end of its sleep, or of the pass before) to
    /// its look: the head read.
    Woken,
    /// Asking the index: a watcher's look (the hold check, `covers` and the candidates), or
    /// a cron pass's own question.
    Index,
    /// Waiting for the component's poll lock.
    PollLock,
    /// Reading the pipeline's steering (before the first claim round and each next one).
    Steering,
    /// Try-locking the candidates and taking their pool slots.
    BatchLocks,
    /// The store's re-check of the locked batches, their earlier attempts and checkpoints.
    Recheck,
    /// The claim transaction.
    Claim,
    /// The component's work (summed over batches).
    Work,
    /// Recording results: the lock check and the append (summed over batches).
    Append,
    /// Unlocking: the poll lock, batch locks and pool slots.
    Release,
    /// The rest: registry reports, the contract check, waiting for a work thread, the
    /// circuit breaker.
    Other,
}

const PHASES: usize = 11;

impl Phase {
    const ALL: [Phase; PHASES] = [
        Phase::Woken,
        Phase::Index,
        Phase::PollLock,
        Phase::Steering,
        Phase::BatchLocks,
        Phase::Recheck,
        Phase::Claim,
        Phase::Work,
        Phase::Append,
        Phase::Release,
        Phase::Other,
    ];
}

/// The phases' totals of one pass, in nanoseconds, shared by the pass's task and its
/// batches' tasks (one allocation a pass).
#[derive(Default)]
struct Totals([AtomicU64; PHASES]);

impl Totals {
    fn add(&self, phase: Phase, took: Duration) {
        self.0[phase as usize].fetch_add(took.as_nanos() as u64, Ordering::Relaxed);
    }

    fn get(&self, phase: Phase) -> Duration {
        Duration::from_nanos(self.0[phase as usize].load(Ordering::Relaxed))
    }
}

/// One task's clock: the pass's totals and the previous mark.
struct Clock {
    totals: Arc<Totals>,
    last: Cell<Instant>,
}

impl Clock {
    fn starting(totals: Arc<Totals>) -> Self {
        Self { totals, last: Cell::new(Instant::now()) }
    }

    fn mark(&self, phase: Phase) {
        let now = Instant::now();
        self.totals.add(phase, now.saturating_duration_since(self.last.replace(now)));
    }
}

tokio::task_local! {
    static CLOCK: Clock;
    static WATCH: WatchClock;
}

/// The time since the previous mark (or the start of the pass, or the batch's task) went to
/// `phase`. Nothing when the pass is not timed.
pub(crate) fn mark(phase: Phase) {
    CLOCK.try_with(|clock| clock.mark(phase)).ok();
}

/// The time since the previous mark goes to no phase: the pass's task waited for its
/// batches' tasks, which time their own phases.
pub(crate) fn skip() {
    CLOCK.try_with(|clock| clock.last.set(Instant::now())).ok();
}

/// Whether anyone may read the phase lines: else a pass is not timed at all. By the
/// subscriber's most verbose level (a debug line anywhere times passes, which costs little),
/// not by `tracing::enabled!`: with per-layer filters that query leaves its answer in a
/// thread-local for the next event, which a layer then drops (tokio-rs/tracing#2519): the
/// first line logged after each pass, say a watcher's refusal, went missing.
fn wanted() -> bool {
    tracing::level_filters::LevelFilter::current() >= tracing::level_filters::LevelFilter::DEBUG
}

/// What a pass's phases took, taken out of its clock when it ends.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct PassPhases {
    took: [Duration; PHASES],
    /// The pass's wall time, from its start to its end (the wake and look before it apart).
    pass: Duration,
}

impl PassPhases {
    /// The phase line of a pass that took up `batches` batches (none for an idle pass).
    pub(crate) fn emit(&self, component: &ComponentName, batches: usize) {
        if batches == 0 {
            return;
        }
        let us = |phase: Phase| self.took[phase as usize].as_micros() as u64;
        tracing::debug!(target: TARGET, component = %component, batches,
            woken_us = us(Phase::Woken), index_us = us(Phase::Index), poll_lock_us = us(Phase::PollLock),
            steering_us = us(Phase::Steering), batch_locks_us = us(Phase::BatchLocks),
            recheck_us = us(Phase::Recheck), claim_us = us(Phase::Claim), work_us = us(Phase::Work),
            append_us = us(Phase::Append), release_us = us(Phase::Release), other_us = us(Phase::Other),
            pass_us = self.pass.as_micros() as u64, "pass phases");
    }
}

/// Runs a pass with its clock: what the pass returned and what its phases took (all zero
/// when no one reads the phase lines). Inside a watch, the wake and look that led to this
/// pass are its first phases, and a pass that took up nothing after a wake is an idle wake
/// (`took_up` says how many batches it took up).
pub(crate) async fn timed<T>(pass: impl Future<Output = T>, took_up: impl FnOnce(&T) -> usize) -> (T, PassPhases) {
    let look = WATCH.try_with(WatchClock::take_look).ok().flatten();
    if !wanted() {
        let output = pass.await;
        WATCH.try_with(|watch| watch.pass_ended(look, took_up(&output))).ok();
        return (output, PassPhases::default());
    }
    let totals = Arc::new(Totals::default());
    let started = Instant::now();
    let output = CLOCK.scope(Clock::starting(Arc::clone(&totals)), async {
        let output = pass.await;
        mark(Phase::Other);
        output
    });
    let output = output.await;
    let mut phases = PassPhases { pass: started.elapsed(), ..PassPhases::default() };
    for phase in Phase::ALL {
        phases.took[phase as usize] = totals.get(phase);
    }
    if let Some(look) = &look {
        phases.took[Phase::Woken as usize] += look.woken;
        phases.took[Phase::Index as usize] += look.index;
    }
    WATCH.try_with(|watch| watch.pass_ended(look, took_up(&output))).ok();
    (output, phases)
}

/// A batch's work task, with a clock of its own adding to its pass's totals (nothing when
/// the pass is not timed). Called in the pass's task, where its clock is, before the spawn.
pub(crate) fn for_batch<T>(work: impl Future<Output = T>) -> impl Future<Output = T> {
    let totals = CLOCK.try_with(|clock| Arc::clone(&clock.totals)).ok();
    async move {
        let Some(totals) = totals else { return work.await };
        let timed = async {
            let output = work.await;
            mark(Phase::Other);
            output
        };
        CLOCK.scope(Clock::starting(totals), timed).await
    }
}

/// A watcher's look at the index: how long after the wake it started, how long it took,
/// whether a sleep came before it.
#[derive(Debug, Clone, Copy)]
struct Look {
    woken: Duration,
    index: Duration,
    after_sleep: bool,
}

/// What a watcher's phases know between passes: when it last woke (the end of a sleep or
/// of a pass), whether that was a sleep, the look no pass has taken yet, and its count of
/// idle wake-ups.
struct WatchClock {
    component: ComponentName,
    woke: Cell<Instant>,
    slept: Cell<bool>,
    look: Cell<Option<Look>>,
    idle_wakes: Cell<u64>,
}

impl WatchClock {
    fn take_look(&self) -> Option<Look> {
        self.look.take()
    }

    /// A look no pass followed (nothing offered): idle if a sleep came before it.
    fn settle(&self) {
        if let Some(look) = self.look.take() {
            self.count_idle(look, 0);
        }
    }

    fn pass_ended(&self, look: Option<Look>, took_up: usize) {
        self.woke.set(Instant::now());
        if let Some(look) = look
            && took_up == 0
        {
            self.count_idle(look, 1);
        }
    }

    fn count_idle(&self, look: Look, passes: u32) {
        if !look.after_sleep {
            return;
        }
        let idle_wakes = self.idle_wakes.get() + 1;
        self.idle_wakes.set(idle_wakes);
        tracing::debug!(target: TARGET, component = %self.component, idle_wakes, passes,
            woken_us = look.woken.as_micros() as u64, index_us = look.index.as_micros() as u64, "idle wake");
    }
}

/// Runs a watch with the clock its wakes and looks are timed by; at its end, the count of
/// its idle wake-ups.
pub(crate) async fn watching<T>(component: &ComponentName, watch: impl Future<Output = T>) -> T {
    let clock = WatchClock {
        component: component.clone(),
        woke: Cell::new(Instant::now()),
        slept: Cell::new(false),
        look: Cell::new(None),
        idle_wakes: Cell::new(0),
    };
    WATCH
        .scope(clock, async {
            let output = watch.await;
            WATCH.with(|watch| {
                watch.settle();
                tracing::debug!(target: TARGET, component = %watch.component, idle_wakes = watch.idle_wakes.get(),
                    "watch ended");
            });
            output
        })
        .await
}

/// A watcher's look at the index, timed: the next pass takes it as its `woken` and `index`
/// phases; a look no pass follows is an idle wake when a sleep came before it.
pub(crate) async fn look<T>(look: impl Future<Output = T>) -> T {
    WATCH.try_with(WatchClock::settle).ok();
    let asked = Instant::now();
    let output = look.await;
    WATCH
        .try_with(|watch| {
            let woken = asked.saturating_duration_since(watch.woke.get());
            let after_sleep = watch.slept.replace(false);
            watch.look.set(Some(Look { woken, index: asked.elapsed(), after_sleep }));
        })
        .ok();
    output
}

/// A watcher's sleep in the store's change feed; its end is the wake the next look counts from.
pub(crate) async fn sleep<T>(sleep: impl Future<Output = T>) -> T {
    WATCH.try_with(WatchClock::settle).ok();
    let output = sleep.await;
    WATCH
        .try_with(|watch| {
            watch.woke.set(Instant::now());
            watch.slept.set(true);
        })
        .ok();
    output
}
