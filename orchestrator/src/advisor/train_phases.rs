//! The training run's phases as `explain` shows them: each phase's peak and
//! what it holds, the one that sets the run's peak, and its band.

use crate::precheck::training::TrainPrediction;
use crate::precheck::{gib, interval, GIB};
use crate::util::table::render_table;

/// "training run 19.4 GiB (likely 16.9G–21.9G), set by generation".
pub fn headline(t: &TrainPrediction) -> String {
    let mut s = format!(
        "training run {} ({}), set by {}",
        gib(t.peak_gib()),
        interval(t.peak_gib(), t.rel_uncertainty),
        t.peak_phase.name()
    );
    if let Some(why) = &t.uncovered {
        s.push_str(&format!(" (wide band: outside the group's training runs: {why})"));
    }
    s
}

/// Every phase, largest term first, the peak's phase marked.
pub fn render(t: &TrainPrediction) -> String {
    let mut cells = vec![vec!["Phase".to_string(), "Term".into(), "GiB".into()]];
    for p in &t.phases {
        let mark = if p.phase == t.peak_phase { " (peak)" } else { "" };
        cells.push(vec![format!("{}{mark}", p.phase.name()), "total".into(), format!("{:.2}", p.bytes / GIB)]);
        let mut terms = p.terms.clone();
        terms.sort_by(|a, b| b.bytes.total_cmp(&a.bytes));
        for term in terms {
            cells.push(vec![String::new(), term.name.to_string(), format!("{:.2}", term.bytes / GIB)]);
        }
    }
    format!("\ntraining run, phase by phase:\n{}", render_table(&cells))
}
