//! Iovs: host memory shared with the agent, or GPU memory the agent maps,
//! each registered with the agent serving its mount point and published
//! under its id for other processes.

use crate::abi::{set_mount_point, Hf3fsIov, MemType, MOUNT_POINT_BYTES};
use crate::agents::{self, Agent};
use crate::published::{self, DeviceRecord, Publication};
use crate::{fail, guard};
use rustix::io::Errno;
use std::ffi::{c_char, c_int, c_void, CStr, OsStr};
use std::fs::File;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;
use zerohop_client::{HostBuffer, SharedMemory};
use zerohop_cuda::{Context, DeviceAllocation, IpcMapping};

/// What `iovh` points at.
pub struct IovState {
    pub agent: Arc<Agent>,
    /// The agent's id of the buffer.
    pub buffer: u32,
    memory: Memory,
    publication: Option<Publication>,
}

enum Memory {
    /// This process's mapping of the memfd (for a wrapped iov, the caller
    /// reaches the same memory through its own mapping at `base`).
    Host { _mapping: HostBuffer },
    Device {
        ctx: Arc<Context>,
        /// Held for their lifetimes: the allocation of a created iov, the
        /// mapping of an opened one, the record memfd of a published one.
        _owned: Option<DeviceAllocation>,
        _imported: Option<IpcMapping>,
        _record: Option<File>,
    },
}

impl IovState {
    /// The iov's state, if `iov` was filled by this library.
    ///
    /// # Safety
    /// `iov` is null or points to an iov that no call is destroying.
    pub unsafe fn of<'a>(iov: *const Hf3fsIov) -> Option<(&'a Hf3fsIov, &'a IovState)> {
        // SAFETY: per the contract; `iovh` is null or a Box this library
        // leaked, live until hf3fs_iovdestroy.
        unsafe {
            let iov = iov.as_ref()?;
            let state = iov.iovh.cast::<IovState>().as_ref()?;
            Some((iov, state))
        }
    }
}

/// The agent serving `mount` (a C string), and its bytes for the struct
/// (which they fit).
///
/// # Safety
/// `mount` is null or NUL-terminated.
pub(crate) unsafe fn mount_point<'a>(mount: *const c_char) -> io::Result<(Arc<Agent>, &'a [u8])> {
    if mount.is_null() {
        return Err(fail(Errno::INVAL));
    }
    // SAFETY: per the contract.
    let bytes = unsafe { CStr::from_ptr(mount) }.to_bytes();
    // Checked before anything is registered: the struct's field holds it.
    if bytes.len() >= MOUNT_POINT_BYTES {
        return Err(fail(Errno::NAMETOOLONG));
    }
    let (agent, _) = agents::serving(Path::new(OsStr::from_bytes(bytes))).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::NotFound,
            "no zerohop agent serves this mount point",
        )
    })?;
    Ok((agent, bytes))
}

/// Fills `iov` (checked non-null by the caller) and leaks `state` into it.
#[allow(clippy::too_many_arguments)] // the struct's fields
fn fill(
    iov: &mut Hf3fsIov,
    state: IovState,
    base: *mut u8,
    id: [u8; 16],
    mount: &[u8],
    size: usize,
    block_size: usize,
    numa: c_int,
) -> io::Result<i32> {
    let fits = set_mount_point(&mut iov.mount_point, mount);
    debug_assert!(fits, "mount_point checked the length");
    iov.base = base;
    iov.id = id;
    iov.size = size;
    iov.block_size = block_size;
    iov.numa = numa;
    iov.iovh = Box::into_raw(Box::new(state)).cast();
    Ok(0)
}

fn host_state(
    agent: Arc<Agent>,
    mem: SharedMemory,
    publish: Option<&[u8; 16]>,
) -> io::Result<(IovState, *mut u8)> {
    let publication = match publish {
        Some(id) => Some(Publication::new(id, mem.file())?),
        None => None,
    };
    let mapping = agent.client.register_host_memory(mem)?;
    let base = mapping.as_ptr();
    let state = IovState {
        agent,
        buffer: mapping.id(),
        memory: Memory::Host { _mapping: mapping },
        publication,
    };
    Ok((state, base))
}

