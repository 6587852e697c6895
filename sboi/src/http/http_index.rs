//! `HttpIndex`: the `BatchIndex` port over the sboi service, so components and the
//! `autocomp` CLI work unchanged with an `http://` index URL. Every operation is safe to
//! repeat (a rebuild twice is only slower), so all of them ride out a service restart.

use std::time::Duration;

use async_trait::async_trait;
use autocomp_http::api::Operation;
use autocomp_http::client::{ClientOptions, HttpClient, Retry, client_token};
use autocomp_model::{BatchId, Selection, Seq, Trigger};
use autocomp_store::StoreError;

use super::wire::{self, Empty, QueryAnswer, op};
use crate::browse::{Page, PageRequest, Tally};
use crate::document::IndexedBatch;
use crate::engine::{CatchUp, IndexError, IndexResult};
use crate::port::BatchIndex;

/// A rebuild (or a reconcile) reads the whole store: at a million batches, minutes.
const REBUILD_TIMEOUT: Duration = Duration::from_secs(2 * 60 * 60);

pub struct HttpIndex {
    client: HttpClient,
}

impl HttpIndex {
    /// A client for the sboi service at `url` (`http://host:port[?retry_for=30s]`); the
    /// token (needed for `rebuild`) comes from `$AUTOCOMP_TOKEN` or `$AUTOCOMP_TOKEN_FILE`.
    pub fn new(url: &str) -> IndexResult<Self> {
        Self::with_token(url, client_token().map_err(StoreError::from)?)
    }

    pub fn with_token(url: &str, token: Option<String>) -> IndexResult<Self> {
        let options = ClientOptions::parse(url, "index url").map_err(StoreError::from)?;
        let client = HttpClient::new(options, "index service", token).map_err(StoreError::from)?;
        Ok(Self { client })
    }

    /// The whole answer of `/v1/query`: with `fresh`, as of the store's head (the service
    /// corrects its committed answer with the changes since, or past its bound of
    /// corrections waits, bounded, for its index); `stale` says whether it may miss some.
    pub async fn query_with(&self, trigger: &Trigger, fresh: bool) -> IndexResult<QueryAnswer> {
        self.call::<op::Query>(&wire::QueryRequest { trigger: trigger.clone(), fresh }, None).await
    }

    /// `POST /v1/reconcile` (needs the token): compares every document with the store and
    /// repairs what differs, while the service goes on indexing changes.
    pub async fn reconcile(&self) -> IndexResult<wire::ReconcileAnswer> {
        self.call::<op::Reconcile>(&Empty {}, Some(REBUILD_TIMEOUT)).await
    }

    async fn call<O: Operation>(&self, request: &O::Request, timeout: Option<Duration>) -> IndexResult<O::Answer> {
        self.client.call::<O>(request, Retry::Safe, timeout).await.map_err(|e| match StoreError::from(e) {
            StoreError::Unavailable(message) => IndexError::Unavailable(message),
            other => other.into(),
        })
    }
}

#[async_trait]
impl BatchIndex for HttpIndex {
    async fn query(&self, trigger: &Trigger) -> IndexResult<Vec<BatchId>> {
        let answer = self.query_with(trigger, true).await?;
        if answer.stale {
            // Not an error: the runner re-checks every candidate against the store.
            tracing::debug!(indexed_seq = %answer.indexed_seq, "the index service answered from a lagging index");
        }
        Ok(answer.batches)
    }

    async fn query_checked(&self, trigger: &Trigger) -> IndexResult<(Vec<BatchId>, bool)> {
        let answer = self.query_with(trigger, true).await?;
        Ok((answer.batches, !answer.stale))
    }

    async fn catch_up(&self) -> IndexResult<CatchUp> {
        self.call::<op::CatchUp>(&Empty {}, None).await
    }

    async fn covers(&self, _seq: Seq, _bound: Duration) -> IndexResult<bool> {
        // The service's queries are fresh: they answer as of the store's head at request
        // time, which is at least `seq` (or say `stale`, which `query` logs).
        Ok(true)
    }

    async fn rebuild(&self) -> IndexResult<usize> {
        let answer = self.call::<op::Rebuild>(&Empty {}, Some(REBUILD_TIMEOUT)).await?;
        Ok(answer.batches)
    }

    async fn document(&self, id: &BatchId) -> IndexResult<Option<IndexedBatch>> {
        let answer = self.call::<op::Document>(&wire::DocumentRequest { id: id.clone() }, None).await?;
        Ok(answer.document)
    }

    async fn tally(&self, selections: &[Selection], quietest: bool) -> IndexResult<Vec<Tally>> {
        let request = wire::TallyRequest { selections: selections.to_vec(), quietest };
        let answer = self.call::<op::Tally>(&request, None).await?;
        Ok(answer.tallies)
    }

    async fn page(&self, request: &PageRequest) -> IndexResult<Page> {
        let answer = self.call::<op::Page>(request, None).await?;
        Ok(answer.page)
    }
}
