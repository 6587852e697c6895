//! A component's crontab schedule as its config declares it (the line cron starts it on, or
//! its `--schedule`), and the one question the registry's readers ask of it: how many
//! scheduled passes have gone by without one. Evaluated in the local time zone, as cron does.

use std::fmt;

use chrono::{DateTime, Local};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::{InvalidInput, Timestamp};

/// A 5-field crontab expression (`*/5 * * * *`), checked when made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schedule {
    text: String,
    cron: croner::Cron,
}

impl Schedule {
    pub fn parse(text: &str) -> Result<Self, InvalidInput> {
        let text = text.trim();
        // croner also takes seconds and years; cron's lines have exactly five fields.
        let fields = text.split_whitespace().count();
        if fields != 5 {
            return Err(InvalidInput::new(
                "schedule",
                text,
                format!("has {fields} fields; a crontab schedule has 5: minute hour day-of-month month day-of-week"),
            ));
        }
        let cron: croner::Cron =
            text.parse().map_err(|e| InvalidInput::new("schedule", text, format!("not a crontab schedule: {e}")))?;
        // A pattern that parses but never fires (`0 0 31 2 *`) would make a component look
        // silent forever.
        if cron.find_next_occurrence(&Local::now(), false).is_err() {
            return Err(InvalidInput::new("schedule", text, "never fires"));
        }
        Ok(Self { text: text.to_owned(), cron })
    }

    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The first scheduled start after `at`.
    pub fn next_after(&self, at: &DateTime<Local>) -> Option<DateTime<Local>> {
        self.cron.find_next_occurrence(at, false).ok()
    }

    /// The scheduled starts after `last` up to a minute before `now`, counted up to `cap`: a
    /// component whose last pass was at `last` has missed that many passes. A start is
    /// missed only a minute after it is due, so a pass that is just starting (and reports
    /// when it ends, or when it claims work) is not counted against it.
    pub fn missed_since(&self, last: Timestamp, now: Timestamp, cap: u32) -> u32 {
        let due_by = Timestamp(now.millis().saturating_sub(MISSED_AFTER_MS));
        let (Some(last), Some(now)) = (local(last), local(due_by)) else { return 0 };
        let missed = self.cron.iter_after(last).take_while(|at| *at <= now).take(cap as usize).count();
        missed as u32
    }
}

/// How long after its start a scheduled pass counts as missed.
const MISSED_AFTER_MS: i64 = 60_000;

fn local(at: Timestamp) -> Option<DateTime<Local>> {
    DateTime::from_timestamp_millis(at.millis()).map(|utc| utc.with_timezone(&Local))
}

impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl Serialize for Schedule {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.text)
    }
}

impl<'de> Deserialize<'de> for Schedule {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        Schedule::parse(&text).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINUTE: i64 = 60_000;

    #[test]
    fn counts_the_starts_gone_by() {
        let every_five = Schedule::parse("*/5 * * * *").unwrap();
        // On a five-minute boundary in every time zone with whole-quarter-hour offsets.
        let last = Timestamp(1_700_000_100_000 - 1_700_000_100_000 % (15 * MINUTE));
        assert_eq!(every_five.missed_since(last, Timestamp(last.0 + 5 * MINUTE), 100), 0, "due, not yet missed");
        assert_eq!(every_five.missed_since(last, Timestamp(last.0 + 6 * MINUTE), 100), 1, "a minute late: missed");
        assert_eq!(every_five.missed_since(last, Timestamp(last.0 + 16 * MINUTE), 100), 3);
        assert_eq!(every_five.missed_since(last, Timestamp(last.0 + 600 * MINUTE), 10), 10, "capped");
    }

    #[test]
    fn bad_schedules_are_refused_naming_the_field() {
        let error = Schedule::parse("every day").unwrap_err().to_string();
        assert!(error.contains("schedule") && error.contains("every day"), "{error}");
        assert!(Schedule::parse("0 0 31 2 *").unwrap_err().to_string().contains("never fires"));
        assert!(Schedule::parse("*/10 * * * * *").unwrap_err().to_string().contains("has 6 fields"));
        let parsed: Schedule = serde_json::from_str("\"0 * * * *\"").unwrap();
        assert_eq!(serde_json::to_string(&parsed).unwrap(), "\"0 * * * *\"");
    }
}
