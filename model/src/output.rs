//! What a run printed, kept with its result: per stream (a command's `stdout` and `stderr`, a
//! Rust component's `log`), the first and the last bytes within a budget, and how many bytes
//! between them were dropped. Capturing is bounded however much a run prints.

use serde::{Deserialize, Serialize};

/// The default budget of a run's output, all streams together.
pub const DEFAULT_OUTPUT_BYTES: usize = 64 * 1024;
/// The largest budget a component may configure: the output travels in the result event,
/// which the store takes up to 1 MiB.
pub const MAX_OUTPUT_BYTES: usize = 512 * 1024;

/// The most streams one run's output holds.
pub const MAX_OUTPUT_STREAMS: usize = 16;

/// A run's output: its streams, in the order they were captured.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "json-schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct RunOutput {
    pub streams: Vec<OutputStream>,
}

/// One stream of a run's output. `head` is its beginning; when the stream was longer than
/// its share of the budget, `tail` is its end and `omitted_bytes` what was dropped between.
/// Text is UTF-8 (invalid bytes replaced by U+FFFD); control characters are kept as printed
/// and neutralized where they are shown.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "json-schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct OutputStream {
    /// `stdout`, `stderr` or `log`.
    pub name: String,
    pub head: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub tail: String,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub omitted_bytes: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl OutputStream {
    /// Bytes printed, including those dropped.
    pub fn total_bytes(&self) -> u64 {
        self.head.len() as u64 + self.tail.len() as u64 + self.omitted_bytes
    }

    /// Bytes kept.
    pub fn kept_bytes(&self) -> usize {
        self.head.len() + self.tail.len()
    }

    /// The stream as one text: head, a line saying what was dropped, tail.
    pub fn text(&self) -> String {
        if self.omitted_bytes == 0 && self.tail.is_empty() {
            return self.head.clone();
        }
        let mut text = self.head.clone();
        if !text.ends_with('\n') {
            text.push('\n');
        }
        text.push_str(&format!("[... {} bytes not kept ...]\n", self.omitted_bytes));
        text.push_str(&self.tail);
        text
    }

    /// The last non-empty line (of the tail if there is one): what a failure's verdict quotes.
    pub fn last_line(&self) -> Option<&str> {
        let end = if self.tail.is_empty() { &self.head } else { &self.tail };
        end.lines().map(str::trim).rfind(|line| !line.is_empty())
    }

    /// What the stream holds past its first `printed` bytes, for a reader that printed that
    /// much of an earlier copy of it (`autocomp logs --follow`): the head and the tail are a
    /// prefix and a suffix of what was printed, whatever the cuts, so a position in the whole
    /// stream says where to go on; what fell between them is said in a line.
    pub fn text_after(&self, printed: u64) -> String {
        let total = self.total_bytes();
        if total <= printed {
            return String::new();
        }
        let head_len = self.head.len() as u64;
        let tail_start = head_len + self.omitted_bytes;
        let mut out = String::new();
        let mut from = printed;
        if from < head_len {
            out.push_str(&self.head[floor_char_boundary(&self.head, from as usize)..]);
            from = head_len;
        }
        if from < tail_start {
            if !out.is_empty() && !out.ends_with('\n') {
                out.push('\n');
            }
            out.push_str(&format!("[... {} bytes not kept ...]\n", tail_start - from));
            from = tail_start;
        }
        let skip = (from - tail_start) as usize;
        if skip < self.tail.len() {
            out.push_str(&self.tail[ceil_char_boundary(&self.tail, skip)..]);
        }
        out
    }

    /// Keeps at most `budget` bytes: half from the head, the rest from the tail, each cut at
    /// a character boundary; what is cut is counted in `omitted_bytes`.
    fn shrink_to(&mut self, budget: usize) {
        if self.kept_bytes() <= budget {
            return;
        }
        let whole = self.kept_bytes();
        let head_budget = budget / 2;
        let tail_budget = budget - head_budget;
        if self.head.len() > head_budget {
            let cut = floor_char_boundary(&self.head, head_budget);
            let moved = self.head.split_off(cut);
            // What leaves the head joins the middle, in front of the tail's own cut.
            if self.tail.is_empty() && self.omitted_bytes == 0 {
                self.tail = moved;
            }
        }
        if self.tail.len() > tail_budget {
            let start = ceil_char_boundary(&self.tail, self.tail.len() - tail_budget);
            self.tail = self.tail.split_off(start);
        }
        let kept = self.kept_bytes();
        self.omitted_bytes += (whole - kept) as u64;
    }
}

