//! The OS threads a component's work runs on, kept for the next batch a while. Starting a
//! thread for every batch cost about 0.13 ms on a 2-core virtual machine where handing the
//! work to a thread parked for it costs 0.03 (a sleeping thread's wake-up), and a stage of a
//! trickle waits for one work call between its claim and its result; a thread that ends also
//! gives its stack back, a few system calls more on the cores the next stage needs.
//!
//! A thread serves one batch at a time, then waits for the next for `kept_idle` and ends if
//! none comes, so an idle watcher keeps no thread awake. A batch's work that panicked ends
//! its thread (a thread-local left half-written is not the next batch's); work that never
//! returns keeps its thread, which is never handed another.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

/// How long a work thread waits for another batch before it ends.
const KEPT_IDLE: Duration = Duration::from_secs(10);

/// One batch's work, run to its end; answers whether its thread may serve another batch.
pub(super) type Job = Box<dyn FnOnce() -> bool + Send>;

/// An idle thread: its number (to find it again) and where it takes its next job.
type Idle = (u64, mpsc::Sender<Job>);

pub(super) struct WorkThreads {
    /// The threads waiting for a job, the one idle for the shortest time last.
    idle: Mutex<Vec<Idle>>,
    /// Threads started so far: each one's number.
    started: AtomicU64,
    kept_idle: Duration,
}

impl Default for WorkThreads {
    fn default() -> Self {
        Self::keeping_idle(KEPT_IDLE)
    }
}

impl WorkThreads {
    fn keeping_idle(kept_idle: Duration) -> Self {
        Self { idle: Mutex::new(Vec::new()), started: AtomicU64::new(0), kept_idle }
    }

    /// Runs `job` on a thread that waits for one, or on a new thread (named `work`) if none
    /// does. An error only when a new thread is needed and the system refuses it.
    pub(super) fn run(self: &Arc<Self>, job: Job) -> std::io::Result<()> {
        let mut job = job;
        while let Some((_, inbox)) = self.idle().pop() {
            match inbox.send(job) {
                Ok(()) => return Ok(()),
                // Taken off the list, a thread waits for its job until it comes (`serve`), so
                // only a thread gone for another reason refuses one: the next.
                Err(mpsc::SendError(back)) => job = back,
            }
        }
        let number = self.started.fetch_add(1, Ordering::Relaxed);
        let threads = Arc::clone(self);
        std::thread::Builder::new().name("work".into()).spawn(move || threads.serve(number, job))?;
        Ok(())
    }

    /// A work thread's life: its first job, then each one handed to it while it waits.
    fn serve(&self, number: u64, first: Job) {
        let (inbox, jobs) = mpsc::channel::<Job>();
        let mut job = first;
        loop {
            if !job() {
                return;
            }
            self.idle().push((number, inbox.clone()));
            job = match jobs.recv_timeout(self.kept_idle) {
                Ok(next) => next,
                Err(RecvTimeoutError::Timeout) => {
                    let mut idle = self.idle();
                    match idle.iter().position(|(waiting, _)| *waiting == number) {
                        Some(at) => {
                            idle.swap_remove(at);
                            return;
                        }
                        // Taken off the list just now by `run`, whose job is on its way.
                        None => {
                            drop(idle);
                            match jobs.recv() {
                                Ok(next) => next,
                                Err(_) => return,
                            }
                        }
                    }
                }
                Err(RecvTimeoutError::Disconnected) => return,
            };
        }
    }

    fn idle(&self) -> MutexGuard<'_, Vec<Idle>> {
        self.idle.lock().unwrap_or_else(PoisonError::into_inner)
    }

    #[cfg(test)]
    fn idle_count(&self) -> usize {
        self.idle().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Barrier;
    use std::sync::atomic::AtomicUsize;
    use std::thread::ThreadId;
    use std::time::Instant;

    /// Runs a job that sends its thread's id back, and waits for it.
    fn thread_of(threads: &Arc<WorkThreads>, serve_again: bool) -> ThreadId {
        let (sender, receiver) = mpsc::channel();
        threads
            .run(Box::new(move || {
                sender.send(std::thread::current().id()).unwrap();
                serve_again
            }))
            .unwrap();
        receiver.recv_timeout(Duration::from_secs(10)).expect("the job ran")
    }

    fn wait_until(what: &str, condition: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !condition() {
            assert!(Instant::now() < deadline, "timed out waiting until {what}");
            std::thread::yield_now();
        }
    }

    #[test]
    fn the_next_batch_runs_on_the_thread_the_last_one_left_waiting() {
        let threads = Arc::new(WorkThreads::default());
        let first = thread_of(&threads, true);
        wait_until("the thread waits again", || threads.idle_count() == 1);
        assert_eq!(thread_of(&threads, true), first);
    }

    #[test]
    fn batches_at_once_each_get_a_thread_of_their_own() {
        let threads = Arc::new(WorkThreads::default());
        let all_started = Arc::new(Barrier::new(3));
        let (sender, receiver) = mpsc::channel();
        for _ in 0..3 {
            let (all_started, sender) = (Arc::clone(&all_started), sender.clone());
            threads
                .run(Box::new(move || {
                    // Returns only once all three run at the same time.
                    all_started.wait();
                    sender.send(std::thread::current().id()).unwrap();
                    true
                }))
                .unwrap();
        }
        let mut ids: Vec<ThreadId> = (0..3).map(|_| receiver.recv_timeout(Duration::from_secs(10)).unwrap()).collect();
        ids.dedup();
        assert_eq!(ids.len(), 3);
    }

    #[test]
    fn a_thread_whose_work_panicked_serves_no_other_batch() {
        let threads = Arc::new(WorkThreads::default());
        let first = thread_of(&threads, false);
        assert_eq!(threads.idle_count(), 0);
        assert_ne!(thread_of(&threads, true), first);
    }

    #[test]
    fn a_thread_idle_past_its_time_ends_and_the_next_batch_starts_another() {
        let threads = Arc::new(WorkThreads::keeping_idle(Duration::from_millis(20)));
        let first = thread_of(&threads, true);
        wait_until("the idle thread ends", || threads.idle_count() == 0 && Arc::strong_count(&threads) == 1);
        assert_ne!(thread_of(&threads, true), first);
    }

    #[test]
    fn every_job_runs_once_while_threads_end_as_they_are_handed_one() {
        // Threads kept idle for about as long as the gaps between jobs: many are taken off the
        // list at the moment they give up waiting.
        let threads = Arc::new(WorkThreads::keeping_idle(Duration::from_micros(200)));
        let ran = Arc::new(AtomicUsize::new(0));
        let jobs = 2_000;
        for n in 0..jobs {
            let ran = Arc::clone(&ran);
            threads
                .run(Box::new(move || {
                    ran.fetch_add(1, Ordering::SeqCst);
                    true
                }))
                .unwrap();
            if n % 3 == 0 {
                std::thread::sleep(Duration::from_micros(150));
            }
        }
        wait_until("every job ran", || ran.load(Ordering::SeqCst) >= jobs);
        wait_until("every thread ended", || Arc::strong_count(&threads) == 1);
        assert_eq!(ran.load(Ordering::SeqCst), jobs);
    }
}
