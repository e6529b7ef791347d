//! A chained run in `status`'s words: which segment runs (or ran last), of
//! how many at most, whether the chain waits between two, and the command's
//! last progress line.

use serde::Serialize;

use crate::state::ConfigRecord;

/// Where a chained run is: "segment 3 of ≤20, epoch 12/500".
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChainStatus {
    pub segment: u32,
    pub max_segments: u32,
    /// Segments that ended with the chain going on (every attempt's).
    pub ended: usize,
    /// The command's last progress line, where it prints one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub progress: Option<String>,
    /// `segment` ended with the chain going on, and the next has not started.
    pub between: bool,
}

impl ChainStatus {
    /// `segment 3 of ≤20, Epoch 12/500`, and what comes after a saved
    /// segment (`next`: "next to come" while the chain goes on).
    pub(super) fn words_then(&self, next: &str) -> String {
        let progress = self.progress.as_deref().map(|p| format!(", {p}")).unwrap_or_default();
        match self.between {
            true => format!("segment {} of ≤{} saved{progress}; {next}", self.segment, self.max_segments),
            false => format!("segment {} of ≤{}{progress}", self.segment, self.max_segments),
        }
    }

    pub(super) fn words(&self) -> String {
        self.words_then("next to come")
    }
}

/// Where the config's chain is, from its attempts' segments.
pub(super) fn chain_status(r: &ConfigRecord) -> Option<ChainStatus> {
    let chains: Vec<_> = r.attempts().iter().filter(|a| !a.abandoned()).filter_map(|a| a.chain()).collect();
    let last = chains.last()?;
    let position = last.position?;
    Some(ChainStatus {
        segment: position.segment,
        max_segments: position.max_segments,
        ended: chains.iter().map(|c| c.ended.len()).sum(),
        progress: last.progress.clone(),
        between: last.ended.last().is_some_and(|e| e.segment == position.segment),
    })
}
