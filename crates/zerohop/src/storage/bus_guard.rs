//! Survives bus errors in file mappings the CPU copies from or into. A file
//! that is truncated while mapped (or, written through a mapping, whose file
//! system is full) turns an access to its vanished pages into SIGBUS,
//! which kills the process by default. The handler installed here looks the
//! faulting address up among the guarded ranges; for one of them it maps a
//! page of zeros over the faulting page and marks the range as faulted, so
//! the copy finishes (with zeros) and its caller reports the truncation. A
//! bus error anywhere else goes on to the handler that was there before (or
//! the default action), exactly as if this one were not installed.
//!
//! The handler allocates nothing and takes no lock: it reads atomics and
//! makes one `mmap` system call (rustix issues it directly, no libc state).
//!
//! Its tests are `mapping`'s, which truncate a real file mapping under a
//! copy.

use std::cell::UnsafeCell;
use std::ffi::c_void;
use std::io;
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;

/// Ranges guarded at once (one per mapped file of the running loads).
const MAX_RANGES: usize = 256;

/// A guarded range; free when `start > end`. A range is published by
/// storing `end`, then `start` (so a half-written one never matches) and
/// withdrawn in the opposite order.
struct Slot {
    claimed: AtomicBool,
    start: AtomicUsize,
    end: AtomicUsize,
    faulted: AtomicBool,
}

#[allow(clippy::declare_interior_mutable_const)] // only to build the array
const FREE: Slot = Slot {
    claimed: AtomicBool::new(false),
    start: AtomicUsize::new(usize::MAX),
    end: AtomicUsize::new(0),
    faulted: AtomicBool::new(false),
};
static SLOTS: [Slot; MAX_RANGES] = [FREE; MAX_RANGES];

/// The page size, read before the handler is first installed (the handler
/// must not call into anything that may initialise state).
static PAGE: AtomicUsize = AtomicUsize::new(0);

/// The action that was installed before ours, which the handler passes
/// other bus errors to. Two copies, `PREVIOUS_AT` naming the live one: a
/// re-installation writes the other copy, then flips the index, so a
/// handler running meanwhile reads a whole action.
struct PreviousActions([UnsafeCell<MaybeUninit<libc::sigaction>>; 2]);
// SAFETY: written only under `INSTALL` into the copy no reader uses (see
// above), read only by the handler.
unsafe impl Sync for PreviousActions {}
static PREVIOUS: PreviousActions = PreviousActions([
    UnsafeCell::new(MaybeUninit::zeroed()),
    UnsafeCell::new(MaybeUninit::zeroed()),
]);
static PREVIOUS_AT: AtomicUsize = AtomicUsize::new(0);
static INSTALL: Mutex<()> = Mutex::new(());

/// A range of memory whose bus errors are absorbed while this lives.
#[derive(Debug)]
pub(crate) struct BusGuard {
    slot: usize,
}

impl BusGuard {
    /// Guards `len` bytes at `ptr` (a mapping the caller owns and keeps
    /// mapped while the guard lives), installing the handler first if it is
    /// not the current one (another library may have replaced it since).
    pub(crate) fn new(ptr: *const u8, len: usize) -> io::Result<Self> {
        install()?;
        let slot = SLOTS
            .iter()
            .position(|s| {
                s.claimed
                    .compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
            })
            .ok_or_else(|| {
                io::Error::other(format!(
                    "more than {MAX_RANGES} file mappings are being read at once"
                ))
            })?;
        let s = &SLOTS[slot];
        s.faulted.store(false, Ordering::Relaxed);
        s.end.store(ptr as usize + len, Ordering::Release);
        s.start.store(ptr as usize, Ordering::Release);
        Ok(BusGuard { slot })
    }

    /// Whether a read of the range has faulted (and read zeros) so far.
    pub(crate) fn faulted(&self) -> bool {
        SLOTS[self.slot].faulted.load(Ordering::Acquire)
    }
}

impl Drop for BusGuard {
    fn drop(&mut self) {
        let s = &SLOTS[self.slot];
        s.start.store(usize::MAX, Ordering::Release);
        s.end.store(0, Ordering::Release);
        s.claimed.store(false, Ordering::Release);
    }
}

