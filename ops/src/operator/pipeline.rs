//! `autocomp pipeline`: every component in the registry, how its trigger reads, where and
//! when it last ran, the result contracts between steps, and the steering state (holds,
//! pools, breakers, the newest steering changes). The view, its JSON (`PipelineJson`), its
//! text and the command.

use std::fmt::Write as _;

use autocomp_model::{ComponentDescriptor, EventType, RegisteredComponent, Steering, SteeringEntry, Timestamp};
use serde::Serialize;

use super::columns::table;
use super::views::{Format, age, render_as};
use super::{Operator, OperatorError};

/// `autocomp pipeline`: every component in the registry, how its trigger reads, where and
/// when it last ran.
#[derive(Debug, Clone)]
pub struct PipelineView {
    /// In pipeline order, retired ones last.
    pub components: Vec<RegisteredComponent>,
    /// Holds, pools and breaker counts.
    pub steering: Steering,
    /// The newest entries of the steering log, newest first.
    pub log: Vec<SteeringEntry>,
    /// The store's clock, for ages.
    pub now: Timestamp,
}

/// `pipeline --format json`.
#[derive(Serialize)]
pub struct PipelineJson<'a> {
    pub now: Timestamp,
    pub components: Vec<ComponentJson<'a>>,
    pub contracts: Vec<ContractJson<'a>>,
    pub steering: &'a Steering,
    pub steering_log: &'a [SteeringEntry],
}

/// A registered component as the registry holds it, with when it was last seen.
#[derive(Serialize)]
pub struct ComponentJson<'a> {
    #[serde(flatten)]
    pub registered: &'a RegisteredComponent,
    pub last_seen: Option<Timestamp>,
    pub seconds_since_last_seen: Option<u64>,
}

/// A read of an active component checked against what its producer publishes.
#[derive(Serialize)]
pub struct ContractJson<'a> {
    pub reader: &'a autocomp_model::ComponentName,
    pub reader_version: &'a str,
    pub event_type: &'a EventType,
    pub requires: Vec<String>,
    pub producer: Option<&'a autocomp_model::ComponentName>,
    pub producer_version: Option<&'a str>,
    /// null: not checked (no producer registered, or it publishes no schema).
    pub compatible: Option<bool>,
    pub broken: Option<String>,
}

/// A trigger as one line of clauses: `requires Data_Received, blocked_by Checksums_Verified`.
fn trigger_text(descriptor: &ComponentDescriptor) -> String {
    if descriptor.source {
        return "(source: records it when a delivery arrives)".into();
    }
    let clauses: Vec<String> = descriptor.trigger.clauses().map(|c| c.to_string()).collect();
    if clauses.is_empty() { "(every batch)".into() } else { clauses.join(", ") }
}

impl PipelineView {
    /// `autocomp pipeline`: the registry, active components in pipeline order, then the
    /// retired ones.
    pub async fn read(operator: &Operator) -> Result<PipelineView, OperatorError> {
        let store = operator.store().await?;
        let active: Vec<RegisteredComponent> =
            operator.pipeline(store.as_ref()).await?.into_iter().map(|step| step.registered).collect();
        let retired = store.components().await?.into_iter().filter(RegisteredComponent::is_retired);
        let components = active.into_iter().chain(retired).collect();
        let (steering, log) = operator.steering().await?;
        Ok(PipelineView { components, steering, log, now: Timestamp::now() })
    }

    pub fn render(&self, format: Format) -> String {
        render_as(format, || self.json(), || self.to_text())
    }

