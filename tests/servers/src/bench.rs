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
