//! A Rust component's run output: the tracing events its `work` emits on the work thread, at
//! INFO and above, kept as the run's `log` stream (`INFO message key=value`, one line each),
//! whatever level stderr logs at. Owns the thread-local capture and the layer that feeds it.
//!
//! Only the work thread is captured: threads the work spawns itself log to stderr as usual
//! but not into the run's output (a thread-local is what makes the capture cost nothing on
//! every other thread, and a spawned thread cannot be told apart from any other).

use std::cell::RefCell;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use autocomp_model::{OutputCapture, OutputStream, RunOutput};
use tracing::field::{Field, Visit};
use tracing_subscriber::layer::Context;

/// The name of the stream a Rust component's log lines are kept in.
pub const LOG_STREAM: &str = "log";

/// Captures installed on some thread right now: while none is, the layer returns before
/// touching its thread-local.
static ACTIVE: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static CURRENT: RefCell<Option<LogCapture>> = const { RefCell::new(None) };
}

/// One stream of a run's output captured as it is printed, within its limit, and readable
/// while the run goes on: the work (or the thread reading a command's pipe) pushes, the
/// runner saves a snapshot every few seconds while the run is going (what `autocomp logs
/// --follow` and the batch page show), and the stream is finished once, when the run ends.
/// Cheap to clone: clones share the capture.
#[derive(Clone)]
pub struct StreamCapture(Arc<Mutex<Captured>>);

/// A stream being captured, then what `finish` made of it (kept for the saves that follow:
/// a command's streams end before its step does, and its output so far must not lose them).
enum Captured {
    Going(OutputCapture),
    Finished(OutputStream),
}

impl StreamCapture {
    /// A capture of stream `name` keeping at most `limit` bytes (its head and its tail).
    /// `WorkContext::capture` makes one the runner saves while the run goes on.
    pub fn new(name: &str, limit: usize) -> Self {
        StreamCapture(Arc::new(Mutex::new(Captured::Going(OutputCapture::new(name, limit)))))
    }

    /// Adds what was printed; once finished, drops it (a reader that outlives its run).
    pub fn push(&self, bytes: &[u8]) {
        if let Captured::Going(capture) = &mut *self.lock() {
            capture.push(bytes);
        }
    }

    /// What was kept, once; later calls get nothing (`None`) and later pushes are dropped.
    pub fn finish(&self) -> Option<OutputStream> {
        let mut captured = self.lock();
        let Captured::Going(capture) = &mut *captured else { return None };
        let stream = std::mem::replace(capture, OutputCapture::new("", 0)).finish();
        *captured = Captured::Finished(stream.clone());
        Some(stream)
    }

    /// Whether `finish` has taken the stream.
    fn finished(&self) -> bool {
        matches!(&*self.lock(), Captured::Finished(_))
    }

