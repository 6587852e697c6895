//! Results made under an older schema: an effective result whose recorded schema digest
//! (`Report::result_schema`) is not the one its producer publishes now (or, recorded before
//! results recorded one, whose data does not fit that schema or what a reader declares it
//! reads). `show` and the monitor's batch
//! page mark each with the rerun that records it afresh; a reader refuses such a result
//! before any work (its run fails with `read_schema`), so the mark says who will.

use autocomp_model::{BatchId, ComponentName, Event, EventType, RESULT_KEY, RESULT_SCHEMA_KEY, Seq, short_digest};
use autocomp_store::BatchHead;
use serde::Serialize;
use serde_json::Value;

use super::Step;

/// One effective result made under an older schema than its producer publishes now.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OlderResult {
    pub event_type: EventType,
    pub seq: Seq,
    /// The step that records the event type now.
    pub producer: ComponentName,
    /// Its version now.
    pub producer_version: String,
    /// The digest the result records (`None`: recorded before results recorded one).
    pub made_under: Option<String>,
    /// The digest of the schema the producer publishes now (`None`: it publishes none).
    pub published_now: Option<String>,
    /// Where the result does not fit the schema published now, and why.
    pub unfit: Option<String>,
    /// The readers that refuse it: it does not give what they declare they read.
    pub refused_by: Vec<ComponentName>,
    /// The command that records it afresh (the readers after it then run again).
    pub next: String,
}

impl OlderResult {
    /// One line: `Data_Archived seq 7 was made under schema sha256:1a2b… of archiver (now
    /// sha256:3c4d…, archiver 0.3.0); it does not fit it at `/archive_path`: ...; access-copy
    /// refuses it` (`line` adds the rerun).
    pub fn what(&self) -> String {
        let under = self
            .made_under
            .as_deref()
            .map_or("no recorded schema".to_owned(), |d| format!("schema {}", short_digest(d)));
        let now = self.published_now.as_deref().map_or("none published now".to_owned(), |d| {
            format!("now {}, {} {}", short_digest(d), self.producer, self.producer_version)
        });
        let mut line =
            format!("{} seq {} was made under {under} of {} ({now})", self.event_type, self.seq, self.producer);
        match &self.unfit {
            Some(unfit) => line.push_str(&format!("; it does not fit it {unfit}")),
            None if self.published_now.is_some() => line.push_str("; it fits it"),
            None => {}
        }
        if !self.refused_by.is_empty() {
            let readers: Vec<&str> = self.refused_by.iter().map(ComponentName::as_str).collect();
            line.push_str(&format!("; {} refuse{} it", readers.join(", "), if readers.len() == 1 { "s" } else { "" }));
        }
        line
    }

    /// `what`, and the command that records it afresh.
    pub fn line(&self) -> String {
        format!("{}; records it afresh: {}", self.what(), self.next)
    }
}

/// The batch's effective results made under an older schema, in pipeline order.
pub fn older_results(head: &BatchHead, pipeline: &[Step]) -> Vec<OlderResult> {
    pipeline
        .iter()
        .filter_map(|producer| {
            older_result(head.id(), head.effective_event(producer.event_type())?, producer, pipeline)
        })
        .collect()
}

fn older_result(batch: &BatchId, event: &Event, producer: &Step, pipeline: &[Step]) -> Option<OlderResult> {
    let result = event.details.get(RESULT_KEY)?;
    let made_under = event.details.get(RESULT_SCHEMA_KEY).and_then(Value::as_str).map(str::to_owned);
    let published = producer.descriptor().result_schema.as_ref();
    let published_now = published.map(autocomp_model::schema_digest);
    // Most results were made under the schema published now: no schema is compiled for them.
    if made_under.is_some() && made_under == published_now {
        return None;
    }
    let unfit = published.and_then(|schema| first_misfit(schema, result));
    let refused_by: Vec<ComponentName> = pipeline
        .iter()
        .filter(|reader| {
            reader
                .descriptor()
                .reads
                .iter()
                .any(|read| read.event_type == event.event_type && first_misfit(&read.schema, result).is_some())
        })
        .map(|reader| reader.name().clone())
        .collect();
    // One made under the schema published now is not marked (a reader that refuses it has a
    // broken contract, said where contracts are); one recorded before results recorded their
    // schema, only when it does not fit: nothing says which schema it was made under.
    let marked = match (&made_under, &published_now) {
        (Some(made), Some(now)) => made != now,
        (Some(_), None) => !refused_by.is_empty(),
        (None, _) => unfit.is_some() || !refused_by.is_empty(),
    };
    if !marked {
        return None;
    }
    Some(OlderResult {
        event_type: event.event_type.clone(),
        seq: event.seq,
        producer: producer.name().clone(),
        producer_version: producer.descriptor().version.clone(),
        made_under,
        published_now,
        unfit,
        refused_by,
        next: format!("autocomp restart {batch} --from {} --reason ...", event.event_type),
    })
}

/// Where `value` first does not fit `schema`: `at `/pages`: "pages" is a required property`;
/// `None` when it fits, or when the schema cannot be compiled (the step that publishes or
/// declares it is refused for that on its own).
fn first_misfit(schema: &Value, value: &Value) -> Option<String> {
    let validator = jsonschema::validator_for(schema).ok()?;
    let error = validator.iter_errors(value).next()?;
    let path = error.instance_path().as_str().to_owned();
    let place = if path.is_empty() { "at the result itself".to_owned() } else { format!("at `{path}`") };
    // The result's keys and values are a step's data: one line, and bounded (a result that
    // does not fit at its root is quoted whole in the message).
    let text = autocomp_toolkit::terminal::one_line(&format!("{place}: {error}")).into_owned();
    Some(match text.char_indices().nth(MISFIT_CHARS) {
        Some((end, _)) => format!("{}…", &text[..end]),
        None => text,
    })
}

/// The most characters of a misfit `show` and the batch page print.
const MISFIT_CHARS: usize = 200;