impl RunOutput {
    /// Checks output a store is asked to keep apart from a result (a running or cancelled
    /// run's, `set_run_output`): at most `MAX_OUTPUT_STREAMS` streams, each named in at most
    /// 64 characters, all together keeping at most `MAX_OUTPUT_BYTES`.
    pub fn validate(&self) -> Result<(), crate::InvalidInput> {
        if self.streams.len() > MAX_OUTPUT_STREAMS {
            return Err(crate::InvalidInput::new(
                "output.streams",
                self.streams.len().to_string(),
                format!("at most {MAX_OUTPUT_STREAMS} streams"),
            ));
        }
        if let Some(stream) = self.streams.iter().find(|s| s.name.is_empty() || s.name.chars().count() > 64) {
            return Err(crate::InvalidInput::new("output.streams.name", &stream.name, "1 to 64 characters"));
        }
        let kept: usize = self.streams.iter().map(OutputStream::kept_bytes).sum();
        if kept > MAX_OUTPUT_BYTES {
            return Err(crate::InvalidInput::new(
                "output",
                format!("{kept} bytes"),
                format!("at most {MAX_OUTPUT_BYTES} bytes kept, all streams together"),
            ));
        }
        Ok(())
    }

    /// No stream printed anything.
    pub fn is_empty(&self) -> bool {
        self.streams.iter().all(|s| s.total_bytes() == 0)
    }

    pub fn stream(&self, name: &str) -> Option<&OutputStream> {
        self.streams.iter().find(|s| s.name == name)
    }

    /// Adds a stream, or replaces the one of the same name.
    pub fn set(&mut self, stream: OutputStream) {
        match self.streams.iter_mut().find(|s| s.name == stream.name) {
            Some(existing) => *existing = stream,
            None => self.streams.push(stream),
        }
    }

    /// Fits every stream into `budget` bytes together: the streams that printed nothing are
    /// dropped; a stream within an equal share keeps everything, and what it leaves over goes
    /// to the others.
    pub fn fit(mut self, budget: usize) -> RunOutput {
        self.streams.retain(|s| s.total_bytes() > 0);
        let mut order: Vec<usize> = (0..self.streams.len()).collect();
        order.sort_by_key(|&i| self.streams[i].kept_bytes());
        let mut left = budget;
        for (position, &i) in order.iter().enumerate() {
            let share = left / (order.len() - position);
            let stream = &mut self.streams[i];
            stream.shrink_to(share);
            left -= stream.kept_bytes().min(left);
        }
        self
    }
}

fn floor_char_boundary(text: &str, mut at: usize) -> usize {
    while at > 0 && !text.is_char_boundary(at) {
        at -= 1;
    }
    at
}

fn ceil_char_boundary(text: &str, mut at: usize) -> usize {
    while at < text.len() && !text.is_char_boundary(at) {
        at += 1;
    }
    at
}

/// Captures one stream as it is printed, within `limit` bytes: the first half kept as it
/// comes, the last half in a window that slides (trimmed in bulk, so the cost stays linear).
#[derive(Debug, Clone)]
pub struct OutputCapture {
    name: String,
    limit: usize,
    head: Vec<u8>,
    tail: Vec<u8>,
    /// Bytes dropped from the front of `tail`.
    dropped: u64,
}

impl OutputCapture {
    pub fn new(name: impl Into<String>, limit: usize) -> Self {
        Self { name: name.into(), limit, head: Vec::new(), tail: Vec::new(), dropped: 0 }
    }

    pub fn push(&mut self, mut bytes: &[u8]) {
        let head_limit = self.limit / 2;
        if self.head.len() < head_limit {
            let take = bytes.len().min(head_limit - self.head.len());
            self.head.extend_from_slice(&bytes[..take]);
            bytes = &bytes[take..];
        }
        if bytes.is_empty() {
            return;
        }
        let tail_limit = self.limit - head_limit;
        self.tail.extend_from_slice(bytes);
        if self.tail.len() > tail_limit.max(4096) * 2 {
            let excess = self.tail.len() - tail_limit;
            self.tail.drain(..excess);
            self.dropped += excess as u64;
        }
    }

    /// Bytes pushed so far, kept or not.
    pub fn total_bytes(&self) -> u64 {
        (self.head.len() + self.tail.len()) as u64 + self.dropped
    }

    /// The stream as kept so far (what `finish` would answer now), the capture going on: what
    /// a running run's output is saved as while it runs.
    pub fn snapshot(&self) -> OutputStream {
        self.clone().finish()
    }

    /// The stream as kept: invalid UTF-8 replaced, the cuts moved to character boundaries.
    pub fn finish(mut self) -> OutputStream {
        let tail_limit = self.limit - self.limit / 2;
        if self.tail.len() > tail_limit {
            let excess = self.tail.len() - tail_limit;
            self.tail.drain(..excess);
            self.dropped += excess as u64;
        }
        if self.dropped == 0 {
            // Nothing was dropped: one contiguous text.
            let mut all = self.head;
            all.extend_from_slice(&self.tail);
            let head = String::from_utf8_lossy(&all).into_owned();
            return OutputStream { name: self.name, head, tail: String::new(), omitted_bytes: 0 };
        }
        // Neither cut may split a character: the head loses a character it ends inside of,
        // the tail the continuation bytes it starts with (0b10xxxxxx).
        let head_end = complete_prefix(&self.head);
        self.dropped += (self.head.len() - head_end) as u64;
        self.head.truncate(head_end);
        let start = self.tail.iter().take(3).take_while(|b| **b & 0xC0 == 0x80).count();
        self.dropped += start as u64;
        OutputStream {
            name: self.name,
            head: String::from_utf8_lossy(&self.head).into_owned(),
            tail: String::from_utf8_lossy(&self.tail[start..]).into_owned(),
            omitted_bytes: self.dropped,
        }
    }
}

