//! The runner's own phase lines, read while the capacity bench measures: a tracing layer on
//! the `autocomp::phases` target (debug) takes each pass's phase totals (a pass that took up
//! work) and each idle wake-up into the current run's samples and counters.

use std::sync::{Arc, Mutex};

use tracing::field::{Field, Visit};
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::{Layer, Registry};

use crate::workers::Shared;

/// The runner's tracing target for phase lines (framework/src/runner/phases.rs).
const TARGET: &str = "autocomp::phases";

/// The run being measured, if any: the layer is global, the runs come one after another.
static CURRENT: Mutex<Option<Arc<Shared>>> = Mutex::new(None);

/// Installs the layer as the global subscriber (once, at start).
pub fn install() {
    let filter = Targets::new().with_target(TARGET, tracing::Level::DEBUG);
    let subscriber = Registry::default().with(PhaseLayer.with_filter(filter));
    tracing::subscriber::set_global_default(subscriber).expect("no other global subscriber");
}

/// Sends the phase lines to `shared` from now on (`None`: nowhere).
pub fn follow(shared: Option<Arc<Shared>>) {
    *CURRENT.lock().unwrap() = shared;
}

struct PhaseLayer;

/// The numbers and message of one phase line.
#[derive(Default)]
struct Line {
    message: String,
    numbers: Vec<(&'static str, u64)>,
}

impl Visit for Line {
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.numbers.push((field.name(), value));
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.numbers.push((field.name(), value.max(0) as u64));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message = value.to_owned();
        }
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.message = format!("{value:?}");
        }
    }
}

impl<S: tracing::Subscriber> Layer<S> for PhaseLayer {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        let Some(shared) = CURRENT.lock().unwrap().clone() else { return };
        if !shared.measuring() {
            return;
        }
        let mut line = Line::default();
        event.record(&mut line);
        let counters = &shared.counters;
        match line.message.as_str() {
            "idle wake" => shared.count(&counters.idle_wakes, 1),
            "pass phases" => {
                shared.count(&counters.passes_with_work, 1);
                let mut samples = shared.samples.lock().unwrap();
                for (name, value) in line.numbers {
                    samples.phases.entry(name).or_default().push(value);
                }
            }
            _ => {}
        }
    }
}
