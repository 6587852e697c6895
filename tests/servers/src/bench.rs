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
