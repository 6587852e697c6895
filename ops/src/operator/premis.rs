//! `autocomp export --format premis`: the provenance of batches as PREMIS 3.0 XML, for an
//! archive's own systems (the Library of Congress standard; the schema is
//! <https://www.loc.gov/standards/premis/v3/premis-v3-0.xsd>). Written as it is read, a page
//! of a batch's log at a time, as of the store's head when the export began (a batch
//! registered or an event recorded after it is left for the next export):
//!
//! - an `object` per batch (a `representation`: the files of one delivery), identified by its
//!   id, with its batch type as a significant property and its location as its storage;
//! - an `event` per recorded event: its seq as its identifier, its event type, its time, its
//!   report's summary and flags as its detail, its outcome with one detail note per failure
//!   and one holding the structured result as JSON, the agent that recorded it and the batch;
//! - an `agent` per component version (`archiver/1.0.0`, software) and per operator
//!   (`operator:ann`, a person) that recorded any of them; the host and process of a
//!   component's run are in its event's detail.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;

use autocomp_model::{BatchId, Event, RESULT_KEY, Seq};
use autocomp_store::{LogCursor, MAX_LOG_PAGE, ObjectStore};
use quick_xml::Writer;
use quick_xml::events::{BytesDecl, BytesText};
use serde_json::Value;

use super::show::report_summary;
use super::views::PAGE;
use super::{Operator, OperatorError};

const NAMESPACE: &str = "http://www.loc.gov/premis/v3";
const SCHEMA_LOCATION: &str = "http://www.loc.gov/premis/v3 https://www.loc.gov/standards/premis/v3/premis-v3-0.xsd";
/// The identifier types autocomp's identifiers are exported under.
const BATCH_ID: &str = "autocomp batch id";
const EVENT_SEQ: &str = "autocomp event seq";
const AGENT_ID: &str = "autocomp agent";

/// Which batches an export covers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExportScope {
    /// These batches (each must exist).
    Batches(Vec<BatchId>),
    /// Every batch registered up to the export's start.
    All,
}

/// What an export wrote, for the line on stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ExportCount {
    pub objects: u64,
    pub events: u64,
    pub agents: u64,
    /// The store's head the export is as of.
    pub as_of: Seq,
}

/// An agent of the export: who recorded events, as PREMIS names it.
struct ExportAgent {
    name: String,
    kind: Option<&'static str>,
    version: Option<String>,
}

impl Operator {
    /// `autocomp export --format premis`: writes the scope's provenance to `out` (see the
    /// module's mapping). Unknown batch ids are refused before anything is written.
    pub async fn export_premis(&self, scope: &ExportScope, out: &mut dyn Write) -> Result<ExportCount, OperatorError> {
        let store = self.store().await?;
        let as_of = store.head().await?;
        let ids = batch_ids(store.as_ref(), scope, as_of).await?;
        // Batches named are read before anything is written (an unknown one is refused
        // whole), and written from what was read.
        let mut named = Vec::new();
        if let ExportScope::Batches(_) = scope {
            for id in &ids {
                named.push(store.batch_head(id).await?);
            }
        }
        let count = ExportCount { as_of, ..ExportCount::default() };
        // PREMIS needs an object: with no batch there is no document to write.
        if ids.is_empty() {
            return Ok(count);
        }
        let mut document = Document::start(out)?;
        for (n, id) in ids.iter().enumerate() {
            let read;
            let head = match named.get(n) {
                Some(head) => head,
                None => {
                    read = store.batch_head(id).await?;
                    &read
                }
            };
            document.object(head)?;
        }
        for id in &ids {
            let mut after = Seq::ZERO;
            loop {
                let page = store.log_page(id, LogCursor::After(after), MAX_LOG_PAGE).await?;
                for event in page.events.iter().filter(|e| e.seq <= as_of) {
                    document.event(event)?;
                }
                match page.newer {
                    Some(newer) if newer < as_of => after = newer,
                    _ => break,
                }
            }
        }
        document.finish(count)
    }

    /// `autocomp export --format premis --from FILE...`: the provenance the export files of
    /// `autocomp prune` hold (the pruned histories, whole), without the store. Each file is
    /// read and checked whole before anything is written.
    pub fn export_premis_from(&self, files: &[PathBuf], out: &mut dyn Write) -> Result<ExportCount, OperatorError> {
        let mut histories = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for file in files {
            let lines = super::retention::read_export(file)?.into_iter().map(|line| line.history);
            // A batch exported twice (a prune run that stopped and one after it) is one object.
            histories.extend(lines.filter(|history| seen.insert(history.batch.id.clone())));
        }
        let count = ExportCount {
            as_of: histories.iter().map(|h| h.batch.changed_seq).max().unwrap_or(Seq::ZERO),
            ..ExportCount::default()
        };
        if histories.is_empty() {
            return Ok(count);
        }
        let mut document = Document::start(out)?;
        for history in &histories {
            document.object(&autocomp_store::BatchHead::of(&history.batch))?;
        }
        for event in histories.iter().flat_map(|history| &history.batch.events) {
            document.event(event)?;
        }
        document.finish(count)
    }
}

