//! Bulk actions from the browser: an action over every batch of the list's filter
//! (`Monitor::ids`), previewed (`Operator::preview_many`) and confirmed
//! (`perform_many_confirmed`) through `confirm`'s protocol. A confirm acts only on the
//! batches its preview planned against: if the filter now selects other batches, or one of
//! them changed, a fresh preview is shown instead.

use std::collections::HashSet;
use std::sync::Arc;

use autocomp_model::{BatchId, Event, IdempotencyKey, InvalidInput, Seq};
use autocomp_ops::operator::{BulkOutcome, BulkPreview, MAX_BULK_BATCHES, Operator, OperatorError};
use axum::Form;
use axum::extract::rejection::{FormRejection, QueryRejection};
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};

use super::access::Access;
use super::action_input::{Carrier, Confirm, Posted};
use super::actions::{Shown, changes_list, recorded, records};
use super::app::App;
use super::confirm::{
    self, Note, confirm_form, done_redirect, facts, field, form_fields, fresh_key, no_store, opening, query_fields,
    query_key, refuse_from_elsewhere, shown_again,
};
use super::error::WebError;
use super::gate::Caller;
use super::html::{Nav, esc, w};
use crate::filter::{Filter, encode};

/// Where a bulk action posts, and its preview's path.
const PATH: &str = "/bulk";

/// `POST /bulk`: the same over every batch of the filter (`Monitor::ids`). A preview asked
/// for is answered 303 to its address, `GET /bulk?...&key=K&since=S`. The confirm form
/// carries the preview's plan (the count and a digest of the ids, their versions and
/// planned writes); if the filter now selects other batches, or one of them changed, a new
/// preview is shown instead of acting on batches nobody looked at.
pub async fn bulk(
    State(app): State<Arc<App>>,
    caller: Caller,
    form: Result<Form<Vec<(String, String)>>, FormRejection>,
) -> Result<Response, WebError> {
    let access = &caller.access;
    let name = access.writer()?;
    let posted = Posted::parse(form_fields(form)?, Carrier::BulkForm)?;
    let filter = filter_of(&posted)?;
    let back = format!("/batches?{}", filter.url_query());
    let link = |e: WebError| e.with_link(&back, "Back to the batches");
    let operator = app.monitor.operator().acting_as(name);
    let Some(Confirm { plan, key }) = &posted.confirm else {
        posted.address(PATH, &[]).map_err(link)?;
        let since = head(&operator).await.map_err(|e| link(e.into()))?;
        let address = posted.address(PATH, &[("key", &fresh_key()), ("since", &since.0.to_string())]);
        return Ok(Redirect::to(&address.map_err(link)?).into_response());
    };
    let ids = app.monitor.ids(&filter).await.map_err(|e| link(e.into()))?;
    match operator.perform_many_confirmed(&ids, &posted.action, &posted.reason, plan, key).await {
        Ok(outcome) => {
            let summary = bulk_summary(posted.action.name(), ids.len(), &outcome);
            tracing::info!(operator = name, action = posted.action.name(), filter = %filter.query(), "{}", summary.lines().next().unwrap_or_default());
            Ok(done_redirect(caller.secure, &back, &summary))
        }
        Err(OperatorError::Refused(words)) => {
            let since = head(&operator).await.map_err(|e| link(e.into()))?.0.to_string();
            let key = fresh_key();
            let address = posted.preview_url(PATH, &[("key", &key), ("since", &since)]);
            Ok(shown_again(caller.secure, PATH, &address, &key, &words))
        }
        Err(e) => Err(link(e.into())),
    }
}

/// The filter a bulk action's fields carry.
fn filter_of(posted: &Posted) -> Result<Filter, WebError> {
    Ok(Filter::parse(field(&posted.fields, "q").unwrap_or_default(), field(&posted.fields, "order"))?)
}

/// The store's head: a confirm of a preview asked for now writes after it, so its page looks
/// for its key among the batches changed since.
async fn head(operator: &Operator) -> Result<Seq, OperatorError> {
    Ok(operator.store().await?.head().await?)
}

