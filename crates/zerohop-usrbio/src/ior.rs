//! Rings: I/Os prepared into a queue of this library's, handed to the
//! agent's ring by the ring's batching rules ([`crate::batches`]), and
//! their completions returned with the caller's index and userdata.

use crate::abi::{set_mount_point, Hf3fsCqe, Hf3fsIor, Hf3fsIov};
use crate::agents::Agent;
use crate::batches::Batching;
use crate::iov::{mount_point, IovState};
use crate::{fail, files, guard};
use rustix::io::Errno;
use std::collections::VecDeque;
use std::ffi::{c_char, c_int, c_void};
use std::io;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};
use zerohop_client::{Completion, IoRing, Submission};
use zerohop_wire::ring::{ring_bytes, OP_READ, OP_WRITE};

/// Entries a ring takes at most (the agent's limit).
const MAX_ENTRIES: u32 = 4096;

/// What `iorh` points at. USRBIO leaves one ring's calls to one thread;
/// the lock makes a program that breaks that rule safe, not fast.
pub struct IorState {
    agent: Arc<Agent>,
    ring: Mutex<Queue>,
}

struct Queue {
    ring: IoRing,
    for_read: bool,
    batching: Batching,
    /// The caller's userdata by index; None where the index is free.
    slots: Vec<Option<usize>>,
    free: Vec<u32>,
    /// Prepared, not yet at the agent: when, which index, what.
    pending: VecDeque<(Instant, u32, Submission)>,
}

impl Queue {
    /// Frees the indexes of `done` and writes their entries to `out`;
    /// returns how many.
    ///
    /// # Safety
    /// `out` has room for `done.len()` entries.
    unsafe fn complete(&mut self, done: Vec<Completion>, out: *mut Hf3fsCqe) -> usize {
        let n = done.len();
        for (i, c) in done.into_iter().enumerate() {
            let index = c.user_data as usize;
            // The agent echoes the index it was given; an unknown one (which
            // it never sends) frees nothing.
            let userdata = self.slots.get_mut(index).and_then(Option::take);
            if userdata.is_some() {
                self.free.push(index as u32);
            }
            let entry = Hf3fsCqe {
                index: index as i32,
                reserved: 0,
                result: c.result,
                userdata: userdata.unwrap_or(0) as *const c_void,
            };
            // SAFETY: i < n, within the caller's room.
            unsafe { *out.add(i) = entry };
        }
        n
    }

    /// Hands over what the batching rules release now.
    fn hand_over(&mut self) -> io::Result<()> {
        let oldest = self.pending.front().map(|p| p.0);
        let n = self.batching.release(
            self.pending.len(),
            self.ring.in_flight(),
            oldest,
            Instant::now(),
        );
        for (_, _, s) in self.pending.drain(..n) {
            self.ring.prepare(s)?;
        }
        if n > 0 {
            self.ring.submit()?;
        }
        Ok(())
    }
}

fn entries_for(entries: c_int) -> io::Result<u32> {
    u32::try_from(entries)
        .ok()
        .filter(|e| (1..=MAX_ENTRIES).contains(e))
        .map(u32::next_power_of_two)
        .ok_or_else(|| fail(Errno::INVAL))
}

#[no_mangle]
pub extern "C" fn hf3fs_ior_size(entries: c_int) -> usize {
    entries_for(entries).map_or(0, ring_bytes)
}

/// # Safety
/// `ior` is writable; `mount` is NUL-terminated.
#[allow(clippy::too_many_arguments)] // the ABI's
#[no_mangle]
pub unsafe extern "C" fn hf3fs_iorcreate4(
    ior: *mut Hf3fsIor,
    mount: *const c_char,
    entries: c_int,
    for_read: bool,
    io_depth: c_int,
    timeout: c_int,
    _numa: c_int,
    flags: u64,
) -> c_int {
    // SAFETY: per the contract.
    unsafe { create(ior, mount, entries, for_read, io_depth, 0, timeout, flags) }
}

/// # Safety
/// As [`hf3fs_iorcreate4`].
#[allow(clippy::too_many_arguments)] // the ABI's
#[no_mangle]
pub unsafe extern "C" fn hf3fs_iorcreate3(
    ior: *mut Hf3fsIor,
    mount: *const c_char,
    entries: c_int,
    for_read: bool,
    io_depth: c_int,
    priority: c_int,
    timeout: c_int,
    _numa: c_int,
) -> c_int {
    // SAFETY: per the contract.
    unsafe {
        create(
            ior, mount, entries, for_read, io_depth, priority, timeout, 0,
        )
    }
}

