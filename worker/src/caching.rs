//! PyTorch's CUDA caching allocator as `torch.cuda.max_memory_allocated`
//! counts, replayed over a CPU run's allocations.
//!
//! On a CPU backend the worker's peak is exact: the live bytes of the tensors
//! ([`crate::alloc`]). The group's figure is not that: PyTorch counts the
//! *blocks* its caching allocator hands out (`c10/cuda/CUDACachingAllocator.cpp`,
//! native backend, default settings), and a block can be larger than the
//! tensor in it:
//!
//! - every request is rounded up to a multiple of 512 bytes;
//! - requests up to 1 MiB come from the small pool (2 MiB segments), larger
//!   ones from the large pool (a 20 MiB segment for a request under 10 MiB,
//!   else the request rounded up to 2 MiB);
//! - a request takes the smallest free cached block of its pool that fits
//!   (best fit, lowest address on a tie), else a new segment;
//! - the block is split when what would remain is at least 512 bytes (small
//!   pool) or more than 1 MiB (large pool); otherwise it is handed out whole,
//!   and `allocated_bytes` counts the whole block;
//! - a freed block merges with free neighbours of its segment. Cached
//!   segments are never returned here (PyTorch returns them only when a
//!   `cudaMalloc` fails, which an `ok` run never met).
//!
//! [`replay`] runs a [`Trace`] of the worker's allocations through this model
//! and gives each phase's peak as PyTorch would have counted it: the exact
//! peak plus the allocator's rounding, a term the fidelity table names.
//! Allocations under 512 bytes are the host's bookkeeping (shapes, names,
//! events), which a GPU run keeps in host memory, and are counted as they are.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use facts::event::{Phase, PhasePeaks};
use facts::gpu::Gpu;

use crate::alloc::{Trace, TraceEvent};

const MIN_BLOCK: u64 = 512;
const SMALL_SIZE: u64 = 1 << 20;
const SMALL_BUFFER: u64 = 2 << 20;
const LARGE_BUFFER: u64 = 20 << 20;
const MIN_LARGE_ALLOC: u64 = 10 << 20;
const ROUND_LARGE: u64 = 2 << 20;

/// A block: its segment and offset in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BlockId {
    segment: u32,
    offset: u64,
}

#[derive(Debug, Clone, Copy)]
struct Block {
    size: u64,
    allocated: bool,
    small: bool,
}

/// The allocator's state: its segments, free blocks and counted bytes.
#[derive(Debug, Default)]
pub struct CachingAllocator {
    /// Every block by segment and offset (adjacent blocks are neighbours).
    blocks: BTreeMap<BlockId, Block>,
    /// Free blocks of the small and the large pool, by (size, position).
    free: [BTreeSet<(u64, BlockId)>; 2],
    segments: u32,
    allocated: u64,
    reserved: u64,
}

impl CachingAllocator {
    /// A request's size as the allocator rounds it.
    pub fn round(size: u64) -> u64 {
        size.max(1).div_ceil(MIN_BLOCK) * MIN_BLOCK
    }

    /// Bytes of blocks handed out now (`torch.cuda.memory_allocated`).
    pub fn allocated(&self) -> u64 {
        self.allocated
    }

    /// Bytes of segments taken from the device (`memory_reserved`).
    pub fn reserved(&self) -> u64 {
        self.reserved
    }

    /// Hand out a block for `size` bytes.
    pub fn malloc(&mut self, size: u64) -> BlockId {
        let size = Self::round(size);
        let small = size <= SMALL_SIZE;
        let pool = &mut self.free[usize::from(small)];
        let found = pool.range((size, BlockId { segment: 0, offset: 0 })..).next().copied();
        let (have, id) = match found {
            Some(entry) => {
                pool.remove(&entry);
                entry
            }
            None => self.new_segment(size, small),
        };
        let rest = have - size;
        let split = if small { rest >= MIN_BLOCK } else { rest > SMALL_SIZE };
        let taken = if split { size } else { have };
        if split {
            let tail = BlockId { segment: id.segment, offset: id.offset + size };
            self.blocks.insert(tail, Block { size: rest, allocated: false, small });
            self.free[usize::from(small)].insert((rest, tail));
        }
        self.blocks.insert(id, Block { size: taken, allocated: true, small });
        self.allocated += taken;
        id
    }

    fn new_segment(&mut self, size: u64, small: bool) -> (u64, BlockId) {
        let bytes = match (small, size) {
            (true, _) => SMALL_BUFFER,
            (false, s) if s < MIN_LARGE_ALLOC => LARGE_BUFFER,
            (false, s) => s.div_ceil(ROUND_LARGE) * ROUND_LARGE,
        };
        let id = BlockId { segment: self.segments, offset: 0 };
        self.segments += 1;
        self.reserved += bytes;
        (bytes, id)
    }