/// # Safety
/// `iov` is writable; `mount` is NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn hf3fs_iovcreate(
    iov: *mut Hf3fsIov,
    mount: *const c_char,
    size: usize,
    block_size: usize,
    numa: c_int,
) -> c_int {
    guard(|| {
        // SAFETY: per the contract.
        let (iov, (agent, mount)) = unsafe {
            (
                iov.as_mut().ok_or_else(|| fail(Errno::INVAL))?,
                mount_point(mount)?,
            )
        };
        let id = published::new_id()?;
        let mem = SharedMemory::create(&published::memfd_name(&id), size)?;
        let (state, base) = host_state(agent, mem, Some(&id))?;
        fill(iov, state, base, id, mount, size, block_size, numa)
    })
}

/// Maps the memfd published under `id` and registers it with the agent.
fn open_host(agent: Arc<Agent>, id: &[u8; 16], size: usize) -> io::Result<(IovState, *mut u8)> {
    let mem = SharedMemory::import(published::open(id)?, size)?;
    host_state(agent, mem, None)
}

/// # Safety
/// `iov` is writable; `id` holds 16 bytes; `mount` is NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn hf3fs_iovopen(
    iov: *mut Hf3fsIov,
    id: *const u8,
    mount: *const c_char,
    size: usize,
    block_size: usize,
    numa: c_int,
) -> c_int {
    guard(|| {
        // SAFETY: per the contract.
        let (iov, id, agent, mount) = unsafe { by_id(iov, id, mount) }?;
        let (state, base) = open_host(agent, &id, size)?;
        fill(iov, state, base, id, mount, size, block_size, numa)
    })
}

/// # Safety
/// As [`hf3fs_iovopen`]; `base` maps the memory published under `id` for
/// `size` bytes while the iov is used.
#[no_mangle]
pub unsafe extern "C" fn hf3fs_iovwrap(
    iov: *mut Hf3fsIov,
    base: *mut c_void,
    id: *const u8,
    mount: *const c_char,
    size: usize,
    block_size: usize,
    numa: c_int,
) -> c_int {
    guard(|| {
        // SAFETY: per the contract.
        let (iov, id, agent, mount) = unsafe { by_id(iov, id, mount) }?;
        if base.is_null() {
            return Err(fail(Errno::INVAL));
        }
        let (state, _) = open_host(agent, &id, size)?;
        fill(iov, state, base.cast(), id, mount, size, block_size, numa)
    })
}

type ByIdArgs<'a> = (&'a mut Hf3fsIov, [u8; 16], Arc<Agent>, &'a [u8]);

/// The arguments of the calls that name an iov by id: the iov to fill,
/// the id, and the agent serving `mount` with `mount`'s bytes.
///
/// # Safety
/// `iov` is null or writable; `id` is null or holds 16 bytes; `mount` is
/// null or NUL-terminated.
unsafe fn by_id<'a>(
    iov: *mut Hf3fsIov,
    id: *const u8,
    mount: *const c_char,
) -> io::Result<ByIdArgs<'a>> {
    // SAFETY: per the contract.
    let (iov, id) = unsafe { (iov.as_mut(), id.cast::<[u8; 16]>().as_ref().copied()) };
    let (iov, id) = iov.zip(id).ok_or_else(|| fail(Errno::INVAL))?;
    // SAFETY: per the contract.
    let (agent, mount) = unsafe { mount_point(mount) }?;
    Ok((iov, id, agent, mount))
}

/// # Safety
/// `iov` was filled by this library and is not being destroyed.
#[no_mangle]
pub unsafe extern "C" fn hf3fs_iovunlink(iov: *mut Hf3fsIov) {
    // SAFETY: per the contract; the state is this library's, reached
    // mutably only here and in destroy (not concurrently, per USRBIO).
    if let Some(state) = unsafe {
        iov.as_ref()
            .and_then(|i| i.iovh.cast::<IovState>().as_mut())
    } {
        if let Some(p) = state.publication.as_mut() {
            p.unlink();
        }
    }
}

