//! Plain-text tables and figures as every command prints them.

/// `2664.6M`, as the reports print parameters.
pub fn millions(n: u64) -> String {
    format!("{:.1}M", n as f64 / 1e6)
}

/// Left-aligned columns separated by two spaces; the last column is not padded.
pub fn render_table(cells: &[Vec<String>]) -> String {
    let cols = cells.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..cols)
        .map(|i| cells.iter().filter_map(|r| r.get(i)).map(|c| c.chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for row in cells {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate() {
            if i + 1 == row.len() {
                line.push_str(cell);
            } else {
                line.push_str(&format!("{cell:<w$}  ", w = widths[i]));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}
