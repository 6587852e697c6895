//! A step's results checked both ways with the schemas of its contract: the result it
//! records against the schema it publishes (before the append: a result that does not fit is
//! not recorded, the run fails with `result_schema` naming where), and each result it reads
//! against what it declares of it (before the work: a batch whose result was recorded under a
//! schema that does not give what the step reads is not worked on, the run fails with
//! `read_schema` naming the field and the rerun of the producer that refreshes it).

use autocomp_model::{Batch, ComponentDescriptor, ComponentName, EventType, Failure, RESULT_KEY, Report};
use serde_json::{Value, json};

use crate::exit::RunError;

/// The compiled schemas of a step's contract.
pub(crate) struct ResultChecks {
    /// The schema its results must fit, when it publishes one, and its digest (recorded
    /// with each result that fits it).
    published: Option<(jsonschema::Validator, String)>,
    /// What it declares of each result it reads.
    reads: Vec<(EventType, jsonschema::Validator)>,
}

fn compile(what: &str, schema: &Value) -> Result<jsonschema::Validator, RunError> {
    jsonschema::validator_for(schema).map_err(|e| RunError::Usage(format!("{what} is not a valid JSON Schema: {e}")))
}

/// `the result itself`, or `` `/pages` ``.
fn place(path: &str) -> String {
    if path.is_empty() { "the result itself".to_owned() } else { format!("`{path}`") }
}

impl ResultChecks {
    /// The schemas of `descriptor`'s contract, compiled once for the runner's life.
    pub(crate) fn of(descriptor: &ComponentDescriptor) -> Result<Self, RunError> {
        let published = match &descriptor.result_schema {
            Some(schema) => {
                Some((compile("the result schema this step publishes", schema)?, autocomp_model::schema_digest(schema)))
            }
            None => None,
        };
        let mut reads = Vec::with_capacity(descriptor.reads.len());
        for read in &descriptor.reads {
            let what = format!("what this step declares it reads of {}", read.event_type);
            reads.push((read.event_type.clone(), compile(&what, &read.schema)?));
        }
        Ok(ResultChecks { published, reads })
    }

    /// A result that does not fit the published schema is dropped and the run fails: one
    /// `result_schema` failure per place that does not fit; one that fits records the
    /// schema's digest (`Report::result_schema`).
    pub(crate) fn check_published(&self, report: &mut Report) {
        let (Some((validator, digest)), Some(result)) = (&self.published, &report.result) else { return };
        let failures: Vec<Failure> = validator
            .iter_errors(result)
            .map(|error| {
                let path = error.instance_path().as_str().to_owned();
                Failure {
                    reference: String::new(),
                    kind: "result_schema".into(),
                    description: format!(
                        "the result does not fit the schema this step publishes at {}: {error}",
                        place(&path)
                    ),
                    details: json!({"instance_path": path, "schema_path": error.schema_path().as_str()}),
                }
            })
            .collect();
        if failures.is_empty() {
            report.result_schema = Some(digest.clone());
            return;
        }
        report.result = None;
        if report.summary.is_empty() {
            report.summary = failures[0].description.clone();
        }
        for failure in failures {
            report.add_failure(failure);
        }
    }

