//! Plain-text layout the operator's text views share: left-aligned columns. Its own room,
//! so views and the parts they show (the timeline) both use it without importing each other.

/// Left-aligned columns, two spaces apart (widths in characters, as `format!` pads). A cell
/// is one line: a line feed in it (a reason, a report) shows as `\u000a`, never as a line
/// of its own that could pass for the program's.
pub(crate) fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|row| row.iter().map(|cell| autocomp_toolkit::terminal::one_line(cell).into_owned()).collect())
        .collect();
    let rows = &rows;
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let padded: Vec<String> = cells.iter().zip(&widths).map(|(cell, width)| format!("{cell:<width$}")).collect();
        format!("{}\n", padded.join("  ").trim_end())
    };
    let mut out = line(header.to_vec());
    for row in rows {
        out.push_str(&line(row.iter().map(String::as_str).collect()));
    }
    out
}
