//! `autocomp logs ID --follow`: after what `logs` prints, what the batch's running runs
//! print, as their runners save it (every 2 s while it grows), then each run's end (its
//! result; an operator's cancel, once the run's whole output is saved; its worker found
//! gone) with whatever it printed last; until no run of the selection is going (what is new in a
//! stream is `OutputStream::text_after`).

use std::time::Duration;

use autocomp_model::{BatchId, ComponentName, Event, RunOutput, RunState, Seq, Timestamp};
use autocomp_store::port::DETAILS_SHOWN_BYTES;
use autocomp_store::{LogCursor, MAX_LOG_PAGE, ObjectStore, SavedRunOutput};

use autocomp_framework::locks::{Liveness, LockService};

use super::attempts::{Attempt, Attempts, Selection, Writer, attempt_text, saved_of};
use crate::operator::{Operator, OperatorError};

/// How often the batch is read again while a run goes on.
const FOLLOW_INTERVAL: Duration = Duration::from_secs(1);
/// How long a cancelled run's worker is waited for to save its whole output (it has its
/// `cancel_grace` to stop, 10 s by default, and a command its `kill_grace` within that).
const WHOLE_OUTPUT_WAIT: Duration = Duration::from_secs(30);

/// What was printed of one run: by stream, how many of its bytes.
struct Printed {
    component: ComponentName,
    generation: i64,
    streams: Vec<(String, u64)>,
}

impl Printed {
    fn of(&self, stream: &str) -> u64 {
        self.streams.iter().find(|(name, _)| name == stream).map_or(0, |(_, bytes)| *bytes)
    }

    fn set(&mut self, stream: &str, bytes: u64) {
        match self.streams.iter_mut().find(|(name, _)| name == stream) {
            Some(entry) => entry.1 = bytes,
            None => self.streams.push((stream.to_owned(), bytes)),
        }
    }
}

/// The follow after `logs` printed the log up to `after`.
pub(super) struct Follow<'s, 'q> {
    selection: &'s Selection<'q>,
    attempts: Attempts,
    after: Seq,
    /// The runs announced as going, and what of their output was printed.
    followed: Vec<Printed>,
    /// The stream the last text came from: a new one gets its own line first.
    last_stream: Option<(ComponentName, i64, String)>,
    /// Open runs whose worker was found gone: no longer followed.
    gone: Vec<(ComponentName, i64)>,
}

impl<'s, 'q> Follow<'s, 'q> {
    /// Starts from what `logs` printed: the log up to `after`, each going run's output so far.
    pub(super) fn new(selection: &'s Selection<'q>, attempts: Attempts, after: Seq) -> Self {
        let followed = selection
            .saved
            .iter()
            .filter(|saved| saved.state == RunState::Open && selection.wants(&saved.component))
            .map(|saved| Printed {
                component: saved.component.clone(),
                generation: saved.generation,
                streams: printed_whole(&saved.output),
            })
            .collect();
        Follow { selection, attempts, after, followed, last_stream: None, gone: Vec::new() }
    }

    /// Reads the batch every `FOLLOW_INTERVAL` and prints what is new, until no run of the
    /// selection is going. Whether it printed anything.
    pub(super) async fn run(
        mut self,
        operator: &Operator,
        store: &dyn ObjectStore,
        id: &BatchId,
        writer: &mut Writer<'_>,
    ) -> Result<bool, OperatorError> {
        let mut shown = !self.followed.is_empty();
        // The lock service judges a going run's worker gone; without one (a host configured
        // with a store alone, the service down) a follow goes on until the run ends.
        let locks = match operator.locks().await {
            Ok(locks) => Some(locks),
            Err(e) => {
                tracing::debug!("no lock service to tell a dead worker by: {e}");
                None
            }
        };
        let followed = self.follow(store, id, locks.as_deref(), writer, &mut shown).await;
        if let Some(locks) = locks {
            locks.close().await;
        }
        followed.map(|()| shown)
    }