    /// The first result `step` reads whose value on `batch` does not give what it declares
    /// (recorded under another schema), as the failure to record instead of working on it.
    pub(crate) fn unfit_read(&self, batch: &Batch, step: &ComponentName) -> Option<Failure> {
        let effective = batch.effective();
        self.reads.iter().find_map(|(event_type, validator)| {
            let event = effective.get(event_type)?;
            let result = event.details.get(RESULT_KEY)?;
            let error = validator.iter_errors(result).next()?;
            let path = error.instance_path().as_str().to_owned();
            let producer = event.run.as_ref().map_or_else(
                || event.agent.as_str().split('/').next().unwrap_or_default().to_owned(),
                |run| run.component.to_string(),
            );
            // Under which schema: the digest it records, or none (its producer published none,
            // or it was recorded before results recorded theirs).
            let recorded = match event.details.get(autocomp_model::RESULT_SCHEMA_KEY).and_then(Value::as_str) {
                Some(digest) => {
                    format!(
                        "it was recorded under another schema ({}) by {producer}",
                        autocomp_model::short_digest(digest)
                    )
                }
                None => format!("it was recorded by {producer} under no published schema"),
            };
            // The same words on every batch it happens to (the lists group failures by them):
            // which event, by whom and the command with the batch's id are in the details.
            Some(Failure {
                reference: event_type.to_string(),
                kind: "read_schema".into(),
                description: format!(
                    "{event_type}'s result does not give what {step} reads at {}: {error}; {recorded}: \
                     `autocomp restart ID --from {event_type} --reason ...` records it afresh, then {step}",
                    place(&path)
                ),
                details: json!({
                    "event_type": event_type,
                    "seq": event.seq.0,
                    "agent": event.agent,
                    "producer": producer,
                    "instance_path": path,
                    "next": format!("autocomp restart {} --from {event_type} --reason ...", batch.id),
                }),
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use autocomp_model::{Agent, BatchId, BatchType, Outcome, ResultRead, RunRef, Seq, Timestamp, Trigger};
    use serde_json::Map;

    use super::*;

    fn descriptor(result_schema: Option<Value>, reads: Vec<ResultRead>) -> ComponentDescriptor {
        let (name, event_type) = (ComponentName::new("access-copy").unwrap(), EventType::new("Access_Copied").unwrap());
        let mut d =
            crate::config::ComponentConfig::default().descriptor(name, "1.0.0", event_type, Trigger::default(), false);
        d.result_schema = result_schema;
        d.reads = reads;
        d
    }

    fn requires_path() -> Value {
        json!({"type": "object", "properties": {"archive_path": {"type": "string"}}, "required": ["archive_path"]})
    }

    fn archived(result: Value) -> Batch {
        let event = autocomp_model::Event {
            seq: Seq(4),
            batch_id: BatchId::new("B1").unwrap(),
            event_type: EventType::new("Data_Archived").unwrap(),
            outcome: Outcome::Success,
            agent: Agent::new("archiver/2.0.0@h#1").unwrap(),
            at: Timestamp(0),
            details: json!({ "result": result }),
            run: Some(RunRef { component: ComponentName::new("archiver").unwrap(), generation: 1 }),
            resets: Vec::new(),
        };
        Batch {
            id: BatchId::new("B1").unwrap(),
            batch_type: BatchType::new("RoundTrip").unwrap(),
            priority: 0,
            metadata: Map::new(),
            created_seq: Seq(1),
            modified_seq: Seq(1),
            changed_seq: Seq(4),
            created_at: Timestamp(0),
            modified_at: Timestamp(0),
            events: vec![event],
            open_runs: Vec::new(),
            as_of: Timestamp(0),
        }
    }

    #[test]
    fn a_result_off_the_published_schema_is_dropped_and_fails_the_run_naming_where() {
        let checks = ResultChecks::of(&descriptor(Some(requires_path()), Vec::new())).unwrap();
        let mut fits = Report::new(10);
        fits.result = Some(json!({"archive_path": "/a"}));
        checks.check_published(&mut fits);
        assert_eq!((fits.outcome, fits.result.is_some()), (Outcome::Success, true));
        assert_eq!(fits.result_schema, Some(autocomp_model::schema_digest(&requires_path())), "the schema it fits");
        let mut off = Report::new(10);
        off.result = Some(json!({"archive_path": 7}));
        checks.check_published(&mut off);
        assert_eq!((off.outcome, off.result.is_none(), off.result_schema.clone()), (Outcome::Failure, true, None));
        assert_eq!(off.failures[0].kind, "result_schema");
        assert!(off.failures[0].description.contains("at `/archive_path`: 7 is not of type \"string\""), "{off:?}");
    }

    #[test]
    fn a_read_result_off_its_declaration_is_named_with_the_rerun_that_refreshes_it() {
        let read = ResultRead { event_type: EventType::new("Data_Archived").unwrap(), schema: requires_path() };
        let checks = ResultChecks::of(&descriptor(None, vec![read])).unwrap();
        let step = ComponentName::new("access-copy").unwrap();
        assert!(checks.unfit_read(&archived(json!({"archive_path": "/a"})), &step).is_none());
        let unfit = checks.unfit_read(&archived(json!({"path": "/a"})), &step).expect("does not fit");
        assert_eq!((unfit.kind.as_str(), unfit.reference.as_str()), ("read_schema", "Data_Archived"));
        assert!(unfit.description.contains("`autocomp restart ID --from Data_Archived --reason ...`"), "{unfit:?}");
        assert_eq!(unfit.details["producer"], "archiver");
        assert_eq!(unfit.details["next"], "autocomp restart B1 --from Data_Archived --reason ...");
        let invalid = ResultChecks::of(&descriptor(Some(json!({"type": 7})), Vec::new()));
        assert!(matches!(invalid, Err(RunError::Usage(_))));
    }
}
