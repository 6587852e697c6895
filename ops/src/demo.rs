//! `autocomp demo`: the whole pipeline on one machine with no servers. It writes sample
//! BagIt deliveries (a few deliberately broken) and an embedded-default config directory,
//! then runs the component binaries round after round the way cron would, and ends with a
//! batch x component table. The config stays in `DIR/config` for the operator commands.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use autocomp_model::{Batch, BatchId};
use autocomp_store::prelude::*;
use autocomp_store::{SqliteStore, StoreError};
use indicatif::{ProgressBar, ProgressStyle};
use md5::Md5;
use sha2::{Digest, Sha256};

use autocomp_framework::exit::RunError;
use autocomp_model::{ComponentDescriptor, ComponentState};

/// The component binaries in pipeline order, with the event type each records.
const STEPS: [(&str, &str); 4] = [
    ("batch-trigger", "Data_Received"),
    ("checksum-verifier", "Checksums_Verified"),
    ("structure-checker", "Structure_Checked"),
    ("archiver", "Data_Archived"),
];
/// The Python step that joins the demo after the archiver through `autocomp-exec` and the
/// command protocol, reading the archiver's and the structure checker's results. Left out
/// when `python3` is not installed.
const PYTHON_STEP: (&str, &str) = ("catalogue", "Catalogued");
/// The step and the module it imports, written into the demo dir (the binary carries them,
/// so an installed `autocomp` needs no source tree).
const PYTHON_STEP_SOURCE: &str = include_str!("../../contrib/python/examples/catalogue.py");
const PYTHON_MODULE_SOURCE: &str = include_str!("../../contrib/python/autocomp_step/__init__.py");
/// The most rounds (every step once) the demo runs: a round that does nothing ends it
/// sooner, and one that still did something when the last round ends is said.
const MAX_ROUNDS: usize = 200;

/// How a sample delivery is broken, if at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Defect {
    None,
    BadChecksum,
    MissingFile,
    ExtraFile,
    EmptyFile,
}

fn defect_of(n: usize) -> Defect {
    match n % 20 {
        3 => Defect::BadChecksum,
        7 => Defect::MissingFile,
        11 => Defect::ExtraFile,
        15 => Defect::EmptyFile,
        _ => Defect::None,
    }
}

pub async fn run(dir: &Path, batches: usize) -> Result<(), RunError> {
    let dir = absolute(dir)?;
    let io = |what: &str, e: std::io::Error| RunError::Usage(format!("{what}: {e}"));
    let binaries = locate_binaries()?;
    let (config_dir, incoming) = (dir.join("config"), dir.join("incoming"));
    for sub in ["config", "incoming", "archive", "logs"] {
        std::fs::create_dir_all(dir.join(sub)).map_err(|e| io(&format!("cannot create {}", dir.display()), e))?;
    }
    let fresh = std::fs::read_dir(&incoming).map(|mut d| d.next().is_none()).unwrap_or(true);
    if fresh {
        for n in 0..batches {
            let id = format!("B{:012}-RT1", 400_022_028_241u64 + n as u64);
            write_sample_bag(&incoming.join(&id), n, defect_of(n)).map_err(|e| io("cannot write a sample bag", e))?;
        }
        println!("wrote {batches} sample BagIt deliveries to {} (4 in 20 deliberately broken)", incoming.display());
    } else {
        println!("continuing the demo in {}", dir.display());
    }
    write_config(&dir).map_err(|e| io("cannot write the demo config", e))?;
    let python = python_step(&dir, &binaries).map_err(|e| io("cannot write the Python step", e))?;
    if python.is_none() {
        println!("python3 is not installed: the demo's Python step ({}) is left out", PYTHON_STEP.0);
    }

    let store = SqliteStore::open(dir.join("store.db")).await?;
    let steps = STEPS.len() + usize::from(python.is_some());
    let expected = std::fs::read_dir(&incoming).map(|d| d.count()).unwrap_or(batches) * steps;
    let progress = ProgressBar::new(expected as u64).with_style(
        ProgressStyle::with_template("{prefix:>8} [{bar:30}] {pos}/{len} results {msg}").expect("valid template"),
    );
    progress.set_position(recorded_results(&store).await? as u64);
    let mut work_left = false;
    for round in 1..=MAX_ROUNDS {
        progress.set_prefix(format!("round {round}"));
        let mut processed = 0;
        for (component, _) in STEPS {
            progress.set_message(component);
            let mut command = Command::new(binaries.join(component));
            command.arg("--config-dir").arg(&config_dir);
            processed += run_component(command, component, &dir)?;
            progress.set_position(recorded_results(&store).await? as u64);
        }
        if let Some(step) = &python {
            progress.set_message(PYTHON_STEP.0);
            processed += run_component(step.command(&config_dir), PYTHON_STEP.0, &dir)?;
            progress.set_position(recorded_results(&store).await? as u64);
        }
        work_left = processed > 0;
        if !work_left {
            break;
        }
    }
    progress.finish_and_clear();
    if work_left {
        println!(
            "The demo stopped after {MAX_ROUNDS} rounds with work still going: `autocomp --config-dir {} status \
             --state ready` lists what is left; run the demo again to go on.\n",
            config_dir.display()
        );
    }

    print_table(&store).await?;
    println!();
    println!("Logs of every component run are in {}.", dir.join("logs").display());
    println!("Try next:");
    println!(
        "  {} --config-dir {} --batch <ID> --force   # run one step again on one batch",
        binaries.join("checksum-verifier").display(),
        config_dir.display()
    );
    println!(
        "  {} --config-dir {} --dry-run              # what a pass would claim, and why",
        binaries.join("archiver").display(),
        config_dir.display()
    );
    println!(
        "  {} --config-dir {}   # the web monitor: open http://127.0.0.1:7072/ \
         (read only; add --users FILE to act)",
        binaries.join("autocomp-monitor").display(),
        config_dir.display()
    );
    println!(
        "  crontab.example (in the source tree, or /usr/share/doc/autocomp/examples/ from the package): how cron \
         runs these components on a real host; the package's timers and watch units do the same under systemd"
    );
    Ok(())
}

