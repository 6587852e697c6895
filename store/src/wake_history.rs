//! What a store handle's pushed wake-ups announced, kept for a while, so that
//! `wait_for_change_concerning` wakes a waiter only for a commit that concerns it.
//!
//! Each announcement (a PostgreSQL notification, a line of an embedded store's `<store>-wake`)
//! says whom its commit concerns (`ChangeConcern`) and becomes one numbered entry. A head read
//! while the announcements are complete is remembered with the number of entries before it: a
//! commit past that head was not visible to the read, so it committed after it and its
//! announcement is a later entry. A waiter from such a head reads the entries since, instead
//! of waking for every commit in between. Whatever it cannot vouch for wakes it: a head it
//! did not see read, entries dropped for room, announcements that stopped (an `Everyone`
//! entry marks every gap).
//!
//! A hand-on (`ChangeConcern::Handed`) wakes the waiter that waits as its taker
//! (`Waiting::taker`), and the taker asks whether one came since its last question
//! (`hand_on_notice`), so it reads its handed runs only when it was handed one, and not even
//! then when the announcements carried them (`push_carrying`: PostgreSQL's, where they fit).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;

use crate::port::{AnnouncementMark, HandOnNotice, StoreResult};
use autocomp_model::{ChangeConcern, ChangeInterest, ComponentName, Seq};

/// Entries kept; a waiter further behind wakes.
const ENTRIES_KEPT: usize = 4096;
/// Head reads remembered; a waiter from an older head wakes at its first change.
const HEADS_KEPT: usize = 64;

pub(crate) struct WakeHistory {
    state: Mutex<State>,
    /// The number of entries so far: waiters sleep on its changes.
    pushed: watch::Sender<u64>,
}

#[derive(Default)]
struct State {
    /// The latest entries, oldest first; the front one is number `first`.
    entries: VecDeque<Entry>,
    first: u64,
    /// Heads read while the announcements were complete, each with the number of entries
    /// before the read; newest last.
    heads: VecDeque<(Seq, u64)>,
    /// The takers (liveness records by component) that offered through this handle, on a
    /// store that announces its hand-ons: only their notices can tell.
    takers: BTreeMap<ComponentName, BTreeSet<String>>,
}

/// One announcement, and for a hand-on to a taker that offered through this handle, the
/// answer it carried for the taker, as the backend wrote it.
struct Entry {
    concern: ChangeConcern,
    carried: Option<Arc<str>>,
}

/// What a taker's question (`WakeHistory::hand_on_notice`) heard: the notice, and the answers
/// the hand-ons it tells of carried (`Some` only when it tells of some and each carried one),
/// for the backend to read into the notice's runs.
pub(crate) struct Heard {
    pub notice: HandOnNotice,
    pub carried: Option<Vec<Arc<str>>>,
}

impl State {
    fn next(&self) -> u64 {
        self.first + self.entries.len() as u64
    }
}

/// What the entries from a number on say to a waiter.
enum Verdict {
    /// One concerns it, or some are gone: wake.
    Wake,
    /// None concerns it; the next entry to look at.
    Quiet(u64),
}

/// Where a waiter's entries start: those that may concern it, and those that may hand a run
/// to it (never later: see `WakeHistory::marks_of`).
#[derive(Clone, Copy)]
struct Starts {
    concerns: u64,
    hand_ons: u64,
}

impl Starts {
    fn both(entry: u64) -> Self {
        Self { concerns: entry, hand_ons: entry }
    }
}

impl Default for WakeHistory {
    fn default() -> Self {
        Self { state: Mutex::default(), pushed: watch::channel(0).0 }
    }
}

impl WakeHistory {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// One announcement (or a gap in them: `Everyone`), waking every waiter.
    pub(crate) fn push(&self, concern: ChangeConcern) {
        self.push_carrying(concern, None);
    }

    /// One announcement with what it carried for its taker (a hand-on's answer), kept only
    /// for a taker that offered through this handle: every process hears every hand-on.
    pub(crate) fn push_carrying(&self, concern: ChangeConcern, carried: Option<Arc<str>>) {
        let next = {
            let mut state = self.state();
            if state.entries.len() == ENTRIES_KEPT {
                state.entries.pop_front();
                state.first += 1;
            }
            let carried = carried.filter(|_| match &concern {
                ChangeConcern::Handed { component, liveness } => {
                    state.takers.get(component).is_some_and(|livenesses| livenesses.contains(liveness))
                }
                _ => false,
            });
            state.entries.push_back(Entry { concern, carried });
            state.next()
        };
        self.pushed.send_replace(next);
    }

