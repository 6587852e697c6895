//! `autocomp logs ID`: what each run of a batch printed (a command's stdout and stderr, a
//! Rust component's log lines), kept with its result event. Owns numbering a component's
//! attempts on a batch and printing their output, neutralized for the terminal.

use std::io::Write;
use std::time::Duration;

use autocomp_model::{ComponentName, Event, InvalidInput, RunOutput, Seq};
use autocomp_store::port::DETAILS_SHOWN_BYTES;
use autocomp_store::{LogCursor, MAX_LOG_PAGE};
use serde_json::json;

use super::{Format, Operator, OperatorError};

/// Which runs' output `logs` prints.
#[derive(Debug, Clone, Default)]
pub struct LogsQuery {
    /// Only this component's runs.
    pub component: Option<String>,
    /// Only the Nth attempt (1 = the first run of a component on the batch).
    pub attempt: Option<u32>,
    /// Only the stream of this name (`stdout`, `stderr`, `log`).
    pub stream: Option<String>,
}

/// One run's result as `logs` shows it.
struct Attempt<'e> {
    component: &'e ComponentName,
    number: u32,
    event: &'e Event,
    output: Option<RunOutput>,
}

impl Operator {
    /// Writes the output of the batch's runs that `query` selects, oldest first: a header
    /// per attempt, then each stream's text; or a JSON array of them. Reads the log a page
    /// at a time and writes as it goes, so no more than a page of events is held.
    pub async fn logs(
        &self,
        id: &str,
        query: &LogsQuery,
        format: Format,
        out: &mut dyn Write,
    ) -> Result<(), OperatorError> {
        let component = query.component.as_deref().map(ComponentName::new).transpose()?;
        if query.attempt == Some(0) {
            return Err(InvalidInput::new("--attempt", "0", "attempts are numbered from 1").into());
        }
        let store = self.store().await?;
        let head = self.head(store.as_ref(), id).await?;
        let written = |e: std::io::Error| OperatorError::usage(format!("cannot write the output: {e}"));
        // Everything printed comes from the batch's runs: neutralized before the terminal.
        let mut write = |text: &str| out.write_all(autocomp_toolkit::for_terminal(text).as_bytes()).map_err(written);
        // Attempts seen per component so far, in seq order.
        let mut attempts: Vec<(ComponentName, u32)> = Vec::new();
        let mut shown = 0usize;
        let mut after = Seq::ZERO;
        loop {
            // By size: a page of a thousand events whose output is near 1 MiB each must not
            // be held at once; an event a page left out is read alone below when wanted.
            let page =
                store.log_page_within(head.id(), LogCursor::After(after), MAX_LOG_PAGE, DETAILS_SHOWN_BYTES).await?;
            for event in &page.events {
                let Some(run) = &event.run else { continue };
                let number = match attempts.iter_mut().find(|(name, _)| *name == run.component) {
                    Some((_, count)) => {
                        *count += 1;
                        *count
                    }
                    None => {
                        attempts.push((run.component.clone(), 1));
                        1
                    }
                };
                if component.as_ref().is_some_and(|wanted| *wanted != run.component) {
                    continue;
                }
                let whole = match page.left_out(event.seq) {
                    Some(_) => autocomp_store::port::event_at(store.as_ref(), head.id(), event.seq).await?,
                    None => None,
                };
                let event = whole.as_ref().unwrap_or(event);
                let output = event.output().map(|output| selected_streams(output, query.stream.as_deref()));
                let chosen = match query.attempt {
                    Some(wanted) => wanted == number,
                    // By default only the attempts that kept some output.
                    None => output.as_ref().is_some_and(|output| !output.streams.is_empty()),
                };
                if !chosen {
                    continue;
                }
                let attempt = Attempt { component: &run.component, number, event, output };
                match format {
                    Format::Text => write(&attempt_text(&attempt))?,
                    Format::Json => {
                        write(if shown == 0 { "[\n  " } else { ",\n  " })?;
                        write(&attempt_json(&attempt).to_string())?;
                    }
                }
                shown += 1;
            }
            match page.newer {
                Some(newer) => after = newer,
                None => break,
            }
        }
        if shown > 0 {
            return if format == Format::Json { write("\n]\n") } else { Ok(()) };
        }
        // Nothing selected: a mistake in the query is an error, an empty answer is not.
        let runs_of = |name: &ComponentName| attempts.iter().find(|(n, _)| n == name).map_or(0, |(_, count)| *count);
        if let Some(name) = &component
            && runs_of(name) == 0
        {
            let pipeline = self.pipeline(store.as_ref()).await?;
            self.step(&pipeline, name.as_str())?;
        }
        if let Some(wanted) = query.attempt {
            let had = match &component {
                Some(name) => format!("{name} ran {} time(s) on {}", runs_of(name), head.id()),
                None => format!("no component ran more than {} time(s) on {}", attempts_max(&attempts), head.id()),
            };
            return Err(InvalidInput::new("--attempt", wanted.to_string(), format!("no such attempt: {had}")).into());
        }
        match format {
            Format::Json => write("[]\n"),
            Format::Text => {
                let whose = component.as_ref().map(|name| format!(" of {name}")).unwrap_or_default();
                let what = query.stream.as_deref().map(|name| format!(" on {name}")).unwrap_or_default();
                write(&format!("{}: no run{whose} kept any output{what}\n", head.id()))
            }
        }
    }
}