    /// Bytes printed so far, and the stream as kept so far (as finished, once it is).
    fn snapshot(&self) -> (u64, OutputStream) {
        match &*self.lock() {
            Captured::Going(capture) => (capture.total_bytes(), capture.snapshot()),
            Captured::Finished(stream) => (stream.total_bytes(), stream.clone()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Captured> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The streams of one run that the runner saves while the run goes on: the work thread's
/// log lines and whatever the work captures with `WorkContext::capture`.
#[derive(Clone, Default)]
pub(crate) struct LiveOutput(Arc<Mutex<Vec<StreamCapture>>>);

impl LiveOutput {
    pub(crate) fn register(&self, stream: StreamCapture) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).push(stream);
    }

    /// The streams, as kept so far (as finished, for those that are), with how many bytes
    /// were printed in all (what tells a snapshot worth saving from the last one saved).
    pub(crate) fn snapshot(&self) -> (u64, RunOutput) {
        let streams = self.0.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let mut printed = 0;
        let mut output = RunOutput::default();
        for (total, stream) in streams.iter().map(StreamCapture::snapshot) {
            printed += total;
            output.set(stream);
        }
        (printed, output)
    }

    /// The registered streams not finished yet, each finished now (for the result).
    pub(crate) fn finish_unfinished(&self) -> Vec<OutputStream> {
        let streams = self.0.lock().unwrap_or_else(|e| e.into_inner()).clone();
        streams.iter().filter(|s| !s.finished()).filter_map(StreamCapture::finish).collect()
    }
}

/// One run's log capture. Shared between the work thread (which writes) and the runner
/// (which takes what was kept when the run times out before the thread returns, and saves
/// it while the run goes on).
#[derive(Clone)]
pub(crate) struct LogCapture(StreamCapture);

impl LogCapture {
    /// A capture of at most `limit` bytes.
    pub(crate) fn new(limit: usize) -> Self {
        LogCapture(StreamCapture::new(LOG_STREAM, limit))
    }

    /// The stream, as the runner saves it while the run goes on.
    pub(crate) fn stream(&self) -> StreamCapture {
        self.0.clone()
    }

    /// Captures this thread's events until the guard is dropped.
    pub(crate) fn install(&self) -> Installed {
        CURRENT.with(|current| *current.borrow_mut() = Some(self.clone()));
        ACTIVE.fetch_add(1, Ordering::Relaxed);
        Installed(())
    }

    /// What was kept so far, once: later events are dropped (a timed-out run is recorded
    /// while its thread may still log).
    pub(crate) fn finish(&self) -> Option<OutputStream> {
        self.0.finish().filter(|stream| stream.total_bytes() > 0)
    }

    fn push(&self, line: &str) {
        self.0.push(line.as_bytes());
    }
}

/// Uninstalls the thread's capture when dropped (also when the work panics).
pub(crate) struct Installed(());

impl Drop for Installed {
    fn drop(&mut self) {
        CURRENT.with(|current| current.borrow_mut().take());
        ACTIVE.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The layer the framework's logging installs: appends each event to the capture of the
/// thread it is emitted on, if there is one (the logging setup filters it to INFO and above).
pub fn layer() -> autocomp_toolkit::logging::ExtraLayer {
    Box::new(CaptureLayer)
}

struct CaptureLayer;

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for CaptureLayer {
    fn on_event(&self, event: &tracing::Event<'_>, _context: Context<'_, S>) {
        if ACTIVE.load(Ordering::Relaxed) == 0 {
            return;
        }
        // `try_with`/`try_borrow`: an event logged while the thread-local is torn down or
        // while this very capture is being written (a field's Debug that logs) is skipped.
        let capture = CURRENT.try_with(|current| current.try_borrow().ok().and_then(|c| c.clone())).ok().flatten();
        let Some(capture) = capture else { return };
        capture.push(&line_of(event));
    }
}

/// `LEVEL message key=value ...`, newline-terminated.
fn line_of(event: &tracing::Event<'_>) -> String {
    let mut fields = Fields::default();
    event.record(&mut fields);
    let mut line = event.metadata().level().to_string();
    if !fields.message.is_empty() {
        line.push(' ');
        line.push_str(&fields.message);
    }
    line.push_str(&fields.rest);
    line.push('\n');
    line
}

#[derive(Default)]
struct Fields {
    message: String,
    rest: String,
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message.push_str(value);
        } else {
            write!(self.rest, " {}={value}", field.name()).ok();
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            write!(self.message, "{value:?}").ok();
        } else {
            write!(self.rest, " {}={value:?}", field.name()).ok();
        }
    }
}

#[cfg(test)]
mod tests {
    use tracing_subscriber::Layer as _;
    use tracing_subscriber::layer::SubscriberExt;

    use super::*;

    /// The layer under the INFO filter the logging setup gives it, as this thread's default.
    fn with_layer<T>(f: impl FnOnce() -> T) -> T {
        let subscriber =
            tracing_subscriber::registry().with(layer().with_filter(tracing_subscriber::filter::LevelFilter::INFO));
        tracing::subscriber::with_default(subscriber, f)
    }

    #[test]
    fn info_and_above_on_the_capturing_thread_become_lines() {
        let stream = with_layer(|| {
            tracing::info!("before the capture");
            let capture = LogCapture::new(1024);
            let _installed = capture.install();
            tracing::info!(pages = 3, file = "a.tif", "checked");
            tracing::debug!("too detailed");
            tracing::warn!("careful");
            tracing::error!(code = 7, "broken");
            let stream = capture.finish();
            assert!(capture.finish().is_none(), "finished once");
            stream
        })
        .expect("something was logged");
        assert_eq!(stream.name, LOG_STREAM);
        assert_eq!(stream.text(), "INFO checked pages=3 file=a.tif\nWARN careful\nERROR broken code=7\n");
    }

    #[test]
    fn other_threads_are_not_captured_and_nothing_logged_is_no_stream() {
        let stream = with_layer(|| {
            let capture = LogCapture::new(1024);
            let _installed = capture.install();
            std::thread::scope(|scope| {
                scope.spawn(|| tracing::info!("elsewhere"));
            });
            capture.finish()
        });
        assert_eq!(stream, None);
    }

    #[test]
    fn a_chatty_run_keeps_its_head_and_tail_within_the_limit() {
        let stream = with_layer(|| {
            let capture = LogCapture::new(200);
            let _installed = capture.install();
            for i in 0..1000 {
                tracing::info!("line {i}");
            }
            capture.finish()
        })
        .unwrap();
        assert!(stream.kept_bytes() <= 200, "{stream:?}");
        assert!(stream.head.starts_with("INFO line 0\n"), "{stream:?}");
        assert!(stream.tail.ends_with("INFO line 999\n"), "{stream:?}");
        assert!(stream.omitted_bytes > 0);
    }

    #[test]
    fn a_shared_capture_hands_over_what_it_kept_once_and_drops_the_rest() {
        with_layer(|| {
            let capture = LogCapture::new(1024);
            let installed = capture.install();
            tracing::info!("kept");
            let taken = capture.finish().unwrap();
            tracing::info!("after the run was recorded");
            drop(installed);
            assert_eq!(taken.text(), "INFO kept\n");
            assert!(capture.finish().is_none());
        });
    }
}
