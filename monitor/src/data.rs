//! What the monitor's pages show, read through the ports: counts and pages of batches from
//! the batch index (never a scan of the store per request), the batches of one page as the
//! store summarizes them, one batch's head and a page of its log (never the whole log),
//! explanations from the operator's own `explain`, the pipeline's steering (holds, pools,
//! breakers and the newest entries of its log) and the batches waiting for a person at each
//! human step. Rendering is elsewhere; everything here is plain data.

use std::time::Duration;

use autocomp_model::{
    BatchId, BatchType, ComponentName, ComponentState, Event, InvalidInput, RegisteredComponent, Selection, Seq,
    Steering, SteeringEntry, SummaryAt, Timestamp,
};
use autocomp_ops::operator::{
    AlertDefaults, Explanation, Operator, OperatorError, SHOW_EVENTS, Step, overdue_after, ready_state, ready_too_long,
};
use autocomp_sboi::{PageKey, PageOrder, PageRequest, Tally};
use autocomp_store::{BatchHead, BatchListing, LogCursor, LogPage, ObjectStore};

use crate::filter::{Filter, StateFilter};

/// Settings of the monitor's views.
#[derive(Debug, Clone)]
pub struct Settings {
    /// A batch ready for a component longer than this is overdue, unless the component's
    /// config sets its own `overdue_after` (working longer than the component's own
    /// `max_runtime` is overdue too).
    pub ready_overdue_after: Duration,
    /// Batches per matrix page.
    pub page_size: usize,
    /// Events per page of a batch's log.
    pub log_page_size: usize,
}

impl Default for Settings {
    fn default() -> Self {
        Self { ready_overdue_after: AlertDefaults::default().ready_after, page_size: 50, log_page_size: SHOW_EVENTS }
    }
}

/// The most batches a bulk action or a preview acts on (the operator's own bound).
pub use autocomp_ops::operator::MAX_BULK_BATCHES as MAX_BULK;

#[derive(Clone)]
pub struct Monitor {
    operator: Operator,
    settings: Settings,
}

/// One component's row of the overview.
#[derive(Debug, Clone)]
pub struct OverviewRow {
    pub component: RegisteredComponent,
    /// Per state, in `StateFilter::ALL` order (overdue last).
    pub counts: Vec<(StateFilter, u64)>,
    /// The last activity of the batch ready the longest (at a human step: waiting for a
    /// person the longest), if any is.
    pub oldest_ready: Option<Timestamp>,
}

impl OverviewRow {
    /// The count of one state.
    pub fn count(&self, state: StateFilter) -> u64 {
        self.counts.iter().find(|(s, _)| *s == state).map_or(0, |(_, n)| *n)
    }
}

#[derive(Debug, Clone)]
pub struct Overview {
    pub rows: Vec<OverviewRow>,
    pub batches: u64,
    pub head: Seq,
    /// The store's clock: ages are measured against it.
    pub now: Timestamp,
    /// The pipeline's holds, pools and breaker counts.
    pub steering: Steering,
    /// The newest entries of the steering log, newest first.
    pub steering_log: Vec<SteeringEntry>,
}

/// The batches waiting for a person at each human step.
#[derive(Debug, Clone)]
pub struct Waiting {
    /// One per human step (a component declared `manual`), in pipeline order.
    pub steps: Vec<WaitingAt>,
    /// The store's clock: waits are measured against it.
    pub now: Timestamp,
}

#[derive(Debug, Clone)]
pub struct WaitingAt {
    pub step: ComponentName,
    /// The type a decision records.
    pub event_type: autocomp_model::EventType,
    /// Waiting longer than this is overdue.
    pub overdue_after: Duration,
    /// Batches the index counts in state `person` (all of them, not only those listed).
    pub total: u64,
    /// At most `WAITING_SHOWN` of them, the longest waiting first.
    pub batches: Vec<WaitingBatch>,
}

#[derive(Debug, Clone)]
pub struct WaitingBatch {
    pub id: BatchId,
    pub batch_type: BatchType,
    pub priority: i32,
    /// Its last activity: it has waited since then.
    pub since: Timestamp,
    pub overdue: bool,
}

/// The most batches the waiting list reads per human step (the first registered, then
/// ordered by how long they have waited); the matrix lists every one.
pub const WAITING_SHOWN: usize = 500;