/// A PREMIS document being written: its objects, then its events, then the agents they
/// named.
struct Document<'w> {
    xml: Xml<'w>,
    root: quick_xml::events::BytesStart<'static>,
    agents: BTreeMap<String, ExportAgent>,
    objects: u64,
    events: u64,
}

fn written(e: std::io::Error) -> OperatorError {
    OperatorError::usage(format!("cannot write the export: {e}"))
}

impl<'w> Document<'w> {
    fn start(out: &'w mut dyn Write) -> Result<Self, OperatorError> {
        let mut xml = Writer::new_with_indent(out, b' ', 2);
        xml.write_event(quick_xml::events::Event::Decl(BytesDecl::new("1.0", Some("UTF-8"), None))).map_err(written)?;
        let root = quick_xml::events::BytesStart::new("premis:premis").with_attributes([
            ("xmlns:premis", NAMESPACE),
            ("xmlns:xsi", "http://www.w3.org/2001/XMLSchema-instance"),
            ("xsi:schemaLocation", SCHEMA_LOCATION),
            ("version", "3.0"),
        ]);
        xml.write_event(quick_xml::events::Event::Start(root.clone())).map_err(written)?;
        Ok(Document { xml, root, agents: BTreeMap::new(), objects: 0, events: 0 })
    }

    fn object(&mut self, head: &autocomp_store::BatchHead) -> Result<(), OperatorError> {
        self.objects += 1;
        write_object(&mut self.xml, head).map_err(written)
    }

    fn event(&mut self, event: &Event) -> Result<(), OperatorError> {
        let agent = agent_of(event);
        write_event(&mut self.xml, event, &agent.0).map_err(written)?;
        self.agents.entry(agent.0).or_insert(agent.1);
        self.events += 1;
        Ok(())
    }

    fn finish(mut self, count: ExportCount) -> Result<ExportCount, OperatorError> {
        for (id, agent) in &self.agents {
            write_agent(&mut self.xml, id, agent).map_err(written)?;
        }
        self.xml.write_event(quick_xml::events::Event::End(self.root.to_end())).map_err(written)?;
        self.xml.get_mut().write_all(b"\n").map_err(written)?;
        Ok(ExportCount { objects: self.objects, events: self.events, agents: self.agents.len() as u64, ..count })
    }
}

/// The ids of the scope's batches registered up to `as_of`: in id order, or as given, each
/// once.
async fn batch_ids(store: &dyn ObjectStore, scope: &ExportScope, as_of: Seq) -> Result<Vec<BatchId>, OperatorError> {
    match scope {
        ExportScope::Batches(ids) => {
            let mut seen = std::collections::BTreeSet::new();
            Ok(ids.iter().filter(|id| seen.insert(*id)).cloned().collect())
        }
        ExportScope::All => {
            let (mut ids, mut after) = (Vec::new(), None::<BatchId>);
            loop {
                let page = store.list_summaries(after.as_ref(), PAGE).await?;
                let Some(last) = page.last() else { return Ok(ids) };
                after = Some(last.id.clone());
                ids.extend(page.into_iter().filter(|s| s.created_seq <= as_of).map(|s| s.id));
            }
        }
    }
}

/// The PREMIS agent an event names, by its identifier: a component's version
/// (`archiver/1.0.0` of `archiver/1.0.0@host#pid`), an operator, or the agent as recorded.
fn agent_of(event: &Event) -> (String, ExportAgent) {
    let recorded = event.agent.as_str();
    if let Some(name) = recorded.strip_prefix("operator:") {
        return (recorded.to_owned(), ExportAgent { name: name.to_owned(), kind: Some("person"), version: None });
    }
    let program = recorded.split_once('@').map_or(recorded, |(program, _)| program);
    match program.split_once('/') {
        Some((name, version)) => (
            program.to_owned(),
            ExportAgent { name: name.to_owned(), kind: Some("software"), version: Some(version.to_owned()) },
        ),
        None => (recorded.to_owned(), ExportAgent { name: recorded.to_owned(), kind: None, version: None }),
    }
}

type Xml<'w> = Writer<&'w mut dyn Write>;

