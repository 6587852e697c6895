//! Pushed wake-ups from PostgreSQL: a connection of the store handle's own that `LISTEN`s on
//! the channel the schema's triggers notify at every commit moving the head, each saying whom
//! its commit concerns (schema 10). Waiters for a change (`wait_for_change`) sleep on its
//! history instead of polling, and those for a concerning change
//! (`wait_for_change_concerning`) read it; while it is not connected (starting, the server
//! restarting, `listen=off`) they poll as before. A hand-on announced with its taker's answer
//! (on `HANDED_CHANNEL`, schema 26) keeps the answer beside it for the taker's notice, which
//! takes it only under the seal of the handle's key (`announcement_key`).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::watch;
use tokio_postgres::AsyncMessage;

use super::announcement_key::AnnouncementKey;
use super::hand_on::carried_answer;
use super::options::PgOptions;
use crate::port::ready_claims::ReadyAnswer;
use crate::port::{AnnouncementMark, HandOnNotice, StoreResult};
use crate::wake_history::{Taker, Waiting, WakeHistory};
use autocomp_model::{BatchId, ChangeConcern, ChangeInterest, ComponentDescriptor, ComponentName, Seq};

/// How often a waiter that is woken by notifications still reads the head, in case they
/// cannot reach it: one cheap read per process every two seconds while idle.
const LISTENING_POLL: Duration = Duration::from_secs(2);

/// The channel `autocomp_notify_changed` (schema 8) notifies.
const CHANNEL: &str = "autocomp_store_changed";
/// The channel `autocomp_announce_handed` (schema 26) announces a hand-on on with its taker's
/// answer: `<component> <liveness> <seal> <answer>`. Of its own, so the releases before it
/// (which do not listen to it) are not woken by what concerns only the taker; whom it
/// concerns is what the `h:` announcement says.
const HANDED_CHANNEL: &str = "autocomp_handed";
/// Reconnecting after a lost listen connection starts this soon and backs off to the longest.
const RECONNECT_FIRST: Duration = Duration::from_millis(500);
const RECONNECT_LONGEST: Duration = Duration::from_secs(30);

/// What the listen task shares with the waiters.
struct Shared {
    /// One entry per notification, and one concerning everyone whenever listening starts or
    /// stops, so a waiter re-reads the head then (a change may have come while nobody listened).
    history: WakeHistory,
    /// The LISTEN is in place: a commit from now on is notified.
    listening: AtomicBool,
}

impl Shared {
    fn set_listening(&self, now: bool) {
        if self.listening.swap(now, Ordering::SeqCst) != now {
            if now {
                self.history.push(ChangeConcern::Everyone);
            } else {
                self.history.announcements_stopped();
            }
        }
    }
}

/// What the notices of one taker carried: the newest claim seq, and the last runs (claim
/// seq, batch, generation). A taker is handed one run at a time, each opened after the one
/// before it closed, so the seqs it is carried grow; a run heard again is one of the last.
#[derive(Clone, Default)]
struct Carried {
    through: i64,
    recent: std::collections::VecDeque<(i64, BatchId, i64)>,
}

impl Carried {
    /// How many of the last carried runs are told apart from a run the store's seqs went
    /// back to: a replay of an older one is read, and so worked once as well.
    const RECENT: usize = 16;
}

/// One per store handle; the task starts with the first waiter and ends with the handle.
pub(super) struct Listener {
    shared: Arc<Shared>,
    enabled: bool,
    /// What the announcements to the takers offered through this handle are sealed with.
    key: AnnouncementKey,
    /// Per taker (component, liveness): what notices have carried to it (`Carried`), so an
    /// authentic announcement heard again (a role that may connect may notify what it
    /// overheard) carries nothing a second time, also not to a runner started later on
    /// this handle.
    carried: std::sync::Mutex<HashMap<(ComponentName, String), Carried>>,
    task: std::sync::Mutex<Option<tokio::task::AbortHandle>>,
}