    async fn follow(
        &mut self,
        store: &dyn ObjectStore,
        id: &BatchId,
        locks: Option<&dyn LockService>,
        writer: &mut Writer<'_>,
        shown: &mut bool,
    ) -> Result<(), OperatorError> {
        loop {
            let head = store.batch_head(id).await?;
            let going: Vec<_> = head
                .open_runs
                .iter()
                .filter(|run| self.selection.wants(&run.component))
                .filter(|run| !self.gone.contains(&(run.component.clone(), run.generation)))
                .collect();
            let saved = if going.is_empty() { Vec::new() } else { store.run_outputs(id).await? };
            for run in &going {
                *shown = true;
                self.announce(&run.component, run.generation, run.started_at, writer)?;
                let output = saved.iter().find(|s| s.component == run.component && s.generation == run.generation);
                if let Some(saved) = output.filter(|saved| saved.state == RunState::Open) {
                    self.print_new(saved, writer)?;
                }
            }
            *shown |= self.ends(store, id, writer).await?;
            if going.is_empty() {
                if !*shown {
                    writer.write(&format!("(no run is going on {id}: nothing to follow)\n"))?;
                }
                return Ok(());
            }
            if let Some(locks) = locks {
                for run in going {
                    self.check_worker(locks, run, writer).await?;
                }
            }
            tokio::time::sleep(FOLLOW_INTERVAL).await;
        }
    }

    /// A run whose worker is proven gone (its liveness record dead: killed, its host down)
    /// stays open until the component's next pass takes it over: it is no longer followed.
    async fn check_worker(
        &mut self,
        locks: &dyn LockService,
        run: &autocomp_model::Run,
        writer: &mut Writer<'_>,
    ) -> Result<(), OperatorError> {
        let Some(record) = &run.holder.liveness else { return Ok(()) };
        if !matches!(locks.judge_liveness(record).await, Ok(Liveness::Dead)) {
            return Ok(());
        }
        writer.write(&format!(
            "== {} run {}: its worker is gone ({} on {} pid {} holds no liveness any more); the run stays open until \
             the next pass of {} takes it over ==\n",
            run.component, run.generation, run.holder.agent, run.holder.host, run.holder.pid, run.component
        ))?;
        self.gone.push((run.component.clone(), run.generation));
        self.followed.retain(|p| !(p.component == run.component && p.generation == run.generation));
        self.last_stream = None;
        Ok(())
    }

    /// A going run seen for the first time: its header line.
    fn announce(
        &mut self,
        component: &ComponentName,
        generation: i64,
        since: Timestamp,
        writer: &mut Writer<'_>,
    ) -> Result<(), OperatorError> {
        if self.printed(component, generation).is_some() {
            return Ok(());
        }
        writer.write(&format!("== {component} run {generation}: running since {since}, followed ==\n"))?;
        self.followed.push(Printed { component: component.clone(), generation, streams: Vec::new() });
        Ok(())
    }

    fn printed(&mut self, component: &ComponentName, generation: i64) -> Option<&mut Printed> {
        self.followed.iter_mut().find(|p| p.component == *component && p.generation == generation)
    }

    /// What a going run's saved output holds that was not printed yet.
    fn print_new(&mut self, saved: &SavedRunOutput, writer: &mut Writer<'_>) -> Result<(), OperatorError> {
        self.print_unseen(&saved.component, saved.generation, &saved.output, writer)
    }

    fn print_unseen(
        &mut self,
        component: &ComponentName,
        generation: i64,
        output: &RunOutput,
        writer: &mut Writer<'_>,
    ) -> Result<(), OperatorError> {
        let wanted = self.selection.query.stream.as_deref();
        for stream in output.streams.iter().filter(|s| wanted.is_none_or(|name| s.name == name)) {
            let Some(printed) = self.printed(component, generation) else { return Ok(()) };
            let new = stream.text_after(printed.of(&stream.name));
            printed.set(&stream.name, stream.total_bytes());
            if new.is_empty() {
                continue;
            }
            let here = (component.clone(), generation, stream.name.clone());
            if self.last_stream.as_ref() != Some(&here) {
                writer.write(&format!("--- {component} run {generation}: {} ---\n", stream.name))?;
                self.last_stream = Some(here);
            }
            writer.write(&new)?;
        }
        Ok(())
    }

