//! One command run under supervision: its own process group, its stdout and stderr kept
//! within a budget (head and tail) in the run's captures, readable while it runs, its exit noticed without reaping it early, and the whole group killed on
//! cancellation (SIGTERM, a grace, SIGKILL), when it exits, or when this process exits.

use std::io::{self, Read};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Once, mpsc};
use std::time::{Duration, Instant};

use std::os::unix::process::CommandExt;

use autocomp_framework::{OutputStream, StreamCapture};

/// Longest pause between two looks at the child and the cancellation flag.
const MAX_POLL: Duration = Duration::from_millis(100);
/// How long to wait for the output readers once the group is gone: only a process that left
/// the group (setsid) and kept our pipes can hold them open longer, and we do not wait for it.
const READER_WAIT: Duration = Duration::from_secs(1);

/// What the command printed: `stdout` and `stderr`, each within its limit.
pub struct Printed {
    pub stdout: OutputStream,
    pub stderr: OutputStream,
}

pub struct Finished {
    pub status: ExitStatus,
    pub printed: Printed,
}

pub enum Outcome {
    Finished(Finished),
    /// Cancelled (timeout, shutdown, operator): the group was killed.
    Cancelled {
        printed: Printed,
    },
}

/// Runs `command` to completion or until `cancelled()` turns true, keeping at most
/// `output_limit` bytes of each of its stdout and stderr; `grace` is the time between
/// SIGTERM and SIGKILL on cancellation.
pub fn run(
    command: &mut Command,
    grace: Duration,
    captures: Captures,
    cancelled: impl Fn() -> bool,
) -> io::Result<Outcome> {
    command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).process_group(0);
    let mut child = command.spawn()?;
    // process_group(0) made the child the leader of a new group whose id is its pid.
    let group = Group::new(child.id() as libc::pid_t);
    let stdout = Reader::capture("stdout", captures.stdout, child.stdout.take());
    let stderr = Reader::capture("stderr", captures.stderr, child.stderr.take());

    // Short commands should not pay the full poll interval: start fast, back off.
    let mut pause = Duration::from_millis(2);
    let was_cancelled = loop {
        if group.leader_exited()? {
            break false;
        }
        if cancelled() {
            break true;
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(MAX_POLL);
    };
    if was_cancelled {
        group.signal(libc::SIGTERM);
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline && !group.leader_exited()? {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    // Whatever the command left running in its group goes with it, so nothing it started
    // outlives its run (a daemon meant to stay must detach with setsid). The leader is not
    // reaped yet, so the group id cannot have been reused by an unrelated process.
    let status = group.kill_and_reap(&mut child)?;
    let printed = Printed { stdout: stdout.finish(), stderr: stderr.finish() };
    Ok(if was_cancelled { Outcome::Cancelled { printed } } else { Outcome::Finished(Finished { status, printed }) })
}

/// A live process group, registered so that it is killed if this process exits first.
struct Group {
    pgid: libc::pid_t,
    slot: Option<usize>,
    /// Killed and reaped: its id may belong to someone else from now on.
    reaped: bool,
}

impl Group {
    fn new(pgid: libc::pid_t) -> Self {
        Self { pgid, slot: live_groups::register(pgid), reaped: false }
    }

    /// Whether the leader has exited, leaving it a zombie (WNOWAIT) so its pid stays ours.
    fn leader_exited(&self) -> io::Result<bool> {
        loop {
            // SAFETY: a zeroed siginfo_t is valid; waitid only writes into it.
            let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
            let flags = libc::WEXITED | libc::WNOHANG | libc::WNOWAIT;
            // SAFETY: plain syscall on our own child's pid with a valid out-pointer.
            let rc = unsafe { libc::waitid(libc::P_PID, self.pgid as libc::id_t, &mut info, flags) };
            if rc == 0 {
                // With WNOHANG, si_pid stays 0 while the child is still running.
                // SAFETY: waitid filled (or left zeroed) the struct; si_pid reads a plain field.
                return Ok(unsafe { info.si_pid() } != 0);
            }
            let error = io::Error::last_os_error();
            if error.kind() != io::ErrorKind::Interrupted {
                return Err(error);
            }
        }
    }

    fn signal(&self, signal: libc::c_int) {
        // SAFETY: killpg has no memory effects; ESRCH (group already gone) is fine.
        unsafe { libc::killpg(self.pgid, signal) };
    }

    fn kill_and_reap(mut self, child: &mut Child) -> io::Result<ExitStatus> {
        self.signal(libc::SIGKILL);
        self.unregister();
        self.reaped = true;
        child.wait()
    }

    fn unregister(&mut self) {
        if let Some(slot) = self.slot.take() {
            live_groups::unregister(slot, self.pgid);
        }
    }
}

impl Drop for Group {
    /// On an early error return the group must not be left running either.
    fn drop(&mut self) {
        if !self.reaped {
            self.signal(libc::SIGKILL);
            self.unregister();
        }
    }
}

/// Groups still running, killed by an `atexit` hook: after a timeout the runner records the
/// failure and exits without waiting for the work thread, which may not have got to it.
mod live_groups {
    use super::*;

    const SLOTS: usize = 256;
    static GROUPS: [AtomicI32; SLOTS] = [const { AtomicI32::new(0) }; SLOTS];
    static HOOK: Once = Once::new();

    extern "C" fn kill_all() {
        for slot in &GROUPS {
            let pgid = slot.swap(0, Ordering::SeqCst);
            if pgid > 0 {
                // SAFETY: killpg has no memory effects.
                unsafe { libc::killpg(pgid, libc::SIGKILL) };
            }
        }
    }

    pub fn register(pgid: libc::pid_t) -> Option<usize> {
        HOOK.call_once(|| {
            // SAFETY: registers a plain extern "C" function with no captured state.
            if unsafe { libc::atexit(kill_all) } != 0 {
                tracing::warn!("cannot register the exit hook; a timed-out command may outlive this process");
            }
        });
        let slot = GROUPS.iter().position(|s| s.compare_exchange(0, pgid, Ordering::SeqCst, Ordering::SeqCst).is_ok());
        if slot.is_none() {
            tracing::warn!(pgid, "more than {SLOTS} commands at once; this one is not killed if the process exits");
        }
        slot
    }

    pub fn unregister(slot: usize, pgid: libc::pid_t) {
        GROUPS[slot].compare_exchange(pgid, 0, Ordering::SeqCst, Ordering::SeqCst).ok();
    }
}

/// A stream read on its own thread into its capture, so a chatty command never blocks on a
/// full pipe; the capture keeps its head and tail within its limit however much it prints.
struct Reader {
    capture: StreamCapture,
    name: String,
    done: mpsc::Receiver<()>,
}

/// Where a command's two streams are captured: the run's own (`WorkContext::capture`), which
/// the runner saves while the command runs.
pub struct Captures {
    pub stdout: StreamCapture,
    pub stderr: StreamCapture,
}

impl Reader {
    fn capture(name: &str, capture: StreamCapture, source: Option<impl Read + Send + 'static>) -> Reader {
        let (sender, done) = mpsc::channel();
        if let Some(mut source) = source {
            let sink = capture.clone();
            std::thread::spawn(move || {
                let mut chunk = [0u8; 8192];
                // Once `finish` took the stream, a reader that outlived the wait drops the rest.
                while let Ok(n @ 1..) = source.read(&mut chunk) {
                    sink.push(&chunk[..n]);
                }
                sender.send(()).ok();
            });
        }
        Reader { capture, name: name.to_owned(), done }
    }

    fn finish(self) -> OutputStream {
        self.done.recv_timeout(READER_WAIT).ok();
        self.capture.finish().unwrap_or_else(|| OutputStream { name: self.name, ..Default::default() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_output_keeps_its_head_and_tail_within_the_limit() {
        let mut command = Command::new("sh");
        command.args(["-c", "echo first; i=0; while [ $i -lt 2000 ]; do echo line $i; i=$((i+1)); done; echo last"]);
        let Outcome::Finished(finished) = run(&mut command, Duration::from_secs(1), captures(100), || false).unwrap()
        else {
            panic!("not cancelled, so it must finish");
        };
        let stdout = finished.printed.stdout;
        assert!(stdout.head.starts_with("first\n") && stdout.tail.ends_with("last\n"), "{stdout:?}");
        assert!(stdout.kept_bytes() <= 100 && stdout.omitted_bytes > 0, "{stdout:?}");
        assert_eq!(finished.printed.stderr.total_bytes(), 0);
    }

    #[test]
    fn cancelling_kills_the_whole_group_even_when_it_ignores_sigterm() {
        let dir = tempfile::tempdir().unwrap();
        let pgid_file = dir.path().join("pgid");
        // The ignored SIGTERM is inherited by both sleeps: only the SIGKILL after the grace works.
        let script = "trap '' TERM; echo $$ > \"$1\"; sleep 300 & sleep 300";
        let mut command = Command::new("sh");
        command.args(["-c", script, "sh"]).arg(&pgid_file);
        // Cancel as soon as the command has started (its pgid is written).
        let written = || std::fs::read_to_string(&pgid_file).is_ok_and(|text| text.ends_with('\n'));
        let outcome = run(&mut command, Duration::from_millis(300), captures(1024), written).unwrap();
        assert!(matches!(outcome, Outcome::Cancelled { .. }));
        let pgid: i32 = std::fs::read_to_string(&pgid_file).unwrap().trim().parse().unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !live_members(pgid).is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(live_members(pgid), Vec::<String>::new());
    }

    #[test]
    fn a_finished_command_reports_its_status_and_output() {
        let mut command = Command::new("sh");
        command.args(["-c", "echo out; echo err >&2; exit 4"]);
        let Outcome::Finished(finished) = run(&mut command, Duration::from_secs(1), captures(1024), || false).unwrap()
        else {
            panic!("not cancelled, so it must finish");
        };
        assert_eq!(finished.status.code(), Some(4));
        let printed = finished.printed;
        assert_eq!((printed.stdout.name.as_str(), printed.stdout.text().as_str()), ("stdout", "out\n"));
        assert_eq!((printed.stderr.name.as_str(), printed.stderr.text().as_str()), ("stderr", "err\n"));
    }

    fn captures(limit: usize) -> Captures {
        Captures { stdout: StreamCapture::new("stdout", limit), stderr: StreamCapture::new("stderr", limit) }
    }

    /// Live (non-zombie) processes of a group, from /proc.
    fn live_members(pgid: i32) -> Vec<String> {
        let mut alive = Vec::new();
        for entry in std::fs::read_dir("/proc").unwrap().flatten() {
            let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else { continue };
            let Some((head, rest)) = stat.rsplit_once(')') else { continue };
            let fields: Vec<&str> = rest.split_whitespace().collect();
            if fields.len() > 2 && fields[2] == pgid.to_string() && fields[0] != "Z" {
                alive.push(format!("{head}) {}", fields[0]));
            }
        }
        alive
    }
}