/// A waiter's view: whether to sleep until woken or poll, and the wake-ups.
pub(super) struct Wakes {
    shared: Arc<Shared>,
    receiver: watch::Receiver<u64>,
}

impl Wakes {
    /// Whether a commit made after this call wakes `changed`: only then may a waiter sleep
    /// longer than a poll.
    pub(super) fn listening(&mut self) -> bool {
        self.receiver.borrow_and_update();
        self.shared.listening.load(Ordering::SeqCst)
    }

    /// Resolves at the next wake-up after the last `listening` call.
    pub(super) async fn changed(&mut self) {
        if self.receiver.changed().await.is_err() {
            // The handle is gone; nothing will wake us again.
            std::future::pending::<()>().await;
        }
    }
}

impl Listener {
    pub(super) fn new(enabled: bool) -> Self {
        Self {
            shared: Arc::new(Shared { history: WakeHistory::default(), listening: AtomicBool::new(false) }),
            enabled,
            key: AnnouncementKey::random(),
            carried: Default::default(),
            task: Default::default(),
        }
    }

    /// What an offer through this handle leaves for its announcements to be sealed with:
    /// nothing with `listen=off`, so no writer builds an answer this handle would not hear.
    pub(super) fn announcement_key_blocks(&self) -> Option<Vec<u8>> {
        self.enabled.then(|| self.key.padded_blocks())
    }

    /// Before a head read: the history's mark, if notifications are complete now.
    pub(super) fn mark(&self) -> Option<u64> {
        self.shared.listening.load(Ordering::SeqCst).then(|| self.shared.history.mark())
    }

    /// After a head read that `mark` preceded.
    pub(super) fn head_read(&self, head: Seq, mark: Option<u64>) {
        if let Some(mark) = mark {
            self.shared.history.head_read(head, mark);
        }
    }

    /// A taker offered through this handle on a schema whose hand-ons are announced: they
    /// wake the handle's waiters, and the listen task starts now (with `listen=off` the
    /// handle hears none, and its notices cannot tell).
    pub(super) fn expect_hand_ons(&self, options: &PgOptions, component: &ComponentName, liveness: &str) {
        self.shared.history.expect_hand_ons(component, liveness);
        drop(self.wakes(options));
    }

    /// `HandOnStore::hand_on_notice`, from the notifications heard so far, with the runs
    /// they carried (none if any is not sealed with the handle's key or fails to read: the
    /// taker reads them all then), each once.
    pub(super) fn hand_on_notice(
        &self,
        component: &ComponentDescriptor,
        liveness: &str,
        since: Option<AnnouncementMark>,
    ) -> HandOnNotice {
        let complete = self.shared.listening.load(Ordering::SeqCst);
        let heard = self.shared.history.hand_on_notice(&component.name, liveness, since, complete);
        let runs = heard.carried.and_then(|carried| {
            let read = carried.iter().map(|sealed| {
                let unsealed = sealed.split_once(' ').filter(|(seal, answer)| {
                    self.key.sealed(&[component.name.as_str(), " ", liveness, " ", answer], seal)
                });
                let Some((_, answer)) = unsealed else {
                    // Not the server's (a role that may connect may notify): read instead.
                    tracing::warn!(component = %component.name, "a hand-on's announcement is not sealed with this taker's key: reading the runs");
                    return None;
                };
                carried_answer(component, liveness, answer)
                    .map_err(|failure| {
                        let error = failure.into_error();
                        tracing::warn!(component = %component.name, "a hand-on's announcement did not read ({error}): reading the runs");
                    })
                    .ok()
            });
            read.collect::<Option<Vec<_>>>()
        });
        let runs = runs.and_then(|runs| self.first_carried(&component.name, liveness, runs));
        HandOnNotice { runs, ..heard.notice }
    }

