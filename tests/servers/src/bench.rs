//! How a benchmark binary learns its size: run by `cargo bench` (with `--bench`) it does the
//! full run, every count and time budget multiplied by `AUTOCOMP_BENCH_SCALE` (default 1);
//! run by `cargo test --all-targets` (without it) it only smoke-tests at a tiny scale.

/// The scale a benchmark runs at.
#[derive(Debug, Clone, Copy)]
pub struct BenchScale {
    pub scale: f64,
    /// Not a measurement: `cargo test` checking that the bench still runs.
    pub smoke: bool,
}

impl BenchScale {
    /// Reads the command line and `AUTOCOMP_BENCH_SCALE`; `smoke_scale` is the scale of a
    /// smoke run.
    pub fn from_env(smoke_scale: f64) -> Self {
        if !std::env::args().skip(1).any(|arg| arg == "--bench") {
            return Self { scale: smoke_scale, smoke: true };
        }
        let scale = match std::env::var("AUTOCOMP_BENCH_SCALE") {
            Ok(text) => match text.trim().parse::<f64>() {
                Ok(scale) if scale.is_finite() && scale > 0.0 => scale,
                _ => {
                    eprintln!("AUTOCOMP_BENCH_SCALE={text:?} is not a positive number; using 1");
                    1.0
                }
            },
            Err(_) => 1.0,
        };
        Self { scale, smoke: false }
    }
}

/// The machine's load average over 1, 5 and 15 minutes, as `/proc/loadavg` says it.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|text| text.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// Clock ticks per second (`sysconf(_SC_CLK_TCK)`), the unit of `/proc/<pid>/stat`'s times.
pub fn clock_ticks() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 { ticks as f64 } else { 100.0 }
}

/// `/proc/<pid>/stat` fields after the command: (ppid, utime+stime, cutime+cstime) in seconds.
pub fn proc_stat(pid: &str) -> Option<(u32, f64, f64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    // fields[0] is the state (field 3); ppid is field 4, utime 14, stime 15, cutime 16, cstime 17.
    let at = |field: usize| fields.get(field - 3).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    let ppid = fields.get(1)?.parse().ok()?;
    Some((ppid, (at(14) + at(15)) / clock_ticks(), (at(16) + at(17)) / clock_ticks()))
}

/// `value` rounded, with a comma between thousands: `1,234,567`.
pub fn thousands(value: f64) -> String {
    let digits = format!("{:.0}", value.max(0.0));
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// CPU seconds of the PostgreSQL server: the postmaster, its live children, and the children
/// it has reaped.
pub fn server_cpu(postmaster: u32) -> f64 {
    let mut total = proc_stat(&postmaster.to_string()).map_or(0.0, |(_, own, reaped)| own + reaped);
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().filter(|n| n.bytes().all(|b| b.is_ascii_digit())) else { continue };
        if let Some((parent, own, _)) = proc_stat(pid)
            && parent == postmaster
        {
            total += own;
        }
    }
    total
}

/// A temporary directory on the virtio disk (`/var/tmp`, not tmpfs), where a bench's store
/// files and servers' data go, so every fsync reaches the disk.
pub fn disk_temp_dir(prefix: &str) -> tempfile::TempDir {
    tempfile::Builder::new().prefix(prefix).tempdir_in("/var/tmp").expect("a temp dir under /var/tmp")
}

/// The machine's CPU time so far, from the first line of `/proc/stat` (clock ticks of all its
/// CPUs): all of it, and the part stolen, the time a CPU of this virtual machine wanted to run
/// while the hypervisor ran another guest on it. On a shared host the stolen share swings by
/// the hour (0 one hour, 40% of a busy window the next), and every latency with it.
#[derive(Debug, Clone, Copy)]
pub struct CpuTimes {
    total: u64,
    stolen: u64,
}

impl CpuTimes {
    /// Now; zero where `/proc/stat` cannot be read.
    pub fn now() -> CpuTimes {
        let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
        // cpu user nice system idle iowait irq softirq steal guest guest_nice: the guest
        // times are counted in user and nice already.
        let ticks: Vec<u64> = stat
            .lines()
            .next()
            .filter(|line| line.starts_with("cpu "))
            .map(|line| line.split_whitespace().skip(1).take(8).filter_map(|v| v.parse().ok()).collect())
            .unwrap_or_default();
        CpuTimes { total: ticks.iter().sum(), stolen: ticks.get(7).copied().unwrap_or(0) }
    }

    /// Of the CPU time since `earlier`, the percentage stolen.
    pub fn stolen_percent_since(&self, earlier: CpuTimes) -> f64 {
        let total = self.total.saturating_sub(earlier.total);
        if total == 0 { 0.0 } else { 100.0 * self.stolen.saturating_sub(earlier.stolen) as f64 / total as f64 }
    }
}

/// How fast this machine is at the moment, printed beside what a benchmark measures on a
/// machine whose speed drifts (a shared virtual machine: the same code has run 30% slower an
/// hour later). `cpu_loop_ms`: the best of three runs of a fixed arithmetic loop in registers
/// (one core's speed). `memory_walk_ms`: the best of three walks of 500,000 dependent reads
/// through a 16 MiB random cycle, each a cache miss (what a neighbour's use of the shared
/// caches and memory slows). `wake_us`: p50 and p90 of a round trip to a thread blocked
/// reading a Unix socket, each after a 2 ms sleep, as a watcher or a server process is woken
/// after a quiet spell (what a trickle's every hop pays).
#[derive(Debug, Clone, Copy)]
pub struct MachinePace {
    pub cpu_loop_ms: f64,
    pub memory_walk_ms: f64,
    pub wake_us: (f64, f64),
}