fn attempts_max(attempts: &[(ComponentName, u32)]) -> u32 {
    attempts.iter().map(|(_, count)| *count).max().unwrap_or(0)
}

/// Only the stream asked for (all without `--stream`).
fn selected_streams(mut output: RunOutput, stream: Option<&str>) -> RunOutput {
    if let Some(name) = stream {
        output.streams.retain(|s| s.name == name);
    }
    output
}

fn attempt_text(attempt: &Attempt<'_>) -> String {
    let event = attempt.event;
    let took = event
        .details
        .get("duration_ms")
        .and_then(serde_json::Value::as_u64)
        .map_or_else(String::new, |ms| format!(", took {}", super::duration_text(Duration::from_millis(ms))));
    let mut outcome = event.outcome.as_str().to_owned();
    for flag in ["timed_out", "transient", "cancelled"] {
        if event.flag(flag) {
            outcome = format!("{outcome} ({})", flag.replace('_', " "));
        }
    }
    let mut text = format!(
        "== {} attempt {} (seq {}): {outcome} at {}{took} ==\n",
        attempt.component, attempt.number, event.seq, event.at
    );
    let streams = attempt.output.as_ref().map_or(&[][..], |output| &output.streams[..]);
    if streams.is_empty() {
        text.push_str("(no output kept)\n");
    }
    for stream in streams {
        let cut = if stream.omitted_bytes > 0 {
            format!(", {} of {} bytes kept", stream.kept_bytes(), stream.total_bytes())
        } else {
            String::new()
        };
        text.push_str(&format!("--- {}{cut} ---\n", autocomp_toolkit::terminal::one_line(&stream.name)));
        let body = stream.text();
        text.push_str(&body);
        if !body.ends_with('\n') {
            text.push('\n');
        }
    }
    text
}

fn attempt_json(attempt: &Attempt<'_>) -> serde_json::Value {
    let event = attempt.event;
    json!({
        "component": attempt.component,
        "attempt": attempt.number,
        "seq": event.seq,
        "outcome": event.outcome,
        "at": event.at,
        "duration_ms": event.details.get("duration_ms"),
        "output": attempt.output.as_ref().map_or(json!({"streams": []}), |output| json!(output)),
    })
}

#[cfg(test)]
mod tests {
    use autocomp_model::{Agent, BatchId, EventType, Outcome, OutputStream, RunRef, Timestamp};

    use super::*;

    #[test]
    fn an_attempt_reads_as_a_header_and_its_streams_with_the_cut_marked() {
        let stream =
            OutputStream { name: "stderr".into(), head: "first\n".into(), tail: "last".into(), omitted_bytes: 90 };
        let output = RunOutput { streams: vec![stream] };
        let event = Event {
            seq: Seq(7),
            batch_id: BatchId::new("B1").unwrap(),
            event_type: EventType::new("Ocr_Done").unwrap(),
            outcome: Outcome::Failure,
            agent: Agent::new("ocr/1@h#1").unwrap(),
            at: Timestamp(0),
            details: json!({"duration_ms": 1500, "timed_out": true, "output": output}),
            run: Some(RunRef { component: ComponentName::new("ocr").unwrap(), generation: 1 }),
            resets: Vec::new(),
        };
        let component = ComponentName::new("ocr").unwrap();
        let attempt = Attempt { component: &component, number: 2, event: &event, output: event.output() };
        let text = attempt_text(&attempt);
        assert!(text.starts_with("== ocr attempt 2 (seq 7): failure (timed out) at 1970-"), "{text}");
        assert!(
            text.contains(
                ", took 1.5s ==\n--- stderr, 10 of 100 bytes kept ---\nfirst\n[... 90 bytes not kept ...]\nlast\n"
            ),
            "{text}"
        );
        let json = attempt_json(&attempt);
        assert_eq!((json["attempt"].as_u64(), json["seq"].as_i64()), (Some(2), Some(7)));
        assert_eq!(json["output"]["streams"][0]["tail"], "last");
        let only_stdout = selected_streams(output, Some("stdout"));
        assert!(only_stdout.streams.is_empty());
    }
}
