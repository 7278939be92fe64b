//! Page-locked host memory made present and registered piece by piece on
//! threads of its own, so that copies from the first pieces start while the
//! rest is made ready.

use crate::error::{check, CudaError};
use crate::memory::{map_anonymous, page_size, populate};
use crate::{Context, Result};
use cudarc::driver::sys;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;

/// Bytes made present at a time by one thread: a huge page.
const POPULATE_CHUNK: usize = 2 << 20;

/// Threads that make the memory present together, the pinner among them:
/// the kernel zeroing pages for one thread made a 128 MiB pool wait tens of
/// milliseconds.
fn populate_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get().min(8))
}

/// An anonymous mapping of this process, made present and registered with
/// the driver one piece after another, from its start, by a thread of its
/// own (with helpers making pages present ahead of it).
/// [`PinnedPieces::wait_pinned`] blocks until a range is registered; until
/// then its bytes are not the owner's to use (making a page present writes
/// a zero into it).
///
/// Why: on the H200 machine, making a staging pool of 128 MiB present takes
/// 4.5 - 5.5 ms on 8 threads, by faults ([`populate`]; another thread's
/// `mmap`, a framework allocating device memory, runs meanwhile), and
/// registering it 2.6 - 5 ms, all before a first load's first copy; a
/// registration stops every copy of the process while it runs (8 x 16 MiB:
/// 3.1 - 5.2 ms in all, the first piece ready after 0.5 - 0.8 ms). In
/// pieces, in order, the first copies wait only for the first pieces: a
/// first load that pinned its own pool (`ZEROHOP_PREPARE=0`) had its 16
/// workers wait 47 - 50 ms in all, about 3 ms each.
#[derive(Debug)]
pub struct PinnedPieces {
    shared: Arc<Shared>,
    pinner: Option<JoinHandle<()>>,
    ptr: *mut u8,
    mapped: usize,
    piece: usize,
    len: usize,
}

#[derive(Debug)]
struct Shared {
    ctx: Arc<Context>,
    /// Bytes from the start that are registered: whole pieces, or all.
    pinned: AtomicUsize,
    state: Mutex<State>,
    changed: Condvar,
}

#[derive(Debug, Default)]
struct State {
    failed: Option<CudaError>,
    /// Set by `Drop`: register no more pieces.
    stop: bool,
    /// The pinner has ended (every piece registered, a failure, or `stop`).
    done: bool,
}

// SAFETY: the mapping is plain memory owned by this value; access goes
// through raw pointers whose users uphold the copy contracts, as with
// `PinnedBuffer`. The shared state is behind a mutex and atomics.
unsafe impl Send for PinnedPieces {}
// SAFETY: as above: `&self` methods only read the state.
unsafe impl Sync for PinnedPieces {}

