//! The server's processes as the harness runs them: the watchdog that outlives a killed
//! test, the cluster dirs and template, running as the `postgres` user (and in a network
//! namespace), each command to its end within a limit, and what `/proc` says of a pid.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{OnceLock, mpsc};
use std::time::{Duration, Instant};

use super::{LIMIT, PARENT_DIR, QUIT_LIMIT, SERVER_USER, USER};
use crate::wait_until;

/// A detached shell that outlives this process: once the test process is gone, it stops
/// the server of `data` (whatever pid its `postmaster.pid` then names: SIGQUIT, then
/// SIGKILL), kills whatever still works in `dir` (an `initdb`, `cp` or `pg_basebackup` the
/// test was waiting for), removes a crashed server's stale shared memory segment, and
/// removes `dir`. It is in its own session, so a Ctrl-C to the test's process group does not
/// stop it, and holds none of the test's stdio (cargo would otherwise wait for it).
fn spawn_watchdog(data: &Path, dir: &Path) -> Child {
    const SCRIPT: &str = r#"
test_pid=$1 data=$2 dir=$3
state() { sed -n 's/^.*) \(.\).*/\1/p' "/proc/$1/stat" 2>/dev/null; }
alive() { s=$(state "$1"); [ -n "$s" ] && [ "$s" != Z ] && [ "$s" != X ]; }
while alive "$test_pid"; do sleep 1; done
pg=$(head -n 1 "$data/postmaster.pid" 2>/dev/null)
is_pg() { [ -n "$pg" ] && [ "$(cat "/proc/$pg/comm" 2>/dev/null)" = postgres ] && alive "$pg"; }
if is_pg; then
    kill -QUIT "$pg"
    i=0
    while is_pg && [ "$i" -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
    if is_pg; then kill -KILL "$pg"; fi
fi
in_dir() {
    find /proc -mindepth 2 -maxdepth 2 -name cwd \( -lname "$dir" -o -lname "$dir/*" \) 2>/dev/null | cut -d/ -f3
}
i=0
while pids=$(in_dir) && [ -n "$pids" ] && [ "$i" -lt 50 ]; do
    kill -KILL $pids 2>/dev/null
    sleep 0.1
    i=$((i + 1))
done
set -- $(sed -n 7p "$data/postmaster.pid" 2>/dev/null)
if [ -n "${2:-}" ]; then
    key=$(printf '0x%08x' "$1")
    if ipcs -m | awk -v key="$key" -v id="$2" '$1 == key && $2 == id && $6 == 0 { found = 1 } END { exit !found }'; then
        ipcrm -m "$2"
    fi
fi
rm -rf "$dir"
"#;
    let mut command = Command::new("sh");
    command
        .args(["-c", SCRIPT, "autocomp-pg-watchdog"])
        .arg(std::process::id().to_string())
        .arg(data)
        .arg(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    own_session(&mut command);
    command.spawn().expect("sh starts (the PostgreSQL watchdog)")
}

/// This process's template cluster: `initdb`-ed once (about 0.7 s), then copied for every
/// new server (about 0.2 s). Copies share the template's system identifier, which matters
/// only to replication between unrelated clusters (never done here). Like [`shared`], it is
/// never dropped: its watchdog removes it.
pub(super) fn template(bin: &Path) -> &'static Path {
    static TEMPLATE: OnceLock<PathBuf> = OnceLock::new();
    TEMPLATE.get_or_init(|| {
        // Its watchdog runs on without a handle.
        let (dir, _watchdog) = server_dir();
        let dir = dir.keep();
        let data = dir.join("data");
        let initdb = run(
            server_command(&bin.join("initdb"), &dir).arg("-D").arg(&data).args([
                "-A",
                "trust",
                "-U",
                USER,
                "--encoding=UTF8",
                "--locale=C",
                "--no-sync",
                "--no-instructions",
            ]),
            None,
            "initdb",
        );
        assert!(initdb.status.success(), "initdb failed: {}\n{}{}", initdb.status, initdb.stdout, initdb.stderr);
        data
    })
}

/// A new temp dir under /var/tmp that the server user can own and traverse, and its
/// watchdog (started at once, so that a test killed while the dir is still being filled
/// leaves nothing behind either).
pub(super) fn server_dir() -> (tempfile::TempDir, Child) {
    let dir = tempfile::Builder::new()
        .prefix("autocomp-pg-")
        .tempdir_in(PARENT_DIR)
        .unwrap_or_else(|e| panic!("a temp dir under {PARENT_DIR}: {e}"));
    let watchdog = spawn_watchdog(&dir.path().join("data"), dir.path());
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod 755 the server dir");
    if is_root() {
        let owner = server_user_ids();
        std::os::unix::fs::chown(dir.path(), Some(owner.0), Some(owner.1))
            .unwrap_or_else(|e| panic!("chown {SERVER_USER} {}: {e}", dir.path().display()));
    }
    (dir, watchdog)
}

pub(super) fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// The server user's uid and gid (`id`, to stay clear of getpwnam's static buffer).
pub(super) fn server_user_ids() -> (u32, u32) {
    static IDS: OnceLock<(u32, u32)> = OnceLock::new();
    *IDS.get_or_init(|| {
        let id = |flag: &str| -> u32 {
            let out = Command::new("id").arg(flag).arg(SERVER_USER).output().expect("`id` runs");
            assert!(
                out.status.success(),
                "no `{SERVER_USER}` user to run PostgreSQL as (tests run as root, which PostgreSQL refuses): \
                 install the server with `apt-get install -y postgresql`, which creates it"
            );
            String::from_utf8_lossy(&out.stdout).trim().parse().expect("a numeric id")
        };
        (id("-u"), id("-g"))
    })
}

/// `program` (`postgres`, `initdb`, `pg_ctl`, ...) as the server user when we are root
/// (PostgreSQL refuses root), in `cwd` (the server user may not be able to enter the test's
/// working dir), with `HOME` there too.
pub(super) fn server_command(program: &Path, cwd: &Path) -> Command {
    server_command_in(program, cwd, None)
}

/// [`server_command`] started in the network namespace `netns` when given. Only root may
/// enter one, so then the switch to the server user happens after entering it, in the
/// child, instead of through `Command::uid`.
pub(super) fn server_command_in(program: &Path, cwd: &Path, netns: Option<&str>) -> Command {
    let mut command = Command::new(program);
    let user = is_root().then(server_user_ids);
    match (netns, user) {
        (Some(netns), user) => enter_network(&mut command, netns, user),
        // std drops the supplementary groups when root sets a uid.
        (None, Some((uid, gid))) => {
            command.uid(uid).gid(gid);
        }
        (None, None) => {}
    }
    command.current_dir(cwd);
    clear_pg_environment(&mut command).env("HOME", cwd);
    command
}

/// Makes `command` start in the network namespace `netns` (`/var/run/netns/<netns>`), then
/// as `user` (uid, gid) if given.
pub(super) fn enter_network(command: &mut Command, netns: &str, user: Option<(u32, u32)>) {
    let path = format!("/var/run/netns/{netns}");
    let namespace = std::fs::File::open(&path).unwrap_or_else(|e| panic!("network namespace {path}: {e}"));
    // SAFETY: setns, setgroups, setgid and setuid are async-signal-safe and touch no memory
    // of this process; the namespace file stays open until the closure is dropped.
    unsafe {
        command.pre_exec(move || {
            if libc::setns(namespace.as_raw_fd(), libc::CLONE_NEWNET) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            if let Some((uid, gid)) = user
                && (libc::setgroups(0, std::ptr::null()) < 0 || libc::setgid(gid) < 0 || libc::setuid(uid) < 0)
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Puts the spawned process in a session of its own (as `pg_ctl` does for the postmaster):
/// a Ctrl-C or hangup meant for the test's process group does not reach it.
pub(super) fn own_session(command: &mut Command) {
    // SAFETY: setsid is async-signal-safe and touches no memory of this process.
    unsafe {
        command.pre_exec(|| {
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Waits at most `limit` for `child` to exit and reaps it.
pub(super) fn reap(child: &mut Child, limit: Duration) -> Option<ExitStatus> {
    let mut status = None;
    wait_until(Instant::now() + limit, || {
        status = child.try_wait().ok().flatten();
        status.is_some()
    });
    status
}

/// Drops the `PG*` variables of the test's environment (PGDATA, PGPORT, PGOPTIONS, ...):
/// every command here says what it means explicitly.
pub(super) fn clear_pg_environment(command: &mut Command) -> &mut Command {
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("PG") {
            command.env_remove(name);
        }
    }
    command
}

pub(super) struct Ran {
    pub(super) status: ExitStatus,
    pub(super) stdout: String,
    pub(super) stderr: String,
}

/// Runs `command` to its end with `input` on stdin, at most [`LIMIT`]; kills it and fails
/// the calling test if it takes longer.
pub(super) fn run(command: &mut Command, input: Option<&str>, what: &str) -> Ran {
    command.stdin(if input.is_some() { Stdio::piped() } else { Stdio::null() });
    command.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = command.spawn().unwrap_or_else(|e| panic!("{what}: cannot run {command:?}: {e}"));
    let pid = child.id();
    if let (Some(mut stdin), Some(input)) = (child.stdin.take(), input) {
        let input = input.to_owned();
        // A thread: a large script must not block on a full stdout pipe nobody reads yet.
        std::thread::spawn(move || stdin.write_all(input.as_bytes()).ok());
    }
    let (done, finished) = mpsc::channel();
    std::thread::spawn(move || done.send(child.wait_with_output()).ok());
    let output = match finished.recv_timeout(LIMIT) {
        Ok(output) => output,
        Err(_) => {
            // SAFETY: kill has no memory effects; the child is not reaped before we do this.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            let output = finished.recv().ok().and_then(Result::ok);
            let (stdout, stderr) = output
                .map(|o| {
                    (String::from_utf8_lossy(&o.stdout).into_owned(), String::from_utf8_lossy(&o.stderr).into_owned())
                })
                .unwrap_or_default();
            panic!(
                "{what} still running after {LIMIT:?}; killed it: {command:?}\n--- stdout\n{stdout}--- stderr\n{stderr}"
            );
        }
    };
    let output = output.unwrap_or_else(|e| panic!("{what}: waiting for {command:?}: {e}"));
    Ran {
        status: output.status,
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// A loopback port nobody listens on right now (it may be taken again before we bind it:
/// starting retries on another).
pub(super) fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a free loopback port");
    listener.local_addr().expect("its address").port()
}

/// The server status line of `postmaster.pid` (`starting`, `ready`, `standby`, `stopping`)
/// while it names postmaster `pid`.
pub(super) fn server_status(data: &Path, pid: u32) -> Option<String> {
    let text = std::fs::read_to_string(data.join("postmaster.pid")).ok()?;
    let lines: Vec<&str> = text.lines().collect();
    (lines.first()?.trim() == pid.to_string()).then(|| lines.get(7).map(|status| status.trim().to_owned()))?
}

/// `/proc/<pid>/stat`'s state field, if the process exists.
fn process_state(pid: u32) -> Option<(char, u32)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // "pid (comm) S ppid ...": comm may hold spaces and parentheses; it ends at the last ')'.
    let mut fields = stat.rsplit_once(')')?.1.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let parent = fields.next()?.parse().ok()?;
    Some((state, parent))
}

/// Whether `pid` is a live process: a zombie is dead (nobody may reap an orphaned
/// postmaster for a while: pid 1 is not always an init that does).
pub(super) fn alive(pid: u32) -> bool {
    process_state(pid).is_some_and(|(state, _)| state != 'Z' && state != 'X')
}

/// SIGKILLs the postmaster `pid` and its children (each in its own session, so not one
/// process group): stopped first, so that it forks no child we miss. Returns the pids.
pub(super) fn kill_server(pid: u32) -> Vec<u32> {
    // SAFETY (all kills here): kill has no memory effects.
    unsafe { libc::kill(pid as i32, libc::SIGSTOP) };
    // The stop is delivered asynchronously: wait until it is (or the process is gone).
    wait_until(Instant::now() + QUIT_LIMIT, || {
        process_state(pid).is_none_or(|(state, _)| state == 'T' || state == 'Z')
    });
    let mut pids: Vec<u32> = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse().ok())
        .filter(|&child| process_state(child).is_some_and(|(_, parent)| parent == pid))
        .collect();
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    for &child in &pids {
        unsafe { libc::kill(child as i32, libc::SIGKILL) };
    }
    pids.push(pid);
    pids
}

/// Removes the System V shared memory segment that a crashed and never restarted server
/// left behind, named on line 7 of its stale `postmaster.pid`, if nothing is attached to it.
/// PostgreSQL removes it on a shutdown or on the next start in the same data dir, never
/// otherwise; left, they pile up (one per crash test) until `shmmni` runs out.
pub(super) fn remove_stale_segment(data: &Path) {
    let Ok(text) = std::fs::read_to_string(data.join("postmaster.pid")) else { return };
    let Some(line) = text.lines().nth(6) else { return };
    let mut fields = line.split_whitespace().map(str::parse::<i32>);
    let (Some(Ok(key)), Some(Ok(id))) = (fields.next(), fields.next()) else { return };
    // SAFETY: shmid_ds is plain data (all zeroes is valid); IPC_STAT writes only into it.
    let mut segment: libc::shmid_ds = unsafe { std::mem::zeroed() };
    let stat = unsafe { libc::shmctl(id, libc::IPC_STAT, &mut segment) };
    if stat == 0 && segment.shm_perm.__key == key && segment.shm_nattch == 0 {
        // SAFETY: IPC_RMID takes no buffer.
        unsafe { libc::shmctl(id, libc::IPC_RMID, std::ptr::null_mut()) };
    }
}

pub(super) fn read_from(path: &Path, offset: u64) -> String {
    let mut text = Vec::new();
    if let Ok(mut file) = std::fs::File::open(path) {
        use std::io::{Seek, SeekFrom};
        file.seek(SeekFrom::Start(offset)).ok();
        file.read_to_end(&mut text).ok();
    }
    String::from_utf8_lossy(&text).into_owned()
}

pub(super) fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].iter().map(|line| format!("{line}\n")).collect()
}

/// `text` as a URL path segment or userinfo part: every byte but the unreserved ones as
/// `%XX`.
pub fn percent_encode(text: &str) -> String {
    text.bytes()
        .map(|byte| match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => (byte as char).to_string(),
            _ => format!("%{byte:02X}"),
        })
        .collect()
}
