//! One action on many batches: previewed ([`BulkPreview`]: counts, a sample, the refusals,
//! a plan token over them all), performed, and confirmed once ([`BulkDigest`]). Each batch
//! is written as `perform` writes one.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use autocomp_model::{Batch, BatchId, Event, IdempotencyKey, InvalidInput, Seq};
use autocomp_store::ObjectStore;
use sha2::{Digest as _, Sha256};

use super::Action;
use super::confirm::{Expect, derived_key, keyed};
use super::perform::perform_prepared;
use super::plan::Plan;
use super::prepared::Prepared;
use super::preview::ActionPreview;
use super::report::ActionReport;
use crate::operator::{Operator, OperatorError, unknown_batch};

/// Most batches one bulk action may name: bounds the work (and the store reads) of one
/// request.
pub const MAX_BULK_BATCHES: usize = 10_000;

/// How many previews and refusals a bulk preview shows.
const BULK_SAMPLE: usize = 10;

/// Batches read per store call by a bulk preview.
const BULK_READ_PAGE: usize = 500;

/// What one action would do to many batches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BulkPreview {
    /// Distinct batches named (a repeated id counts, and would be acted on, once).
    pub total: usize,
    /// How many of them the action would apply to; the rest would be refused.
    pub applicable: usize,
    /// The previews of the first batches it would apply to, in the order named.
    pub sample: Vec<ActionPreview>,
    /// The first refusals, in the order named, each in the words `perform` would use.
    pub refused: Vec<(BatchId, String)>,
    /// The plan token: `TOTAL:DIGEST`, the SHA-256 (hex) of the distinct ids in order, each
    /// with its version and planned write (or refusal), for a confirm to post back
    /// ([`Operator::perform_many_confirmed`] acts only if it is unchanged).
    pub plan: String,
}

/// What one action did to many batches, in the order named.
#[derive(Debug)]
pub struct BulkOutcome {
    pub performed: Vec<ActionReport>,
    /// Batches the action was refused on (their state, an unknown id, no effective
    /// `--from` type), in the words `perform` uses; nothing was written for them.
    pub refused: Vec<(BatchId, String)>,
    /// A store or backend error that stopped the run at this batch (whether its event was
    /// written is unknown: `autocomp show` tells); the batches named after it were not
    /// attempted.
    pub stopped: Option<(BatchId, OperatorError)>,
}

impl Operator {
    /// What `perform_many` would do; writes nothing. Input that is wrong whatever the batch
    /// (reason, operator name, component, `--from`, more than `MAX_BULK_BATCHES` ids) is an
    /// error of the whole call; a batch the action would be refused on is counted and listed.
    pub async fn preview_many(
        &self,
        ids: &[BatchId],
        action: &Action,
        reason: &str,
    ) -> Result<BulkPreview, OperatorError> {
        let ids = distinct_within_bound(ids)?;
        let prepared = Prepared::new(self, action, reason).await?;
        let mut next = prepared.store.head().await?;
        let mut preview = BulkPreview {
            total: ids.len(),
            applicable: 0,
            sample: Vec::new(),
            refused: Vec::new(),
            plan: String::new(),
        };
        let mut digest = BulkDigest::default();
        for page in ids.chunks(BULK_READ_PAGE) {
            let (page, mut found) = batches_by_id(prepared.store.as_ref(), page).await?;
            for id in page {
                let batch = found.remove(&id);
                let planned = match &batch {
                    Some(batch) => prepared.plan(batch),
                    None => Err(unknown_batch(id.as_str()).into()),
                };
                digest.add(&id, batch.as_ref(), planned.as_ref().ok());
                match (batch, planned) {
                    (Some(batch), Ok(plan)) => {
                        // Performed in this order, each appends one event.
                        next = Seq(next.0 + 1);
                        preview.add(&prepared, &batch, plan, next);
                    }
                    (_, planned) => {
                        let error = planned.err().unwrap_or_else(|| unknown_batch(id.as_str()).into());
                        preview.refuse(id, refusal_words(error)?);
                    }
                }
            }
        }
        preview.plan = digest.token();
        Ok(preview)
    }

    /// Performs `action` on each batch named (once, in the order named) as `perform` does.
    /// Input that is wrong whatever the batch fails the whole call before anything is
    /// written; a refused batch is listed and the others go on; a store or backend error
    /// stops the run there (`BulkOutcome::stopped`).
    pub async fn perform_many(
        &self,
        ids: &[BatchId],
        action: &Action,
        reason: &str,
    ) -> Result<BulkOutcome, OperatorError> {
        let ids = distinct_within_bound(ids)?;
        let prepared = Prepared::new(self, action, reason).await?;
        let plans = ids.iter().map(|id| (*id, Expect::Nothing, None)).collect();
        Ok(perform_each(&prepared, plans).await)
    }