/// # Safety
/// `iov` was filled by this library, no I/O on it is in flight, and it is
/// not used afterwards (until filled again).
#[no_mangle]
pub unsafe extern "C" fn hf3fs_iovdestroy(iov: *mut Hf3fsIov) {
    // SAFETY: per the contract.
    let Some(iov) = (unsafe { iov.as_mut() }) else {
        return;
    };
    if iov.iovh.is_null() {
        return;
    }
    // SAFETY: a Box this library leaked into `iovh`, taken back once (the
    // field is cleared below).
    let state = unsafe { Box::from_raw(iov.iovh.cast::<IovState>()) };
    iov.iovh = std::ptr::null_mut();
    iov.base = std::ptr::null_mut();
    let _ = state.agent.client.deregister_buffer(state.buffer);
}

fn cuda_devices() -> usize {
    zerohop_cuda::Driver::get()
        .and_then(|d| d.device_count())
        .unwrap_or(0)
}

/// The primary context of `device`: ENOTSUP where no GPU is usable.
fn context(device: c_int, block_size: usize) -> io::Result<Arc<Context>> {
    let count = cuda_devices();
    if count == 0 {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "no usable CUDA GPU",
        ));
    }
    let ordinal = usize::try_from(device).ok().filter(|d| *d < count);
    let ordinal = ordinal.ok_or_else(|| fail(Errno::INVAL))?;
    if block_size != 0 {
        return Err(fail(Errno::INVAL));
    }
    Context::new(ordinal).map_err(cuda)
}

fn cuda(e: zerohop_cuda::CudaError) -> io::Error {
    io::Error::other(e.to_string())
}

/// Registers `size` bytes at `ptr` and publishes them under `id` (where
/// the allocation has an IPC handle: VMM memory is served but not
/// published).
fn device_state(
    agent: Arc<Agent>,
    ctx: Arc<Context>,
    ptr: u64,
    size: usize,
    id: &[u8; 16],
    owned: Option<DeviceAllocation>,
) -> io::Result<IovState> {
    let device = ctx.ordinal() as u32;
    let buffer = agent
        .client
        .register_device_buffer(device, ptr, size as u64)?;
    let published = zerohop_cuda::export_ipc(&ctx, ptr).ok().map(|export| {
        let record = DeviceRecord {
            device,
            offset: export.offset,
            size: size as u64,
            handle: export.handle,
        };
        let memfd = record.memfd(id)?;
        let publication = Publication::new(id, &memfd)?;
        Ok::<_, io::Error>((memfd, publication))
    });
    let (record, publication) = match published.transpose() {
        Ok(p) => p.unzip(),
        Err(e) => {
            let _ = agent.client.deregister_buffer(buffer);
            return Err(e);
        }
    };
    Ok(IovState {
        agent,
        buffer,
        memory: Memory::Device {
            ctx,
            _owned: owned,
            _imported: None,
            _record: record,
        },
        publication,
    })
}

/// # Safety
/// `iov` is writable; `mount` is NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn hf3fs_iovcreate_device(
    iov: *mut Hf3fsIov,
    mount: *const c_char,
    size: usize,
    block_size: usize,
    device: c_int,
) -> c_int {
    guard(|| {
        let ctx = context(device, block_size)?;
        // SAFETY: per the contract.
        let (iov, (agent, mount)) = unsafe {
            (
                iov.as_mut().ok_or_else(|| fail(Errno::INVAL))?,
                mount_point(mount)?,
            )
        };
        let memory = DeviceAllocation::new(&ctx, size).map_err(cuda)?;
        let ptr = memory.ptr();
        let id = published::new_id()?;
        let state = device_state(agent, ctx, ptr, size, &id, Some(memory))?;
        fill(iov, state, ptr as *mut u8, id, mount, size, 0, -1)
    })
}

