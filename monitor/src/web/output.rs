//! What runs printed, on the batch page: a `<details>` per attempt whose result kept output
//! (a command's stdout and stderr, a Rust component's log lines) or, for a run without a
//! result (cancelled, abandoned), whose output was saved apart; what the going runs printed
//! so far; and the last lines of a failed attempt's stderr (or log) beside its verdict. Owns
//! how run output reaches HTML.

use autocomp_model::{Event, Outcome, OutputStream, Run, RunOutput, RunState, Timestamp};
use autocomp_store::SavedRunOutput;
use autocomp_toolkit::terminal::for_terminal;

use super::html::{age, esc, time, w};

/// Lines of a failed attempt's stderr quoted beside its verdict.
pub const VERDICT_LINES: usize = 8;

/// Output as page text: control characters (but line feeds and tabs) become the visible
/// `\uXXXX` the CLI prints, then everything is HTML-escaped.
fn shown(text: &str) -> String {
    esc(for_terminal(text)).to_string()
}

/// One attempt with output: the event that ended it (a result, or an operator's cancel whose
/// output was saved apart), its run and what it printed.
struct Shown<'e> {
    event: &'e Event,
    component: &'e autocomp_model::ComponentName,
    generation: i64,
    output: RunOutput,
}

/// The attempts on this page of the log that kept output, oldest first.
fn with_output<'e>(events: &'e [Event], saved: &'e [SavedRunOutput]) -> Vec<Shown<'e>> {
    let mut runs = Vec::new();
    for event in events {
        let (run, output) = match (&event.run, event.cancelled_run()) {
            (Some(run), _) => (run, event.output()),
            (None, Some(cancelled)) => {
                let found =
                    saved.iter().find(|s| s.component == cancelled.component && s.generation == cancelled.generation);
                let Some(found) = found else { continue };
                runs.push(Shown {
                    event,
                    component: &found.component,
                    generation: found.generation,
                    output: found.output.clone(),
                });
                continue;
            }
            (None, None) => continue,
        };
        if let Some(output) = output.filter(|output| !output.is_empty()) {
            runs.push(Shown { event, component: &run.component, generation: run.generation, output });
        }
    }
    runs
}

/// The "Run output" section for the events of a page of the log, oldest first: one
/// `<details>` per attempt that kept output, the newest failed attempt of each component
/// open; then the abandoned runs whose output was saved before their worker stopped. Empty
/// when there is none.
pub fn section(events: &[Event], saved: &[SavedRunOutput]) -> String {
    let runs = with_output(events, saved);
    let abandoned: Vec<&SavedRunOutput> = saved.iter().filter(|s| s.state == RunState::Abandoned).collect();
    if runs.is_empty() && abandoned.is_empty() {
        return String::new();
    }
    // The newest failed attempt of each component: the one a reader came for.
    let mut open: Vec<i64> = Vec::new();
    let mut seen: Vec<&autocomp_model::ComponentName> = Vec::new();
    for run in runs.iter().rev() {
        if run.event.outcome == Outcome::Failure && !seen.contains(&run.component) {
            open.push(run.event.seq.0);
            seen.push(run.component);
        }
    }
    let mut out = String::from(
        "<h2 id=\"output\">Run output</h2>\n<p>What each run on this page of the log printed, kept with its result \
         (the first and the last bytes of each stream, within the component's <code>max_output</code>), or saved \
         while it ran when it has none; <code>autocomp logs ID</code> prints the same.</p>\n",
    );
    for run in &runs {
        let event = run.event;
        let took = event
            .details
            .get("duration_ms")
            .and_then(serde_json::Value::as_u64)
            .map(|ms| format!(", took {}", autocomp_ops::operator::duration_text(std::time::Duration::from_millis(ms))))
            .unwrap_or_default();
        let cancelled =
            if event.run.is_none() { " (cancelled by an operator; its output until it stopped)" } else { "" };
        w!(
            out,
            "<details class=\"run-output\" id=\"output-{0}\"{1}><summary><code>{2}</code> run {3} (seq {0}): {4}{5} at \
             {6}{7}</summary>\n",
            esc(event.seq),
            if open.contains(&event.seq.0) { " open" } else { "" },
            esc(run.component),
            esc(run.generation),
            esc(event.outcome.as_str()),
            cancelled,
            time(event.at),
            esc(took)
        );
        out.push_str(&streams(&run.output));
        out.push_str("</details>\n");
    }
    for saved in abandoned {
        w!(
            out,
            "<details class=\"run-output\"><summary><code>{}</code> run {}: abandoned (its worker stopped or was \
             taken over); output saved at {}</summary>\n{}</details>\n",
            esc(&saved.component),
            esc(saved.generation),
            time(saved.saved_at),
            streams(&saved.output)
        );
    }
    out
}

