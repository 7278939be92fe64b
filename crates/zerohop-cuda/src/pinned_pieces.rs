//! Page-locked host memory registered piece by piece on a thread of its own,
//! so that copies from the first pieces start while the driver pins the rest.

use crate::error::{check, CudaError};
use crate::memory::{map_populated, page_size};
use crate::{Context, Result};
use cudarc::driver::sys;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;

/// An anonymous mapping of this process, populated, then registered with
/// the driver one piece after another, from its start, by a thread of its
/// own. [`PinnedPieces::wait_pinned`] blocks until a range is registered.
///
/// Why: pinning a staging pool of 128 MiB took 13 - 25 ms on the H200
/// machine (one registration after the pages were made present), all of it
/// before a first load's first copy. In pieces, the first copies wait only
/// for the first piece. The driver charges each registration a fixed cost
/// (about 0.8 ms), so pieces should not be small.
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
    /// Maps and populates `len` bytes (at least a page), then starts
    /// registering them in pieces of `piece` bytes (rounded up to whole
    /// pages) on a new thread.
    pub fn new(ctx: &Arc<Context>, len: usize, piece: usize) -> Result<Self> {
        ctx.bind()?;
        let page = page_size();
        let mapped = len.max(1).next_multiple_of(page);
        let piece = piece.max(1).next_multiple_of(page).min(mapped);
        let ptr = map_populated(mapped)?;
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

/// The pinner's thread: registers `start..start+mapped` piece by piece,
/// publishing each piece as it is done, until all are, one fails, or the
/// owner stops it.
fn pin_pieces(shared: &Shared, start: usize, mapped: usize, piece: usize) {
    let mut failed = shared.ctx.bind().err();
    let mut at = 0;
    while failed.is_none() && at < mapped {
        if shared
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .stop
        {
            break;
        }
        let n = piece.min(mapped - at);
        // SAFETY: the piece lies inside the owner's mapping, which `Drop`
        // unmaps only after this thread has ended and the piece is
        // unregistered.
        let registered = check(
            unsafe {
                sys::cuMemHostRegister_v2(
                    (start + at) as *mut libc::c_void,
                    n,
                    sys::CU_MEMHOSTREGISTER_PORTABLE,
                )
            },
            "cuMemHostRegister",
        );
        match registered {
            Ok(()) => {
                at += n;
                // Published under the lock, so a waiter that saw too few
                // bytes is already waiting when the news comes.
                let _state = shared.state.lock().unwrap_or_else(PoisonError::into_inner);
                shared.pinned.store(at, Ordering::Release);
                shared.changed.notify_all();
            }
            Err(e) => failed = Some(e),
        }
    }
    let mut state = shared.state.lock().unwrap_or_else(PoisonError::into_inner);
    state.failed = failed;
    state.done = true;
    shared.changed.notify_all();
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