/// `GET /bulk?q=...&action=...&key=K&since=S`: the bulk preview, reading only. If a batch
/// holds the key its confirm derives for it, the confirm was done: the page says on how
/// many batches, and offers nothing to confirm. Never stored by the browser.
pub async fn bulk_preview(
    State(app): State<Arc<App>>,
    caller: Caller,
    headers: HeaderMap,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> Response {
    no_store(bulk_preview_page(&app, &caller, &headers, query).await)
}

async fn bulk_preview_page(
    app: &App,
    caller: &Caller,
    headers: &HeaderMap,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> Result<Response, WebError> {
    let access = &caller.access;
    let name = access.writer()?;
    refuse_from_elsewhere(headers)?;
    let fields = query_fields(query)?;
    let posted = Posted::parse(fields.clone(), Carrier::BulkQuery)?;
    let key = query_key(&fields)?;
    let since = field(&fields, "since").unwrap_or_default();
    let since = since.parse::<i64>().ok().filter(|s| *s >= 0).map(Seq).ok_or_else(|| {
        InvalidInput::new("since", since, "required: the store's seq when the preview was asked for, a whole number")
    })?;
    let filter = filter_of(&posted)?;
    let back = format!("/batches?{}", filter.url_query());
    let link = |e: WebError| e.with_link(&back, "Back to the batches");
    let operator = app.monitor.operator().acting_as(name);
    let ids = match done_or_ids(app, &operator, &filter, since, &key).await.map_err(|e| link(e.into()))? {
        Err(done) => return Ok(bulk_done(access, &posted, &filter, &back, &done)),
        Ok(ids) => ids,
    };
    let note = Note::take(headers, caller.secure, PATH, key.as_str());
    let preview = operator.preview_many(&ids, &posted.action, &posted.reason).await.map_err(|e| link(e.into()))?;
    let shown = Shown { name, posted: &posted, key: &key, note: note.text() };
    let body = bulk_preview_body(&shown, &filter, &back, &preview);
    let title = format!("Preview: {} on {} batches", posted.action.name(), preview.total);
    Ok(note.cleared(confirm::page(access, Nav::Batches, StatusCode::OK, &title, &body)))
}

/// The events a confirm of this preview recorded, if it was done (`Err`); else the ids of
/// the filter's batches, to preview.
async fn done_or_ids(
    app: &App,
    operator: &Operator,
    filter: &Filter,
    since: Seq,
    key: &IdempotencyKey,
) -> Result<Result<Vec<BatchId>, Vec<Event>>, OperatorError> {
    let (done, unfinished) = keyed_since(operator, since, key).await?;
    if !done.is_empty() {
        return Ok(Err(done));
    }
    let ids = app.monitor.ids(filter).await?;
    if let Some(seen) = unfinished {
        let rest: Vec<BatchId> = ids.iter().filter(|id| !seen.contains(*id)).cloned().collect();
        let done = operator.find_keyed_many(&rest, key).await?;
        if !done.is_empty() {
            return Ok(Err(done));
        }
    }
    Ok(Ok(ids))
}

/// Change-feed entries read per call when a bulk preview looks for its key.
const CHANGE_PAGE: usize = 1_000;

/// The events a bulk confirm with `key` recorded on the batches changed after `since` (the
/// store's head when the preview was asked for: the confirm wrote after it, perhaps taking
/// the batches out of the filter, as a rerun of `state:failed` does), up to
/// `MAX_BULK_BATCHES` batches; if more changed, also the batches looked at, so that the
/// caller looks at the filter's others too.
async fn keyed_since(
    operator: &Operator,
    since: Seq,
    key: &IdempotencyKey,
) -> Result<(Vec<Event>, Option<HashSet<BatchId>>), OperatorError> {
    let store = operator.store().await?;
    let mut seen: HashSet<BatchId> = HashSet::new();
    let mut done = Vec::new();
    let mut cursor = since;
    loop {
        let page = store.changes(cursor, CHANGE_PAGE).await?;
        let changed: Vec<BatchId> =
            page.changes.iter().map(|(_, id)| id.clone()).filter(|id| seen.insert(id.clone())).collect();
        done.extend(operator.find_keyed_many(&changed, key).await?);
        if page.changes.len() < CHANGE_PAGE || page.next >= page.head || page.next <= cursor {
            return Ok((done, None));
        }
        if seen.len() >= MAX_BULK_BATCHES {
            return Ok((done, Some(seen)));
        }
        cursor = page.next;
    }
}

/// A bulk preview whose confirm was done: on how many batches, the first of them; nothing
/// to confirm.
fn bulk_done(access: &Access, posted: &Posted, filter: &Filter, back: &str, done: &[Event]) -> Response {
    let mut body = String::new();
    let q = filter.query();
    let (first, last) = (done.iter().map(|e| e.seq).min(), done.iter().map(|e| e.seq).max());
    w!(body, "<h1>Done: {} on {} batches</h1>\n", esc(posted.action.name()), esc(done.len()));
    w!(
        body,
        "<p class=\"verdict\" role=\"status\">Done: this preview was confirmed, and its confirm recorded {} on {} \
         batches (seq {} to {}).</p>\n<dl class=\"facts\"><dt>Filter</dt><dd><a href=\"{}\"><code>{}</code></a></dd>\
         <dt>Reason</dt><dd>{}</dd></dl>\n",
        esc(posted.action.name()),
        esc(done.len()),
        esc(first.unwrap_or_default()),
        esc(last.unwrap_or_default()),
        esc(back),
        esc(if q.is_empty() { "every batch" } else { &q }),
        esc(posted.reason.trim())
    );
    let mut sample: Vec<&Event> = done.iter().collect();
    sample.sort_by_key(|e| e.seq);
    w!(
        body,
        "<div class=\"scroll\" role=\"region\" aria-label=\"Batches done\" tabindex=\"0\"><table class=\"grid\"><caption>The first {} of the {} batches it was done on</caption><thead><tr>\
         <th scope=\"col\">Batch</th><th scope=\"col\">Recorded</th><th scope=\"col\">Seq</th><th scope=\"col\">By\
         </th><th scope=\"col\">At</th></tr></thead><tbody>\n",
        esc(sample.len().min(BULK_DONE_SAMPLE)),
        esc(done.len())
    );
    for event in sample.iter().take(BULK_DONE_SAMPLE) {
        w!(
            body,
            "<tr><th scope=\"row\"><a href=\"/batches/{}\">{}</a></th><td>{}</td><td>{}</td><td><code>{}</code></td>\
             <td>{}</td></tr>\n",
            esc(encode(event.batch_id.as_str())),
            esc(&event.batch_id),
            esc(recorded(event)),
            esc(event.seq),
            esc(&event.agent),
            esc(event.at)
        );
    }
    body.push_str("</tbody></table></div>\n");
    w!(
        body,
        "<p>It cannot be confirmed again, and nothing more was written. To do it once more, preview it again from \
         the batches.</p>\n<p><a href=\"{}\">Back to the batches</a></p>\n",
        esc(back)
    );
    let title = format!("Done: {} on {} batches", posted.action.name(), done.len());
    confirm::page(access, Nav::Batches, StatusCode::OK, &title, &body)
}

/// How many batches a done bulk preview lists.
const BULK_DONE_SAMPLE: usize = 10;

fn bulk_preview_body(shown: &Shown, filter: &Filter, back: &str, preview: &BulkPreview) -> String {
    let posted = shown.posted;
    let q = filter.query();
    let heading = format!("Preview: {} on {} batches", esc(posted.action.name()), esc(preview.total));
    let mut body = opening(&heading, shown.note, &posted.action.to_string());
    let refused = preview.total - preview.applicable;
    let mut planned = String::new();
    w!(
        planned,
        "<dt>Filter</dt><dd><a href=\"{}\"><code>{}</code></a></dd><dt>Batches</dt><dd>{} selected: {} would be \
         acted on, {} refused</dd>",
        esc(back),
        esc(if q.is_empty() { "every batch" } else { &q }),
        esc(preview.total),
        esc(preview.applicable),
        esc(refused)
    );
    body.push_str(&facts(&planned, shown.name, &posted.reason));
    body.push_str(
        "<p>Nothing has been written yet. If the filter selects other batches, or one of them changes, before you \
         confirm, nothing is done and this preview is shown again.</p>\n",
    );
    body.push_str(&sample_table(preview));
    body.push_str(&refusals_table(&preview.refused, refused));
    if preview.applicable > 0 {
        let label = format!("{} on {} batches", posted.action.name(), preview.applicable);
        let hidden = posted.confirm_fields(&preview.plan, shown.key);
        body.push_str(&confirm_form(PATH, &hidden, &label, back, "Cancel, back to the batches"));
    } else {
        w!(body, "<p>Nothing to do. <a href=\"{}\">Back to the batches</a></p>\n", esc(back));
    }
    body
}

/// The first batches a bulk preview would act on: what each would record and change.
fn sample_table(preview: &BulkPreview) -> String {
    let mut body = String::new();
    if preview.sample.is_empty() {
        return body;
    }
    w!(
        body,
        "<div class=\"scroll\" role=\"region\" aria-label=\"Batches it would act on\" tabindex=\"0\"><table class=\"grid\"><caption>The first {} of {} batches it would act on</caption><thead><tr>\
         <th scope=\"col\">Batch</th><th scope=\"col\">Will record</th><th scope=\"col\">State changes</th>\
         <th scope=\"col\">It will report</th></tr></thead><tbody>\n",
        esc(preview.sample.len()),
        esc(preview.applicable)
    );
    for p in &preview.sample {
        w!(
            body,
            "<tr><th scope=\"row\"><a href=\"/batches/{}\">{}</a></th><td>{}</td><td>{}</td><td>{}</td></tr>\n",
            esc(encode(p.batch.as_str())),
            esc(&p.batch),
            esc(records(p)),
            esc(changes_list(p)),
            esc(&p.message)
        );
    }
    body.push_str("</tbody></table></div>\n");
    body
}

fn refusals_table(refused: &[(BatchId, String)], total: usize) -> String {
    let mut out = String::new();
    if refused.is_empty() {
        return out;
    }
    w!(
        out,
        "<div class=\"scroll\" role=\"region\" aria-label=\"Refusals\" tabindex=\"0\"><table class=\"grid\"><caption>The first {} of {} refusals</caption><thead><tr><th scope=\"col\">Batch</th>\
         <th scope=\"col\">Why</th></tr></thead><tbody>\n",
        esc(refused.len()),
        esc(total)
    );
    for (id, words) in refused {
        w!(
            out,
            "<tr><th scope=\"row\"><a href=\"/batches/{}\">{}</a></th><td>{}</td></tr>\n",
            esc(encode(id.as_str())),
            esc(id),
            esc(words)
        );
    }
    out.push_str("</tbody></table></div>\n");
    out
}

/// The outcome counts, what the first writes were, the first refusals and the error that
/// stopped it, if any.
fn bulk_summary(action: &str, total: usize, outcome: &BulkOutcome) -> String {
    let already = outcome.performed.iter().filter(|r| r.already_done).count();
    let written = outcome.performed.len() - already;
    let mut out = format!("{action} on {total} batches: {written} performed");
    if already > 0 {
        w!(out, ", {already} already done (nothing written for them)");
    }
    w!(out, ", {} refused", outcome.refused.len());
    if let Some((id, error)) = &outcome.stopped {
        let left = total.saturating_sub(outcome.performed.len() + outcome.refused.len());
        w!(out, ", stopped at {id} ({left} not attempted): {error}");
    }
    for report in outcome.performed.iter().take(3) {
        w!(out, "\n  {}", report.message);
    }
    if outcome.performed.len() > 3 {
        w!(out, "\n  ... and {} more", outcome.performed.len() - 3);
    }
    for (id, words) in outcome.refused.iter().take(3) {
        w!(out, "\n  refused {id}: {words}");
    }
    if outcome.refused.len() > 3 {
        w!(out, "\n  ... and {} more refusals", outcome.refused.len() - 3);
    }
    out
}
