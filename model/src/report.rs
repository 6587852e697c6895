//! The structured report a component run records as an event's `details`.
//! Failures are capped so one broken batch cannot write a huge event; the cap and the true
//! count are reported so nobody mistakes a capped list for the whole story.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{Outcome, RunOutput};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "json-schema", derive(schemars::JsonSchema))]
pub struct Failure {
    /// What failed, e.g. a file path inside the batch; empty when the batch as a whole failed.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reference: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub description: String,
    #[serde(default, skip_serializing_if = "Value::is_null")]
    pub details: Value,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "json-schema", derive(schemars::JsonSchema))]
pub struct Report {
    pub outcome: Outcome,
    pub duration_ms: u64,
    pub failures: Vec<Failure>,
    /// How many failures were found, including those beyond the cap.
    pub failures_total: usize,
    pub failures_cap: usize,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub summary: String,
    #[serde(default, skip_serializing_if = "is_false")]
    pub transient: bool,
    #[serde(default, skip_serializing_if = "is_false")]
    pub timed_out: bool,
    #[serde(default, skip_serializing_if = "is_false")]
    pub cancelled: bool,
    #[serde(default, skip_serializing_if = "is_false")]
    pub skipped: bool,
    /// The component's structured result (any JSON value), under the details key `result`;
    /// later components read it typed with `Batch::result`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    /// The schema the result was checked against before it was recorded (its step's
    /// published result schema, as `schema_digest` names it); absent when the step publishes
    /// none. A result whose digest differs from what its producer publishes now was made
    /// under an older schema.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result_schema: Option<String>,
    /// What the run printed (a command's stdout and stderr, a Rust component's log lines),
    /// bounded; under the details key `output`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<RunOutput>,
}

/// The details key a component's structured result is recorded under.
pub const RESULT_KEY: &str = "result";
/// The details key a run's output is recorded under.
pub const OUTPUT_KEY: &str = "output";
/// The details key of the digest of the schema a result was made under.
pub const RESULT_SCHEMA_KEY: &str = "result_schema";

fn is_false(flag: &bool) -> bool {
    !flag
}

impl Report {
    pub fn new(failures_cap: usize) -> Self {
        Report {
            outcome: Outcome::Success,
            duration_ms: 0,
            failures: Vec::new(),
            failures_total: 0,
            failures_cap,
            summary: String::new(),
            transient: false,
            timed_out: false,
            cancelled: false,
            skipped: false,
            result: None,
            result_schema: None,
            output: None,
        }
    }

    /// Records a failure (kept if under the cap, always counted) and makes the outcome a failure.
    pub fn add_failure(&mut self, failure: Failure) {
        self.failures_total += 1;
        self.outcome = Outcome::Failure;
        if self.failures.len() < self.failures_cap {
            self.failures.push(failure);
        }
    }

    pub fn to_details(&self) -> Value {
        serde_json::to_value(self).expect("a report always serializes")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_beyond_the_cap_are_counted_not_kept() {
        let mut report = Report::new(2);
        for i in 0..5 {
            report.add_failure(Failure {
                reference: format!("data/{i}.tif"),
                kind: "checksum".into(),
                description: "mismatch".into(),
                details: Value::Null,
            });
        }
        assert_eq!(report.outcome, Outcome::Failure);
        assert_eq!(report.failures.len(), 2);
        assert_eq!(report.failures_total, 5);
        let details = report.to_details();
        assert_eq!(details["failures_cap"], 2);
        assert_eq!(serde_json::from_value::<Report>(details).unwrap(), report);
    }
}