    /// Return a block; it merges with the free blocks beside it.
    pub fn free(&mut self, id: BlockId) {
        let Some(block) = self.blocks.get(&id).copied().filter(|b| b.allocated) else {
            return;
        };
        self.allocated -= block.size;
        let pool = usize::from(block.small);
        let (mut start, mut size) = (id, block.size);
        let next = BlockId { segment: id.segment, offset: id.offset + block.size };
        if let Some(n) = self.blocks.get(&next).copied().filter(|n| !n.allocated) {
            self.free[pool].remove(&(n.size, next));
            self.blocks.remove(&next);
            size += n.size;
        }
        let before = self.blocks.range(..id).next_back().map(|(k, b)| (*k, *b));
        if let Some((prev, p)) = before.filter(|(k, p)| k.segment == id.segment && !p.allocated) {
            self.free[pool].remove(&(p.size, prev));
            self.blocks.remove(&id);
            start = prev;
            size += p.size;
        }
        self.blocks.insert(start, Block { size, allocated: false, small: block.small });
        self.free[pool].insert((size, start));
    }
}

/// Each phase's peak as PyTorch's caching allocator would count this trace's
/// allocations: bytes live before the trace (`Trace::live_before`) as they
/// are, allocations under 512 bytes as they are, every other one as its block.
/// A phase's window runs from its [`TraceEvent::Open`] to its
/// [`TraceEvent::Close`]; a phase run twice keeps its higher peak.
pub fn replay(trace: &Trace) -> PhasePeaks {
    let mut model = CachingAllocator::default();
    let mut live: HashMap<u64, Option<BlockId>> = HashMap::new();
    let mut plain = trace.live_before;
    let mut window: Option<(Phase, u64)> = None;
    let mut peaks = PhasePeaks::default();
    for event in &trace.events {
        match *event {
            TraceEvent::Alloc { addr, size } => {
                let block = (size >= MIN_BLOCK).then(|| model.malloc(size));
                if block.is_none() {
                    plain += size;
                }
                live.insert(addr, block);
            }
            TraceEvent::Free { addr, size } => match live.remove(&addr) {
                Some(Some(block)) => model.free(block),
                // Allocated before the trace, or under 512 bytes: as it was counted.
                Some(None) | None => plain = plain.saturating_sub(size),
            },
            TraceEvent::Open(phase) => window = Some((phase, 0)),
            TraceEvent::Close => {
                if let Some((phase, peak)) = window.take() {
                    let slot = phase_slot(&mut peaks, phase);
                    *slot = Some(slot.map_or(peak, |p: u64| p.max(peak)));
                }
            }
        }
        if let Some((_, peak)) = window.as_mut() {
            *peak = (*peak).max(plain + model.allocated());
        }
    }
    peaks
}

/// Bytes of one cuBLAS workspace as PyTorch allocates it on `gpu`
/// (`aten/src/ATen/cuda/CublasHandlePool.cpp`, no `CUBLAS_WORKSPACE_CONFIG`):
/// 32 MiB from Hopper on, `:4096:2:16:8` (8.125 MiB) before. It comes from
/// the caching allocator, so `max_memory_allocated` counts it.
pub fn cublas_workspace(gpu: Gpu) -> u64 {
    if gpu.compute_major() >= 9 {
        4096 * 8 * 1024
    } else {
        (4096 * 2 + 16 * 8) * 1024
    }
}

/// The cuBLAS workspaces a CUDA run of PyTorch holds in `phase`: one per
/// (handle, stream), a handle per thread, allocated at the thread's first
/// matmul and cached to the end: none while the model is built, the forward
/// thread's from the forward on, autograd's device thread's as well from the
/// backward on (the optimizer's foreach step runs no matmul).
pub fn cuda_workspaces(gpu: Gpu, phase: Phase) -> u64 {
    let handles = match phase {
        Phase::Model => 0,
        Phase::Fwd => 1,
        Phase::Bwd | Phase::Step => 2,
    };
    handles * cublas_workspace(gpu)
}

