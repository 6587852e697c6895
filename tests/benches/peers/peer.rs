//! The peer job queues under test: their worker and enqueuer scripts, Redis for Celery.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use autocomp_e2e::wait_until;

use super::processes::Proc;
use super::{CELERY, Done, GRAPHILE, PROCRASTINATE, System, WORKERS};

/// A peer job queue: its worker and enqueuer scripts (tests/assets/peers, copied into a temp
/// dir next to the installed packages), its 4 workers, Redis for Celery, and the file stage 4
/// appends finished items to.
pub(super) struct Peer {
    // Dropped first: the workers, then the enqueuer, then Redis.
    workers: Vec<Proc>,
    enqueuer: Enqueuer,
    redis: Option<Proc>,
    system: &'static str,
    peers: PathBuf,
    env: Vec<(String, String)>,
    done_file: PathBuf,
    /// Bytes of the done file already read.
    read: usize,
    dir: tempfile::TempDir,
}

/// A peer's enqueuer process: the bench writes commands to its stdin, it answers "ok" to each.
struct Enqueuer {
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
    unanswered: usize,
    proc: Proc,
}

impl Enqueuer {
    fn send(&mut self, command: &str) {
        let stdin = self.stdin.as_mut().expect("the enqueuer's stdin");
        writeln!(stdin, "{command}")
            .unwrap_or_else(|e| panic!("the enqueuer took no command: {e}\n{}", self.proc.log_tail()));
        stdin.flush().ok();
        self.unanswered += 1;
    }

    /// Waits for the line `expected` (the enqueuer's readiness or an answer).
    fn expect(&mut self, expected: &str, limit: Duration) {
        match self.lines.recv_timeout(limit) {
            Ok(line) if line.trim() == expected => {}
            Ok(line) => panic!("the enqueuer said {line:?}, not {expected:?}\n{}", self.proc.log_tail()),
            Err(_) => panic!("no {expected:?} from the enqueuer within {limit:?}\n{}", self.proc.log_tail()),
        }
    }

    fn answered_all(&mut self, limit: Duration) {
        while self.unanswered > 0 {
            self.expect("ok", limit);
            self.unanswered -= 1;
        }
    }
}

impl Drop for Enqueuer {
    fn drop(&mut self) {
        // EOF on stdin ends it cleanly; Proc's drop kills it if it does not.
        self.stdin.take();
        let proc = &mut self.proc;
        wait_until(Instant::now() + Duration::from_secs(5), || proc.exited().is_some());
    }
}

impl Peer {
    pub(super) fn start(system: &'static str, database_url: Option<String>, peers: &Path) -> Peer {
        let dir = tempfile::tempdir().expect("a temp dir");
        let assets = Path::new(env!("CARGO_MANIFEST_DIR")).join("assets/peers");
        // The scripts next to the installed packages: node resolves `graphile-worker` from
        // the script's own dir; Python's bytecode caches land here, not in the work tree.
        for file in ["graphile.mjs", "peers_procrastinate.py", "peers_celery.py"] {
            std::fs::copy(assets.join(file), dir.path().join(file)).expect("a peer script copied");
        }
        std::os::unix::fs::symlink(peers.join("node/node_modules"), dir.path().join("node_modules"))
            .expect("node_modules linked");
        let done_file = dir.path().join("done.txt");
        std::fs::write(&done_file, "").unwrap();
        let mut env = vec![
            ("DONE_FILE".to_owned(), done_file.display().to_string()),
            ("PYTHONPATH".to_owned(), dir.path().display().to_string()),
        ];
        if let Some(url) = database_url {
            env.push(("DATABASE_URL".into(), url));
        }
        let redis = (system == CELERY).then(|| {
            let (proc, url) = start_redis(dir.path());
            env.push(("REDIS_URL".into(), url));
            proc
        });
        let enqueuer_command = match system {
            GRAPHILE => vec!["node".to_owned(), "graphile.mjs".into(), "enqueue".into()],
            PROCRASTINATE => python(peers, &["-m", "peers_procrastinate", "enqueue"]),
            _ => python(peers, &["-m", "peers_celery", "enqueue"]),
        };
        let log = dir.path().join("enqueuer.log");
        let mut command = peer_command(&enqueuer_command, dir.path(), &env);
        let log_file = std::fs::File::create(&log).unwrap();
        command.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(log_file).process_group(0);
        let mut proc = Proc::spawn_configured("enqueuer", command, &log);
        let stdin = proc.child.stdin.take();
        let stdout = proc.child.stdout.take().expect("the enqueuer's stdout");
        let (send, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if send.send(line).is_err() {
                    break;
                }
            }
        });
        let mut enqueuer = Enqueuer { stdin, lines, unanswered: 0, proc };
        // Creating the schema (graphile's migrations, procrastinate's schema) happens here.
        enqueuer.expect("ready", Duration::from_secs(120));
        Peer { workers: Vec::new(), enqueuer, redis, system, peers: peers.to_owned(), env, done_file, read: 0, dir }
    }
}