    /// Confirms a bulk preview: `plan` is its [`BulkPreview::plan`], `key` the confirm's
    /// idempotency key (each batch's key is derived from it and the batch id). Unless some
    /// batch's log already holds its key (a repeated confirm: what it did is answered as
    /// already done, and nothing else is written: the ids named again may be the filter's
    /// batches as they are now, which nobody previewed), the ids, their versions and planned
    /// writes must be those previewed, else it is refused (`OperatorError::Refused`) saying
    /// so, with nothing written; each batch is then written only if it did not change since
    /// this check (else it is listed as refused).
    pub async fn perform_many_confirmed(
        &self,
        ids: &[BatchId],
        action: &Action,
        reason: &str,
        plan: &str,
        key: &IdempotencyKey,
    ) -> Result<BulkOutcome, OperatorError> {
        let ids = distinct_within_bound(ids)?;
        let prepared = Prepared::new(self, action, reason).await?;
        let (previewed, _) = BulkDigest::parse(plan)?;
        let keys: HashMap<&BatchId, IdempotencyKey> = ids.iter().map(|id| (*id, derived_key(key, id))).collect();
        let (now, versions, done) = digest_now(&prepared, &ids, &keys).await?;
        if !done.is_empty() {
            // Submitted again: what it did is answered, and nothing more is written.
            let plans = ids.iter().filter(|id| done.contains(**id)).map(|id| (*id, Expect::Nothing, Some(&keys[id])));
            let mut outcome = perform_each(&prepared, plans.collect()).await;
            for id in ids.iter().filter(|id| !done.contains(**id)) {
                outcome.refused.push(((*id).clone(), NOT_DONE_ON_A_REPEATED_CONFIRM.to_owned()));
            }
            return Ok(outcome);
        }
        if now != plan {
            let (count, _) = BulkDigest::parse(&now)?;
            return Err(OperatorError::Refused(format!(
                "the batches changed since your preview ({previewed} batches then, {count} now; a batch was written \
                 since, or what the action would write on it differs): nothing was done; review and confirm again"
            )));
        }
        let plans = ids
            .iter()
            .map(|id| {
                let expect = versions.get(*id).map_or(Expect::Nothing, |version| Expect::Batch(*version));
                (*id, expect, Some(&keys[id]))
            })
            .collect();
        Ok(perform_each(&prepared, plans).await)
    }

    /// Every one of `ids` is a batch of the store, else the first that is not is the error
    /// (`batch id`): a command naming batches checks them all before it writes.
    pub async fn require_batches(&self, ids: &[BatchId]) -> Result<(), OperatorError> {
        let ids = distinct_within_bound(ids)?;
        let store = self.store().await?;
        for page in ids.chunks(BULK_READ_PAGE) {
            let (page, found) = batches_by_id(store.as_ref(), page).await?;
            if let Some(missing) = page.iter().find(|id| !found.contains_key(*id)) {
                return Err(unknown_batch(missing.as_str()).into());
            }
        }
        Ok(())
    }

    /// The events a bulk confirm with `key` recorded on any of `ids` (each batch's key
    /// derived from `key` and its id, as `perform_many_confirmed` does); reads only. An id
    /// with no batch has none.
    pub async fn find_keyed_many(&self, ids: &[BatchId], key: &IdempotencyKey) -> Result<Vec<Event>, OperatorError> {
        let ids = distinct_within_bound(ids)?;
        let store = self.store().await?;
        let mut found = Vec::new();
        for page in ids.chunks(BULK_READ_PAGE) {
            let page: Vec<BatchId> = page.iter().map(|id| (*id).clone()).collect();
            for batch in store.get_batches(&page).await? {
                found.extend(keyed(&batch, &derived_key(key, &batch.id)).cloned());
            }
        }
        Ok(found)
    }
}

impl BulkPreview {
    /// A batch the action applies to: counted, and previewed while the sample has room.
    fn add(&mut self, prepared: &Prepared, batch: &Batch, plan: Plan, seq: Seq) {
        self.applicable += 1;
        if self.sample.len() < BULK_SAMPLE {
            self.sample.push(prepared.preview(batch, plan, seq));
        }
    }

    /// A batch the action is refused on: listed while the list has room.
    fn refuse(&mut self, id: BatchId, words: String) {
        if self.refused.len() < BULK_SAMPLE {
            self.refused.push((id, words));
        }
    }
}

/// What a repeated confirm says of a batch its first submit did not write.
const NOT_DONE_ON_A_REPEATED_CONFIRM: &str =
    "not done: this confirm was submitted before, and a second submit writes nothing new; preview again to act on it";