    /// The JSON document, as a type.
    pub fn json(&self) -> PipelineJson<'_> {
        let components = self
            .components
            .iter()
            .map(|c| ComponentJson {
                registered: c,
                last_seen: c.last_seen(),
                seconds_since_last_seen: c.last_seen().map(|t| self.now.since(t).as_secs()),
            })
            .collect();
        let contracts = self
            .read_checks()
            .into_iter()
            .map(|check| ContractJson {
                reader: &check.reader.name,
                reader_version: &check.reader.version,
                event_type: &check.read.event_type,
                requires: autocomp_model::required_fields(&check.read.schema),
                producer: check.producer.map(|p| &p.name),
                producer_version: check.producer.map(|p| p.version.as_str()),
                compatible: check.verdict.as_ref().map(Result::is_ok),
                broken: check.broken(),
            })
            .collect();
        PipelineJson { now: self.now, components, contracts, steering: &self.steering, steering_log: &self.log }
    }

    /// Each read of an active component, checked against what its producer publishes
    /// (`model::check_reads`): a broken contract shows before a pass refuses to start.
    pub fn read_checks(&self) -> Vec<autocomp_model::ReadCheck<'_>> {
        let active: Vec<&ComponentDescriptor> =
            self.components.iter().filter(|c| !c.is_retired()).map(|c| &c.descriptor).collect();
        active.iter().flat_map(|reader| autocomp_model::check_reads(reader, &active)).collect()
    }

    /// The results the steps publish (their top-level fields) and read (the fields they
    /// require), and every broken contract; nothing when no step publishes or reads one.
    fn results_text(&self) -> String {
        let mut out = String::new();
        for c in self.components.iter().filter(|c| !c.is_retired()) {
            let d = &c.descriptor;
            if let Some(schema) = &d.result_schema {
                let fields = autocomp_model::published_fields(schema);
                let fields = if fields.is_empty() { "(no fields listed)".to_owned() } else { fields.join(", ") };
                writeln!(out, "  {} {} result: {fields}", d.name, d.event_type).ok();
            }
        }
        let checks = self.read_checks();
        for check in &checks {
            let fields = autocomp_model::required_fields(&check.read.schema);
            let fields = if fields.is_empty() { "(no field required)".to_owned() } else { fields.join(", ") };
            let verdict = match (&check.verdict, check.producer) {
                (_, None) => " (no component records it yet: not checked)".to_owned(),
                (None, Some(p)) => format!(" ({} publishes no schema: not checked)", p.name),
                (Some(Ok(())), Some(p)) => format!(" (compatible with {} {})", p.name, p.version),
                (Some(Err(_)), Some(_)) => " (BROKEN: see below)".to_owned(),
            };
            writeln!(out, "  {} reads {}: {fields}{verdict}", check.reader.name, check.read.event_type).ok();
        }
        let broken: Vec<String> = checks.iter().filter_map(|check| check.broken()).collect();
        if !broken.is_empty() {
            out.push_str("\nbroken contracts (the reader's passes do not start, exit 2):\n");
            for line in broken {
                writeln!(out, "  {line}").ok();
            }
        }
        if out.is_empty() { out } else { format!("\nresults and what reads them:\n{out}") }
    }

    /// A component's row of the table.
    fn row(&self, c: &RegisteredComponent) -> Vec<String> {
        let d = &c.descriptor;
        let hosts: Vec<String> = c
            .hosts
            .iter()
            .map(|h| {
                let outcome = if h.running() {
                    "running".to_owned()
                } else {
                    h.outcome.map_or("-".to_owned(), |o| o.as_str().to_owned())
                };
                format!("{} ({outcome})", h.host)
            })
            .collect();
        let seen = match c.last_seen() {
            Some(t) => format!("{} ago", age(self.now.since(t))),
            None => "never".into(),
        };
        let state = match (&c.retired, self.steering.hold_of(&d.name)) {
            (Some(r), _) => format!("retired {} by {}: {}", r.at, r.by, r.reason),
            (None, Some(hold)) => hold.kind.as_str().to_owned(),
            (None, None) if d.manual => "human step".into(),
            (None, None) => "active".into(),
        };
        let (name, records) = (d.name.to_string(), d.event_type.to_string());
        vec![name, records, trigger_text(d), hosts.join(", "), seen, d.version.clone(), state]
    }

    fn to_text(&self) -> String {
        if self.components.is_empty() {
            return "no component has run a pass against this store yet\n".into();
        }
        let rows: Vec<Vec<String>> = self.components.iter().map(|c| self.row(c)).collect();
        let mut out =
            table(&["component", "records", "trigger", "hosts (last pass)", "last seen", "version", "state"], &rows);
        out.push_str(&self.refused_text());
        out.push_str(&self.mixed_versions_text());
        out.push_str(&self.results_text());
        out.push_str(&self.steering_text());
        out
    }

    /// The components whose hosts last ran different versions (hosts upgraded one at a
    /// time): each version with its hosts, the newest registered first. The table's version
    /// column is the last pass's.
    fn mixed_versions_text(&self) -> String {
        let mut out = String::new();
        for c in self.components.iter().filter(|c| c.retired.is_none()) {
            if let Some(mixed) = c.mixed_versions() {
                let line = autocomp_toolkit::terminal::one_line(&mixed).into_owned();
                writeln!(out, "  {}: {line}", c.descriptor.name).ok();
            }
        }
        if out.is_empty() { out } else { format!("\nrunning mixed versions (hosts upgraded one at a time):\n{out}") }
    }

    /// The passes that did not start (a broken contract, a configuration refused), with why,
    /// as each host last reported: the table says only `(error)`.
    fn refused_text(&self) -> String {
        let mut out = String::new();
        for c in &self.components {
            for (host, why) in c.hosts.iter().filter_map(|h| Some((&h.host, h.refused()?))) {
                let why = autocomp_toolkit::terminal::one_line(why).into_owned();
                writeln!(out, "  {} on {host}: {why}", c.descriptor.name).ok();
            }
        }
        if out.is_empty() { out } else { format!("\nlast passes not started (exit 2):\n{out}") }
    }

    /// Holds, pools, breaker counts and the newest steering changes, each section only when
    /// it has something to say.
    fn steering_text(&self) -> String {
        let one_line = autocomp_toolkit::terminal::one_line;
        let mut out = String::new();
        let held = super::hold_lines(&self.steering);
        if !held.is_empty() {
            out.push_str("\nheld (no new work is claimed):\n");
            for line in held {
                writeln!(out, "  {line}").ok();
            }
        }
        if !self.steering.pools.is_empty() {
            out.push_str("\npools:\n");
            for (name, pool) in &self.steering.pools {
                let reason = one_line(&pool.reason);
                writeln!(out, "  {name}: size {} (set by {} at {}: {reason})", pool.size, pool.by, pool.since).ok();
            }
        }
        if !self.steering.breakers.is_empty() {
            out.push_str("\ncircuit breakers:\n");
            for (name, breaker) in &self.steering.breakers {
                let last = breaker.last.as_deref().map(|last| format!(", last: {}", one_line(last)));
                let last = last.unwrap_or_default();
                writeln!(out, "  {name}: {} consecutive failures{last}", breaker.consecutive).ok();
            }
        }
        if !self.log.is_empty() {
            out.push_str("\nsteering log (newest first):\n");
            for entry in &self.log {
                let (said, reason) = (&entry.said, one_line(&entry.reason));
                writeln!(out, "  {} v{} {}: {said} ({reason})", entry.at, entry.version, entry.by).ok();
            }
        }
        out
    }
}