fn python(peers: &Path, args: &[&str]) -> Vec<String> {
    let mut command = vec![peers.join("venv/bin/python").display().to_string()];
    command.extend(args.iter().map(|a| a.to_string()));
    command
}

fn peer_command(argv: &[String], dir: &Path, env: &[(String, String)]) -> Command {
    let mut command = Command::new(&argv[0]);
    command.args(&argv[1..]).current_dir(dir);
    for var in ["PGUSER", "PGPASSWORD", "PGDATABASE", "PGHOST", "PGPORT", "NODE_OPTIONS", "PYTHONSTARTUP"] {
        command.env_remove(var);
    }
    command.envs(env.iter().map(|(k, v)| (k, v)));
    command
}

/// `redis-server` on a free loopback port, its files in `dir`, Redis's defaults otherwise
/// (RDB snapshots, no AOF: a job is not fsynced, unlike PostgreSQL's); waits until it answers PING.
fn start_redis(dir: &Path) -> (Proc, String) {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut command = Command::new("redis-server");
    command.args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--dir"]).arg(dir);
    let mut proc = Proc::spawn("redis-server", command, &dir.join("redis.log"));
    let ping = || -> Option<()> {
        let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
        stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
        stream.write_all(b"PING\r\n").ok()?;
        let mut answer = [0u8; 7];
        stream.read_exact(&mut answer).ok()?;
        (&answer == b"+PONG\r\n").then_some(())
    };
    let up = wait_until(Instant::now() + Duration::from_secs(30), || proc.exited().is_some() || ping().is_some());
    assert!(up && proc.exited().is_none(), "redis-server did not answer PING\n{}", proc.log_tail());
    (proc, format!("redis://127.0.0.1:{port}/0"))
}

impl System for Peer {
    fn register_backlog(&mut self, first: u64, count: u64) {
        self.enqueuer.send(&format!("backlog {first} {count}"));
        self.enqueuer.answered_all(Duration::from_secs(600));
    }

    fn register_one(&mut self, id: u64) {
        self.enqueuer.send(&format!("one {id}"));
    }

    fn registered_all(&mut self) {
        self.enqueuer.answered_all(Duration::from_secs(60));
    }

    fn start_workers(&mut self) {
        for n in 1..=WORKERS {
            let argv = match self.system {
                GRAPHILE => vec!["node".to_owned(), "graphile.mjs".into(), "worker".into()],
                PROCRASTINATE => vec![
                    self.peers.join("venv/bin/procrastinate").display().to_string(),
                    "--app=peers_procrastinate.app".into(),
                    "worker".into(),
                    "--concurrency=2".into(),
                ],
                _ => vec![
                    self.peers.join("venv/bin/celery").display().to_string(),
                    "-A".into(),
                    "peers_celery".into(),
                    "worker".into(),
                    "--concurrency=2".into(),
                    "-n".into(),
                    format!("w{n}@%h"),
                ],
            };
            let command = peer_command(&argv, self.dir.path(), &self.env);
            let log = self.dir.path().join(format!("worker{n}.log"));
            self.workers.push(Proc::spawn(&format!("{} worker {n}", self.system), command, &log));
        }
    }

    fn poll_done(&mut self) -> Vec<Done> {
        let text = std::fs::read(&self.done_file).unwrap_or_default();
        let Some(end) = text.iter().rposition(|&b| b == b'\n').map(|i| i + 1) else { return Vec::new() };
        if end <= self.read {
            return Vec::new();
        }
        let new = String::from_utf8_lossy(&text[self.read..end]).into_owned();
        self.read = end;
        new.lines()
            .map(|line| {
                let numbers: Vec<i64> = line.split(' ').map(|n| n.parse().expect("a number")).collect();
                Done { id: numbers[0] as u64, registered: numbers[1], finished: numbers[2], stages: Vec::new() }
            })
            .collect()
    }

    fn worker_pids(&self) -> Vec<u32> {
        self.workers.iter().map(Proc::pid).collect()
    }

    fn server_pids(&self) -> Vec<u32> {
        self.redis.iter().map(Proc::pid).collect()
    }

    fn dead(&mut self) -> Option<String> {
        self.workers.iter_mut().chain(self.redis.as_mut()).find_map(Proc::exited)
    }

    fn logs(&self) -> String {
        self.workers.iter().chain(&self.redis).chain([&self.enqueuer.proc]).map(Proc::log_tail).collect()
    }
}
