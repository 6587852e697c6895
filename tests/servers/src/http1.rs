//! A bare HTTP/1.1 client over `std::net` for the services' tests: bytes go on the wire
//! exactly as given (bodies no client library would send: truncated, not UTF-8, over the
//! limit), one fresh connection per request, and the status and body come back as read.

use std::io::{Read, Write};
use std::time::Duration;

use serde_json::Value;

/// One exchange: the status and the body, or None if the service cannot be reached. The
/// body is written from another thread while the answer is read, because the service may
/// answer (413) and close before reading a huge body.
pub fn request(method: &str, url: &str, token: Option<&str>, body: Vec<u8>) -> Option<(u16, Vec<u8>)> {
    let rest = url.strip_prefix("http://")?;
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let mut stream = std::net::TcpStream::connect(authority).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(30))).ok()?;
    let auth = token.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {authority}\r\nContent-Type: application/json\r\n{auth}\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).ok()?;
    let mut writer = stream.try_clone().ok()?;
    let sender = std::thread::spawn(move || {
        // A broken pipe here is the service having answered already.
        let _ = writer.write_all(&body);
    });
    let mut answer = Vec::new();
    // A reset after the answer (the unread rest of a huge body) still leaves the answer read.
    let _ = stream.read_to_end(&mut answer);
    drop(stream);
    sender.join().ok();
    parse_response(&answer)
}

/// `GET url`: the status and the body, or None if unreachable.
pub fn get(url: &str) -> Option<(u16, Vec<u8>)> {
    request("GET", url, None, Vec::new())
}

/// A request that must answer with a JSON body: its status and that body.
pub fn call(method: &str, url: &str, token: Option<&str>, body: Vec<u8>) -> (u16, Value) {
    let (status, body) = request(method, url, token, body).expect("the service answers");
    let json = serde_json::from_slice(&body).unwrap_or_else(|e| {
        panic!("HTTP {status} with a body that is not JSON ({e}): {}", String::from_utf8_lossy(&body))
    });
    (status, json)
}

/// `POST url` with `body`, answered with JSON: its status and that body.
pub fn post(url: &str, token: Option<&str>, body: &[u8]) -> (u16, Value) {
    call("POST", url, token, body.to_vec())
}

fn parse_response(answer: &[u8]) -> Option<(u16, Vec<u8>)> {
    let split = answer.windows(4).position(|w| w == b"\r\n\r\n")?;
    let status: u16 = std::str::from_utf8(answer.get(9..12)?).ok()?.parse().ok()?;
    let head = String::from_utf8_lossy(&answer[..split]).to_lowercase();
    let mut body = answer[split + 4..].to_vec();
    if head.contains("transfer-encoding: chunked") {
        body = dechunk(&body);
    }
    Some((status, body))
}

fn dechunk(mut data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(line_end) = data.windows(2).position(|w| w == b"\r\n") {
        let size = usize::from_str_radix(std::str::from_utf8(&data[..line_end]).unwrap().trim(), 16).unwrap();
        if size == 0 {
            break;
        }
        out.extend_from_slice(&data[line_end + 2..line_end + 2 + size]);
        data = &data[line_end + 2 + size + 2..];
    }
    out
}
