//! The processes the peers bench starts and the CPU their process trees use.

use std::collections::{HashMap, HashSet};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use autocomp_e2e::wait_until;

/// A process the bench started, in a process group of its own (Celery's prefork children,
/// a shell's children) so that stopping it stops them all: SIGTERM to the group, then SIGKILL
/// after a grace period. Dropping it stops it, also when the bench panics.
pub(crate) struct Proc {
    pub(crate) name: String,
    pub(crate) child: Child,
    pub(crate) log: PathBuf,
}

impl Proc {
    /// Starts `command` with stdout and stderr appended to `log` (unless already redirected).
    pub(crate) fn spawn(name: &str, mut command: Command, log: &Path) -> Proc {
        let file = std::fs::OpenOptions::new().create(true).append(true).open(log).expect("a log file");
        command.stdin(Stdio::null()).stdout(file.try_clone().expect("log handle")).stderr(file).process_group(0);
        Self::spawn_configured(name, command, log)
    }

    pub(crate) fn spawn_configured(name: &str, mut command: Command, log: &Path) -> Proc {
        let child = command.spawn().unwrap_or_else(|e| panic!("cannot start {name} ({command:?}): {e}"));
        Proc { name: name.to_owned(), child, log: log.to_owned() }
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    pub(crate) fn exited(&mut self) -> Option<String> {
        self.child.try_wait().ok().flatten().map(|status| format!("{} exited ({status})", self.name))
    }

    pub(crate) fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        format!("--- {} ({})\n{}\n", self.name, self.log.display(), lines[lines.len().saturating_sub(20)..].join("\n"))
    }

    pub(crate) fn stop(&mut self, grace: Duration) {
        let group = -(self.child.id() as libc::pid_t);
        if self.child.try_wait().ok().flatten().is_none() {
            // SAFETY: kill(2) on the process group of a child we spawned and have not reaped.
            unsafe { libc::kill(group, libc::SIGTERM) };
            wait_until(Instant::now() + grace, || self.child.try_wait().ok().flatten().is_some());
        }
        // Whatever is left of the group (a worker's children), and the leader if it hung.
        // SAFETY: as above; the group id stays ours while any member lives.
        unsafe { libc::kill(group, libc::SIGKILL) };
        self.child.kill().ok();
        self.child.wait().ok();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(10));
    }
}

/// Clock ticks of CPU (user + system, of the processes and of their reaped children) used by
/// the process trees under `roots`, live descendants included, counted once each.
pub(crate) fn tree_ticks(roots: &[u32]) -> u64 {
    let mut table: HashMap<u32, (u32, u64)> = HashMap::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        // The fields after the command's closing parenthesis: ppid is the 2nd; utime, stime,
        // cutime and cstime the 12th to 15th.
        let Some((_, rest)) = stat.rsplit_once(')') else { continue };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let field = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok()).unwrap_or(0);
        table.insert(pid, (field(1) as u32, field(11) + field(12) + field(13) + field(14)));
    }
    let mut children: HashMap<u32, Vec<u32>> = HashMap::new();
    for (&pid, &(parent, _)) in &table {
        children.entry(parent).or_default().push(pid);
    }
    let mut seen = HashSet::new();
    let mut pending: Vec<u32> = roots.to_vec();
    let mut total = 0;
    while let Some(pid) = pending.pop() {
        if !seen.insert(pid) {
            continue;
        }
        total += table.get(&pid).map_or(0, |&(_, ticks)| ticks);
        pending.extend(children.get(&pid).into_iter().flatten());
    }
    total
}

pub(crate) fn ticks_to_ms(ticks: u64) -> f64 {
    ticks as f64 * 1000.0 / autocomp_test_servers::bench::clock_ticks()
}

/// A process's command name (`/proc/<pid>/comm`), empty once it is gone.
pub(crate) fn command_name(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default().trim().to_owned()
}

/// This process's children whose command name is `comm` (the harnesses' servers: ZooKeeper's
/// `java`, `sboi`), which the harnesses do not hand out.
pub(crate) fn children_named(comm: &str) -> Vec<u32> {
    let me = std::process::id();
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
        let name = command_name(pid);
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let parent = stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<u32>().ok());
        if name == comm && parent == Some(me) {
            found.push(pid);
        }
    }
    found
}

pub(crate) fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as i64
}
