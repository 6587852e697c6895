//! The headless-Chromium harness against a real browser and pages served here on loopback:
//! reading, clicking, a screenshot, axe-core findings on a broken and on a clean page, and no
//! browser process left after a drop, a panicking test or a test process killed outright.

use std::io::{BufRead, BufReader, Write};
use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use autocomp_test_servers::chromium::{self, Browser, axe_violations, processes_in, serious_or_critical};
use autocomp_test_servers::wait_until;
use fantoccini::Locator;

const PAGE: &str = r#"<!doctype html>
<html lang="en"><head><title>Harness page</title></head>
<body><main>
<h1>Harness page</h1>
<p id="greeting">Hello from loopback</p>
<button id="change" onclick="document.getElementById('greeting').textContent = 'Clicked'">Change</button>
</main></body></html>"#;

/// An image with no alt text: axe's `image-alt`, which it rates critical.
const BROKEN: &str = r#"<!doctype html>
<html lang="en"><head><title>Broken page</title></head>
<body><main><h1>Broken page</h1><img id="logo" src="/dot.svg"></main></body></html>"#;

const CLEAN: &str = r#"<!doctype html>
<html lang="en"><head><title>Clean page</title></head>
<body><main><h1>Clean page</h1><p>Nothing to find here.</p><img src="/dot.svg" alt="A black dot"></main></body></html>"#;

const DOT: &str =
    r#"<svg xmlns="http://www.w3.org/2000/svg" width="10" height="10"><circle cx="5" cy="5" r="5"/></svg>"#;

/// A fixed-page HTTP server on a free loopback port, on a thread that lives as long as the test
/// process; returns its base URL.
fn serve() -> String {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut request_line = String::new();
            if reader.read_line(&mut request_line).is_err() {
                continue;
            }
            // The rest of the head; no request here has a body.
            let mut line = String::new();
            while reader.read_line(&mut line).is_ok_and(|n| n > 0) && line != "\r\n" {
                line.clear();
            }
            let path = request_line.split_whitespace().nth(1).unwrap_or("/");
            let (status, kind, body) = match path {
                "/" => ("200 OK", "text/html; charset=utf-8", PAGE),
                "/broken" => ("200 OK", "text/html; charset=utf-8", BROKEN),
                "/clean" => ("200 OK", "text/html; charset=utf-8", CLEAN),
                "/dot.svg" => ("200 OK", "image/svg+xml", DOT),
                _ => ("404 Not Found", "text/plain", "not found"),
            };
            let head = format!(
                "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            stream.write_all(head.as_bytes()).and_then(|()| stream.write_all(body.as_bytes())).ok();
        }
    });
    base
}

/// Where screenshots go: `target/test-screenshots`, beside cargo's own dirs, to be looked at.
fn screenshot_dir() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).parent().unwrap().join("test-screenshots")
}

/// Fails unless every process of the browser that had `dir` is gone (a zombie counts as gone)
/// and the dir is removed.
fn assert_all_gone(dir: &Path) {
    let mut left = Vec::new();
    let gone = wait_until(Instant::now() + Duration::from_secs(20), || {
        left = processes_in(dir);
        left.is_empty() && !dir.exists()
    });
    assert!(gone, "browser processes {left:?} or the dir {} still there", dir.display());
}

