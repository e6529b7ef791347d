//! Log axes a person reads at a glance: ticks at 1-2-5 steps, each label
//! different from its neighbours, and a range that starts at a tick at or below
//! the smallest value and ends at one at or above the largest, so no point lies
//! below the lowest label or beyond the last.

/// What the numbers are, for tick placement and labels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// Counts (tokens, voxels): `500`, `2k`, `1M`.
    Count,
    /// Memory in GiB: MiB steps below one GiB (`200M`, `500M`), GiB above (`1G`, `20G`).
    Gib,
}

/// The range drawn and the labelled ticks, ascending, first and last at the ends.
#[derive(Debug, Clone, PartialEq)]
pub struct LogAxis {
    pub lo: f64,
    pub hi: f64,
    pub ticks: Vec<f64>,
    pub unit: Unit,
}

/// Most labels an axis gets; fewer steps are chosen until they fit.
const MAX_TICKS: usize = 9;

impl LogAxis {
    /// The axis for `values` (non-positive and non-finite ones ignored); `None` without any.
    pub fn new(values: impl IntoIterator<Item = f64>, unit: Unit) -> Option<LogAxis> {
        let (mut min, mut max) = (f64::INFINITY, 0.0f64);
        for v in values.into_iter().filter(|v| v.is_finite() && *v > 0.0) {
            min = min.min(v);
            max = max.max(v);
        }
        if max <= 0.0 {
            return None;
        }
        // One value (or nearly): a range around it, with the value itself labelled.
        let single = max / min < 1.05;
        let (from, to) = if single { (min / 2.0, max * 2.0) } else { (min, max) };
        for stride in [
            Stride::Mantissas(&[1.0, 2.0, 5.0]),
            Stride::Mantissas(&[1.0, 3.0]),
            Stride::Decades(1),
            Stride::Decades(2),
            Stride::Decades(3),
            Stride::Decades(5),
            Stride::Decades(10),
        ] {
            let ladder = ladder(from, to, unit, stride);
            let Some(lo) = ladder.iter().rev().find(|t| **t <= from * (1.0 + 1e-9)).copied() else { continue };
            let Some(hi) = ladder.iter().find(|t| **t >= to * (1.0 - 1e-9)).copied() else { continue };
            let mut ticks: Vec<f64> = ladder.into_iter().filter(|t| *t >= lo && *t <= hi).collect();
            if single {
                ticks.push(min);
                ticks.sort_by(f64::total_cmp);
            }
            let axis = LogAxis { lo, hi, ticks, unit }.distinct();
            if axis.ticks.len() <= MAX_TICKS {
                return Some(axis);
            }
        }
        None
    }

    /// A tick's label.
    pub fn label(&self, v: f64) -> String {
        label(v, self.unit)
    }

    /// Drop ticks whose label equals the previous one (the lone value beside a step).
    fn distinct(mut self) -> Self {
        let mut seen: Vec<String> = Vec::new();
        let unit = self.unit;
        self.ticks.retain(|t| {
            let l = label(*t, unit);
            let new = !seen.contains(&l);
            seen.push(l);
            new
        });
        self
    }
}

/// A linear memory axis from 0: round steps (1-2-5 of MiB below a GiB, of
/// GiB above), the last tick at or above `max` and the axis ending there.
pub fn linear_gib(max: f64) -> (f64, Vec<f64>) {
    let max = if max.is_finite() && max > 0.0 { max } else { 1.0 };
    // Steps in MiB when the whole axis is below a GiB, else in GiB.
    let unit = if max < 1.0 { 1.0 / 1024.0 } else { 1.0 };
    let span = max / unit;
    let raw = span / 8.0;
    let base = 10f64.powi(decade(raw));
    let step = [1.0, 2.0, 5.0, 10.0].iter().map(|m| m * base).find(|s| *s >= raw).unwrap_or(10.0 * base);
    let n = (span / step).ceil().max(1.0) as usize;
    let ticks: Vec<f64> = (0..=n).map(|i| i as f64 * step * unit).collect();
    (n as f64 * step * unit, ticks)
}

