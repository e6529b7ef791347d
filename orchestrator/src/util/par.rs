//! A map over a slice on all cores, in order: planning's per-config work
//! (typing, hashing, predicting) is independent from config to config, and
//! where a run of neighbours can share work (a cache, a document built up
//! step by step), each core takes one run. Rayon's pool runs them.

use rayon::prelude::*;

/// Below this many items the work stays on the calling thread.
const SERIAL_BELOW: usize = 2048;

/// `items.iter().map(f).collect()`, the slice split across the cores; the
/// results keep the items' order. Small inputs stay on this thread.
pub fn map<T: Sync, R: Send>(items: &[T], f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    if items.len() < SERIAL_BELOW {
        return items.iter().map(f).collect();
    }
    items.par_iter().map(&f).collect()
}

/// `f` on each of a few contiguous runs of the slice, one run a core, the
/// runs' results in the slice's order: for work that carries something from
/// one item to the next (a cache, a document built up step by step). Small
/// inputs are one run, on this thread.
pub fn chunks<T: Sync, R: Send>(items: &[T], f: impl Fn(&[T]) -> R + Sync) -> Vec<R> {
    let threads = rayon::current_num_threads();
    if threads < 2 || items.len() < SERIAL_BELOW {
        return vec![f(items)];
    }
    items.par_chunks(items.len().div_ceil(threads)).map(&f).collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn results_keep_the_order_of_the_items() {
        let items: Vec<u64> = (0..10_000).collect();
        assert_eq!(super::map(&items, |x| x * 2), items.iter().map(|x| x * 2).collect::<Vec<_>>());
        assert_eq!(super::map(&[1, 2, 3], |x| x + 1), [2, 3, 4]);
        assert!(super::map(&Vec::<u8>::new(), |x| *x).is_empty());
    }

    #[test]
    fn runs_are_contiguous_and_in_order() {
        let items: Vec<u64> = (0..10_000).collect();
        let runs = super::chunks(&items, |c| c.to_vec());
        assert_eq!(runs.concat(), items);
        assert!(runs.iter().all(|r| !r.is_empty()));
        assert_eq!(super::chunks(&[1, 2, 3], |c| c.len()), [3]);
    }
}