/// One batch's cell for one component.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cell {
    pub state: ComponentState,
    pub overdue: bool,
    /// A failed cell's failure in short (its effective event's `Event::failure_reason`, at most
    /// `FAILURE_SUMMARY_CHARS`), once `Monitor::failure_summaries` has read it.
    pub failure: Option<String>,
}

/// The most characters of a failure's summary a matrix cell shows.
pub const FAILURE_SUMMARY_CHARS: usize = 80;

/// `text` cut to `FAILURE_SUMMARY_CHARS` characters, an ellipsis marking a cut.
pub(crate) fn cut(text: &str) -> String {
    let text = text.trim();
    if text.chars().count() <= FAILURE_SUMMARY_CHARS {
        return text.to_owned();
    }
    let mut out: String = text.chars().take(FAILURE_SUMMARY_CHARS - 1).collect();
    out.push('…');
    out
}

/// A batch as a row of the matrix (and an export) shows it: read from its summary, never
/// its log.
#[derive(Debug, Clone)]
pub struct ListedBatch {
    pub id: BatchId,
    pub batch_type: BatchType,
    pub priority: i32,
    pub created_at: Timestamp,
    /// Everything the row's states come from.
    pub listing: BatchListing,
}

impl From<BatchListing> for ListedBatch {
    fn from(listing: BatchListing) -> Self {
        let summary = &listing.summary;
        Self {
            id: summary.id.clone(),
            batch_type: summary.batch_type.clone(),
            priority: summary.priority,
            created_at: listing.created_at,
            listing,
        }
    }
}

#[derive(Debug, Clone)]
pub struct MatrixRow {
    pub batch: ListedBatch,
    /// One per component of `Matrix::components`.
    pub cells: Vec<Cell>,
}

impl MatrixRow {
    /// When its time in the pipeline ends: `now` while a step works on it or waits to
    /// (ready, a person's decision, a retry, a redo), since a wait is time in the pipeline; else,
    /// at rest (done, failed, waiting for nothing that moves), its last activity.
    pub fn in_pipeline_until(&self, now: Timestamp) -> Timestamp {
        let moving = self.cells.iter().any(|cell| {
            matches!(
                cell.state,
                ComponentState::Ready
                    | ComponentState::Person
                    | ComponentState::Working
                    | ComponentState::Retrying
                    | ComponentState::Stale
            )
        });
        let last = self.batch.listing.summary.last_activity;
        if moving { Timestamp(now.millis().max(last.millis())) } else { last }
    }
}

#[derive(Debug, Clone)]
pub struct Matrix {
    pub components: Vec<ComponentName>,
    /// When the states were judged.
    pub now: Timestamp,
    pub rows: Vec<MatrixRow>,
    /// The cursor of the next page, when there is one.
    pub next: Option<PageKey>,
    /// Batches the filter selects (all pages).
    pub total: u64,
}

#[derive(Debug, Clone)]
pub struct BatchPage {
    /// Header, metadata, effective view, open runs: no log.
    pub head: BatchHead,
    /// One page of the log (the newest, or the one before the page asked for), oldest first.
    pub log: LogPage,
    /// Every component's explanation, in pipeline order.
    pub explanations: Vec<Explanation>,
    /// What runs without a result printed (running, cancelled, abandoned), saved apart.
    pub saved_outputs: Vec<autocomp_store::SavedRunOutput>,
    /// Effective results made under an older schema than their producers publish now.
    pub older_results: Vec<autocomp_ops::operator::OlderResult>,
}

/// Whether `step`'s state on a listed batch is overdue at `now`, as `alerts::is_overdue`
/// judges a whole batch: ready longer than the step's threshold, or working longer than its
/// `max_runtime`.
fn is_overdue(
    step: &Step,
    listing: &BatchListing,
    state: ComponentState,
    now: Timestamp,
    ready_after: Duration,
) -> bool {
    match state {
        ComponentState::Ready | ComponentState::Person => {
            now.since(listing.summary.last_activity) >= overdue_after(step, ready_after)
        }
        ComponentState::Working => {
            listing.open_run(step.name()).is_some_and(|run| now.since(run.started_at) >= step.descriptor().max_runtime)
        }
        _ => false,
    }
}