impl std::fmt::Display for MachinePace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "CPU loop {:.1} ms, memory walk {:.1} ms, a sleeping thread's wake-up round trip p50 {:.0} us, p90 {:.0} us",
            self.cpu_loop_ms, self.memory_walk_ms, self.wake_us.0, self.wake_us.1
        )
    }
}

/// Measures `MachinePace` (about a second).
pub fn machine_pace() -> MachinePace {
    use std::io::{Read, Write};
    use std::time::{Duration, Instant};
    let cpu_loop_ms = (0..3)
        .map(|_| {
            let started = Instant::now();
            let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
            for _ in 0..20_000_000u32 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x = std::hint::black_box(x);
            }
            std::hint::black_box(x);
            started.elapsed().as_secs_f64() * 1000.0
        })
        .fold(f64::INFINITY, f64::min);
    let memory_walk_ms = memory_walk_ms();
    let (mut near, mut far) = std::os::unix::net::UnixStream::pair().expect("a socket pair");
    let echo = std::thread::spawn(move || {
        let mut byte = [0u8; 1];
        while far.read(&mut byte).is_ok_and(|n| n == 1) {
            if far.write_all(&byte).is_err() {
                break;
            }
        }
    });
    let mut trips: Vec<f64> = (0..300)
        .map(|_| {
            std::thread::sleep(Duration::from_millis(2));
            let started = Instant::now();
            let mut byte = [1u8; 1];
            near.write_all(&byte).expect("the echo thread reads");
            near.read_exact(&mut byte).expect("the echo thread answers");
            started.elapsed().as_secs_f64() * 1_000_000.0
        })
        .collect();
    drop(near);
    echo.join().ok();
    trips.sort_by(f64::total_cmp);
    let at = |q: f64| trips[((trips.len() as f64 * q) as usize).min(trips.len() - 1)];
    MachinePace { cpu_loop_ms, memory_walk_ms, wake_us: (at(0.5), at(0.9)) }
}

/// The best of three walks of 500,000 dependent reads through one random cycle over 16 MiB
/// (Sattolo's shuffle, a fixed seed: the same walk on every machine).
fn memory_walk_ms() -> f64 {
    const SLOTS: usize = 4 << 20;
    let mut next: Vec<u32> = (0..SLOTS as u32).collect();
    let mut seed: u64 = 0x2545_F491_4F6C_DD1D;
    for i in (1..SLOTS).rev() {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        next.swap(i, (seed % i as u64) as usize);
    }
    (0..3)
        .map(|_| {
            let started = std::time::Instant::now();
            let mut at = 0u32;
            for _ in 0..500_000 {
                at = next[at as usize];
            }
            std::hint::black_box(at);
            started.elapsed().as_secs_f64() * 1000.0
        })
        .fold(f64::INFINITY, f64::min)
}

/// `AUTOCOMP_BENCH_NESTED=1`: the statements inside the store's functions are counted too
/// (`pg_stat_statements.track = all`): where a call's server time goes, each figure inflated
/// by the counting.
pub fn nested_statements() -> bool {
    std::env::var_os("AUTOCOMP_BENCH_NESTED").is_some_and(|v| v == "1")
}

/// A PostgreSQL server that counts its statements (`pg_stat_statements`, utility statements
/// and plans too; those inside functions with `nested_statements`), the extension created in
/// its `postgres` database.
pub fn postgres_counting_statements() -> crate::Postgres {
    let mut options = crate::Options::default()
        .setting("shared_preload_libraries", "pg_stat_statements")
        .setting("pg_stat_statements.track_utility", "on")
        // Plans counted too: a statement planned at every call pays its planning on the
        // item's path.
        .setting("pg_stat_statements.track_planning", "on");
    if nested_statements() {
        options = options.setting("pg_stat_statements.track", "all");
    }
    let server = crate::Postgres::start_with(options);
    server.psql("postgres", "create extension pg_stat_statements");
    server
}

/// Leaves `server` quiet for the next system of a bench: what the systems before it left
/// for autovacuum (a job queue's deleted jobs, a pipeline's updated rows) vacuumed and
/// analyzed now, and a checkpoint, so none of it runs inside the next system's windows and
/// is charged to it. Says which autovacuum workers were running and how long it took.
pub fn quiet_server(server: &crate::Postgres) -> String {
    let started = std::time::Instant::now();
    let running = server.psql(
        "postgres",
        "SELECT count(*) || coalesce(': ' || string_agg(datname || ' ' || query, ', '), '') FROM pg_stat_activity \
         WHERE backend_type = 'autovacuum worker'",
    );
    let databases = server.psql("postgres", "SELECT datname FROM pg_database WHERE datallowconn");
    for database in databases.lines().map(str::trim).filter(|name| !name.is_empty()) {
        server.psql(database, "VACUUM (ANALYZE)");
    }
    server.psql("postgres", "CHECKPOINT");
    format!(
        "autovacuum workers running {}; every database vacuumed and analyzed, a checkpoint, in {:.1} s",
        running.trim(),
        started.elapsed().as_secs_f64()
    )
}