    /// The events since the last read: a followed run's end is its attempt's header and
    /// what it printed last; any other attempt of the selection that kept output is shown
    /// as `logs` shows it. Whether it printed anything.
    async fn ends(
        &mut self,
        store: &dyn ObjectStore,
        id: &BatchId,
        writer: &mut Writer<'_>,
    ) -> Result<bool, OperatorError> {
        let mut shown = false;
        loop {
            let page =
                store.log_page_within(id, LogCursor::After(self.after), MAX_LOG_PAGE, DETAILS_SHOWN_BYTES).await?;
            for event in &page.events {
                self.after = event.seq;
                shown |= self.end(store, event, writer).await?;
            }
            if page.newer.is_none() || page.events.is_empty() {
                return Ok(shown);
            }
        }
    }

    async fn end(
        &mut self,
        store: &dyn ObjectStore,
        event: &Event,
        writer: &mut Writer<'_>,
    ) -> Result<bool, OperatorError> {
        let cancelled = event.cancelled_run();
        let Some(run) = event.run.as_ref().or(cancelled.as_ref()) else { return Ok(false) };
        let number = self.attempts.count(&run.component);
        if !self.selection.wants(&run.component) {
            return Ok(false);
        }
        let followed = self.printed(&run.component, run.generation).is_some();
        // The event whole: a page leaves out details over 16 KiB (the output, the duration).
        let whole = autocomp_store::port::event_at(store, &event.batch_id, event.seq).await?;
        let event = whole.as_ref().unwrap_or(event);
        let output = match &cancelled {
            // The fenced runner saves a cancelled run's whole output once its work returns.
            Some(run) if followed => self.whole_output(store, &event.batch_id, run, writer).await?,
            Some(run) => saved_of(&store.run_outputs(&event.batch_id).await?, run).map(|s| s.output.clone()),
            None => event.output(),
        };
        let generation = run.generation;
        let attempt = Attempt { component: &run.component, number, generation, event, output: None };
        let header = attempt_text(&attempt);
        if !followed {
            // Begun and ended between two reads: shown whole, as `logs` shows it.
            let kept = output.as_ref().is_some_and(|o| !o.is_empty());
            if kept {
                writer.write(&attempt_text(&Attempt { output, ..attempt }))?;
            }
            return Ok(kept);
        }
        if let Some(output) = &output {
            self.print_unseen(&run.component, run.generation, output, writer)?;
        }
        // The header alone (its "no output kept" line is not what the follow printed).
        let ended = header.lines().next().unwrap_or_default();
        writer.write(&format!("{ended}\n"))?;
        self.last_stream = None;
        self.followed.retain(|p| !(p.component == run.component && p.generation == run.generation));
        Ok(true)
    }
}

impl Follow<'_, '_> {
    /// A cancelled run's output once its worker saved it whole (waited for up to
    /// `WHOLE_OUTPUT_WAIT`), else what was saved so far, saying so.
    async fn whole_output(
        &self,
        store: &dyn ObjectStore,
        id: &BatchId,
        run: &autocomp_model::RunRef,
        writer: &mut Writer<'_>,
    ) -> Result<Option<RunOutput>, OperatorError> {
        let deadline = tokio::time::Instant::now() + WHOLE_OUTPUT_WAIT;
        loop {
            let saved = store.run_outputs(id).await?;
            let found = saved_of(&saved, run);
            if found.is_some_and(|s| s.whole) || tokio::time::Instant::now() >= deadline {
                if found.is_some_and(|s| !s.whole) {
                    writer.write(&format!(
                        "(the cancelled run's worker did not save its whole output within {}s; `autocomp logs {id}` \
                         shows it once it does)\n",
                        WHOLE_OUTPUT_WAIT.as_secs()
                    ))?;
                }
                return Ok(found.map(|s| s.output.clone()));
            }
            tokio::time::sleep(FOLLOW_INTERVAL / 4).await;
        }
    }
}

impl Selection<'_> {
    /// Whether runs of `component` are selected.
    pub(super) fn wants(&self, component: &ComponentName) -> bool {
        self.component.is_none_or(|wanted| wanted == component)
    }
}

/// Each stream of `output` as printed whole.
fn printed_whole(output: &RunOutput) -> Vec<(String, u64)> {
    output.streams.iter().map(|s| (s.name.clone(), s.total_bytes())).collect()
}
