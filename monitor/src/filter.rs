//! The monitor's filter: which batches a list, an export or a bulk action is about, as the
//! URL carries it (`?q=component:checksum-verifier state:failed type:RoundTrip B2020
//! priority:>=5&order=priority`), parsed strictly (an unknown key or state is an error naming
//! it) and turned into an index `Selection`.

use std::fmt::Write as _;

use autocomp_model::{BatchId, BatchType, ComponentDescriptor, ComponentName, ComponentState, InvalidInput, Selection};
use autocomp_sboi::{PageKey, PageOrder};

/// A component's state as the monitor filters on it: one of `ComponentState::ALL` (`person`
/// included: a human step's batches waiting for a decision), or `overdue`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StateFilter {
    State(ComponentState),
    /// Ready or working for longer than the component's threshold.
    Overdue,
}

impl StateFilter {
    /// `ComponentState::ALL` in its order, then `overdue`.
    pub const ALL: [StateFilter; ComponentState::ALL.len() + 1] = {
        let mut all = [StateFilter::Overdue; ComponentState::ALL.len() + 1];
        let mut i = 0;
        while i < ComponentState::ALL.len() {
            all[i] = StateFilter::State(ComponentState::ALL[i]);
            i += 1;
        }
        all
    };

    /// A state's own name (`ComponentState::as_str`), or `overdue`.
    pub fn as_str(self) -> &'static str {
        match self {
            StateFilter::State(state) => state.as_str(),
            StateFilter::Overdue => "overdue",
        }
    }

    pub fn parse(text: &str) -> Result<StateFilter, InvalidInput> {
        StateFilter::ALL.into_iter().find(|s| s.as_str() == text).ok_or_else(|| {
            let known: Vec<&str> = StateFilter::ALL.iter().map(|s| s.as_str()).collect();
            InvalidInput::new("state", text, format!("not a state (one of {})", known.join(", ")))
        })
    }
}

/// Everything a list of batches is filtered and ordered by. The default is every batch,
/// oldest first.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Filter {
    pub component: Option<ComponentName>,
    pub state: Option<StateFilter>,
    pub batch_type: Option<BatchType>,
    pub id_prefix: Option<String>,
    pub priority: PriorityFilter,
    pub order: PageOrder,
}

/// `priority:5`, `priority:>=5` or `priority:<=-1`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PriorityFilter {
    pub min: Option<i32>,
    pub max: Option<i32>,
}

/// Longest `q` accepted.
const MAX_QUERY_CHARS: usize = 1_000;

impl Filter {
    /// Parses the URL's `q` (space-separated `key:value` terms; a bare word is an id
    /// prefix) and `order` (`oldest`, the default, or `priority`).
    pub fn parse(q: &str, order: Option<&str>) -> Result<Filter, InvalidInput> {
        if q.chars().count() > MAX_QUERY_CHARS {
            return Err(InvalidInput::new("q", q, format!("longer than {MAX_QUERY_CHARS} characters")));
        }
        let mut filter = Filter {
            order: match order.unwrap_or("oldest") {
                "" | "oldest" => PageOrder::Oldest,
                "priority" => PageOrder::Priority,
                other => return Err(InvalidInput::new("order", other, "expected oldest or priority")),
            },
            ..Filter::default()
        };
        for term in q.split_whitespace() {
            let (key, value) = match term.split_once(':') {
                Some((key, value)) => (key, value),
                None => ("id", term),
            };
            let twice = || InvalidInput::new("q", term, format!("`{key}:` given twice"));
            match key {
                "component" => {
                    let name =
                        ComponentName::new(value).map_err(|e| InvalidInput::new("component", value, e.reason))?;
                    filter.component.replace(name).map_or(Ok(()), |_| Err(twice()))?;
                }
                "state" => {
                    filter.state.replace(StateFilter::parse(value)?).map_or(Ok(()), |_| Err(twice()))?;
                }
                "type" => {
                    let batch_type = BatchType::new(value).map_err(|e| InvalidInput::new("type", value, e.reason))?;
                    filter.batch_type.replace(batch_type).map_or(Ok(()), |_| Err(twice()))?;
                }
                "id" => {
                    // A prefix of a valid id is itself a valid id (the grammar has no suffix rule).
                    BatchId::new(value).map_err(|e| InvalidInput::new("id prefix", value, e.reason))?;
                    filter.id_prefix.replace(value.to_owned()).map_or(Ok(()), |_| Err(twice()))?;
                }
                "priority" => {
                    if filter.priority != PriorityFilter::default() {
                        return Err(twice());
                    }
                    filter.priority = parse_priority(value)?;
                }
                other => {
                    return Err(InvalidInput::new(
                        "q",
                        term,
                        format!("unknown filter `{other}:` (known: component:, state:, type:, id:, priority:)"),
                    ));
                }
            }
        }
        Ok(filter)
    }