fn absolute(dir: &Path) -> Result<PathBuf, RunError> {
    std::path::absolute(dir).map_err(|e| RunError::Usage(format!("--dir {}: {e}", dir.display())))
}

/// The component binaries live beside `autocomp` (same cargo target dir or install dir).
fn locate_binaries() -> Result<PathBuf, RunError> {
    let here = std::env::current_exe().map_err(|e| RunError::Usage(format!("cannot locate autocomp itself: {e}")))?;
    let dir = here.parent().map(Path::to_path_buf).unwrap_or_default();
    for (component, _) in STEPS {
        if !dir.join(component).is_file() {
            return Err(RunError::Usage(format!(
                "the component binary {component} is not beside autocomp in {}; build them all with \
                 `cargo build --workspace`",
                dir.display()
            )));
        }
    }
    Ok(dir)
}

/// The demo's Python step, as cron would run it: `autocomp-exec` running `python3 catalogue.py`
/// with the `autocomp_step` module on its path.
struct PythonStep {
    exec: PathBuf,
    steps_dir: PathBuf,
}

impl PythonStep {
    fn command(&self, config_dir: &Path) -> Command {
        let (name, event_type) = PYTHON_STEP;
        let mut command = Command::new(&self.exec);
        command
            .arg("--config-dir")
            .arg(config_dir)
            .args(["--name", name, "--event-type", event_type, "--requires", "Data_Archived,Structure_Checked"])
            .arg("--")
            .arg("python3")
            .arg(self.steps_dir.join("catalogue.py"))
            .env("PYTHONPATH", &self.steps_dir)
            .env("PYTHONDONTWRITEBYTECODE", "1");
        command
    }
}

/// Writes the Python step and its module into `DIR/steps` when `python3` and `autocomp-exec`
/// are there to run it; `None` otherwise (the demo runs without it).
fn python_step(dir: &Path, binaries: &Path) -> std::io::Result<Option<PythonStep>> {
    let exec = binaries.join("autocomp-exec");
    let has_python = Command::new("python3")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success());
    if !has_python || !exec.is_file() {
        return Ok(None);
    }
    let steps_dir = dir.join("steps");
    std::fs::create_dir_all(steps_dir.join("autocomp_step"))?;
    std::fs::write(steps_dir.join("autocomp_step/__init__.py"), PYTHON_MODULE_SOURCE)?;
    std::fs::write(steps_dir.join("catalogue.py"), PYTHON_STEP_SOURCE)?;
    Ok(Some(PythonStep { exec, steps_dir }))
}

