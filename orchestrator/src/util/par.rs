//! A map over a slice on all cores, in order: planning's per-config work
//! (typing, hashing, predicting) is independent from config to config.
//! Plain scoped threads: rayon would be one more dependency for this one loop.

/// `items.iter().map(f).collect()`, the slice split across the cores; the
/// results keep the items' order. Small inputs stay on this thread.
pub fn map<T: Sync, R: Send>(items: &[T], f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    const SERIAL_BELOW: usize = 2048;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(16);
    if threads < 2 || items.len() < SERIAL_BELOW {
        return items.iter().map(f).collect();
    }
    let chunk = items.len().div_ceil(threads);
    let f = &f;
    std::thread::scope(|s| {
        let parts: Vec<_> = items.chunks(chunk).map(|c| s.spawn(move || c.iter().map(f).collect::<Vec<R>>())).collect();
        let mut out = Vec::with_capacity(items.len());
        for p in parts {
            match p.join() {
                Ok(v) => out.extend(v),
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }
        out
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
}
