//! `autocomp notify`: news by mail and webhook, each item once per channel. A pass finds
//! items (`find`: permanent failures and last steps' successes from the change feed after the
//! notifiers' cursor, opened circuits, long pauses, overdue work, batches waiting for a person,
//! the day's digest), puts them in the store's outbox keyed `<channel>:<what>` (a key the
//! outbox holds already is not added again, so any number of notifiers may find the same
//! item) moving the cursor in the same call, then delivers what is due (`send`). Config:
//! `notify.toml` in the config directory (`config`).

mod config;
mod find;
mod send;
mod text;

use std::sync::Arc;

use autocomp_model::{Seq, Timestamp};
use autocomp_sboi::BatchIndex;
use autocomp_store::pipeline_state::MAX_NOTICES_PER_CALL;
use autocomp_store::{CursorMove, NewNotice, ObjectStore};
use serde::Serialize;
use serde_json::{Value, json};

pub use config::{DigestAt, EventKind, MailConfig, NOTIFY_FILE, NotifyConfig, SmtpSecurity, SmtpServer, WebhookConfig};
pub use send::{KEY_HEADER, SIGNATURE_HEADER, signature};

use crate::operator::OperatorError;
use find::{Finder, Item};

/// What one `notify_once` did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct NotifyReport {
    /// Notices this pass put in the outbox (one per item and channel; items the outbox held
    /// already, found again, are not counted).
    pub found: u64,
    /// Notices delivered by this pass (found now or earlier).
    pub sent: u64,
    /// Deliveries that failed; each is tried again later.
    pub failed: u64,
    /// `<key>: <why>` per failed delivery.
    pub errors: Vec<String>,
    /// The notifiers' cursor in the change feed after the pass.
    pub cursor: Seq,
    /// What a person should know about the pass itself (a first run starting at the head, a
    /// notifier too far behind skipping to it).
    pub notes: Vec<String>,
}

impl NotifyReport {
    /// Nothing found, sent or failed, and nothing to say.
    pub fn is_quiet(&self) -> bool {
        self.found == 0 && self.sent == 0 && self.failed == 0 && self.notes.is_empty()
    }

    /// For a person: nothing at all when the pass was quiet (cron mails any output), else a
    /// line of counts, the notes and one line per failed delivery.
    pub fn render(&self) -> String {
        if self.is_quiet() {
            return String::new();
        }
        let mut out = String::new();
        for note in &self.notes {
            out.push_str(&format!("notify: {note}\n"));
        }
        if self.found + self.sent + self.failed > 0 {
            out.push_str(&format!(
                "notify: {} new, {} sent, {} failed (tried again later)\n",
                self.found, self.sent, self.failed
            ));
        }
        for error in &self.errors {
            out.push_str(&format!("notify: not delivered: {}\n", autocomp_toolkit::for_terminal(error)));
        }
        out
    }
}

/// One pass of the notifier, as `holder` (who takes notices from the outbox: e.g.
/// `notify@host#pid`): finds what is news, enqueues it with the cursor's move, delivers what
/// is due. Quiet (an empty report) when there is nothing to do. Failed deliveries are in the
/// report, not errors; an error is the store or the index failing.
pub async fn notify_once(
    store: Arc<dyn ObjectStore>,
    index: Arc<dyn BatchIndex>,
    config: &NotifyConfig,
    holder: &str,
) -> Result<NotifyReport, OperatorError> {
    let pipeline = crate::operator::pipeline_of(store.as_ref()).await?;
    let finder = Finder { store: store.as_ref(), index: index.as_ref(), config, pipeline, now: Timestamp::now() };
    let found = finder.find().await?;
    for note in &found.notes {
        tracing::info!("notify: {note}");
    }
    let notices: Vec<NewNotice> = found.items.iter().flat_map(|item| notices(item, &config.channels())).collect();
    let (added, cursor) = enqueue(store.as_ref(), notices, found.cursor).await?;
    let delivered = send::deliver(store.as_ref(), config, holder).await?;
    Ok(NotifyReport {
        found: added,
        sent: delivered.sent,
        failed: delivered.failed,
        errors: delivered.errors,
        cursor,
        notes: found.notes,
    })
}