impl PinnedPieces {
    /// Maps `len` bytes (at least a page), then starts making them present
    /// and registering them in pieces of `piece` bytes (rounded up to whole
    /// populating chunks) on new threads.
    pub fn new(ctx: &Arc<Context>, len: usize, piece: usize) -> Result<Self> {
        ctx.bind()?;
        let mapped = len.max(1).next_multiple_of(page_size());
        let piece = piece.max(1).next_multiple_of(POPULATE_CHUNK).min(mapped);
        let ptr = map_anonymous(mapped)?;
        let shared = Arc::new(Shared {
            ctx: ctx.clone(),
            pinned: AtomicUsize::new(0),
            state: Mutex::default(),
            changed: Condvar::new(),
        });
        let start = ptr as usize;
        let pinner = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("zerohop-pin".into())
                .spawn(move || pin_pieces(&shared, start, mapped, piece))
        };
        let pinner = match pinner {
            Ok(handle) => handle,
            Err(e) => {
                // SAFETY: unmaps the mapping made above, which nothing
                // refers to and nothing registered.
                unsafe { libc::munmap(ptr.cast(), mapped) };
                return Err(CudaError::new(
                    crate::CudaErrorKind::OutOfMemory,
                    "pinning thread",
                    format!("cannot start a thread to pin staging memory: {e}"),
                ));
            }
        };
        Ok(PinnedPieces {
            shared,
            pinner: Some(pinner),
            ptr,
            mapped,
            piece,
            len,
        })
    }

    /// Whether `offset..offset+len` is registered already.
    pub fn is_pinned(&self, offset: usize, len: usize) -> bool {
        self.shared.pinned.load(Ordering::Acquire) >= offset.saturating_add(len).min(self.mapped)
    }

    /// Blocks until `offset..offset+len` is registered; the registration's
    /// error where it failed.
    pub fn wait_pinned(&self, offset: usize, len: usize) -> Result<()> {
        let end = offset.saturating_add(len).min(self.mapped);
        let shared = &self.shared;
        if shared.pinned.load(Ordering::Acquire) >= end {
            return Ok(());
        }
        let mut state = shared.state.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            if shared.pinned.load(Ordering::Acquire) >= end {
                return Ok(());
            }
            if let Some(e) = &state.failed {
                return Err(e.clone());
            }
            if state.done {
                return Err(CudaError::new(
                    crate::CudaErrorKind::NotSupported,
                    "cuMemHostRegister",
                    "staging memory is being released",
                ));
            }
            state = shared
                .changed
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// Whether a registration failed: the pieces after it are never
    /// registered.
    pub fn has_failed(&self) -> bool {
        let state = self
            .shared
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        state.failed.is_some()
    }

    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// The pinner's thread: makes `start..start+mapped` present and registers
/// it piece by piece, publishing each piece as it is done, until all are,
/// one fails, or the owner stops it. Helper threads make chunks present in
/// order ahead of it; it makes chunks present itself while its next piece
/// is not yet.
fn pin_pieces(shared: &Shared, start: usize, mapped: usize, piece: usize) {
    let chunks = mapped.div_ceil(POPULATE_CHUNK);
    let next = AtomicUsize::new(0);
    let populated: Vec<AtomicUsize> = (0..mapped.div_ceil(piece))
        .map(|_| AtomicUsize::new(0))
        .collect();
    let quit = std::sync::atomic::AtomicBool::new(false);
    // Makes the next chunk present; false once none is left (or on quit).
    let populate_next = || {
        let c = next.fetch_add(1, Ordering::Relaxed);
        if c >= chunks || quit.load(Ordering::Relaxed) {
            return false;
        }
        let from = c * POPULATE_CHUNK;
        populate(start + from, POPULATE_CHUNK.min(mapped - from));
        // A piece is whole chunks, or the whole mapping (see `new`).
        populated[c * POPULATE_CHUNK / piece].fetch_add(1, Ordering::Release);
        true
    };
    let stopped = || {
        shared
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .stop
    };
    let failed = std::thread::scope(|scope| {
        for _ in 1..populate_threads().min(chunks) {
            scope.spawn(|| while populate_next() {});
        }
        let outcome = register_pieces(shared, start, mapped, piece, |k, end| {
            let need = (end - k * piece).div_ceil(POPULATE_CHUNK);
            while populated[k].load(Ordering::Acquire) < need {
                if !populate_next() {
                    std::thread::yield_now();
                }
            }
            !stopped()
        });
        quit.store(true, Ordering::Relaxed);
        outcome.err()
    });
    let mut state = shared.state.lock().unwrap_or_else(PoisonError::into_inner);
    state.failed = failed;
    state.done = true;
    shared.changed.notify_all();
}

/// Registers the pieces in order, each once `ready(k, end)` (piece `k`,
/// ending at byte `end`) says it may be: false stops.
fn register_pieces(
    shared: &Shared,
    start: usize,
    mapped: usize,
    piece: usize,
    mut ready: impl FnMut(usize, usize) -> bool,
) -> Result<()> {
    shared.ctx.bind()?;
    for (k, at) in (0..mapped).step_by(piece).enumerate() {
        let n = piece.min(mapped - at);
        if !ready(k, at + n) {
            break;
        }
        // SAFETY: the piece lies inside the owner's mapping, which `Drop`
        // unmaps only after this thread has ended and the piece is
        // unregistered.
        check(
            unsafe {
                sys::cuMemHostRegister_v2(
                    (start + at) as *mut libc::c_void,
                    n,
                    sys::CU_MEMHOSTREGISTER_PORTABLE,
                )
            },
            "cuMemHostRegister",
        )?;
        // Published under the lock, so a waiter that saw too few bytes is
        // already waiting when the news comes.
        let _state = shared.state.lock().unwrap_or_else(PoisonError::into_inner);
        shared.pinned.store(at + n, Ordering::Release);
        shared.changed.notify_all();
    }
    Ok(())
}

impl Drop for PinnedPieces {
    fn drop(&mut self) {
        self.shared
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .stop = true;
        if let Some(pinner) = self.pinner.take() {
            // A panic there left nothing half-done that matters here.
            let _ = pinner.join();
        }
        // Unregistered only where the context can still be bound: a mapping
        // still registered is never unmapped (the driver may be using it).
        if self.shared.ctx.bind().is_err() {
            return;
        }
        let pinned = self.shared.pinned.load(Ordering::Acquire);
        for at in (0..pinned).step_by(self.piece) {
            // SAFETY: balances the registration of the piece at `at`, which
            // the pinner made (it registered every piece below `pinned`).
            unsafe { sys::cuMemHostUnregister(self.ptr.add(at).cast()) };
        }
        // SAFETY: nothing refers to the mapping any more, and none of it is
        // registered.
        unsafe { libc::munmap(self.ptr.cast(), self.mapped) };
    }
}