    /// The runs of `carried` not carried to the taker before, in claim order (each once);
    /// `None` (the taker reads) for a run at or below the newest carried that is not one of
    /// the last carried: the store's seqs went back (a failover to a standby that missed
    /// commits, a restore), and only a read tells which runs are the taker's now.
    fn first_carried(
        &self,
        component: &ComponentName,
        liveness: &str,
        mut carried: Vec<ReadyAnswer>,
    ) -> Option<Vec<ReadyAnswer>> {
        let run_of = |answer: &ReadyAnswer| {
            answer.claim.as_ref().map(|claim| (claim.run.claim_seq.0, claim.run.batch_id.clone(), claim.run.generation))
        };
        carried.sort_by_key(|answer| run_of(answer).map(|(seq, ..)| seq));
        let mut all = self.carried.lock().unwrap_or_else(|p| p.into_inner());
        let before = all.entry((component.clone(), liveness.to_owned())).or_default();
        let mut taker = before.clone();
        let mut first = Vec::with_capacity(carried.len());
        for answer in carried {
            let Some(run) = run_of(&answer) else { continue };
            if taker.recent.contains(&run) {
                continue;
            }
            if run.0 <= taker.through {
                return None;
            }
            taker.through = run.0;
            taker.recent.push_back(run);
            if taker.recent.len() > Carried::RECENT {
                taker.recent.pop_front();
            }
            first.push(answer);
        }
        *before = taker;
        Some(first)
    }

    /// The wake-ups, starting the listen task on first use; `None` with `listen=off`.
    pub(super) fn wakes(&self, options: &PgOptions) -> Option<Wakes> {
        if !self.enabled {
            return None;
        }
        let receiver = self.shared.history.subscribe();
        let mut task = self.task.lock().unwrap_or_else(|p| p.into_inner());
        if task.is_none() {
            let (shared, options) = (Arc::clone(&self.shared), options.clone());
            *task = Some(tokio::spawn(listen_forever(shared, options)).abort_handle());
        }
        Some(Wakes { shared: Arc::clone(&self.shared), receiver })
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        if let Some(task) = self.task.lock().unwrap_or_else(|p| p.into_inner()).take() {
            task.abort();
        }
    }
}

/// Connects, listens and passes notifications on until the connection ends, then again
/// after a pause; waiters poll meanwhile.
async fn listen_forever(shared: Arc<Shared>, options: PgOptions) {
    let mut pause = RECONNECT_FIRST;
    loop {
        match listen_once(&shared, &options).await {
            Ok(()) => pause = RECONNECT_FIRST,
            Err(error) => {
                tracing::debug!(store = %options.target, "listening for store changes: {error}; polling meanwhile");
            }
        }
        shared.set_listening(false);
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(RECONNECT_LONGEST);
    }
}

/// One listen connection, until it ends. `Ok` when it had been listening (a restart: retry
/// soon), `Err` when it never got that far.
async fn listen_once(shared: &Shared, options: &PgOptions) -> Result<(), String> {
    let tls = options.tls().map_err(|e| e.to_string())?;
    let config = super::config_for_new_connection(options);
    let (client, mut connection) = config.connect(tls).await.map_err(|e| super::describe_error(&e))?;
    let statement = format!("LISTEN {CHANNEL}; LISTEN {HANDED_CHANNEL}");
    let listen = client.batch_execute(&statement);
    tokio::pin!(listen);
    let mut listened = false;
    loop {
        tokio::select! {
            done = &mut listen, if !listened => {
                done.map_err(|e| super::describe_error(&e))?;
                listened = true;
                shared.set_listening(true);
            }
            message = std::future::poll_fn(|cx| connection.poll_message(cx)) => match message {
                Some(Ok(AsyncMessage::Notification(notified))) => {
                    let (concern, carried) = heard(notified.channel(), notified.payload());
                    shared.history.push_carrying(concern, carried);
                }
                Some(Ok(_)) => {}
                Some(Err(error)) if !listened => return Err(super::describe_error(&error)),
                Some(Err(_)) | None => return Ok(()),
            },
        }
    }
}