    /// The `q` that parses back into this filter (for links and forms).
    pub fn query(&self) -> String {
        let mut q = String::new();
        let mut term = |text: String| {
            if !q.is_empty() {
                q.push(' ');
            }
            q.push_str(&text);
        };
        if let Some(component) = &self.component {
            term(format!("component:{component}"));
        }
        if let Some(state) = self.state {
            term(format!("state:{}", state.as_str()));
        }
        if let Some(batch_type) = &self.batch_type {
            term(format!("type:{batch_type}"));
        }
        if let Some(prefix) = &self.id_prefix {
            term(format!("id:{prefix}"));
        }
        match (self.priority.min, self.priority.max) {
            (Some(min), Some(max)) if min == max => term(format!("priority:{min}")),
            (Some(min), None) => term(format!("priority:>={min}")),
            (None, Some(max)) => term(format!("priority:<={max}")),
            _ => {}
        }
        q
    }

    /// The URL query string (`q=...&order=...`), percent-encoded.
    pub fn url_query(&self) -> String {
        let mut out = format!("q={}", encode(&self.query()));
        if self.order == PageOrder::Priority {
            out.push_str("&order=priority");
        }
        out
    }

    /// The same filter with the state (and component) replaced: the overview's links.
    pub fn for_state(component: &ComponentName, state: StateFilter) -> Filter {
        Filter { component: Some(component.clone()), state: Some(state), ..Filter::default() }
    }

    /// The filter as an index selection, apart from `overdue`, whose time bound depends on
    /// the component (`Monitor` adds it). `descriptors`: the filtered component's, or, with
    /// no `component:`, every component of the pipeline: a bare `state:S` selects the batches
    /// in state S at any of them.
    pub fn selection(&self, descriptors: &[&ComponentDescriptor]) -> Selection {
        let mut selection = Selection::All;
        if let Some(StateFilter::State(state)) = self.state {
            let mut any: Vec<Selection> =
                descriptors.iter().map(|descriptor| Selection::component_state(descriptor, state)).collect();
            selection = selection.and(if any.len() == 1 { any.remove(0) } else { Selection::Or(any) });
        }
        if let Some(batch_type) = &self.batch_type {
            selection = selection.and(Selection::BatchType(batch_type.clone()));
        }
        if let Some(prefix) = &self.id_prefix {
            selection = selection.and(Selection::IdPrefix(prefix.clone()));
        }
        if self.priority != PriorityFilter::default() {
            selection = selection.and(Selection::Priority { min: self.priority.min, max: self.priority.max });
        }
        selection
    }
}

fn parse_priority(value: &str) -> Result<PriorityFilter, InvalidInput> {
    let number = |text: &str| {
        text.parse::<i32>().map_err(|_| InvalidInput::new("priority", value, "expected N, >=N or <=N (N an integer)"))
    };
    Ok(if let Some(min) = value.strip_prefix(">=") {
        PriorityFilter { min: Some(number(min)?), max: None }
    } else if let Some(max) = value.strip_prefix("<=") {
        PriorityFilter { min: None, max: Some(number(max)?) }
    } else {
        let exact = number(value)?;
        PriorityFilter { min: Some(exact), max: Some(exact) }
    })
}

/// A page cursor as the URL carries it: `after=<priority>.<created_seq>`.
pub fn parse_after(text: &str) -> Result<PageKey, InvalidInput> {
    let invalid = || InvalidInput::new("after", text, "expected PRIORITY.SEQ, as the previous page's link gives it");
    let (priority, created_seq) = text.split_once('.').ok_or_else(invalid)?;
    Ok(PageKey {
        priority: priority.parse().map_err(|_| invalid())?,
        created_seq: created_seq.parse().map_err(|_| invalid())?,
    })
}