    /// The announcements stopped (a listen connection lost, a wake file removed): one gap
    /// entry wakes every waiter, and the heads read so far vouch for nothing any more. A
    /// waiter from such a head must read the head again rather than find the gap again at
    /// each wait, which made it look without pause until the head moved.
    pub(crate) fn announcements_stopped(&self) {
        self.state().heads.clear();
        self.push(ChangeConcern::Everyone);
    }

    /// The number the next entry will have: take it before a head read.
    pub(crate) fn mark(&self) -> u64 {
        self.state().next()
    }

    /// `head` was read after `mark`, and the announcements were complete at the mark.
    pub(crate) fn head_read(&self, head: Seq, mark: u64) {
        let mut state = self.state();
        if state.heads.len() == HEADS_KEPT {
            state.heads.pop_front();
        }
        state.heads.push_back((head, mark));
    }

    /// The entries from which the commits after `since` show, if `since` is a head read here.
    /// Of several reads of the same head, every one would serve (a commit past it came after
    /// each): the latest for what concerns the waiter, so an announcement of a commit the
    /// head already held, heard between two reads of it, is not met again at every wait (a
    /// waiter that woke for it, looked, found nothing new and slept from the same head, woke
    /// again at once, 64 times, until that read was forgotten); the earliest for hand-ons to
    /// a taker, since a later read may have come after its last question about them, and a
    /// sleep from there could miss a hand-on announced in between.
    fn marks_of(&self, since: Seq) -> Option<Starts> {
        let state = self.state();
        let mut reads = state.heads.iter().filter(|(head, _)| *head == since).map(|(_, mark)| *mark);
        let earliest = reads.next()?;
        Some(Starts { concerns: reads.next_back().unwrap_or(earliest), hand_ons: earliest })
    }

    fn verdict(&self, from: Starts, interest: &ChangeInterest, taker: Option<Taker<'_>>) -> Verdict {
        let state = self.state();
        if from.concerns.min(from.hand_ons) < state.first {
            return Verdict::Wake;
        }
        let after = |start: u64| state.entries.iter().skip(usize::try_from(start - state.first).unwrap_or(usize::MAX));
        let handed = |concern: &ChangeConcern| taker.is_some_and(|(c, l)| concern.hands_to(c, l));
        if after(from.concerns).any(|entry| entry.concern.concerns(interest))
            || after(from.hand_ons).any(|entry| handed(&entry.concern))
        {
            Verdict::Wake
        } else {
            Verdict::Quiet(state.next())
        }
    }

    pub(crate) fn subscribe(&self) -> watch::Receiver<u64> {
        self.pushed.subscribe()
    }

    /// A taker offered through this handle, on a store that announces its hand-ons: its
    /// notices can tell.
    pub(crate) fn expect_hand_ons(&self, component: &ComponentName, liveness: &str) {
        self.state().takers.entry(component.clone()).or_default().insert(liveness.to_owned());
    }