/// Whom a notification on `channel` concerns, and what it carried for its taker if it is a
/// hand-on announced with an answer (`HANDED_CHANNEL`): `<seal> <answer>`, the seal checked
/// when the taker asks (`Listener::hand_on_notice`). A liveness is printable ASCII without
/// spaces.
fn heard(channel: &str, payload: &str) -> (ChangeConcern, Option<Arc<str>>) {
    if channel != HANDED_CHANNEL {
        return (ChangeConcern::from_payload(payload), None);
    }
    let mut parts = payload.splitn(3, ' ');
    let (component, liveness, sealed) = (parts.next(), parts.next(), parts.next());
    let component = component.and_then(|name| ComponentName::new(name).ok());
    match (component, liveness.filter(|liveness| !liveness.is_empty()), sealed) {
        (Some(component), Some(liveness), Some(sealed)) => {
            (ChangeConcern::Handed { component, liveness: liveness.to_owned() }, Some(Arc::from(sealed)))
        }
        _ => (ChangeConcern::Everyone, None),
    }
}

impl super::PgBackend {
    /// Sleeps until the server notifies a commit (`listen=on`, the default), or polls the
    /// sequence every 25 ms while not listening (one cheap read, no lock); only when a seq
    /// past `since` was taken does it wait for the horizon. While listening it still looks
    /// every `LISTENING_POLL`, in case the notifications cannot reach it (a PgBouncer in
    /// transaction mode should say `listen=off`).
    pub(super) async fn pg_wait_for_change(&self, since: Seq, timeout: Duration) -> StoreResult<Seq> {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut wakes = self.inner.listener.wakes(&self.inner.options);
        loop {
            // Before the read: a commit after it wakes the wait below.
            let listening = wakes.as_mut().is_some_and(|wakes| wakes.listening());
            if self.latest_seq_taken().await? > since {
                let head = self.horizon().await?;
                if head > since {
                    return Ok(head);
                }
            }
            if tokio::time::Instant::now() >= deadline {
                return self.horizon().await;
            }
            let poll = if listening { LISTENING_POLL } else { Duration::from_millis(25) };
            let woken = async {
                match wakes.as_mut() {
                    Some(wakes) => wakes.changed().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = woken => {}
                _ = tokio::time::sleep_until((tokio::time::Instant::now() + poll).min(deadline)) => {}
            }
        }
    }
}

impl super::PgBackend {
    /// `wait_for_change_concerning`: sleeps until a notification concerns `interest`, reading
    /// what the commits since `since` announced when `since` is a head this handle read while
    /// listening; otherwise (and while not listening) as `pg_wait_for_change`: any head move.
    pub(super) async fn pg_wait_for_change_concerning(
        &self,
        since: Seq,
        interest: &ChangeInterest,
        timeout: Duration,
    ) -> StoreResult<Seq> {
        match self.pg_wait_for_concerning_change(since, None, interest, None, timeout).await? {
            Some(head) => Ok(head),
            None => crate::port::BatchStore::head(self).await,
        }
    }

    /// `wait_for_concerning_change`: `wait_for_change_concerning` without the head read
    /// after a notification that concerns `interest` (`None`), or that hands a run to
    /// `taker`, if it waits as one (`HandOnStore::wait_as_taker`).
    pub(super) async fn pg_wait_for_concerning_change(
        &self,
        since: Seq,
        read_after: Option<AnnouncementMark>,
        interest: &ChangeInterest,
        taker: Option<Taker<'_>>,
        timeout: Duration,
    ) -> StoreResult<Option<Seq>> {
        let Some(mut wakes) = self.inner.listener.wakes(&self.inner.options) else {
            return self.pg_wait_for_change(since, timeout).await.map(Some);
        };
        let mut waiting = Waiting {
            history: &self.inner.listener.shared.history,
            taker,
            complete: || wakes.listening(),
            read_head: || crate::port::BatchStore::head(self),
            poll_head: || async { self.read_number("head", super::calls::HORIZON_NOW).await.map(Seq) },
            poll_complete: LISTENING_POLL,
            poll_incomplete: Duration::from_millis(25),
        };
        waiting.concerning_or_announced(since, read_after, interest, timeout).await
    }
}
