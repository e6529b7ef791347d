//! The forward/backward simulation over a walk's segments: what is alive when,
//! the peak and the moment it happens, and the terms resident then.

use super::{Seg, Term, TermKind, TermPhase};

/// Where the forward/backward peak happens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Moment {
    Fwd(usize),
    Bwd(usize),
}

/// Simulate forward then backward over the segments; return the peak bytes of
/// the dynamic part (activations, bf16 weight copies, gradients) and when.
pub(super) fn timeline(segs: &[Seg], cache_bytes_per_param: f64, grad_bytes_per_param: f64) -> (f64, Moment) {
    let mut cur = 0.0;
    let mut peak = 0.0;
    let mut at = Moment::Fwd(0);
    for (i, s) in segs.iter().enumerate() {
        cur += cache_bytes_per_param * s.params;
        let m = cur + s.kept + s.scores + s.skip + s.transient;
        if m > peak {
            peak = m;
            at = Moment::Fwd(i);
        }
        cur += s.kept + s.scores + s.skip - s.fwd_free;
    }
    // The autocast region ends before backward: checkpointed blocks' weight copies go with its cache.
    cur -= cache_bytes_per_param * segs.iter().filter(|s| s.ckpt).map(|s| s.params).sum::<f64>();
    for (i, s) in segs.iter().enumerate().rev() {
        let recast = if s.ckpt { cache_bytes_per_param * s.params } else { 0.0 };
        let m = cur + recast + s.recompute + s.transient;
        if m > peak {
            peak = m;
            at = Moment::Bwd(i);
        }
        // A skip freed in forward (`skip_consumed`) is not freed again at its producer's backward.
        let skip = if s.skip_consumed { 0.0 } else { s.skip };
        cur -= s.kept + s.scores + skip + s.bwd_free + if s.ckpt { 0.0 } else { cache_bytes_per_param * s.params };
        cur += grad_bytes_per_param * (s.params + s.uncast) + s.bwd_alloc;
    }
    (peak, at)
}

/// The terms resident at `moment`, aggregated by name, level and kind.
pub(super) fn moment_terms(segs: &[Seg], moment: Moment, cache_bpp: f64, grad_bpp: f64, terms: &mut Vec<Term>) {
    let mut add = |name: &'static str, level: Option<u8>, kind: TermKind, bytes: f64| {
        if bytes <= 0.0 {
            return;
        }
        // Names are static literals: compare the cheap fields and the pointer first.
        let same = |t: &Term| t.level == level && t.kind == kind && (std::ptr::eq(t.name, name) || t.name == name);
        if let Some(t) = terms.iter_mut().find(|t| same(t)) {
            t.bytes += bytes;
        } else {
            terms.push(Term { name, level, kind, phase: TermPhase::FwdBwd, bytes });
        }
    };
    let (last_alive, running, in_bwd) = match moment {
        Moment::Fwd(i) => (i, i, false),
        Moment::Bwd(i) => (i, i, true),
    };
    let mut cache = 0.0;
    let mut grads = 0.0;
    let mut held = 0.0;
    let mut consumed = Vec::new();
    for (j, s) in segs.iter().enumerate() {
        if j <= last_alive {
            add(s.name, s.level, TermKind::Activations, s.kept);
            add("attention scores", s.level, TermKind::AttentionScores, s.scores);
            if !(in_bwd && s.skip_consumed) {
                add("skip connections", s.level, TermKind::Skip, s.skip);
            }
            if !in_bwd && j < running && s.fwd_free > 0.0 {
                // Consumed by this segment's forward: no longer held.
                consumed.push((s.level, s.fwd_free));
            }
            // In backward a checkpointed block's copies are back only while it runs.
            if !(in_bwd && s.ckpt) || j == running {
                cache += cache_bpp * s.params;
            }
        } else if in_bwd {
            grads += grad_bpp * (s.params + s.uncast);
            held += s.bwd_alloc - s.bwd_free;
        } else {
            break;
        }
    }
    let r = &segs[running];
    if in_bwd {
        add("checkpoint recompute of the running block", r.level, TermKind::Workspace, r.recompute);
    }
    add("transient buffers of the running block", r.level, TermKind::Workspace, r.transient);
    add("bf16 weight copies (autocast cache)", None, TermKind::Weights, cache);
    add("gradients accumulated so far", None, TermKind::Grads, grads);
    add("skip gradients waiting for the encoder", None, TermKind::Workspace, held);
    for (level, bytes) in consumed {
        if let Some(t) = terms.iter_mut().find(|t| t.kind == TermKind::Skip && t.level == level) {
            t.bytes -= bytes;
        }
    }
    terms.retain(|t| t.kind != TermKind::Skip || t.bytes > 0.0);
}