    /// Whether a run was announced handed to the taker since `since` (a notice's mark), while
    /// `complete` (every commit from now on is announced here), with what those hand-ons
    /// carried. It cannot tell (`handed: None`) for a taker that did not offer through this
    /// handle (or on a store that does not announce its hand-ons), without a mark, while
    /// incomplete, past entries dropped for room or an announcement that could have been
    /// anything (`Everyone`: a gap, an unreadable line).
    pub(crate) fn hand_on_notice(
        &self,
        component: &ComponentName,
        liveness: &str,
        since: Option<AnnouncementMark>,
        complete: bool,
    ) -> Heard {
        let state = self.state();
        let unknown = |mark| Heard { notice: HandOnNotice { mark, ..HandOnNotice::UNKNOWN }, carried: None };
        if !state.takers.get(component).is_some_and(|livenesses| livenesses.contains(liveness)) {
            return unknown(None);
        }
        let mark = complete.then(|| AnnouncementMark(state.next()));
        let Some(AnnouncementMark(from)) = since.filter(|since| complete && since.0 >= state.first) else {
            return unknown(mark);
        };
        let skip = usize::try_from(from - state.first).unwrap_or(usize::MAX);
        // A gap may hide hand-ons: what was heard then tells of some at most, not all.
        let (mut gap, mut carried) = (false, Vec::new());
        let mut all_carried = true;
        for entry in state.entries.iter().skip(skip) {
            if entry.concern.hands_to(component, liveness) {
                match &entry.carried {
                    Some(answer) => carried.push(Arc::clone(answer)),
                    None => all_carried = false,
                }
                // Told of one without carrying it: read, and what was carried is read too.
                if !all_carried {
                    break;
                }
            }
            gap |= entry.concern == ChangeConcern::Everyone;
        }
        let handed = match (!carried.is_empty() || !all_carried, gap) {
            (true, _) => Some(true),
            (false, true) => None,
            (false, false) => Some(false),
        };
        let carried = (all_carried && !gap && !carried.is_empty()).then_some(carried);
        Heard { notice: HandOnNotice { handed, mark, runs: None }, carried }
    }
}

/// A taker (its component and liveness record): a waiter as which wakes for a run handed to it.
pub(crate) type Taker<'a> = (&'a ComponentName, &'a str);

/// How one backend waits: its head read, whether its announcements are complete, and how
/// often to look at the head meanwhile.
pub(crate) struct Waiting<'a, Complete, ReadHead, PollHead> {
    pub history: &'a WakeHistory,
    /// The taker the waiter is, if it is one: a run handed to it wakes it too.
    pub taker: Option<Taker<'a>>,
    /// Whether a commit from now on is announced (the LISTEN or the file watch is up).
    pub complete: Complete,
    /// The backend's head read (which remembers itself in the history).
    pub read_head: ReadHead,
    /// The head read while the announcements are complete but none came (they may not reach
    /// this process): one that never waits for a writer in flight, since no announcement is
    /// judged until it answers (PostgreSQL's horizon as last confirmed), and not remembered.
    pub poll_head: PollHead,
    /// How often to read the head while the announcements are complete (in case they
    /// cannot reach this process although they seem to) and while they are not.
    pub poll_complete: Duration,
    pub poll_incomplete: Duration,
}