#[tokio::test]
async fn loads_a_page_reads_text_clicks_and_takes_a_screenshot() {
    let base = serve();
    let started = Instant::now();
    let browser = Browser::start().await;
    eprintln!("Browser::start took {:?}", started.elapsed());
    let dir = browser.dir().to_path_buf();
    assert!(!processes_in(&dir).is_empty(), "the browser's processes name its dir");
    assert!(browser.webdriver_url().starts_with("http://127.0.0.1:"));

    let client = browser.client();
    client.goto(&format!("{base}/")).await.unwrap();
    assert_eq!(client.title().await.unwrap(), "Harness page");
    let greeting = client.find(Locator::Id("greeting")).await.unwrap();
    assert_eq!(greeting.text().await.unwrap(), "Hello from loopback");

    client.find(Locator::Id("change")).await.unwrap().click().await.unwrap();
    let changed = client
        .wait()
        .at_most(Duration::from_secs(10))
        .for_element(Locator::XPath("//p[@id='greeting' and text()='Clicked']"))
        .await
        .expect("the button's inline script changed the text");
    assert_eq!(changed.text().await.unwrap(), "Clicked");

    let (width, height): (u64, u64) = client.get_window_size().await.unwrap();
    assert_eq!((width, height), (1280, 900), "--window-size");

    let path = chromium::screenshot(client, screenshot_dir().join("chromium-harness.png")).await;
    let png = std::fs::read(&path).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "{} is a PNG", path.display());
    let png_width = u32::from_be_bytes(png[16..20].try_into().unwrap());
    assert!(png_width > 0 && png_width <= 1280, "viewport width {png_width}");

    browser.close().await;
    assert_all_gone(&dir);
}

#[tokio::test]
async fn axe_flags_an_image_without_alt_and_passes_a_clean_page() {
    let base = serve();
    let browser = Browser::start().await;
    let client = browser.client();

    client.goto(&format!("{base}/broken")).await.unwrap();
    let violations = axe_violations(client).await;
    let serious = serious_or_critical(&violations);
    let image_alt = serious.iter().find(|v| v.id == "image-alt").unwrap_or_else(|| panic!("{violations:#?}"));
    assert_eq!(image_alt.impact.as_deref(), Some("critical"));
    assert_eq!(image_alt.targets, ["#logo"]);
    assert!(image_alt.help_url.contains("image-alt"), "{image_alt}");
    // Running again on the same page reuses the injected axe-core.
    assert_eq!(axe_violations(client).await, violations);

    client.goto(&format!("{base}/clean")).await.unwrap();
    let violations = axe_violations(client).await;
    assert!(violations.is_empty(), "{}", violations.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n"));
    assert!(serious_or_critical(&violations).is_empty());
}

#[test]
fn a_panicking_test_leaves_no_browser_process() {
    let base = serve();
    let (dir_tx, dir_rx) = std::sync::mpsc::channel();
    let outcome = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async {
            let browser = Browser::start().await;
            dir_tx.send(browser.dir().to_path_buf()).unwrap();
            browser.client().goto(&format!("{base}/")).await.unwrap();
            panic!("deliberate panic with a browser open (expected by this test)");
        })
    })
    .join();
    assert!(outcome.is_err(), "the thread panicked");
    assert_all_gone(&dir_rx.recv().unwrap());
}

/// Run by [`a_killed_test_process_leaves_no_browser_process`] in a child process: starts a
/// browser and aborts, so that no destructor runs. A no-op otherwise.
#[tokio::test]
async fn killed_browser_child() {
    if std::env::var_os("AUTOCOMP_BROWSER_CHILD").is_none() {
        return;
    }
    let browser = Browser::start().await;
    browser.client().goto("about:blank").await.unwrap();
    println!("BROWSER {}", browser.dir().display());
    std::io::stdout().flush().unwrap();
    std::process::abort();
}

#[test]
fn a_killed_test_process_leaves_no_browser_process() {
    chromium::require_installed();
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "killed_browser_child", "--nocapture", "--test-threads=1"])
        .env("AUTOCOMP_BROWSER_CHILD", "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "the child aborts: {stdout}{}", String::from_utf8_lossy(&out.stderr));
    let dir = stdout
        .lines()
        .find_map(|l| l.split_once("BROWSER ").map(|(_, dir)| dir))
        .unwrap_or_else(|| panic!("{stdout}{}", String::from_utf8_lossy(&out.stderr)));
    assert_all_gone(Path::new(dir));
}