impl Operator {
    /// `autocomp pipeline`: see `PipelineView::read`.
    pub async fn pipeline_view(&self) -> Result<PipelineView, OperatorError> {
        PipelineView::read(self).await
    }
}

#[cfg(test)]
mod tests {
    use autocomp_model::{ComponentName, EventType, HostRecord, RegisteredComponent, Trigger, WorkHistory};

    use super::*;

    fn host(name: &str, version: &str) -> HostRecord {
        HostRecord {
            host: name.into(),
            version: version.into(),
            last_seen: Timestamp(1_000),
            pass_started_at: Some(Timestamp(900)),
            pass_ended_at: Some(Timestamp(1_000)),
            outcome: Some(autocomp_model::PassOutcome::Idle),
            summary: String::new(),
            duration_ms: Some(1),
        }
    }

    fn component(name: &str, version: &str, hosts: Vec<HostRecord>) -> RegisteredComponent {
        let descriptor = autocomp_model::ComponentDescriptor::new(
            ComponentName::new(name).unwrap(),
            version,
            EventType::new("Data_Archived").unwrap(),
            Trigger::default(),
        );
        RegisteredComponent {
            descriptor,
            registered_at: Timestamp(0),
            changed_at: Timestamp(0),
            hosts,
            retired: None,
            work: WorkHistory::default(),
        }
    }

    /// Hosts upgraded one at a time: the text says which runs what, the newest first.
    #[test]
    fn hosts_running_different_versions_are_listed_under_the_table() {
        let view = |hosts| PipelineView {
            components: vec![component("archiver", "1.2.0", hosts)],
            steering: Default::default(),
            log: Vec::new(),
            now: Timestamp(2_000),
        };
        let mixed = view(vec![host("h1", "1.1.0"), host("h2", "1.2.0"), host("h3", "1.1.0")]).to_text();
        assert!(
            mixed.contains(
                "\nrunning mixed versions (hosts upgraded one at a time):\n  archiver: 1.2.0 on h2; 1.1.0 on h1, h3\n"
            ),
            "{mixed}"
        );
        let same = view(vec![host("h1", "1.2.0"), host("h2", "1.2.0")]).to_text();
        assert!(!same.contains("mixed versions"), "{same}");
    }
}
