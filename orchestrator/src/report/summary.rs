//! The summaries under a report's tables: groups, best configs, the largest
//! token counts that ran, what never ran, the precheck's error.

use std::collections::{BTreeMap, BTreeSet};

use super::{Best, Largest, Report, Row, Status, Summary};

impl Report {
    /// Rows grouped as the reports group them: per section (input shape or
    /// table), then per group (UNet levels, transformer variant), in first-seen order.
    pub fn groups(&self) -> Vec<((String, String), Vec<&Row>)> {
        let mut order: Vec<(String, String)> = Vec::new();
        let mut by: BTreeMap<(String, String), Vec<&Row>> = BTreeMap::new();
        for r in &self.rows {
            let key = (r.section.clone(), r.group.clone());
            if !by.contains_key(&key) {
                order.push(key.clone());
            }
            by.entry(key).or_default().push(r);
        }
        // Sections stay together even when their groups interleave in the sweep.
        let sections: Vec<String> = order.iter().map(|k| k.0.clone()).fold(Vec::new(), |mut v, s| {
            if !v.contains(&s) {
                v.push(s);
            }
            v
        });
        let mut out = Vec::new();
        for s in sections {
            for k in order.iter().filter(|k| k.0 == s) {
                let rows = by.remove(k).unwrap_or_default();
                out.push((k.clone(), rows));
            }
        }
        out
    }

    pub fn sections(&self) -> BTreeSet<&str> {
        self.rows.iter().map(|r| r.section.as_str()).collect()
    }

    pub fn summary(&self) -> Summary {
        let mut counts = BTreeMap::new();
        for r in &self.rows {
            *counts.entry(r.status.label()).or_default() += 1;
        }
        let mut best = Vec::new();
        for ((section, group), rows) in self.groups() {
            let viable = rows
                .iter()
                .filter_map(|r| r.viable_peak().map(|p| (r, p)))
                .max_by(|(a, pa), (b, pb)| a.params.cmp(&b.params).then(pa.0.total_cmp(&pb.0)));
            if let Some((r, (peak_gib, predicted))) = viable {
                best.push(Best { group, section, name: r.name.clone(), params: r.params, peak_gib, predicted });
            }
        }
        let mut largest = Vec::new();
        let mut variants: Vec<&str> = Vec::new();
        for r in self.rows.iter().filter(|r| r.is_transformer()) {
            if !variants.contains(&r.group.as_str()) {
                variants.push(&r.group);
            }
        }
        for g in variants {
            let rows: Vec<&Row> = self.rows.iter().filter(|r| r.group == g).collect();
            let predicted_tokens = rows.iter().filter(|r| r.verdict.may_run()).filter_map(|r| r.tokens).max();
            let ran = rows
                .iter()
                .filter_map(|r| Some((r, r.tokens?, r.viable_peak()?)))
                .max_by(|a, b| a.1.cmp(&b.1).then(b.2 .0.total_cmp(&a.2 .0)));
            if let Some((r, tokens, (peak_gib, predicted))) = ran {
                largest.push(Largest {
                    group: g.to_string(),
                    tokens,
                    name: r.name.clone(),
                    peak_gib,
                    predicted,
                    predicted_tokens,
                });
            }
        }
        let never_run = self
            .rows
            .iter()
            .filter(|r| {
                matches!(r.status, Status::SkippedOom | Status::SkippedRisky | Status::Invalid | Status::NotSubmitted)
            })
            .map(|r| r.name.clone())
            .collect();
        let mut errs: Vec<f64> = self.rows.iter().filter_map(Row::error_pct).map(f64::abs).collect();
        errs.sort_by(f64::total_cmp);
        Summary {
            counts,
            best,
            largest_tokens: largest,
            never_run,
            median_abs_error_pct: median(&errs),
            max_abs_error_pct: errs.last().copied(),
            measured: errs.len(),
        }
    }
}

fn median(sorted: &[f64]) -> Option<f64> {
    match sorted.len() {
        0 => None,
        n if n % 2 == 1 => Some(sorted[n / 2]),
        n => Some((sorted[n / 2 - 1] + sorted[n / 2]) / 2.0),
    }
}