/// # Safety
/// As [`hf3fs_iorcreate4`].
#[no_mangle]
pub unsafe extern "C" fn hf3fs_iorcreate2(
    ior: *mut Hf3fsIor,
    mount: *const c_char,
    entries: c_int,
    for_read: bool,
    io_depth: c_int,
    priority: c_int,
    _numa: c_int,
) -> c_int {
    // SAFETY: per the contract.
    unsafe { create(ior, mount, entries, for_read, io_depth, priority, 0, 0) }
}

/// # Safety
/// As [`hf3fs_iorcreate4`].
#[no_mangle]
pub unsafe extern "C" fn hf3fs_iorcreate(
    ior: *mut Hf3fsIor,
    mount: *const c_char,
    entries: c_int,
    for_read: bool,
    io_depth: c_int,
    _numa: c_int,
) -> c_int {
    // SAFETY: per the contract.
    unsafe { create(ior, mount, entries, for_read, io_depth, 0, 0, 0) }
}

/// # Safety
/// As [`hf3fs_iorcreate4`].
#[allow(clippy::too_many_arguments)] // the ABI's
unsafe fn create(
    ior: *mut Hf3fsIor,
    mount: *const c_char,
    entries: c_int,
    for_read: bool,
    io_depth: c_int,
    priority: c_int,
    timeout: c_int,
    flags: u64,
) -> c_int {
    guard(|| {
        // SAFETY: per the contract.
        let ior = unsafe { ior.as_mut() }.ok_or_else(|| fail(Errno::INVAL))?;
        // SAFETY: per the contract.
        let (agent, mount) = unsafe { mount_point(mount) }?;
        let entries = entries_for(entries)?;
        if !set_mount_point(&mut ior.mount_point, mount)
            || !set_mount_point(&mut ior.iov.mount_point, mount)
        {
            return Err(fail(Errno::NAMETOOLONG));
        }
        let ring = agent.client.create_ring(entries)?;
        let batching = Batching {
            io_depth,
            timeout: u64::try_from(timeout)
                .ok()
                .filter(|t| *t > 0)
                .map(Duration::from_millis),
        };
        let queue = Queue {
            ring,
            for_read,
            batching,
            slots: vec![None; entries as usize],
            free: (0..entries).rev().collect(),
            pending: VecDeque::new(),
        };
        ior.iov = Hf3fsIov {
            base: std::ptr::null_mut(),
            iovh: std::ptr::null_mut(),
            id: [0; 16],
            mount_point: ior.iov.mount_point,
            size: ring_bytes(entries),
            block_size: 0,
            numa: -1,
        };
        ior.for_read = for_read;
        ior.io_depth = io_depth;
        ior.priority = priority;
        ior.timeout = timeout;
        ior.flags = flags;
        let state = IorState {
            agent,
            ring: Mutex::new(queue),
        };
        ior.iorh = Box::into_raw(Box::new(state)).cast();
        Ok(0)
    })
}

/// # Safety
/// `ior` is null or filled by this library and not being destroyed.
unsafe fn state<'a>(ior: *const Hf3fsIor) -> io::Result<&'a IorState> {
    // SAFETY: per the contract; `iorh` is null or a Box this library
    // leaked, live until hf3fs_iordestroy.
    unsafe {
        ior.as_ref()
            .and_then(|r| r.iorh.cast::<IorState>().as_ref())
    }
    .ok_or_else(|| fail(Errno::INVAL))
}

/// # Safety
/// `ior` was filled by this library, no I/O on it is in flight, and it is
/// not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn hf3fs_iordestroy(ior: *mut Hf3fsIor) {
    // SAFETY: per the contract.
    let Some(ior) = (unsafe { ior.as_mut() }) else {
        return;
    };
    if ior.iorh.is_null() {
        return;
    }
    // SAFETY: a Box this library leaked into `iorh`, taken back once.
    let state = unsafe { Box::from_raw(ior.iorh.cast::<IorState>()) };
    ior.iorh = std::ptr::null_mut();
    let id = state
        .ring
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .ring
        .id();
    let _ = state.agent.client.deregister_ring(id);
}

/// # Safety
/// `ior` is null or filled by this library.
#[no_mangle]
pub unsafe extern "C" fn hf3fs_io_entries(ior: *const Hf3fsIor) -> c_int {
    guard(|| {
        // SAFETY: per the contract.
        let state = unsafe { state(ior) }?;
        Ok(state
            .ring
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .slots
            .len() as c_int)
    })
}