/// An item as each channel's notice: the same body, keyed per channel.
fn notices(item: &Item, channels: &[&'static str]) -> Vec<NewNotice> {
    channels
        .iter()
        .map(|channel| {
            let key = format!("{channel}:{}", item.id);
            let mut body = item.facts.clone();
            body.insert("kind".into(), json!(item.kind.as_str()));
            body.insert("key".into(), json!(key));
            body.insert("subject".into(), json!(item.subject));
            body.insert("text".into(), json!(item.text));
            NewNotice {
                key,
                channel: (*channel).to_owned(),
                subject: item.subject.clone(),
                body: fit(Value::Object(body)),
            }
        })
        .collect()
}

/// A body the outbox takes (at most 64 KiB): one that is larger keeps its kind, key,
/// subject and the start of its text.
fn fit(body: Value) -> Value {
    const ROOM: usize = autocomp_store::pipeline_state::MAX_NOTICE_BYTES - 4 * 1024;
    if body.to_string().len() <= ROOM {
        return body;
    }
    let text: String = body["text"].as_str().unwrap_or_default().chars().take(8_000).collect();
    json!({
        "kind": body["kind"], "key": body["key"], "subject": body["subject"],
        "text": format!("{text}\n… (cut: the notice was too large)"), "cut": true,
    })
}

/// Adds the notices in calls the outbox takes, the cursor's move with the last one.
async fn enqueue(
    store: &dyn ObjectStore,
    mut notices: Vec<NewNotice>,
    cursor: Option<CursorMove>,
) -> Result<(u64, Seq), OperatorError> {
    let mut added = 0;
    while notices.len() > MAX_NOTICES_PER_CALL {
        let rest = notices.split_off(MAX_NOTICES_PER_CALL);
        added += store.enqueue_notices(std::mem::replace(&mut notices, rest), None).await?.added;
    }
    let last = store.enqueue_notices(notices, cursor).await?;
    Ok((added + last.added, last.cursor))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The monitor may run passes on a timer in a spawned task.
    #[allow(dead_code, unreachable_code, clippy::diverging_sub_expression)]
    fn a_pass_can_be_spawned() {
        fn spawnable<T: Send + 'static>(_: T) {}
        let (store, index, config): (Arc<dyn ObjectStore>, Arc<dyn BatchIndex>, Arc<NotifyConfig>) =
            (unimplemented!(), unimplemented!(), unimplemented!());
        spawnable(async move { notify_once(store, index, &config, "notify@host#1").await });
    }

    #[test]
    fn a_quiet_pass_renders_nothing_and_a_busy_one_says_what_it_did() {
        assert_eq!(NotifyReport::default().render(), "");
        let report = NotifyReport {
            found: 2,
            sent: 1,
            failed: 1,
            errors: vec!["webhook:failure:B1:7: https://h/x answered 503 Service Unavailable".into()],
            ..NotifyReport::default()
        };
        assert_eq!(
            report.render(),
            "notify: 2 new, 1 sent, 1 failed (tried again later)\n\
             notify: not delivered: webhook:failure:B1:7: https://h/x answered 503 Service Unavailable\n"
        );
    }

    #[test]
    fn each_channel_gets_its_own_key_and_a_body_the_outbox_takes() {
        let item = Item {
            kind: EventKind::Failure,
            id: "failure:B1:7".into(),
            subject: "[autocomp] checker failed on B1".into(),
            text: "x".repeat(100_000),
            facts: serde_json::Map::new(),
        };
        let notices = notices(&item, &["mail", "webhook"]);
        let keys: Vec<&str> = notices.iter().map(|n| n.key.as_str()).collect();
        assert_eq!(keys, ["mail:failure:B1:7", "webhook:failure:B1:7"]);
        for notice in &notices {
            assert!(notice.body.to_string().len() <= autocomp_store::pipeline_state::MAX_NOTICE_BYTES);
            assert_eq!(notice.body["key"], json!(notice.key));
            assert_eq!(notice.body["cut"], json!(true));
        }
    }
}