/// Installs the handler unless it is the current SIGBUS action, keeping
/// the current one to pass other bus errors to.
pub(super) fn install() -> io::Result<()> {
    let _one = INSTALL.lock().unwrap_or_else(|p| p.into_inner());
    PAGE.store(rustix::param::page_size(), Ordering::Relaxed);
    let mut current = MaybeUninit::<libc::sigaction>::zeroed();
    // SAFETY: queries the action only; writes one sigaction.
    if unsafe { libc::sigaction(libc::SIGBUS, std::ptr::null(), current.as_mut_ptr()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: sigaction succeeded, so it wrote the struct.
    let current = unsafe { current.assume_init() };
    if current.sa_sigaction == on_bus_error as *const () as usize {
        return Ok(());
    }
    let spare = 1 - PREVIOUS_AT.load(Ordering::Acquire);
    // SAFETY: only this function writes the copies, under `INSTALL`, and the
    // handler reads only the one `PREVIOUS_AT` names, which is not `spare`.
    unsafe { (*PREVIOUS.0[spare].get()).write(current) };
    PREVIOUS_AT.store(spare, Ordering::Release);
    // SAFETY: a zeroed sigaction is a valid starting point; the fields set
    // are a handler with the three-argument signature SA_SIGINFO promises.
    let mut ours: libc::sigaction = unsafe { std::mem::zeroed() };
    ours.sa_sigaction = on_bus_error as *const () as usize;
    ours.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK | libc::SA_RESTART;
    // SAFETY: `ours` is a complete action whose handler is async-signal-safe
    // (see `on_bus_error`); the old action was saved above.
    if unsafe { libc::sigaction(libc::SIGBUS, &ours, std::ptr::null_mut()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

extern "C" fn on_bus_error(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut c_void) {
    // SAFETY: the kernel passes a valid siginfo to SA_SIGINFO handlers.
    let (code, addr) = unsafe { ((*info).si_code, (*info).si_addr() as usize) };
    // A positive code means the kernel raised it for a memory access (not
    // kill(2) or raise(3)).
    if code > 0 && absorb(addr) {
        return;
    }
    // SAFETY: the handler runs only while installed, after `install` wrote
    // the copy `PREVIOUS_AT` names.
    let previous =
        unsafe { (*PREVIOUS.0[PREVIOUS_AT.load(Ordering::Acquire)].get()).assume_init() };
    match previous.sa_sigaction {
        libc::SIG_DFL | libc::SIG_IGN => {
            // Back to the default action; returning re-runs the faulting
            // access (or delivers the re-raised signal), which then ends the
            // process as it would have without us.
            // SAFETY: a zeroed action with SIG_DFL is the default action.
            let mut default: libc::sigaction = unsafe { std::mem::zeroed() };
            default.sa_sigaction = libc::SIG_DFL;
            // SAFETY: sigaction and raise are async-signal-safe.
            unsafe {
                libc::sigaction(sig, &default, std::ptr::null_mut());
                if code <= 0 {
                    libc::raise(sig);
                }
            }
        }
        handler if previous.sa_flags & libc::SA_SIGINFO != 0 => {
            // SAFETY: the previous owner installed this address as a
            // three-argument handler (SA_SIGINFO).
            let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut c_void) =
                unsafe { std::mem::transmute(handler) };
            f(sig, info, ctx);
        }
        handler => {
            // SAFETY: the previous owner installed this address as a
            // one-argument handler (no SA_SIGINFO).
            let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(handler) };
            f(sig);
        }
    }
}

/// Maps zeros over the faulting page if `addr` is in a guarded range.
fn absorb(addr: usize) -> bool {
    let page = PAGE.load(Ordering::Relaxed);
    for s in &SLOTS {
        if s.start.load(Ordering::Acquire) <= addr && addr < s.end.load(Ordering::Acquire) {
            let at = addr & !(page - 1);
            // SAFETY: replaces one page inside a guarded range, which belongs
            // to a file mapping whose owner keeps it mapped while guarded;
            // the new page is private zeros, writable so that a write into a
            // guarded mapping finishes too (into this page, never the
            // file's), after which its owner sees `faulted` and fails.
            let mapped = unsafe {
                rustix::mm::mmap_anonymous(
                    at as *mut c_void,
                    page,
                    rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
                    rustix::mm::MapFlags::PRIVATE | rustix::mm::MapFlags::FIXED,
                )
            };
            if mapped.is_ok() {
                s.faulted.store(true, Ordering::Release);
                return true;
            }
        }
    }
    false
}