impl<Complete, ReadHead, Read, PollHead, PollRead> Waiting<'_, Complete, ReadHead, PollHead>
where
    Complete: FnMut() -> bool,
    ReadHead: FnMut() -> Read,
    Read: Future<Output = StoreResult<Seq>>,
    PollHead: FnMut() -> PollRead,
    PollRead: Future<Output = StoreResult<Seq>>,
{
    /// Waits until a commit after `since` concerns `interest` (or `timeout`): `None` when an
    /// announcement that concerns it woke it (the head is not read then), else the head.
    /// Where the announcements cannot vouch for the commits since `since`, any head move
    /// wakes it, as `wait_for_change` does.
    /// `read_after`: the mark taken before the reads that saw every commit up to `since`,
    /// else `since` is looked up among the heads read.
    pub(crate) async fn concerning_or_announced(
        &mut self,
        since: Seq,
        read_after: Option<AnnouncementMark>,
        interest: &ChangeInterest,
        timeout: Duration,
    ) -> StoreResult<Option<Seq>> {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut pushed = self.history.subscribe();
        // From which entry on the commits after `since` show, once known.
        let mut from = read_after.map(|mark| Starts::both(mark.0)).or_else(|| self.history.marks_of(since));
        // The entry from which a head move with no entry at all since means the
        // announcements do not reach us.
        let mut silent_from = from.map(|from| from.concerns);
        loop {
            pushed.borrow_and_update();
            let complete = (self.complete)();
            let mark = self.history.mark();
            if let Some(entries) = from {
                match self.history.verdict(entries, interest, self.taker) {
                    Verdict::Wake => return Ok(None),
                    Verdict::Quiet(next) => from = Some(Starts::both(next)),
                }
            }
            if from.is_none() || !complete {
                let head = (self.read_head)().await?;
                if head > since {
                    return Ok(Some(head));
                }
                if complete {
                    // Nothing after `since` yet: whatever comes is announced after the mark.
                    from = Some(Starts::both(mark));
                    silent_from = Some(mark);
                }
            }
            let now = tokio::time::Instant::now();
            if now >= deadline {
                return (self.read_head)().await.map(Some);
            }
            let poll = if complete { self.poll_complete } else { self.poll_incomplete };
            tokio::select! {
                _ = pushed.changed() => {}
                _ = tokio::time::sleep_until((now + poll).min(deadline)) => {
                    // The head moved without a single announcement since: they do not reach
                    // us (a pooler that drops notifications, a writer that cannot announce).
                    // A gap is marked, so no notice vouches for what was not heard.
                    if complete && silent_from == Some(self.history.mark()) {
                        let head = (self.poll_head)().await?;
                        if head > since {
                            self.history.push(ChangeConcern::Everyone);
                            return Ok(Some(head));
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicI64, Ordering};

    use super::*;
    use autocomp_model::EventType;

    fn types(names: &[&str]) -> BTreeSet<EventType> {
        names.iter().map(|n| EventType::new(*n).unwrap()).collect()
    }

    /// A backend whose head is a number the test moves, announcing as it is told.
    struct Fake {
        history: WakeHistory,
        head: AtomicI64,
        /// The taker its waits are as.
        taker: Option<(ComponentName, String)>,
    }

    impl Fake {
        fn new() -> Arc<Self> {
            Arc::new(Self { history: WakeHistory::default(), head: AtomicI64::new(5), taker: None })
        }

        async fn head(&self) -> StoreResult<Seq> {
            let mark = self.history.mark();
            let head = Seq(self.head.load(Ordering::SeqCst));
            self.history.head_read(head, mark);
            Ok(head)
        }

        fn commit(&self, concern: ChangeConcern) {
            self.head.fetch_add(1, Ordering::SeqCst);
            self.history.push(concern);
        }

        async fn wait(&self, since: Seq, interest: &ChangeInterest, timeout: Duration) -> Seq {
            let mut waiting = Waiting {
                history: &self.history,
                taker: self.taker.as_ref().map(|(c, l)| (c, l.as_str())),
                complete: || true,
                read_head: || self.head(),
                poll_head: || self.head(),
                poll_complete: Duration::from_millis(100),
                poll_incomplete: Duration::from_millis(25),
            };
            match waiting.concerning_or_announced(since, None, interest, timeout).await.unwrap() {
                Some(head) => head,
                None => self.head().await.unwrap(),
            }
        }
    }

    impl WakeHistory {
        /// The notice alone (these tests carry nothing).
        fn notice(
            &self,
            component: &ComponentName,
            liveness: &str,
            since: Option<AnnouncementMark>,
            complete: bool,
        ) -> HandOnNotice {
            self.hand_on_notice(component, liveness, since, complete).notice
        }
    }

    const QUIET: Duration = Duration::from_millis(300);
    const LONG: Duration = Duration::from_secs(30);

    #[tokio::test]
    async fn commits_after_a_head_read_wake_only_whom_they_concern() {
        let store = Fake::new();
        let interest = ChangeInterest::Types(types(&["A_Done"]));
        let seen = store.head().await.unwrap();
        // Committed between the head read and the wait: the history vouches for them.
        store.commit(ChangeConcern::Types(types(&["B_Done"])));
        store.commit(ChangeConcern::nobody());
        let started = tokio::time::Instant::now();
        assert_eq!(store.wait(seen, &interest, QUIET).await, Seq(7), "times out at the head");
        assert!(started.elapsed() >= QUIET, "slept through what does not concern it");
        let waiter = {
            let store = Arc::clone(&store);
            let interest = interest.clone();
            tokio::spawn(async move { store.wait(seen, &interest, LONG).await })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        store.commit(ChangeConcern::Types(types(&["A_Done", "C_Done"])));
        let started = tokio::time::Instant::now();
        assert_eq!(waiter.await.unwrap(), Seq(8));
        assert!(started.elapsed() < LONG / 2, "woke at the concerning commit");
        store.commit(ChangeConcern::Everyone);
        assert_eq!(store.wait(seen, &interest, LONG).await, Seq(9), "everyone wakes at once");
    }

    /// Announcements that stop wake the waiters once; a waiter from a head read before then
    /// polls the head instead of waking again at each wait (it looked without pause).
    #[tokio::test]
    async fn a_waiter_from_before_announcements_stopped_polls_instead_of_waking_at_once() {
        let store = Fake::new();
        let interest = ChangeInterest::Types(types(&["A_Done"]));
        let seen = store.head().await.unwrap();
        store.history.announcements_stopped();
        let mut waiting = Waiting {
            history: &store.history,
            taker: None,
            complete: || false,
            read_head: || store.head(),
            poll_head: || store.head(),
            poll_complete: Duration::from_millis(100),
            poll_incomplete: Duration::from_millis(25),
        };
        let started = tokio::time::Instant::now();
        let answer = waiting.concerning_or_announced(seen, None, &interest, QUIET).await.unwrap();
        assert_eq!(answer, Some(seen), "timed out at the unmoved head");
        assert!(started.elapsed() >= QUIET, "polled until the timeout, woke after {:?}", started.elapsed());
    }

    #[tokio::test]
    async fn what_the_history_cannot_vouch_for_wakes() {
        let store = Fake::new();
        let interest = ChangeInterest::Types(types(&["A_Done"]));
        // A head this handle never read: any move wakes.
        store.commit(ChangeConcern::nobody());
        assert_eq!(store.wait(Seq(5), &interest, LONG).await, Seq(6));
        // Entries dropped for room past a remembered head: wakes.
        let seen = store.head().await.unwrap();
        for _ in 0..=ENTRIES_KEPT {
            store.commit(ChangeConcern::nobody());
        }
        assert_eq!(store.wait(seen, &interest, LONG).await, Seq(6 + ENTRIES_KEPT as i64 + 1));
        // The head moved without any announcement reaching us: wakes at the next look, and
        // a taker's notice no longer vouches that nothing was handed to it.
        let (checker, liveness) = (ComponentName::new("checker").unwrap(), "local:h:1:n");
        store.history.expect_hand_ons(&checker, liveness);
        let asked = store.history.notice(&checker, liveness, None, true);
        let seen = store.head().await.unwrap();
        store.head.fetch_add(1, Ordering::SeqCst);
        assert_eq!(store.wait(seen, &interest, LONG).await, Seq(seen.0 + 1));
        assert_eq!(store.history.notice(&checker, liveness, asked.mark, true).handed, None);
    }
    /// An announcement heard between two reads of the same head is of a commit that head
    /// holds: a waiter from it sleeps (it woke at once at every wait, 64 times, until the
    /// first read was forgotten), unless the announcement hands a run to the taker it
    /// waits as, which may have come after the taker's last question.
    #[tokio::test]
    async fn an_announcement_heard_between_two_reads_of_a_head_wakes_only_its_taker() {
        let (checker, liveness) = (ComponentName::new("checker").unwrap(), "local:h:1:n");
        let store = Arc::new(Fake {
            history: WakeHistory::default(),
            head: AtomicI64::new(5),
            taker: Some((checker.clone(), liveness.to_owned())),
        });
        let interest = ChangeInterest::Types(types(&["A_Done"]));
        let seen = store.head().await.unwrap();
        store.history.push(ChangeConcern::Types(types(&["A_Done"])));
        assert_eq!(store.head().await.unwrap(), seen, "the announced commit was in the head");
        for _ in 0..3 {
            let started = tokio::time::Instant::now();
            assert_eq!(store.wait(seen, &interest, QUIET).await, seen);
            assert!(started.elapsed() >= QUIET, "woke for a commit the head held, after {:?}", started.elapsed());
        }
        store.history.push(ChangeConcern::Handed { component: checker.clone(), liveness: liveness.to_owned() });
        assert_eq!(store.head().await.unwrap(), seen);
        let started = tokio::time::Instant::now();
        store.wait(seen, &interest, LONG).await;
        assert!(started.elapsed() < QUIET, "slept through a hand-on to it heard between the reads");
    }

    /// A taker's notice holds what the hand-ons it tells of carried, only when each carried
    /// something and no gap came since (a gap may hide a hand-on: the taker reads then); what
    /// was carried for a taker that did not offer through the handle is not kept.
    #[test]
    fn a_notice_holds_what_its_hand_ons_carried_only_when_it_is_all_of_them() {
        let history = WakeHistory::default();
        let (checker, liveness) = (ComponentName::new("checker").unwrap(), "local:h:1:n");
        let handed = |to: &str| ChangeConcern::Handed { component: checker.clone(), liveness: to.to_owned() };
        let carried = |heard: &Heard| heard.carried.as_ref().map(|all| all.iter().map(|a| a.to_string()).collect());
        history.expect_hand_ons(&checker, liveness);
        let mut mark = history.hand_on_notice(&checker, liveness, None, true).notice.mark;
        let mut ask = |expected: (Option<bool>, Option<Vec<String>>)| {
            let heard = history.hand_on_notice(&checker, liveness, mark, true);
            assert_eq!((heard.notice.handed, carried(&heard)), expected);
            mark = heard.notice.mark;
        };
        ask((Some(false), None));
        history.push_carrying(handed(liveness), Some("one".into()));
        history.push_carrying(handed("local:h:2:n"), Some("another taker's".into()));
        history.push_carrying(handed(liveness), Some("two".into()));
        ask((Some(true), Some(vec!["one".into(), "two".into()])));
        history.push_carrying(handed(liveness), Some("three".into()));
        history.push(handed(liveness));
        ask((Some(true), None));
        history.push(ChangeConcern::Everyone);
        history.push_carrying(handed(liveness), Some("four".into()));
        ask((Some(true), None));
        history.push(ChangeConcern::Everyone);
        ask((None, None));
        let kept = history.state().entries.iter().filter(|entry| entry.carried.is_some()).count();
        assert_eq!(kept, 4, "another taker's answer is not kept");
    }

    /// A hand-on wakes the waiter that waits as its taker, whatever its interest; the
    /// taker's notice says it was handed one since its last question, and nothing else does.
    #[tokio::test]
    async fn a_hand_on_wakes_its_taker_and_its_notice_tells_it() {
        let (checker, liveness) = (ComponentName::new("checker").unwrap(), "local:h:1:n");
        let store = Arc::new(Fake {
            history: WakeHistory::default(),
            head: AtomicI64::new(5),
            taker: Some((checker.clone(), liveness.to_owned())),
        });
        let handed = || ChangeConcern::Handed { component: checker.clone(), liveness: liveness.to_owned() };
        let interest = ChangeInterest::Types(types(&["A_Done"]));
        assert_eq!(store.history.notice(&checker, liveness, None, true), HandOnNotice::UNKNOWN, "not offered");
        store.history.expect_hand_ons(&checker, liveness);
        let first = store.history.notice(&checker, liveness, None, true);
        assert_eq!(first.handed, None, "no mark yet: cannot tell");
        let quiet = store.history.notice(&checker, liveness, first.mark, true);
        assert_eq!(quiet.handed, Some(false));
        // Another taker's hand-on (another process, another step) tells and wakes nothing.
        let seen = store.head().await.unwrap();
        store.commit(ChangeConcern::Handed { component: checker.clone(), liveness: "local:h:2:n".into() });
        let other = store.history.notice(&checker, liveness, quiet.mark, true);
        assert_eq!(other.handed, Some(false));
        let started = tokio::time::Instant::now();
        store.wait(seen, &interest, QUIET).await;
        assert!(started.elapsed() >= QUIET, "slept through another taker's hand-on");
        let seen = store.head().await.unwrap();
        let waiter = {
            let (store, interest) = (Arc::clone(&store), interest.clone());
            tokio::spawn(async move { store.wait(seen, &interest, LONG).await })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        store.commit(handed());
        let started = tokio::time::Instant::now();
        assert_eq!(waiter.await.unwrap(), Seq(seen.0 + 1));
        assert!(started.elapsed() < LONG / 2, "woke at the hand-on");
        let told = store.history.notice(&checker, liveness, other.mark, true);
        assert_eq!(told.handed, Some(true));
        assert_eq!(store.history.notice(&checker, liveness, told.mark, true).handed, Some(false), "told once");
        // What the handle cannot vouch for: it cannot tell.
        assert_eq!(store.history.notice(&checker, liveness, told.mark, false).handed, None, "not listening");
        store.history.announcements_stopped();
        assert_eq!(store.history.notice(&checker, liveness, told.mark, true).handed, None, "a gap");
    }
}