/// The listings of `ids`, in the order asked, a store page at a time.
async fn listings(store: &dyn ObjectStore, ids: &[BatchId]) -> Result<Vec<BatchListing>, OperatorError> {
    let mut all = Vec::with_capacity(ids.len());
    for chunk in ids.chunks(1_000) {
        all.extend(store.get_listings(chunk).await?);
    }
    Ok(all)
}

impl Monitor {
    pub fn new(operator: Operator, settings: Settings) -> Self {
        Self { operator, settings }
    }

    pub fn operator(&self) -> &Operator {
        &self.operator
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// The store's head: it moves with every write, so it is the pages' ETag.
    pub async fn head(&self) -> Result<Seq, OperatorError> {
        let store = self.operator.store().await?;
        Ok(store.head().await?)
    }

    pub async fn pipeline(&self) -> Result<Vec<Step>, OperatorError> {
        let store = self.operator.store().await?;
        self.operator.pipeline(store.as_ref()).await
    }

    /// The component x state grid: one index tally for all its counts.
    pub async fn overview(&self) -> Result<Overview, OperatorError> {
        let store = self.operator.store().await?;
        let head = store.head().await?;
        let pipeline = self.operator.pipeline(store.as_ref()).await?;
        let index = self.operator.index(&store)?;
        let mut selections = vec![Selection::All];
        for step in &pipeline {
            selections.extend(step.state_selections(self.settings.ready_overdue_after));
        }
        let tallies = index.tally(&selections, false).await?;
        let ready: Vec<Selection> =
            pipeline.iter().map(|s| Selection::component_state(s.descriptor(), ready_state(s))).collect();
        let oldest_ready = index.tally(&ready, true).await?;
        let overdue_runs = self.operator.overdue_runs(&pipeline).await?;
        let batches = tallies.first().map_or(0, |t| t.count);
        let mut rows = Vec::with_capacity(pipeline.len());
        let per_step = ComponentState::ALL.len() + 1;
        for (i, step) in pipeline.iter().enumerate() {
            let tallies: &[Tally] = &tallies[1 + i * per_step..1 + (i + 1) * per_step];
            let mut counts: Vec<(StateFilter, u64)> = ComponentState::ALL
                .iter()
                .zip(tallies)
                .map(|(state, t)| (StateFilter::State(*state), t.count))
                .collect();
            let overdue_working = overdue_runs.iter().filter(|run| run.component == *step.name()).count() as u64;
            counts.push((StateFilter::Overdue, tallies[per_step - 1].count + overdue_working));
            rows.push(OverviewRow {
                component: step.registered.clone(),
                counts,
                oldest_ready: oldest_ready[i].quietest,
            });
        }
        let (steering, steering_log) = self.operator.steering().await?;
        Ok(Overview { rows, batches, head, now: Timestamp::now(), steering, steering_log })
    }

    /// The batches in state `person` at each human step: counted by the index, the first
    /// `WAITING_SHOWN` of them read from the store (their state checked there again), the
    /// longest waiting first.
    pub async fn waiting(&self) -> Result<Waiting, OperatorError> {
        let store = self.operator.store().await?;
        let pipeline = self.operator.pipeline(store.as_ref()).await?;
        let index = self.operator.index(&store)?;
        let steps: Vec<&Step> = pipeline.iter().filter(|s| s.descriptor().manual).collect();
        let selections: Vec<Selection> =
            steps.iter().map(|s| Selection::component_state(s.descriptor(), ComponentState::Person)).collect();
        let tallies = if selections.is_empty() { Vec::new() } else { index.tally(&selections, false).await? };
        let now = Timestamp::now();
        let mut out = Vec::with_capacity(steps.len());
        for ((step, selection), tally) in steps.into_iter().zip(selections).zip(tallies) {
            let request = PageRequest { selection, order: PageOrder::Oldest, after: None, limit: WAITING_SHOWN };
            let page = index.page(&request).await?;
            let threshold = overdue_after(step, self.settings.ready_overdue_after);
            let mut batches: Vec<WaitingBatch> = listings(store.as_ref(), &page.batches)
                .await?
                .into_iter()
                .filter(|l| step.state_of(&SummaryAt { summary: &l.summary, at: now }) == ComponentState::Person)
                .map(|l| {
                    let since = l.summary.last_activity;
                    WaitingBatch {
                        id: l.summary.id,
                        batch_type: l.summary.batch_type,
                        priority: l.summary.priority,
                        since,
                        overdue: now.since(since) >= threshold,
                    }
                })
                .collect();
            batches.sort_by(|a, b| a.since.cmp(&b.since).then_with(|| a.id.cmp(&b.id)));
            out.push(WaitingAt {
                step: step.name().clone(),
                event_type: step.event_type().clone(),
                overdue_after: threshold,
                total: tally.count,
                batches,
            });
        }
        Ok(Waiting { steps: out, now })
    }

    /// One page of the batch x component matrix.
    pub async fn matrix(&self, filter: &Filter, after: Option<PageKey>) -> Result<Matrix, OperatorError> {
        let store = self.operator.store().await?;
        let pipeline = self.operator.pipeline(store.as_ref()).await?;
        let index = self.operator.index(&store)?;
        let selection = self.selection(&pipeline, filter)?;
        let request =
            PageRequest { selection: selection.clone(), order: filter.order, after, limit: self.settings.page_size };
        let (page, total) = (index.page(&request).await?, index.tally(&[selection], false).await?);
        // In the index's order, as the store summarizes them: no log is read.
        let listed = listings(store.as_ref(), &page.batches).await?;
        let now = Timestamp::now();
        let ready_after = self.settings.ready_overdue_after;
        let overdue_only = filter.state == Some(StateFilter::Overdue);
        // `overdue` with a component: overdue there; without one: overdue at any component.
        let filtered = filter.component.as_ref().and_then(|c| pipeline.iter().position(|s| s.name() == c));
        let rows = listed
            .into_iter()
            .map(|listing| {
                let facts = SummaryAt { summary: &listing.summary, at: now };
                let cells: Vec<Cell> = pipeline
                    .iter()
                    .map(|step| {
                        let state = step.state_of(&facts);
                        Cell { state, overdue: is_overdue(step, &listing, state, now, ready_after), failure: None }
                    })
                    .collect();
                MatrixRow { cells, batch: listing.into() }
            })
            .filter(|row| {
                !overdue_only
                    || match filtered {
                        Some(i) => row.cells[i].overdue,
                        None => row.cells.iter().any(|cell| cell.overdue),
                    }
            })
            .collect();
        Ok(Matrix {
            components: pipeline.iter().map(|s| s.name().clone()).collect(),
            now,
            rows,
            next: page.next,
            total: total.first().map_or(0, |t| t.count),
        })
    }

    /// Fills in the failure summary of each failed cell of `matrix`: the head of each batch
    /// with one is read (at most a page of them; never a log), its failed component's
    /// effective event's `details.summary` cut short. A batch gone since the page was read
    /// keeps its cells as they were.
    pub async fn failure_summaries(&self, matrix: &mut Matrix) -> Result<(), OperatorError> {
        let store = self.operator.store().await?;
        let pipeline = self.operator.pipeline(store.as_ref()).await?;
        let event_types: Vec<Option<&autocomp_model::EventType>> = matrix
            .components
            .iter()
            .map(|name| pipeline.iter().find(|s| s.name() == name).map(Step::event_type))
            .collect();
        for row in &mut matrix.rows {
            if !row.cells.iter().any(|cell| cell.state == ComponentState::Failed) {
                continue;
            }
            let Ok(head) = store.batch_head(&row.batch.id).await else { continue };
            for (cell, event_type) in row.cells.iter_mut().zip(&event_types) {
                if cell.state != ComponentState::Failed {
                    continue;
                }
                let failure = head
                    .effective
                    .iter()
                    .find(|e| Some(&e.event_type) == *event_type && e.outcome == autocomp_model::Outcome::Failure);
                cell.failure = failure.and_then(Event::failure_reason).map(|reason| cut(&reason));
            }
        }
        Ok(())
    }

    /// The ids the filter selects, in its order, at most `MAX_BULK` (bulk actions and
    /// their previews); an error naming the count when there are more.
    pub async fn ids(&self, filter: &Filter) -> Result<Vec<BatchId>, OperatorError> {
        let store = self.operator.store().await?;
        let pipeline = self.operator.pipeline(store.as_ref()).await?;
        let index = self.operator.index(&store)?;
        let selection = self.selection(&pipeline, filter)?;
        let total = index.tally(std::slice::from_ref(&selection), false).await?.first().map_or(0, |t| t.count);
        if total as usize > MAX_BULK {
            return Err(InvalidInput::new(
                "q",
                filter.query(),
                format!("selects {total} batches; a bulk action takes at most {MAX_BULK}: narrow the filter"),
            )
            .into());
        }
        let mut ids = Vec::with_capacity(total as usize);
        let mut after = None;
        // Bounded: each page moves the cursor forward, and there are at most MAX_BULK ids.
        for _ in 0..=MAX_BULK / autocomp_sboi::MAX_PAGE + 1 {
            let request = PageRequest {
                selection: selection.clone(),
                order: filter.order,
                after,
                limit: autocomp_sboi::MAX_PAGE,
            };
            let page = index.page(&request).await?;
            ids.extend(page.batches);
            after = page.next;
            if after.is_none() {
                break;
            }
        }
        if filter.state == Some(StateFilter::Overdue) {
            // The filtered component, or (without one) every component: overdue at any.
            let steps: Vec<&Step> = match &filter.component {
                Some(c) => pipeline.iter().filter(|s| s.name() == c).collect(),
                None => pipeline.iter().collect(),
            };
            let now = Timestamp::now();
            let overdue: std::collections::HashSet<BatchId> = listings(store.as_ref(), &ids)
                .await?
                .into_iter()
                .filter(|listing| {
                    steps.iter().any(|step| {
                        let state = step.state_of(&SummaryAt { summary: &listing.summary, at: now });
                        is_overdue(step, listing, state, now, self.settings.ready_overdue_after)
                    })
                })
                .map(|listing| listing.summary.id)
                .collect();
            ids.retain(|id| overdue.contains(id));
        }
        Ok(ids)
    }

    /// One batch's page: its head (metadata, effective view, open runs), one page of its log
    /// (the newest, or the events before `before`), and every component's explanation,
    /// clause by clause in the store and in the index. Reads as much whatever the log's length.
    pub async fn batch(&self, id: &str, before: Option<Seq>) -> Result<BatchPage, OperatorError> {
        let id = autocomp_model::BatchId::new(id)?;
        let (head, explanations) = self.operator.explain_all(&id).await?;
        let store = self.operator.store().await?;
        let cursor = before.map_or(LogCursor::Newest, LogCursor::Before);
        // By size: an event's details over 16 KiB stay in the store, the page links to them.
        let shown = autocomp_store::port::DETAILS_SHOWN_BYTES;
        let log = store.log_page_within(head.id(), cursor, self.settings.log_page_size, shown).await?;
        let saved_outputs = store.run_outputs(head.id()).await?;
        let older_results =
            autocomp_ops::operator::older_results(&head, &self.operator.pipeline(store.as_ref()).await?);
        Ok(BatchPage { head, log, explanations, saved_outputs, older_results })
    }

    /// The filter as an index selection; the component must be one of the pipeline. Without
    /// `component:`, a state is that state at any component of the pipeline.
    fn selection(&self, pipeline: &[Step], filter: &Filter) -> Result<Selection, OperatorError> {
        let steps: Vec<&Step> = match &filter.component {
            Some(name) => vec![self.operator.step(pipeline, name.as_str())?],
            None => pipeline.iter().collect(),
        };
        let descriptors: Vec<_> = steps.iter().map(|step| step.descriptor()).collect();
        let mut selection = filter.selection(&descriptors);
        if filter.state == Some(StateFilter::Overdue) {
            let mut any = Vec::with_capacity(steps.len() * 2);
            for step in steps {
                any.push(ready_too_long(step, self.settings.ready_overdue_after));
                any.push(
                    Selection::Running(step.name().clone()).and(Selection::QuietFor(step.descriptor().max_runtime)),
                );
            }
            selection = selection.and(Selection::Or(any));
        }
        Ok(selection)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_long_summary_is_cut_with_an_ellipsis() {
        assert_eq!(super::cut("  disk full "), "disk full");
        let long = "é".repeat(200);
        let cut = super::cut(&long);
        assert_eq!(cut.chars().count(), super::FAILURE_SUMMARY_CHARS);
        assert!(cut.ends_with('…'));
    }
}
