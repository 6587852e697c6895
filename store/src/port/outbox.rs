//! `OutboxStore`: the notification outbox the notifiers share (notices by key, their leases and
//! the notifiers' cursor), apart because only `autocomp notify` uses it.

use std::time::Duration;

use super::StoreResult;
use crate::pipeline_state::{CursorMove, Enqueued, NewNotice, Notice, NoticeOutcome};
use crate::steering_rules;

port_trait! {
    /// The notification outbox.
    pub trait OutboxStore {
        /// Adds the notices whose keys the outbox does not hold yet and, with `cursor`, moves the
        /// notifiers' cursor from `cursor.from` to `cursor.to` if it is still at `from` (another
        /// notifier may have moved it: then it stays). Answers how many were new and the cursor.
        /// `cursor: None` only reads the cursor (`CURSOR_UNSET` before any notifier moved it).
        #[checked(steering_rules::check_notices(&notices)?; steering_rules::check_cursor(&cursor)?)]
        async fn enqueue_notices(&self, notices: Vec<NewNotice>, cursor: Option<CursorMove>) -> StoreResult<Enqueued>;

        /// Takes up to `limit` pending notices that are due (never sent, past their retry time,
        /// not leased to another notifier) for `holder`, leased to it for `lease`: no other
        /// notifier takes them until it settles them or the lease runs out. Oldest first.
        #[checked(steering_rules::check_take(holder, limit, lease)?)]
        async fn take_notices(&self, holder: &str, limit: usize, lease: Duration) -> StoreResult<Vec<Notice>>;

        /// Settles a notice `holder` took: sent (never taken again), or failed (taken again once
        /// `retry_in` has passed, its attempts counted). A `Conflict` when the notice is not
        /// leased to `holder` now (its lease ran out, whether or not another took it since, or it
        /// was sent); `Invalid` naming `holder` or `retry_in` (at most `MAX_NOTICE_RETRY`).
        #[checked(steering_rules::check_settle(key, holder, &outcome)?)]
        async fn settle_notice(&self, key: &str, holder: &str, outcome: NoticeOutcome) -> StoreResult<()>;

        /// The newest `limit` notices (1 to `MAX_NOTICES_PER_CALL`), pending and sent, newest first.
        #[checked(steering_rules::check_take("reader", limit, Duration::from_secs(1))?)]
        async fn recent_notices(&self, limit: usize) -> StoreResult<Vec<Notice>>;
    }
}