/// # Safety
/// `iov` is writable; `id` holds 16 bytes; `mount` is NUL-terminated;
/// `ptr..ptr+size` is GPU memory of `device` that stays allocated while
/// the iov (and any opened from it) is used.
#[no_mangle]
pub unsafe extern "C" fn hf3fs_iovwrap_device(
    iov: *mut Hf3fsIov,
    ptr: *mut c_void,
    id: *const u8,
    mount: *const c_char,
    size: usize,
    block_size: usize,
    device: c_int,
) -> c_int {
    guard(|| {
        let ctx = context(device, block_size)?;
        // SAFETY: per the contract.
        let (iov, id, agent, mount) = unsafe { by_id(iov, id, mount) }?;
        let state = device_state(agent, ctx, ptr as u64, size, &id, None)?;
        fill(iov, state, ptr.cast(), id, mount, size, 0, -1)
    })
}

/// # Safety
/// `iov` is writable; `id` holds 16 bytes; `mount` is NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn hf3fs_iovopen_device(
    iov: *mut Hf3fsIov,
    id: *const u8,
    mount: *const c_char,
    size: usize,
    block_size: usize,
    device: c_int,
) -> c_int {
    guard(|| {
        let ctx = context(device, block_size)?;
        // SAFETY: per the contract.
        let (iov, id, agent, mount) = unsafe { by_id(iov, id, mount) }?;
        let record = DeviceRecord::open(&id)?;
        if record.device as usize != ctx.ordinal() || size as u64 > record.size {
            return Err(fail(Errno::INVAL));
        }
        let mapping = IpcMapping::open(&ctx, &record.handle).map_err(cuda)?;
        if record.offset + size as u64 > mapping.len() as u64 {
            return Err(fail(Errno::INVAL));
        }
        let base = mapping.base() + record.offset;
        let buffer = agent.client.register_cuda_ipc(
            record.device,
            &record.handle,
            record.offset,
            size as u64,
        )?;
        let state = IovState {
            agent,
            buffer,
            memory: Memory::Device {
                ctx,
                _owned: None,
                _imported: Some(mapping),
                _record: None,
            },
            publication: None,
        };
        fill(iov, state, base as *mut u8, id, mount, size, 0, -1)
    })
}

/// # Safety
/// `iov` is null or filled by this library.
#[no_mangle]
pub unsafe extern "C" fn hf3fs_iovsync(iov: *const Hf3fsIov, _direction: c_int) -> c_int {
    guard(|| {
        // SAFETY: per the contract.
        let (_, state) = unsafe { IovState::of(iov) }.ok_or_else(|| fail(Errno::INVAL))?;
        if let Memory::Device { ctx, .. } = &state.memory {
            ctx.synchronize().map_err(cuda)?;
        }
        Ok(0)
    })
}

#[no_mangle]
pub extern "C" fn hf3fs_gdr_available() -> bool {
    std::panic::catch_unwind(cuda_devices).is_ok_and(|n| n > 0)
}

#[no_mangle]
pub extern "C" fn hf3fs_gdr_device_count() -> c_int {
    std::panic::catch_unwind(cuda_devices).map_or(0, |n| n.min(c_int::MAX as usize) as c_int)
}

/// # Safety
/// `iov` is null or filled by this library.
#[no_mangle]
pub unsafe extern "C" fn hf3fs_iov_mem_type(iov: *const Hf3fsIov) -> MemType {
    // SAFETY: per the contract.
    match unsafe { IovState::of(iov) } {
        Some((
            _,
            IovState {
                memory: Memory::Device { .. },
                ..
            },
        )) => MemType::Device,
        _ => MemType::Host,
    }
}

/// # Safety
/// `iov` is null or filled by this library.
#[no_mangle]
pub unsafe extern "C" fn hf3fs_iov_device_id(iov: *const Hf3fsIov) -> c_int {
    // SAFETY: per the contract.
    match unsafe { IovState::of(iov) } {
        Some((
            _,
            IovState {
                memory: Memory::Device { ctx, .. },
                ..
            },
        )) => ctx.ordinal() as c_int,
        _ => -1,
    }
}