/// The length of `bytes` without a UTF-8 character that starts in its last three bytes and
/// does not end in them.
fn complete_prefix(bytes: &[u8]) -> usize {
    let len = bytes.len();
    for back in 1..=len.min(3) {
        let byte = bytes[len - back];
        if byte & 0xC0 == 0xC0 {
            let needs = if byte >= 0xF0 {
                4
            } else if byte >= 0xE0 {
                3
            } else {
                2
            };
            return if needs > back { len - back } else { len };
        }
        if byte & 0xC0 != 0x80 {
            return len;
        }
    }
    len
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cut(head: &str, omitted: u64, tail: &str) -> OutputStream {
        OutputStream { name: "stdout".into(), head: head.into(), tail: tail.into(), omitted_bytes: omitted }
    }

    #[test]
    fn what_is_new_is_told_by_position_in_the_whole_stream() {
        assert_eq!(cut("page 1\n", 0, "").text_after(0), "page 1\n");
        assert_eq!(cut("page 1\npage 2\n", 0, "").text_after(7), "page 2\n");
        assert_eq!(cut("page 1\npage 2\n", 0, "").text_after(14), "");
        // The middle was dropped: what fell out is said, the tail goes on where it starts.
        assert_eq!(cut("page 1\n", 100, "page 99\n").text_after(7), "[... 100 bytes not kept ...]\npage 99\n");
        assert_eq!(cut("page 1\n", 100, "page 99\npage 100\n").text_after(115), "page 100\n");
        // Printed up to inside the dropped middle: only the rest of it is counted.
        assert_eq!(cut("ab", 10, "yz").text_after(5), "[... 7 bytes not kept ...]\nyz");
        // A cut inside a character moves to its boundary.
        assert_eq!(cut("é!", 0, "").text_after(1), "é!");
    }

    #[test]
    fn short_output_is_kept_whole() {
        let mut capture = OutputCapture::new("stdout", 64);
        capture.push(b"hello\n");
        capture.push(b"world\n");
        let stream = capture.finish();
        assert_eq!(stream.head, "hello\nworld\n");
        assert_eq!((stream.tail.as_str(), stream.omitted_bytes), ("", 0));
        assert_eq!(stream.text(), "hello\nworld\n");
        assert_eq!(stream.last_line(), Some("world"));
    }

    #[test]
    fn long_output_keeps_its_head_and_tail_and_counts_the_middle() {
        let mut capture = OutputCapture::new("stderr", 100);
        let mut printed = 0u64;
        for i in 0..10_000 {
            let line = format!("line {i}\n");
            printed += line.len() as u64;
            capture.push(line.as_bytes());
        }
        let stream = capture.finish();
        assert!(stream.head.starts_with("line 0\nline 1\n"), "{}", stream.head);
        assert!(stream.tail.ends_with("line 9999\n"), "{}", stream.tail);
        assert!(stream.kept_bytes() <= 100);
        assert_eq!(stream.total_bytes(), printed, "every byte is kept or counted");
        assert!(stream.text().contains("bytes not kept"));
        assert_eq!(stream.last_line(), Some("line 9999"));
    }

    #[test]
    fn cuts_never_split_a_character_and_bad_bytes_become_replacement_characters() {
        let mut capture = OutputCapture::new("stdout", 11);
        capture.push("ééééééééééééé".as_bytes());
        capture.push(b"\xff\x00end");
        let stream = capture.finish();
        assert!(stream.head.chars().all(|c| c == 'é'), "{:?}", stream.head);
        assert!(stream.tail.ends_with("\u{fffd}\u{0}end"), "{:?}", stream.tail);
        assert_eq!(stream.total_bytes(), "ééééééééééééé".len() as u64 + 5 + 2, "{stream:?}");
    }

    #[test]
    fn fitting_streams_shares_the_budget_and_a_quiet_stream_leaves_room_to_the_other() {
        let long = |name: &str| OutputStream { name: name.into(), head: "x".repeat(1000), ..Default::default() };
        let short = OutputStream { name: "stdout".into(), head: "ok\n".into(), ..Default::default() };
        let quiet = OutputStream { name: "log".into(), ..Default::default() };
        let output = RunOutput { streams: vec![short.clone(), long("stderr"), quiet] }.fit(500);
        assert_eq!(output.streams.len(), 2, "the quiet stream is dropped");
        assert_eq!(output.stream("stdout"), Some(&short));
        let stderr = output.stream("stderr").unwrap();
        assert_eq!(stderr.kept_bytes(), 497);
        assert_eq!(stderr.total_bytes(), 1000);
        let both = RunOutput { streams: vec![long("stdout"), long("stderr")] }.fit(500);
        assert!(both.streams.iter().all(|s| s.kept_bytes() == 250 && s.total_bytes() == 1000), "{both:?}");
    }
}