/// "Output so far": for each going run, what its runner saved of its output (every 2 s while
/// it prints), open; the page refreshes itself meanwhile. Empty when nothing goes.
pub fn going_section(open_runs: &[Run], saved: &[SavedRunOutput], now: Timestamp) -> String {
    if open_runs.is_empty() {
        return String::new();
    }
    let mut out = String::from(
        "<h2 id=\"output-so-far\">Output so far</h2>\n<p>What each going run printed, as its runner saves it every \
         2 s while it prints; this page refreshes itself, and <code>autocomp logs ID --follow</code> follows it in a \
         terminal.</p>\n",
    );
    for run in open_runs {
        let found = saved.iter().find(|s| s.component == run.component && s.generation == run.generation);
        match found.filter(|s| s.state == RunState::Open && !s.output.is_empty()) {
            Some(saved) => w!(
                out,
                "<details class=\"run-output\" id=\"going-{0}-{1}\" open><summary><code>{0}</code> run {1}: running; \
                 saved at {2} ({3} ago)</summary>\n{4}</details>\n",
                esc(&run.component),
                esc(run.generation),
                time(saved.saved_at),
                esc(age(now.since(saved.saved_at))),
                streams(&saved.output)
            ),
            None => w!(
                out,
                "<p><code>{}</code> run {}: nothing saved yet (a run's output is saved once it has printed and run \
                 2 s).</p>\n",
                esc(&run.component),
                esc(run.generation)
            ),
        }
    }
    out
}

/// Every stream of `output`, each in its `<pre>`.
fn streams(output: &RunOutput) -> String {
    output.streams.iter().map(|stream| stream_block(stream, &stream.text())).collect()
}

/// One stream in a `<pre>`, stderr marked as such.
fn stream_block(stream: &OutputStream, text: &str) -> String {
    let stderr = stream.name == "stderr";
    let kept = if stream.omitted_bytes > 0 {
        format!(" ({} of {} bytes kept)", stream.kept_bytes(), stream.total_bytes())
    } else {
        String::new()
    };
    format!(
        "<figure class=\"output{}\"><figcaption>{}{}</figcaption><pre>{}</pre></figure>\n",
        if stderr { " stderr" } else { "" },
        if stderr { "<strong>stderr</strong>".to_owned() } else { esc(&stream.name).to_string() },
        esc(kept),
        shown(text)
    )
}

/// The last lines of a failed result's stderr (or, for a Rust component, its log), for
/// beside its verdict; empty when it kept none.
pub fn verdict_tail(failure: &Event) -> String {
    if failure.outcome != Outcome::Failure {
        return String::new();
    }
    let Some(output) = failure.output() else { return String::new() };
    let Some(stream) = output.stream("stderr").or_else(|| output.stream("log")).filter(|s| s.total_bytes() > 0) else {
        return String::new();
    };
    let end = if stream.tail.is_empty() { &stream.head } else { &stream.tail };
    let lines: Vec<&str> = end.lines().collect();
    let last = lines[lines.len().saturating_sub(VERDICT_LINES)..].join("\n");
    let mut out = String::new();
    w!(
        out,
        "<figure class=\"output verdict-output{}\"><figcaption>The end of its {} (<a href=\"#output-{}\">all of \
         its output</a>)</figcaption><pre>{}</pre></figure>\n",
        if stream.name == "stderr" { " stderr" } else { "" },
        esc(&stream.name),
        esc(failure.seq),
        shown(&last)
    );
    out
}

#[cfg(test)]
mod tests {
    use autocomp_model::{Agent, BatchId, ComponentName, EventType, RunRef, Seq, Timestamp};
    use serde_json::json;

    use super::*;

    fn result(seq: i64, outcome: Outcome, output: RunOutput) -> Event {
        Event {
            seq: Seq(seq),
            batch_id: BatchId::new("B1").unwrap(),
            event_type: EventType::new("Ocr_Done").unwrap(),
            outcome,
            agent: Agent::new("ocr/1@h#1").unwrap(),
            at: Timestamp(0),
            details: json!({"duration_ms": 1500, "output": output}),
            run: Some(RunRef { component: ComponentName::new("ocr").unwrap(), generation: seq }),
            resets: Vec::new(),
        }
    }

    fn stderr(text: &str) -> RunOutput {
        RunOutput { streams: vec![OutputStream { name: "stderr".into(), head: text.into(), ..Default::default() }] }
    }

    #[test]
    fn output_is_escaped_and_controls_are_visible_and_the_newest_failure_is_open() {
        let events = [
            result(2, Outcome::Failure, stderr("old <b>\n")),
            result(3, Outcome::Failure, stderr("red \u{1b}[31m<script>\0\n\tindented\n")),
        ];
        let page = section(&events, &[]);
        assert!(page.contains("red \\u001b[31m&lt;script&gt;\\u0000\n\tindented"), "{page}");
        assert!(!page.contains('\u{1b}') && !page.contains('\0') && !page.contains("<b>"), "{page}");
        assert!(page.contains("<details class=\"run-output\" id=\"output-3\" open>"), "{page}");
        assert!(page.contains("<details class=\"run-output\" id=\"output-2\"><summary>"), "{page}");
        let tail = verdict_tail(&events[1]);
        assert!(tail.contains("<strong>") || tail.contains("stderr"), "{tail}");
        assert!(tail.contains("\tindented</pre>") && tail.contains("href=\"#output-3\""), "{tail}");
        assert_eq!(section(&[], &[]), "");
    }
}