/// The plan token of the batches as they are now, each batch's version, and the batches
/// whose log holds their key already (a repeated confirm).
async fn digest_now(
    prepared: &Prepared,
    ids: &[&BatchId],
    keys: &HashMap<&BatchId, IdempotencyKey>,
) -> Result<(String, HashMap<BatchId, Seq>, HashSet<BatchId>), OperatorError> {
    let mut digest = BulkDigest::default();
    let mut versions: HashMap<BatchId, Seq> = HashMap::new();
    let mut done = HashSet::new();
    for page in ids.chunks(BULK_READ_PAGE) {
        let (page, mut found) = batches_by_id(prepared.store.as_ref(), page).await?;
        for id in page {
            let batch = found.remove(&id);
            let planned = batch.as_ref().map(|batch| prepared.plan(batch));
            digest.add(&id, batch.as_ref(), planned.as_ref().and_then(|p| p.as_ref().ok()));
            if let Some(batch) = batch {
                if keyed(&batch, &keys[&id]).is_some() {
                    done.insert(id.clone());
                }
                versions.insert(id, batch.changed_seq);
            }
        }
    }
    Ok((digest.token(), versions, done))
}

async fn perform_each(
    prepared: &Arc<Prepared>,
    plans: Vec<(&BatchId, Expect, Option<&IdempotencyKey>)>,
) -> BulkOutcome {
    let mut outcome = BulkOutcome { performed: Vec::new(), refused: Vec::new(), stopped: None };
    for (id, expect, key) in plans {
        match perform_prepared(prepared, id, expect, key).await {
            Ok(report) => outcome.performed.push(report),
            Err(error) => match refusal_words(error) {
                Ok(words) => outcome.refused.push((id.clone(), words)),
                Err(error) => {
                    outcome.stopped = Some((id.clone(), error));
                    break;
                }
            },
        }
    }
    outcome
}

/// A bulk preview's plan token, `TOTAL:SHA256`: the distinct ids in order, each with its
/// version and planned write, or `-` for an id with no batch and `refused` for a refusal.
#[derive(Default)]
struct BulkDigest {
    lines: BTreeMap<String, String>,
}

impl BulkDigest {
    fn add(&mut self, id: &BatchId, batch: Option<&Batch>, plan: Option<&Plan>) {
        let version = batch.map_or("-".to_owned(), |b| b.changed_seq.to_string());
        let writes = plan.map_or("refused".to_owned(), |p| p.write.describe());
        self.lines.insert(id.as_str().to_owned(), format!("{version}\t{writes}"));
    }

    fn token(&self) -> String {
        let mut hash = Sha256::new();
        for (id, line) in &self.lines {
            hash.update(id.as_bytes());
            hash.update(b"\t");
            hash.update(line.as_bytes());
            hash.update(b"\n");
        }
        format!("{}:{}", self.lines.len(), hex::encode(hash.finalize()))
    }

    /// The count and the digest of a token.
    fn parse(text: &str) -> Result<(usize, String), InvalidInput> {
        let bad =
            || InvalidInput::new("plan", text, "expected COUNT:DIGEST, as the bulk preview's confirm form posts it");
        let (count, digest) = text.split_once(':').ok_or_else(bad)?;
        let count = count.parse::<usize>().map_err(|_| bad())?;
        if digest.len() != 64 || !digest.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(bad());
        }
        Ok((count, digest.to_owned()))
    }
}

/// The ids of a bulk action, each once in the order first named, if there are not too many.
fn distinct_within_bound(ids: &[BatchId]) -> Result<Vec<&BatchId>, OperatorError> {
    if ids.len() > MAX_BULK_BATCHES {
        return Err(InvalidInput::new(
            "batch ids",
            format!("{} ids", ids.len()),
            format!("at most {MAX_BULK_BATCHES} batches per bulk action"),
        )
        .into());
    }
    let mut seen = HashSet::new();
    Ok(ids.iter().filter(|id| seen.insert(*id)).collect())
}

/// A bulk action's answer for one batch: its refusal (by the batch's state, or the batch
/// unknown or without the `--from` type) in the words `perform` uses. Any other error is
/// the whole call's.
fn refusal_words(error: OperatorError) -> Result<String, OperatorError> {
    match error {
        OperatorError::Refused(words) => Ok(words),
        OperatorError::Input(invalid) => Ok(invalid.to_string()),
        other => Err(other),
    }
}

/// One page of a bulk action's ids and the batches among them that exist, by id: one store
/// read, whatever the page's size.
async fn batches_by_id(
    store: &dyn ObjectStore,
    ids: &[&BatchId],
) -> Result<(Vec<BatchId>, HashMap<BatchId, Batch>), OperatorError> {
    let page: Vec<BatchId> = ids.iter().map(|id| (*id).clone()).collect();
    let found = store.get_batches(&page).await?.into_iter().map(|b| (b.id.clone(), b)).collect();
    Ok((page, found))
}
