//! A map over a slice on all cores, in order: planning's per-config work
//! (typing, hashing, predicting) is independent from config to config, and
//! where a run of neighbours can share work (a cache, a document built up
//! step by step), each core takes one run.
//! Plain scoped threads: rayon would be one more dependency for this one loop.

/// `items.iter().map(f).collect()`, the slice split across the cores; the
/// results keep the items' order. Small inputs stay on this thread.
pub fn map<T: Sync, R: Send>(items: &[T], f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    let mut parts = chunks(items, |c| c.iter().map(&f).collect::<Vec<R>>()).into_iter();
    let mut out = parts.next().unwrap_or_default();
    out.reserve(items.len() - out.len());
    parts.for_each(|p| out.extend(p));
    out
}

/// `f` on each of a few contiguous runs of the slice, one run a core, the
/// runs' results in the slice's order: for work that carries something from
/// one item to the next (a cache, a document built up step by step). Small
/// inputs are one run, on this thread.
pub fn chunks<T: Sync, R: Send>(items: &[T], f: impl Fn(&[T]) -> R + Sync) -> Vec<R> {
    const SERIAL_BELOW: usize = 2048;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(16);
    if threads < 2 || items.len() < SERIAL_BELOW {
        return vec![f(items)];
    }
    let chunk = items.len().div_ceil(threads);
    let f = &f;
    std::thread::scope(|s| {
        let parts: Vec<_> = items.chunks(chunk).map(|c| s.spawn(move || f(c))).collect();
        parts.into_iter().map(|p| p.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))).collect()
    })
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