/// # Safety
/// `ior` and `iov` are null or filled by this library.
#[allow(clippy::too_many_arguments)] // the ABI's
#[no_mangle]
pub unsafe extern "C" fn hf3fs_prep_io(
    ior: *const Hf3fsIor,
    iov: *const Hf3fsIov,
    read: bool,
    ptr: *mut c_void,
    fd: c_int,
    off: usize,
    len: u64,
    userdata: *const c_void,
) -> c_int {
    guard(|| {
        // SAFETY: per the contract.
        let (state, buffer) = unsafe { (state(ior)?, IovState::of(iov)) };
        let (iov, buffer) = buffer.ok_or_else(|| fail(Errno::INVAL))?;
        if !Arc::ptr_eq(&state.agent, &buffer.agent) {
            return Err(fail(Errno::INVAL));
        }
        let file = files::registered(fd)
            .filter(|f| Arc::ptr_eq(&f.agent, &state.agent))
            .ok_or_else(|| fail(Errno::BADF))?;
        let at = (ptr as u64)
            .checked_sub(iov.base as u64)
            .filter(|at| {
                at.checked_add(len)
                    .is_some_and(|end| end <= iov.size as u64)
            })
            .ok_or_else(|| fail(Errno::INVAL))?;
        let mut q = state.ring.lock().unwrap_or_else(|p| p.into_inner());
        if read != q.for_read {
            return Err(fail(Errno::INVAL));
        }
        let index = q.free.pop().ok_or_else(|| fail(Errno::AGAIN))?;
        q.slots[index as usize] = Some(userdata as usize);
        let op = if read { OP_READ } else { OP_WRITE };
        let entry = Submission::raw(
            op,
            file.id,
            off as u64,
            buffer.buffer,
            at,
            len,
            index as u64,
        );
        q.pending.push_back((Instant::now(), index, entry));
        Ok(index as c_int)
    })
}

/// # Safety
/// `ior` is null or filled by this library.
#[no_mangle]
pub unsafe extern "C" fn hf3fs_submit_ios(ior: *const Hf3fsIor) -> c_int {
    guard(|| {
        // SAFETY: per the contract.
        let state = unsafe { state(ior) }?;
        state
            .ring
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .hand_over()?;
        Ok(0)
    })
}

/// An absolute CLOCK_REALTIME time as an instant (now if it has passed).
fn deadline(abs: &Timespec) -> Option<Instant> {
    let at = Duration::new(
        u64::try_from(abs.tv_sec).ok()?,
        u32::try_from(abs.tv_nsec).ok()?,
    );
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .ok()?;
    Some(Instant::now() + at.saturating_sub(now))
}

/// `struct timespec` on Linux.
#[repr(C)]
pub struct Timespec {
    tv_sec: i64,
    tv_nsec: i64,
}

/// # Safety
/// `ior` is null or filled by this library; `cqes` has room for `cqec`
/// entries; `abs_timeout` is null or a valid timespec.
#[no_mangle]
pub unsafe extern "C" fn hf3fs_wait_for_ios(
    ior: *const Hf3fsIor,
    cqes: *mut Hf3fsCqe,
    cqec: c_int,
    min_results: c_int,
    abs_timeout: *const Timespec,
) -> c_int {
    guard(|| {
        // SAFETY: per the contract.
        let state = unsafe { state(ior) }?;
        let room = usize::try_from(cqec).map_err(|_| fail(Errno::INVAL))?;
        if room > 0 && cqes.is_null() {
            return Err(fail(Errno::INVAL));
        }
        // SAFETY: per the contract.
        let until = match unsafe { abs_timeout.as_ref() } {
            Some(t) => Some(deadline(t).ok_or_else(|| fail(Errno::INVAL))?),
            None => None,
        };
        let want = usize::try_from(min_results).unwrap_or(0).min(room);
        let mut q = state.ring.lock().unwrap_or_else(|p| p.into_inner());
        let mut got = 0;
        loop {
            q.hand_over()?;
            let ready = q.ring.wait_up_to(0, room - got, None)?;
            // SAFETY: at most room - got entries after the first got.
            got += unsafe { q.complete(ready, cqes.add(got)) };
            let reachable = q.ring.in_flight()
                + if q.batching.pending_can_go() {
                    q.pending.len()
                } else {
                    0
                };
            let now = Instant::now();
            if got >= want || reachable == 0 || until.is_some_and(|u| u <= now) {
                break;
            }
            // Wake for the first of: the caller's deadline, a partial
            // batch's time to go, and (with a cap on I/Os at the agent)
            // each completion that lets more go.
            let oldest = q.pending.front().map(|p| p.0);
            let wake = [until, q.batching.partial_deadline(oldest)]
                .into_iter()
                .flatten()
                .min();
            let slice = wake.map_or(Duration::from_millis(100), |w| {
                w.saturating_duration_since(now)
            });
            let done =
                q.ring
                    .wait_up_to(1, room - got, Some(slice.max(Duration::from_micros(100))))?;
            // SAFETY: as above.
            got += unsafe { q.complete(done, cqes.add(got)) };
        }
        Ok(got as c_int)
    })
}
