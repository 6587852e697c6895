//! The batch list's query string (`q`, `order`, `after`), which the list page, its CSV and
//! NDJSON exports and its bulk actions read alike: typed here, next to nothing but the
//! filter it parses into, so an export does not reach through the pages for it.

use autocomp_sboi::PageKey;
use axum::extract::Query;
use axum::extract::rejection::QueryRejection;
use serde::Deserialize;

use super::error::WebError;
use crate::filter::{Filter, parse_after};

/// The query of the list, its exports and its bulk actions.
#[derive(Debug, Deserialize, Default)]
pub struct ListQuery {
    pub q: Option<String>,
    pub order: Option<String>,
    pub after: Option<String>,
}

impl ListQuery {
    pub fn from(query: Result<Query<ListQuery>, QueryRejection>) -> Result<ListQuery, WebError> {
        query.map(|Query(q)| q).map_err(|e| WebError::unreadable("query string", e.status(), &e.body_text()))
    }

    pub fn filter(&self) -> Result<Filter, WebError> {
        Ok(Filter::parse(self.q.as_deref().unwrap_or_default(), self.order.as_deref())?)
    }

    pub fn after(&self) -> Result<Option<PageKey>, WebError> {
        match self.after.as_deref() {
            None | Some("") => Ok(None),
            Some(text) => Ok(Some(parse_after(text)?)),
        }
    }
}
