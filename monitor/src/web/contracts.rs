//! Under the pipeline graph (`/graph`): the results the steps publish and what reads them.
//! One `<details>` per component that publishes a result schema (the schema as pretty JSON)
//! or reads another step's result (the fields it requires, and whether the producer's schema
//! gives them), and the broken contracts in words: the reader's passes refuse to start
//! (exit 2) until one side changes. Read from the overview's registry rows; no store read.

use autocomp_model::{ComponentDescriptor, ReadCheck, check_reads, published_fields, required_fields};

use super::html::{esc, json_block, w};
use crate::data::Overview;

/// The section, or nothing when no step publishes or reads a result.
pub fn section(overview: &Overview) -> String {
    let active: Vec<&ComponentDescriptor> =
        overview.rows.iter().filter(|row| !row.component.is_retired()).map(|row| &row.component.descriptor).collect();
    let checks: Vec<ReadCheck<'_>> = active.iter().flat_map(|reader| check_reads(reader, &active)).collect();
    let shown: Vec<&ComponentDescriptor> =
        active.iter().copied().filter(|d| d.result_schema.is_some() || !d.reads.is_empty()).collect();
    if shown.is_empty() {
        return String::new();
    }
    let mut out =
        String::from("<section class=\"contracts\" id=\"contracts\">\n<h2>Results and what reads them</h2>\n");
    let broken: Vec<String> = checks.iter().filter_map(ReadCheck::broken).collect();
    if broken.is_empty() {
        out.push_str(
            "<p>Every result a step reads is published as it expects (where its producer publishes a schema).</p>\n",
        );
    } else {
        out.push_str("<p><strong>Broken contracts</strong>: the reader's passes do not start (exit 2) until the reader's expectation or the producer's result changes.</p>\n<ul class=\"broken\">\n");
        for line in &broken {
            w!(out, "<li>{}</li>\n", esc(line));
        }
        out.push_str("</ul>\n");
    }
    for d in shown {
        let reads: Vec<&ReadCheck<'_>> = checks.iter().filter(|c| c.reader.name == d.name).collect();
        let broken = reads.iter().any(|c| c.incompatibility().is_some());
        let mut summary = Vec::new();
        if let Some(schema) = &d.result_schema {
            summary.push(format!("publishes {}: {}", d.event_type, fields(published_fields(schema))));
        }
        for check in &reads {
            summary.push(format!("reads {}", check.read.event_type));
        }
        w!(
            out,
            "<details{}><summary><strong>{}</strong> {} — {}{}</summary>\n",
            if broken { " open" } else { "" },
            esc(&d.name),
            esc(&d.version),
            esc(summary.join("; ")),
            if broken { " — <strong>broken contract</strong>" } else { "" }
        );
        if let Some(schema) = &d.result_schema {
            w!(out, "<p>The result it records as {} (JSON Schema):</p>\n", esc(&d.event_type));
            out.push_str(&json_block(schema));
            out.push('\n');
        }
        for check in reads {
            w!(
                out,
                "<p>Reads {}'s result, requiring {}: {}</p>\n",
                esc(&check.read.event_type),
                esc(fields(required_fields(&check.read.schema))),
                esc(verdict(check))
            );
        }
        out.push_str("</details>\n");
    }
    out.push_str("</section>\n");
    out
}

fn fields(fields: Vec<String>) -> String {
    if fields.is_empty() { "no listed field".to_owned() } else { fields.join(", ") }
}

/// Whether the producer's schema gives what the read expects, in words.
fn verdict(check: &ReadCheck<'_>) -> String {
    match (check.producer, &check.verdict) {
        (None, _) => "no component records it yet (not checked).".to_owned(),
        (Some(p), None) => format!("{} publishes no result schema (not checked).", p.name),
        (Some(p), Some(Ok(()))) => format!("compatible with what {} {} publishes.", p.name, p.version),
        (Some(_), Some(Err(_))) => {
            format!("incompatible: {}.", check.broken().unwrap_or_default())
        }
    }
}