/// Runs one pass like cron would (`command` with its arguments); returns how many batches it
/// processed (stdout lines).
fn run_component(mut command: Command, component: &str, dir: &Path) -> Result<usize, RunError> {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("logs").join(format!("{component}.log")))
        .map_err(|e| RunError::Usage(format!("cannot open the log of {component}: {e}")))?;
    let output = command
        .stdin(Stdio::null())
        .stderr(log)
        .output()
        .map_err(|e| RunError::Usage(format!("cannot start {component}: {e}")))?;
    match output.status.code() {
        Some(0 | 1 | 3) => {}
        other => {
            return Err(RunError::Usage(format!(
                "{component} exited with {other:?}; see {}",
                dir.join("logs").join(format!("{component}.log")).display()
            )));
        }
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    Ok(stdout.lines().filter(|line| !line.trim().is_empty()).count())
}

async fn all_batches(store: &SqliteStore) -> Result<Vec<Batch>, StoreError> {
    let mut all = Vec::new();
    let mut after: Option<BatchId> = None;
    loop {
        let page = store.list_batches(after.as_ref(), 1_000).await?;
        let Some(last) = page.last() else { break };
        after = Some(last.id.clone());
        all.extend(page);
    }
    Ok(all)
}

async fn recorded_results(store: &SqliteStore) -> Result<usize, StoreError> {
    let steps: Vec<&str> = STEPS.iter().chain([&PYTHON_STEP]).map(|(_, event_type)| *event_type).collect();
    Ok(all_batches(store)
        .await?
        .iter()
        .map(|batch| batch.effective().iter().filter(|e| steps.contains(&e.event_type.as_str())).count())
        .sum())
}

async fn print_table(store: &SqliteStore) -> Result<(), RunError> {
    // The pipeline as the components' own passes registered it (no config file says it).
    let pipeline: Vec<ComponentDescriptor> =
        store.components().await?.into_iter().filter(|c| !c.is_retired()).map(|c| c.descriptor).collect();
    let ordered: Vec<_> = STEPS
        .iter()
        .chain([&PYTHON_STEP])
        .filter_map(|(name, _)| pipeline.iter().find(|step| step.name.as_str() == *name))
        .collect();
    let batches = all_batches(store).await?;
    let mut out = std::io::stdout().lock();
    let mut header = format!("{:<19}", "batch");
    for step in &ordered {
        header.push_str(&format!(" {:<18}", step.name));
    }
    writeln!(out, "\n{}", header.trim_end()).ok();
    let mut problems = Vec::new();
    for batch in &batches {
        let mut row = format!("{:<19}", batch.id);
        for step in &ordered {
            let state = step.state_of(batch);
            row.push_str(&format!(" {:<18}", state));
            if state == ComponentState::Failed
                && let Some(event) = batch.effective().get(&step.event_type)
            {
                let first = event.details["failures"][0]["reference"].as_str().unwrap_or_default().to_owned();
                let why = event.details["failures"][0]["description"].as_str().unwrap_or_default().to_owned();
                let summary = event.details["summary"].as_str().unwrap_or_default().to_owned();
                let reason = if first.is_empty() { summary } else { format!("{first}: {why}") };
                problems.push(format!("{} failed {}: {reason}", batch.id, step.name));
            }
        }
        writeln!(out, "{}", row.trim_end()).ok();
    }
    if !problems.is_empty() {
        writeln!(out, "\nWhy the failed ones failed:").ok();
        for problem in problems {
            writeln!(out, "  {problem}").ok();
        }
    }
    Ok(())
}