pub fn format_after(key: PageKey) -> String {
    format!("{}.{}", key.priority, key.created_seq)
}

/// Percent-encodes a query-string value (everything but unreserved characters).
pub fn encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => out.push(byte as char),
            b' ' => out.push('+'),
            other => {
                write!(out, "%{other:02X}").ok();
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_filter_parses_and_prints_back() {
        let q = "component:checksum-verifier state:failed type:RoundTrip id:B2020 priority:>=5";
        let filter = Filter::parse(q, Some("priority")).unwrap();
        assert_eq!(filter.component.as_ref().unwrap().as_str(), "checksum-verifier");
        assert_eq!(filter.state, Some(StateFilter::State(ComponentState::Failed)));
        assert_eq!(filter.priority, PriorityFilter { min: Some(5), max: None });
        assert_eq!(filter.order, PageOrder::Priority);
        assert_eq!(filter.query(), q);
        assert_eq!(Filter::parse(&filter.query(), Some("priority")).unwrap(), filter);
        assert_eq!(filter.url_query(), format!("q={}&order=priority", encode(q)));
    }

    #[test]
    fn a_bare_word_is_an_id_prefix_and_an_empty_query_is_everything() {
        assert_eq!(Filter::parse("B2020", None).unwrap().id_prefix.as_deref(), Some("B2020"));
        assert_eq!(Filter::parse("  ", None).unwrap(), Filter::default());
        assert_eq!(Filter::default().selection(&[]), Selection::All);
    }

    #[test]
    fn bad_filters_name_the_field_and_the_value() {
        let cases = [
            ("colour:red", None, "q", "colour:red"),
            ("component:Bad/Name", None, "component", "Bad/Name"),
            ("component:a state:stuck", None, "state", "stuck"),
            ("priority:high", None, "priority", "high"),
            ("../etc", None, "id prefix", "../etc"),
            ("component:a component:b", None, "q", "component:b"),
            ("", Some("newest"), "order", "newest"),
        ];
        for (q, order, field, value) in cases {
            let error = Filter::parse(q, order).unwrap_err();
            assert_eq!((error.field.as_str(), error.value.as_str()), (field, value), "{q:?}: {error}");
        }
        let long = "x".repeat(MAX_QUERY_CHARS + 1);
        assert_eq!(Filter::parse(&long, None).unwrap_err().field, "q");
    }

    #[test]
    fn a_bare_state_is_that_state_at_any_component() {
        let filter = Filter::parse("state:failed", None).unwrap();
        assert_eq!((filter.component.as_ref(), filter.state), (None, Some(StateFilter::State(ComponentState::Failed))));
        assert_eq!(filter.query(), "state:failed");
        // No component at all: no batch is failed anywhere.
        assert_eq!(filter.selection(&[]), Selection::nothing());
    }

    #[test]
    fn the_state_filters_are_the_component_states_then_overdue() {
        let names: Vec<&str> = StateFilter::ALL.iter().map(|s| s.as_str()).collect();
        assert_eq!(
            names,
            [
                "ready",
                "person",
                "waiting",
                "working",
                "retrying",
                "failed",
                "acknowledged",
                "stale",
                "skipped",
                "success",
                "overdue"
            ]
        );
        for state in StateFilter::ALL {
            assert_eq!(StateFilter::parse(state.as_str()).unwrap(), state);
        }
        let error = StateFilter::parse("stuck").unwrap_err();
        assert!(error.reason.contains("success, overdue"), "{error}");
    }

    #[test]
    fn page_cursors_round_trip_and_bad_ones_are_refused() {
        let key = PageKey { priority: -3, created_seq: 812 };
        assert_eq!(parse_after(&format_after(key)).unwrap(), key);
        for bad in ["", "12", "a.b", "1.2.3", "1."] {
            assert_eq!(parse_after(bad).unwrap_err().field, "after", "{bad:?}");
        }
    }

    #[test]
    fn encoding_keeps_the_query_readable_and_safe() {
        assert_eq!(encode("state:failed id:B1"), "state%3Afailed+id%3AB1");
        assert_eq!(encode("<script>&"), "%3Cscript%3E%26");
    }
}