/// `<premis:NAME>text</premis:NAME>`, the text made valid XML 1.0 (`xml_text`), markup
/// escaped, and written as a character reference: a carriage return (a parser would read a
/// raw one as a line feed), and the controls XML holds (DEL, C1) and the characters that
/// conceal or reorder text (bidi overrides, zero-width characters): the document read by a
/// parser says the same, and printed to a terminal it cannot recolour it or disguise a line.
fn leaf(xml: &mut Xml<'_>, name: &str, text: &str) -> std::io::Result<()> {
    let valid = xml_text(text);
    let escaped = quick_xml::escape::escape(valid.as_ref());
    // What a terminal must not be handed raw, as `for_terminal` judges it: the carriage
    // return, DEL and C1 among the controls, the concealing and invisible characters.
    let referenced = autocomp_toolkit::terminal::marked;
    let escaped = match escaped.chars().any(referenced) {
        false => escaped,
        true => escaped
            .chars()
            .map(|c| if referenced(c) { format!("&#{};", c as u32) } else { c.to_string() })
            .collect::<String>()
            .into(),
    };
    xml.create_element(name).write_text_content(BytesText::from_escaped(escaped))?;
    Ok(())
}

/// `<premis:NAME><TYPE>type</TYPE><VALUE>value</VALUE></premis:NAME>`.
fn identifier(
    xml: &mut Xml<'_>,
    name: &str,
    (type_name, kind): (&str, &str),
    (value_name, value): (&str, &str),
) -> std::io::Result<()> {
    xml.create_element(name).write_inner_content(|xml| {
        leaf(xml, type_name, kind)?;
        leaf(xml, value_name, value)
    })?;
    Ok(())
}

fn write_object(xml: &mut Xml<'_>, head: &autocomp_store::BatchHead) -> std::io::Result<()> {
    xml.create_element("premis:object").with_attribute(("xsi:type", "premis:representation")).write_inner_content(
        |xml| {
            identifier(
                xml,
                "premis:objectIdentifier",
                ("premis:objectIdentifierType", BATCH_ID),
                ("premis:objectIdentifierValue", head.id().as_str()),
            )?;
            xml.create_element("premis:significantProperties").write_inner_content(|xml| {
                leaf(xml, "premis:significantPropertiesType", "batch type")?;
                leaf(xml, "premis:significantPropertiesValue", head.summary.batch_type.as_str())
            })?;
            if let Some(location) = head.location() {
                xml.create_element("premis:storage").write_inner_content(|xml| {
                    identifier(
                        xml,
                        "premis:contentLocation",
                        ("premis:contentLocationType", "path"),
                        ("premis:contentLocationValue", location),
                    )
                })?;
            }
            Ok(())
        },
    )?;
    Ok(())
}

fn write_event(xml: &mut Xml<'_>, event: &Event, agent: &str) -> std::io::Result<()> {
    xml.create_element("premis:event").write_inner_content(|xml| {
        identifier(
            xml,
            "premis:eventIdentifier",
            ("premis:eventIdentifierType", EVENT_SEQ),
            ("premis:eventIdentifierValue", &event.seq.0.to_string()),
        )?;
        leaf(xml, "premis:eventType", event.event_type.as_str())?;
        leaf(xml, "premis:eventDateTime", &event.at.to_string())?;
        let mut detail = report_summary(event);
        if let Some(run) = &event.run {
            detail.push(format!("run {} of {} by {}", run.generation, run.component, event.agent));
        } else if event.agent.as_str() != agent {
            detail.push(format!("recorded by {}", event.agent));
        }
        if !detail.is_empty() {
            xml.create_element("premis:eventDetailInformation")
                .write_inner_content(|xml| leaf(xml, "premis:eventDetail", &detail.join("; ")))?;
        }
        xml.create_element("premis:eventOutcomeInformation").write_inner_content(|xml| {
            leaf(xml, "premis:eventOutcome", event.outcome.as_str())?;
            for note in outcome_notes(&event.details) {
                xml.create_element("premis:eventOutcomeDetail")
                    .write_inner_content(|xml| leaf(xml, "premis:eventOutcomeDetailNote", &note))?;
            }
            Ok(())
        })?;
        xml.create_element("premis:linkingAgentIdentifier").write_inner_content(|xml| {
            leaf(xml, "premis:linkingAgentIdentifierType", AGENT_ID)?;
            leaf(xml, "premis:linkingAgentIdentifierValue", agent)?;
            let role = if agent.starts_with("operator:") { "authorizer" } else { "executing program" };
            leaf(xml, "premis:linkingAgentRole", role)
        })?;
        xml.create_element("premis:linkingObjectIdentifier").write_inner_content(|xml| {
            leaf(xml, "premis:linkingObjectIdentifierType", BATCH_ID)?;
            leaf(xml, "premis:linkingObjectIdentifierValue", event.batch_id.as_str())?;
            leaf(xml, "premis:linkingObjectRole", "source")
        })?;
        Ok(())
    })?;
    Ok(())
}