fn write_config(dir: &Path) -> std::io::Result<()> {
    let config = dir.join("config");
    let path = |sub: &str| dir.join(sub).display().to_string();
    std::fs::write(
        config.join("autocomp.toml"),
        format!(
            "# The embedded default: one SQLite store file, a local index, flock locks.\n\
             store = \"sqlite://{}\"\nindex = \"local:{}\"\nlocks = \"local:{}\"\n",
            path("store.db"),
            path("index"),
            path("locks")
        ),
    )?;
    std::fs::write(
        config.join("batch-trigger.toml"),
        format!(
            "[settings]\nincoming = \"{}\"\n# BagIt's tag manifest marks a finished delivery.\nsettle_for = \"0s\"\n",
            path("incoming")
        ),
    )?;
    std::fs::write(config.join("checksum-verifier.toml"), "max_threads = 2\n")?;
    std::fs::write(
        config.join("structure-checker.toml"),
        "# Every setting at its default: the component's own trigger decides.\n",
    )?;
    std::fs::write(config.join("archiver.toml"), format!("[settings]\narchive_root = \"{}\"\n", path("archive")))
}

/// A small BagIt bag (RFC 8493) with md5 and sha256 manifests, broken as `defect` says.
fn write_sample_bag(root: &Path, n: usize, defect: Defect) -> std::io::Result<()> {
    let data = root.join("data");
    std::fs::create_dir_all(data.join("scans 2"))?;
    let mut payload: Vec<(String, Vec<u8>)> = (1..=3)
        .map(|page| {
            let text = format!("page {page} of delivery {n}\n").repeat(200 + 37 * page + n);
            (format!("data/page-{page:04}.txt"), text.into_bytes())
        })
        .collect();
    payload.push((
        format!("data/scans 2/scan {n}.txt"),
        format!("a nested scan with a space in its name, {n}\n").into_bytes(),
    ));
    if defect == Defect::EmptyFile {
        payload.push(("data/empty.txt".into(), Vec::new()));
    }
    for (path, bytes) in &payload {
        std::fs::write(root.join(path), bytes)?;
    }
    let manifest = |hash: fn(&[u8]) -> String| -> String {
        payload.iter().map(|(path, bytes)| format!("{}  {path}\n", hash(bytes))).collect()
    };
    let octets: usize = payload.iter().map(|(_, bytes)| bytes.len()).sum();
    let tag_files = [
        ("bagit.txt", "BagIt-Version: 1.0\nTag-File-Character-Encoding: UTF-8\n".to_owned()),
        ("bag-info.txt", bag_info(root, n, octets, payload.len())),
        ("manifest-md5.txt", manifest(md5_hex)),
        ("manifest-sha256.txt", manifest(sha256_hex)),
    ];
    let mut tagmanifest = String::new();
    for (name, text) in &tag_files {
        std::fs::write(root.join(name), text)?;
        tagmanifest.push_str(&format!("{}  {name}\n", sha256_hex(text.as_bytes())));
    }
    match defect {
        Defect::BadChecksum => {
            let mut bytes = payload[1].1.clone();
            bytes[10] ^= 0x20;
            std::fs::write(root.join(&payload[1].0), bytes)?;
        }
        Defect::MissingFile => std::fs::remove_file(root.join(&payload[0].0))?,
        Defect::ExtraFile => std::fs::write(data.join("notes-not-in-manifest.txt"), "left behind by the scanner\n")?,
        Defect::None | Defect::EmptyFile => {}
    }
    // Written last: its presence tells batch-trigger the delivery is complete.
    std::fs::write(root.join("tagmanifest-sha256.txt"), tagmanifest)
}

/// The metadata a real delivery declares (RFC 8493 §2.2.2), so that a step reading it (the
/// structure checker's result, a cataloguing step) finds it on every sample bag.
fn bag_info(root: &Path, n: usize, octets: usize, files: usize) -> String {
    let id = root.file_name().map(|name| name.to_string_lossy().into_owned()).unwrap_or_default();
    let today = chrono::Utc::now().format("%Y-%m-%d");
    format!(
        "Source-Organization: autocomp demo scanning bureau\n\
         Organization-Address: 1 Archive Lane, Aarhus, Denmark\n\
         Contact-Name: Demo Operator\n\
         Contact-Email: scanning@example.org\n\
         External-Identifier: {id}\n\
         External-Description: Sample round-trip delivery {n}: three scanned pages and a nested scan\n\
         Bagging-Date: {today}\n\
         Bag-Size: {:.1} kB\n\
         Payload-Oxum: {octets}.{files}\n\
         Bag-Count: 1 of 1\n",
        octets as f64 / 1000.0
    )
}

fn md5_hex(bytes: &[u8]) -> String {
    hex::encode(Md5::digest(bytes))
}

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}
