//! The index bench's queries: the two triggers asked (`cases`), the reference answer they are checked against (`Trigger::select` over every batch), and their latencies.

use super::*;

pub(super) struct Latencies {
    pub(super) sorted: Vec<Duration>,
}

impl Latencies {
    pub(super) fn measure<T>(
        iterations: usize,
        warm_up: usize,
        budget: Option<Duration>,
        mut run: impl FnMut() -> T,
    ) -> Self {
        for _ in 0..warm_up {
            std::hint::black_box(run());
        }
        let start = Instant::now();
        let mut sorted = Vec::with_capacity(iterations);
        for i in 0..iterations {
            if let Some(budget) = budget
                && i >= MIN_SQL_RUNS
                && start.elapsed() >= budget
            {
                break;
            }
            let t = Instant::now();
            std::hint::black_box(run());
            sorted.push(t.elapsed());
        }
        sorted.sort();
        Self { sorted }
    }

    pub(super) fn quantile(&self, q: f64) -> Duration {
        let rank = ((self.sorted.len() as f64 * q).ceil() as usize).clamp(1, self.sorted.len());
        self.sorted[rank - 1]
    }

    pub(super) fn p50(&self) -> f64 {
        ms(self.quantile(0.50))
    }

    pub(super) fn p99(&self) -> f64 {
        ms(self.quantile(0.99))
    }

    pub(super) fn max(&self) -> f64 {
        ms(*self.sorted.last().expect("samples"))
    }

    pub(super) fn describe(&self) -> String {
        format!("{} / {} / {} ms (n={})", fmt_ms(self.p50()), fmt_ms(self.p99()), fmt_ms(self.max()), self.sorted.len())
    }
}

pub(super) fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

pub(super) fn fmt_ms(ms: f64) -> String {
    if ms >= 100.0 {
        format!("{ms:.0}")
    } else if ms >= 1.0 {
        format!("{ms:.2}")
    } else {
        format!("{ms:.3}")
    }
}

pub(super) struct Case {
    pub(super) name: &'static str,
    pub(super) description: &'static str,
    pub(super) trigger: Trigger,
}

pub(super) fn cases() -> Vec<Case> {
    let events = |names: &[&str]| names.iter().map(|n| EventType::new(*n).expect("event type")).collect();
    vec![
        Case {
            name: "typical",
            description: "requires Data_Received + Checksums_Verified, blocked_by Structure_Checked, type RoundTrip",
            trigger: Trigger {
                requires: events(&["Data_Received", "Checksums_Verified"]),
                blocked_by: events(&["Structure_Checked"]),
                types: vec![BatchType::new(MAIN_TYPE).expect("batch type")],
                limit: Some(100),
                ..Trigger::default()
            },
        },
        Case {
            name: "selective",
            description: "requires Manual_Review (0.25% of batches), type Film (2%)",
            trigger: Trigger {
                requires: events(&["Manual_Review"]),
                types: vec![BatchType::new(RARE_TYPE).expect("batch type")],
                limit: Some(100),
                ..Trigger::default()
            },
        },
    ]
}

/// `Trigger::select` over every batch, kept incrementally: all matches and their order keys.
pub(super) struct Reference {
    pub(super) matches: Vec<((Reverse<i32>, i64), BatchId)>,
}

impl Reference {
    pub(super) fn answer(&mut self, limit: usize) -> Vec<BatchId> {
        self.matches.sort_by_key(|(key, _)| *key);
        self.matches.iter().take(limit).map(|(_, id)| id.clone()).collect()
    }
}