#[derive(Debug, Clone, Copy)]
enum Stride {
    /// These mantissas in every decade.
    Mantissas(&'static [f64]),
    /// 1 x 10^k for every n-th k.
    Decades(i32),
}

/// Candidate ticks covering [from, to] with one step to spare on each side.
fn ladder(from: f64, to: f64, unit: Unit, stride: Stride) -> Vec<f64> {
    let mut out = Vec::new();
    // GiB below one: steps of MiB, so labels read 200M, 500M rather than 0.195G.
    let (scale, lo_k, hi_k) = match unit {
        Unit::Count => (1.0, decade(from) - 1, decade(to) + 1),
        Unit::Gib => (1.0 / 1024.0, decade(from * 1024.0) - 1, decade(to * 1024.0) + 1),
    };
    for k in lo_k..=hi_k {
        let mantissas: &[f64] = match stride {
            Stride::Mantissas(m) => m,
            Stride::Decades(n) if k.rem_euclid(n) == 0 => &[1.0],
            Stride::Decades(_) => &[],
        };
        for m in mantissas {
            let step = m * 10f64.powi(k);
            // From 1000M on the steps are GiB (1G, 2G), not 1000M or 1024M.
            if unit == Unit::Gib && step >= 1000.0 {
                continue;
            }
            out.push(step * scale);
        }
    }
    if unit == Unit::Gib && to >= 0.5 {
        for k in 0..=decade(to) + 1 {
            let mantissas: &[f64] = match stride {
                Stride::Mantissas(m) => m,
                Stride::Decades(n) if k.rem_euclid(n) == 0 => &[1.0],
                Stride::Decades(_) => &[],
            };
            out.extend(mantissas.iter().map(|m| m * 10f64.powi(k)));
        }
    }
    out.sort_by(f64::total_cmp);
    out
}

fn decade(v: f64) -> i32 {
    v.log10().floor() as i32
}

/// `500`, `2k`, `1.5M` (counts); `200M`, `1G`, `20G` (GiB).
pub fn label(v: f64, unit: Unit) -> String {
    match unit {
        Unit::Count if v >= 1e6 => format!("{}M", trim(v / 1e6)),
        Unit::Count if v >= 1e3 => format!("{}k", trim(v / 1e3)),
        Unit::Count => trim(v),
        Unit::Gib if v >= 1.0 => format!("{}G", trim(v)),
        Unit::Gib => format!("{}M", trim(v * 1024.0)),
    }
}

/// At most two significant decimals, no trailing zeros: `2`, `1.5`, `0.25`.
fn trim(v: f64) -> String {
    let s = if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    };
    let s = if s.contains('.') { s.trim_end_matches('0').trim_end_matches('.').to_string() } else { s };
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(a: &LogAxis) -> Vec<String> {
        a.ticks.iter().map(|t| a.label(*t)).collect()
    }

    #[test]
    fn the_range_starts_and_ends_at_labelled_ticks_around_the_data() {
        let data = [320.0, 5120.0, 20480.0, 40960.0];
        let a = LogAxis::new(data, Unit::Count).unwrap();
        assert_eq!(a.ticks.first(), Some(&a.lo));
        assert_eq!(a.ticks.last(), Some(&a.hi));
        assert!(a.lo <= 320.0 && a.hi >= 40960.0, "{a:?}");
        assert_eq!(labels(&a), ["200", "500", "1k", "2k", "5k", "10k", "20k", "50k"]);
    }

    #[test]
    fn memory_ticks_step_through_mib_into_gib_without_repeating_a_label() {
        let a = LogAxis::new([0.004, 0.09], Unit::Gib).unwrap();
        assert_eq!(labels(&a), ["2M", "5M", "10M", "20M", "50M", "100M"]);
        let b = LogAxis::new([0.3, 1.0, 1.02, 62.7], Unit::Gib).unwrap();
        let l = labels(&b);
        assert_eq!(l.first().map(String::as_str), Some("200M"), "{l:?}");
        assert_eq!(l.last().map(String::as_str), Some("100G"));
        let mut unique = l.clone();
        unique.dedup();
        assert_eq!(unique, l, "a label drawn twice");
        assert!(b.lo <= 0.3 && b.hi >= 62.7);
    }

    #[test]
    fn a_single_value_gets_its_own_tick_and_room_on_both_sides() {
        let a = LogAxis::new([4096.0, 4096.0], Unit::Count).unwrap();
        assert!(a.ticks.contains(&4096.0), "{a:?}");
        assert!(a.lo < 4096.0 && a.hi > 4096.0 && a.ticks.len() >= 3);
        let m = LogAxis::new([0.084], Unit::Gib).unwrap();
        assert!(m.ticks.contains(&0.084) && m.lo < 0.084 && m.hi > 0.084, "{m:?}");
    }

    #[test]
    fn wide_ranges_thin_out_to_decades() {
        let a = LogAxis::new([10.0, 1e9], Unit::Count).unwrap();
        assert!(a.ticks.len() <= MAX_TICKS, "{a:?}");
        assert!(a.lo <= 10.0 && a.hi >= 1e9);
        assert_eq!(labels(&a).first().map(String::as_str), Some("10"));
        assert!(LogAxis::new([0.0, -1.0, f64::NAN], Unit::Count).is_none());
    }

    #[test]
    fn linear_memory_axes_use_round_steps() {
        let (top, ticks) = linear_gib(0.0869);
        let labels: Vec<String> = ticks.iter().map(|t| label(*t, Unit::Gib)).collect();
        assert_eq!(labels[1..], ["20M", "40M", "60M", "80M", "100M"]);
        assert_eq!(top * 1024.0, 100.0);
        let (top, ticks) = linear_gib(87.0);
        assert_eq!(ticks.iter().map(|t| label(*t, Unit::Gib)).next_back().as_deref(), Some("100G"));
        assert_eq!(top, 100.0);
    }

    #[test]
    fn labels_are_short() {
        assert_eq!(label(1.5e6, Unit::Count), "1.5M");
        assert_eq!(label(2000.0, Unit::Count), "2k");
        assert_eq!(label(0.5, Unit::Gib), "512M");
        assert_eq!(label(20.0, Unit::Gib), "20G");
        assert_eq!(label(200.0 / 1024.0, Unit::Gib), "200M");
    }
}
