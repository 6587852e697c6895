//! What runs printed, on the batch page: a `<details>` per attempt whose result kept output
//! (a command's stdout and stderr, a Rust component's log lines), and the last lines of a
//! failed attempt's stderr (or log) beside its verdict. Owns how run output reaches HTML.

use autocomp_model::{Event, Outcome, OutputStream, RunOutput};
use autocomp_toolkit::terminal::for_terminal;

use super::html::{esc, time, w};

/// Lines of a failed attempt's stderr quoted beside its verdict.
pub const VERDICT_LINES: usize = 8;

/// Output as page text: control characters (but line feeds and tabs) become the visible
/// `\uXXXX` the CLI prints, then everything is HTML-escaped.
fn shown(text: &str) -> String {
    esc(for_terminal(text)).to_string()
}

/// The "Run output" section for the result events of a page of the log, oldest first: one
/// `<details>` per attempt that kept output, the newest failed attempt of each component
/// open. Empty when no event on the page kept any.
pub fn section(events: &[Event]) -> String {
    let runs: Vec<(&Event, RunOutput)> = events
        .iter()
        .filter(|event| event.run.is_some())
        .filter_map(|event| Some((event, event.output().filter(|output| !output.is_empty())?)))
        .collect();
    if runs.is_empty() {
        return String::new();
    }
    // The newest failed attempt of each component: the one a reader came for.
    let mut open: Vec<&Event> = Vec::new();
    for (event, _) in runs.iter().rev() {
        let component = event.run.as_ref().map(|run| &run.component);
        let seen = open.iter().any(|e| e.run.as_ref().map(|run| &run.component) == component);
        if event.outcome == Outcome::Failure && !seen {
            open.push(event);
        }
    }
    let mut out = String::from(
        "<h2 id=\"output\">Run output</h2>\n<p>What each run on this page of the log printed, kept with its result \
         (the first and the last bytes of each stream, within the component's <code>max_output</code>); \
         <code>autocomp logs ID</code> prints the same.</p>\n",
    );
    for (event, output) in &runs {
        let run = event.run.as_ref().expect("filtered on runs");
        let took = event
            .details
            .get("duration_ms")
            .and_then(serde_json::Value::as_u64)
            .map(|ms| format!(", took {:.1}s", ms as f64 / 1000.0))
            .unwrap_or_default();
        w!(
            out,
            "<details class=\"run-output\" id=\"output-{0}\"{1}><summary><code>{2}</code> run {3} (seq {0}): {4} at \
             {5}{6}</summary>\n",
            esc(event.seq),
            if open.iter().any(|e| e.seq == event.seq) { " open" } else { "" },
            esc(&run.component),
            esc(run.generation),
            esc(event.outcome.as_str()),
            time(event.at),
            esc(took)
        );
        for stream in &output.streams {
            out.push_str(&stream_block(stream, &stream.text()));
        }
        out.push_str("</details>\n");
    }
    out
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
        let page = section(&events);
        assert!(page.contains("red \\u001b[31m&lt;script&gt;\\u0000\n\tindented"), "{page}");
        assert!(!page.contains('\u{1b}') && !page.contains('\0') && !page.contains("<b>"), "{page}");
        assert!(page.contains("<details class=\"run-output\" id=\"output-3\" open>"), "{page}");
        assert!(page.contains("<details class=\"run-output\" id=\"output-2\"><summary>"), "{page}");
        let tail = verdict_tail(&events[1]);
        assert!(tail.contains("<strong>") || tail.contains("stderr"), "{tail}");
        assert!(tail.contains("\tindented</pre>") && tail.contains("href=\"#output-3\""), "{tail}");
        assert_eq!(section(&[]), "");
    }
}