fn phase_slot(peaks: &mut PhasePeaks, phase: Phase) -> &mut Option<u64> {
    match phase {
        Phase::Model => &mut peaks.model,
        Phase::Fwd => &mut peaks.fwd,
        Phase::Bwd => &mut peaks.bwd,
        Phase::Step => &mut peaks.step,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    /// PyTorch's defaults: 32 MiB a workspace on Hopper and later, 8.125 MiB
    /// on an A100; the forward holds one, backward and step two.
    #[test]
    fn cublas_workspaces_follow_the_card_and_the_phase() {
        assert_eq!(cublas_workspace(Gpu::H200_141), 32 * MIB);
        assert_eq!(cublas_workspace(Gpu::H100_80), 32 * MIB);
        assert_eq!(cublas_workspace(Gpu::A100Sxm80), 8 * MIB + MIB / 8);
        let per_phase = Phase::ALL.map(|p| cuda_workspaces(Gpu::A100Pcie80, p));
        assert_eq!(per_phase, [0, 1, 2, 2].map(|n| n * cublas_workspace(Gpu::A100Pcie80)));
    }

    #[test]
    fn requests_round_to_512_bytes() {
        let mut a = CachingAllocator::default();
        a.malloc(1);
        a.malloc(513);
        assert_eq!(a.allocated(), 512 + 1024);
        assert_eq!(a.reserved(), 2 * MIB, "both from one small-pool segment");
    }

    #[test]
    fn a_cached_block_up_to_1_mib_larger_is_handed_out_whole() {
        let mut a = CachingAllocator::default();
        let big = a.malloc(8 * MIB);
        // The 20 MiB segment's 12 MiB tail fits this exactly.
        let _fence = a.malloc(12 * MIB);
        assert_eq!(a.reserved(), 20 * MIB);
        a.free(big);
        // 7.5 MiB in the free 8 MiB block would leave 0.5 MiB: taken whole.
        let whole = a.malloc(7 * MIB + MIB / 2);
        assert_eq!(a.allocated(), 12 * MIB + 8 * MIB, "counted as the whole block");
        a.free(whole);
        // 1.5 MiB more than asked is split off instead.
        a.malloc(6 * MIB + MIB / 2);
        assert_eq!(a.allocated(), 12 * MIB + 6 * MIB + MIB / 2);
        assert_eq!(a.reserved(), 20 * MIB);
    }

    #[test]
    fn segments_follow_the_request_size() {
        let mut a = CachingAllocator::default();
        a.malloc(MIB);
        assert_eq!(a.reserved(), 2 * MIB, "1 MiB is still the small pool");
        a.malloc(MIB + 512);
        assert_eq!(a.reserved(), 22 * MIB, "1 to 10 MiB: a 20 MiB segment");
        a.malloc(MIB);
        assert_eq!(a.reserved(), 22 * MIB, "the next 1 MiB fits the small segment");
        a.malloc(19 * MIB + 1);
        assert_eq!(a.reserved(), 42 * MIB, "10 MiB and up, too big for the free tail: rounded to 2 MiB");
        // Its new 20 MiB segment would keep under 1 MiB: handed out whole.
        assert_eq!(a.allocated(), 3 * MIB + 512 + 20 * MIB);
    }

    #[test]
    fn freed_neighbours_merge_and_best_fit_wins() {
        let mut a = CachingAllocator::default();
        let x = a.malloc(3 * MIB);
        let y = a.malloc(3 * MIB);
        let z = a.malloc(3 * MIB);
        a.free(x);
        a.free(y);
        // x and y merged into one 6 MiB block; the segment's 11 MiB tail is
        // free too. A 5.5 MiB request takes the 6 MiB block whole (the best
        // fit, 0.5 MiB over), not a piece of the tail.
        let w = a.malloc(5 * MIB + MIB / 2);
        assert_eq!(w, x);
        assert_eq!(a.allocated(), 6 * MIB + 3 * MIB);
        a.free(z);
        a.free(w);
        assert_eq!(a.allocated(), 0);
        // Everything merged back into the one segment: a 20 MiB request fits in it.
        a.malloc(20 * MIB);
        assert_eq!(a.reserved(), 20 * MIB);
    }

    #[test]
    fn replay_gives_each_phase_its_window_and_counts_small_and_earlier_bytes_as_they_are() {
        use TraceEvent::*;
        let trace = Trace {
            live_before: 1000,
            events: vec![
                Open(Phase::Model),
                Alloc { addr: 1, size: 100 },
                Alloc { addr: 2, size: 8 * MIB },
                Close,
                Open(Phase::Fwd),
                Free { addr: 2, size: 8 * MIB },
                Alloc { addr: 3, size: 7 * MIB + MIB / 2 },
                Free { addr: 99, size: 600 },
                Close,
                // Outside every window: not counted anywhere.
                Alloc { addr: 4, size: 100 * MIB },
            ],
        };
        let p = replay(&trace);
        assert_eq!(p.model, Some(1000 + 100 + 8 * MIB));
        // The window opens at the bytes live then: above what follows (the
        // freed 8 MiB merge back into their segment, 7.5 MiB are split from it).
        assert_eq!(p.fwd, Some(1000 + 100 + 8 * MIB));
        assert_eq!(p.bwd, None);
    }
}