/// An event's outcome details: one note per failure kept (`reference: type: description`,
/// `the batch` for one without a reference), then the structured result as JSON.
fn outcome_notes(details: &Value) -> Vec<String> {
    let mut notes = Vec::new();
    for failure in details.get("failures").and_then(Value::as_array).into_iter().flatten() {
        let text = |key: &str| failure.get(key).and_then(Value::as_str).unwrap_or_default().to_owned();
        let reference = Some(text("reference")).filter(|r| !r.is_empty()).unwrap_or_else(|| "the batch".into());
        notes.push(format!("{reference}: {}: {}", text("type"), text("description")));
    }
    if let Some(result) = details.get(RESULT_KEY) {
        notes.push(format!("result: {result}"));
    }
    notes
}

fn write_agent(xml: &mut Xml<'_>, id: &str, agent: &ExportAgent) -> std::io::Result<()> {
    xml.create_element("premis:agent").write_inner_content(|xml| {
        identifier(
            xml,
            "premis:agentIdentifier",
            ("premis:agentIdentifierType", AGENT_ID),
            ("premis:agentIdentifierValue", id),
        )?;
        leaf(xml, "premis:agentName", &agent.name)?;
        if let Some(kind) = agent.kind {
            leaf(xml, "premis:agentType", kind)?;
        }
        if let Some(version) = &agent.version {
            leaf(xml, "premis:agentVersion", version)?;
        }
        Ok(())
    })?;
    Ok(())
}

/// `text` with what XML 1.0 cannot hold (control characters but tab, line feed and
/// carriage return; unpaired surrogates cannot occur in a `str`; U+FFFE and U+FFFF) written
/// as `\u{1b}`, so the document stays well-formed whatever a step recorded.
fn xml_text(text: &str) -> std::borrow::Cow<'_, str> {
    let allowed = |c: char| matches!(c, '\t' | '\n' | '\r') || (c >= ' ' && c != '\u{fffe}' && c != '\u{ffff}');
    if text.chars().all(allowed) {
        return std::borrow::Cow::Borrowed(text);
    }
    std::borrow::Cow::Owned(
        text.chars().map(|c| if allowed(c) { c.to_string() } else { format!("\\u{{{:x}}}", c as u32) }).collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_xml_cannot_hold_is_written_visibly() {
        assert_eq!(xml_text("plain & <ok>\ttab"), "plain & <ok>\ttab");
        assert_eq!(xml_text("bell\u{7} esc\u{1b} nul\u{0} \u{ffff}"), "bell\\u{7} esc\\u{1b} nul\\u{0} \\u{ffff}");
    }

    #[test]
    fn what_would_steer_a_terminal_is_a_character_reference_and_reads_back_the_same() {
        let text = "csi\u{9b}2J del\u{7f} rlo\u{202e}txt zw\u{200b} cr\r & <tag> plain";
        let mut written = Vec::new();
        let mut xml = Writer::new(&mut written as &mut dyn Write);
        leaf(&mut xml, "premis:note", text).unwrap();
        let written = String::from_utf8(written).unwrap();
        assert_eq!(
            written,
            "<premis:note>csi&#155;2J del&#127; rlo&#8238;txt zw&#8203; cr&#13; &amp; &lt;tag&gt; plain</premis:note>"
        );
        assert!(written.chars().all(|c| !c.is_control() && !autocomp_toolkit::terminal::marked(c)), "{written:?}");
        let inner = written.strip_prefix("<premis:note>").and_then(|w| w.strip_suffix("</premis:note>")).unwrap();
        assert_eq!(quick_xml::escape::unescape(inner).unwrap(), text, "a parser reads what was recorded");
    }

    #[test]
    fn a_components_agent_is_its_version_and_an_operators_is_the_person() {
        let event = |agent: &str| Event {
            seq: Seq(1),
            batch_id: BatchId::new("B1").unwrap(),
            event_type: autocomp_model::EventType::new("Data_Archived").unwrap(),
            outcome: autocomp_model::Outcome::Success,
            agent: autocomp_model::Agent::new(agent).unwrap(),
            at: autocomp_model::Timestamp(0),
            details: Value::Null,
            run: None,
            resets: Vec::new(),
        };
        let (id, agent) = agent_of(&event("archiver/1.2.0@host1#42"));
        assert_eq!(
            (id.as_str(), agent.name.as_str(), agent.kind, agent.version.as_deref()),
            ("archiver/1.2.0", "archiver", Some("software"), Some("1.2.0"))
        );
        let (id, agent) = agent_of(&event("operator:ann"));
        assert_eq!((id.as_str(), agent.name.as_str(), agent.kind), ("operator:ann", "ann", Some("person")));
        let (id, agent) = agent_of(&event("test"));
        assert_eq!((id.as_str(), agent.kind), ("test", None));
    }
}
