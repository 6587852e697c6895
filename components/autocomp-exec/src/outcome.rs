//! How a command's run becomes an outcome: its exit status (0 success, 75 a transient
//! failure, anything else or a signal a failure) together with what its result file said,
//! and the output kept with the result. Apart from `main.rs`, which runs the command.

use autocomp_framework::prelude::*;
use serde_json::json;

use crate::child;

/// EX_TEMPFAIL from sysexits.h: "try again later".
const EXIT_TRANSIENT: i32 = 75;

/// What the result file said, once taken into the run.
pub(crate) struct Said {
    /// Its summary, when not empty.
    pub(crate) summary: Option<String>,
    /// It listed failures (then the exit status adds none of its own).
    pub(crate) gave_failures: bool,
    /// It asked for a transient failure.
    pub(crate) transient: bool,
    /// It could not be read as the protocol's JSON.
    pub(crate) malformed: bool,
}

/// How the command ended, as the outcome tells it: its exit status, the last lines it
/// printed and what a failure keeps of it.
pub(crate) struct Ended {
    program: String,
    status: std::process::ExitStatus,
    /// The command, its exit code and the ends of both streams.
    details: Value,
    stderr_line: String,
    stdout_line: Option<String>,
}

impl Ended {
    /// The ending of `finished`, whose whole output (head and tail) becomes the run's.
    pub(crate) fn of(words: Vec<String>, finished: child::Finished, context: &mut WorkContext) -> Self {
        let printed = finished.printed;
        // The failure keeps the ends of both streams too, as it always has, for whatever
        // reads the failure alone.
        let details = json!({
            "command": words,
            "exit_code": finished.status.code(),
            "stderr_tail": tail_text(&printed.stderr.text()),
            "stdout_tail": tail_text(&printed.stdout.text()),
        });
        let stderr_line = printed.stderr.last_line().unwrap_or("no output on stderr").to_owned();
        let stdout_line = printed.stdout.last_line().map(str::to_owned);
        keep_output(context, printed);
        Self { program: step_word(&words).to_owned(), status: finished.status, details, stderr_line, stdout_line }
    }

    /// The outcome of the exit status and the result file together.
    pub(crate) fn verdict(self, context: &mut WorkContext, said: Said) -> Result<(), WorkError> {
        let program = self.program.clone();
        match self.status.code() {
            Some(0) => {
                let summary = match (said.summary, said.malformed) {
                    (_, true) => format!("`{program}` exited 0 but its result file is malformed"),
                    (Some(summary), false) => summary,
                    (None, false) => {
                        let line = self.stdout_line.map(|l| format!(": {l}")).unwrap_or_default();
                        format!("`{program}` exited 0{line}")
                    }
                };
                context.set_summary(summary);
                if said.transient && !said.malformed {
                    return Err(WorkError::transient(format!("`{program}` reported a transient failure")));
                }
                Ok(())
            }
            Some(EXIT_TRANSIENT) => {
                let malformed = said.malformed;
                self.failed(context, "exit_status", &said, None);
                if malformed {
                    context
                        .set_summary(format!("`{program}` exited {EXIT_TRANSIENT} but its result file is malformed"));
                    return Ok(());
                }
                Err(WorkError::transient(format!("`{program}` exited {EXIT_TRANSIENT} (temporary failure)")))
            }
            Some(code) => {
                self.failed(context, "exit_status", &said, Some(format!("exited with status {code}")));
                Ok(())
            }
            None => {
                use std::os::unix::process::ExitStatusExt;
                let signal = self.status.signal().unwrap_or_default();
                self.failed(context, "signal", &said, Some(format!("was killed by signal {signal}")));
                Ok(())
            }
        }
    }

    /// A failing exit: a failure of `kind` unless the result file gave its own; the summary
    /// `` `program` <how>: <summary> ``, or the result file's own when `how` is `None`.
    fn failed(self, context: &mut WorkContext, kind: &str, said: &Said, how: Option<String>) {
        if !said.gave_failures {
            context.add_failure(&self.program, kind, self.stderr_line, self.details);
        }
        match how {
            Some(how) => {
                let tail = said.summary.as_ref().map(|s| format!(": {s}")).unwrap_or_default();
                context.set_summary(format!("`{}` {how}{tail}", self.program));
            }
            None => {
                if let Some(summary) = &said.summary {
                    context.set_summary(summary.clone());
                }
            }
        }
    }
}

/// How much of each stream a failure's details keep (the end is what explains a failure).
const TAIL_BYTES: usize = 2048;

/// The last `TAIL_BYTES` of `text`, cut at a character boundary, marked when cut.
pub(crate) fn tail_text(text: &str) -> String {
    if text.len() <= TAIL_BYTES {
        return text.to_owned();
    }
    let mut start = text.len() - TAIL_BYTES;
    while !text.is_char_boundary(start) {
        start += 1;
    }
    format!("...{}", &text[start..])
}

/// The word that names the step in a failure and a summary: the script an interpreter runs
/// (`ocr.py` of `python3 /opt/steps/ocr.py`), else the program itself.
pub(crate) fn step_word(words: &[String]) -> &str {
    const INTERPRETERS: &[&str] = &["python", "python3", "sh", "bash", "dash", "perl", "ruby", "node", "Rscript"];
    let program = words[0].as_str();
    let base = std::path::Path::new(program).file_name().and_then(|name| name.to_str()).unwrap_or(program);
    match words.get(1) {
        Some(script) if INTERPRETERS.contains(&base) && !script.starts_with('-') => {
            std::path::Path::new(script).file_name().and_then(|name| name.to_str()).unwrap_or(script)
        }
        _ => program,
    }
}

/// Both streams go with the run's result (the runner drops one that printed nothing).
pub(crate) fn keep_output(context: &mut WorkContext, printed: child::Printed) {
    if context.output_budget() > 0 {
        context.set_output(printed.stdout);
        context.set_output(printed.stderr);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_run_by_an_interpreter_is_named_by_its_script() {
        let words = |text: &str| text.split(' ').map(str::to_owned).collect::<Vec<_>>();
        assert_eq!(step_word(&words("python3 /opt/steps/ocr.py --fast")), "ocr.py");
        assert_eq!(step_word(&words("/usr/bin/sh count.sh")), "count.sh");
        assert_eq!(step_word(&words("python3 -m ocr")), "python3", "a module, not a file: the program");
        assert_eq!(step_word(&words("/opt/bin/ocr-tool --pages 3")), "/opt/bin/ocr-tool");
    }

    #[test]
    fn tails_keep_the_end_and_cut_at_a_character() {
        assert_eq!(tail_text("short"), "short");
        let long = "é".repeat(TAIL_BYTES) + "the end";
        let tail = tail_text(&long);
        assert!(tail.starts_with("...é") && tail.ends_with("the end"), "{tail}");
        assert!(tail.len() <= TAIL_BYTES + 3);
    }
}
