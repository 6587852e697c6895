//! Durations as operators write them in configs and triggers: `"90s"`, `"5m"`, `"2h"`, or a
//! whole number of seconds. For `#[serde(with = "duration_text")]` (and `::option`).

use std::fmt;
use std::time::Duration;

use serde::de::{self, Visitor};
use serde::{Deserializer, Serializer};

pub fn serialize<S: Serializer>(value: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.collect_str(&humantime::format_duration(*value))
}

pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
    deserializer.deserialize_any(DurationVisitor)
}

pub mod option {
    use super::*;

    pub fn serialize<S: Serializer>(value: &Option<Duration>, serializer: S) -> Result<S::Ok, S::Error> {
        match value {
            Some(d) => super::serialize(d, serializer),
            None => serializer.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Duration>, D::Error> {
        deserializer.deserialize_option(OptionVisitor)
    }

    struct OptionVisitor;

    impl<'de> Visitor<'de> for OptionVisitor {
        type Value = Option<Duration>;

        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            DurationVisitor.expecting(f)
        }

        fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
            super::deserialize(deserializer).map(Some)
        }
    }
}

struct DurationVisitor;

impl<'de> Visitor<'de> for DurationVisitor {
    type Value = Duration;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a duration such as 90s, 5m or 2h, or a number of seconds")
    }

    fn visit_u64<E: de::Error>(self, seconds: u64) -> Result<Self::Value, E> {
        Ok(Duration::from_secs(seconds))
    }

    fn visit_i64<E: de::Error>(self, seconds: i64) -> Result<Self::Value, E> {
        u64::try_from(seconds)
            .map(Duration::from_secs)
            .map_err(|_| E::custom(format!("invalid duration {seconds}: must not be negative")))
    }

    fn visit_str<E: de::Error>(self, text: &str) -> Result<Self::Value, E> {
        humantime::parse_duration(text)
            .map_err(|e| E::custom(format!("invalid duration {text:?}: {e} (write e.g. 90s, 5m, 2h)")))
    }
}
