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
    let line_len: usize = widths.iter().map(|w| w + 2).sum();
    let mut out = String::with_capacity(cells.len() * line_len);
    for row in cells {
        let start = out.len();
        for (i, cell) in row.iter().enumerate() {
            out.push_str(cell);
            if i + 1 < row.len() {
                let pad = widths[i].saturating_sub(cell.chars().count()) + 2;
                out.extend(std::iter::repeat_n(' ', pad));
            }
        }
        // No trailing blanks (a short last cell, or empty cells at the end).
        let end = start + out[start..].trim_end().len();
        out.truncate(end);
        out.push('\n');
    }
    out
}
