//! The driver's checkpoint of another CUDA process (`cuCheckpointProcess*`,
//! what `cuda-checkpoint --toggle` calls): lock the process's CUDA calls,
//! move what the process holds on the GPU into its own host memory and
//! release the GPU, and back. The functions are looked up by name
//! (`cuGetProcAddress`): cudarc does not bind them, and drivers before 570
//! (CUDA 12.8) lack some of them.

use crate::driver::Driver;
use crate::error::{check, CudaError, CudaErrorKind};
use crate::Result;
use cudarc::driver::sys::{self, CUresult};
use std::ffi::{c_int, c_void, CStr};
use std::sync::OnceLock;
use std::time::Duration;

/// Where a process stands with the driver's checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProcessState {
    /// Its CUDA calls run.
    Running,
    /// Its CUDA calls wait (locked).
    Locked,
    /// Its GPU state sits in its host memory; the GPU holds none of it.
    Checkpointed,
    /// A checkpoint or restore failed beyond repair.
    Failed,
    /// A state this build does not know (a newer driver's).
    Other(u32),
}

/// `{ unsigned int timeoutMs; unsigned int reserved0; cuuint64_t reserved1[7]; }`
#[repr(C)]
struct LockArgs {
    timeout_ms: u32,
    reserved0: u32,
    reserved1: [u64; 7],
}

type PidCall = unsafe extern "C" fn(c_int, *mut c_void) -> CUresult;
type StateCall = unsafe extern "C" fn(c_int, *mut u32) -> CUresult;

/// The driver's process-checkpoint entry points.
#[derive(Debug)]
pub struct ProcessCheckpoint {
    get_state: StateCall,
    lock: PidCall,
    checkpoint: PidCall,
    restore: PidCall,
    unlock: PidCall,
    storage_hook: bool,
}

impl ProcessCheckpoint {
    /// The entry points of the loaded driver; `NotSupported` where the
    /// driver has none.
    pub fn get() -> Result<&'static ProcessCheckpoint> {
        static API: OnceLock<Result<ProcessCheckpoint>> = OnceLock::new();
        API.get_or_init(Self::load).as_ref().map_err(Clone::clone)
    }

    fn load() -> Result<ProcessCheckpoint> {
        let driver = Driver::get()?;
        let raw = driver.raw_version();
        let find = |name: &'static CStr| lookup(name, raw);
        let missing = |name: &CStr| {
            CudaError::new(
                CudaErrorKind::NotSupported,
                "cuGetProcAddress",
                format!(
                    "driver CUDA {}.{} has no {} (the driver's process checkpoint needs driver 570 or later)",
                    driver.version().0,
                    driver.version().1,
                    name.to_string_lossy()
                ),
            )
        };
        let pid_call = |name: &'static CStr| {
            find(name).map(|f| {
                // SAFETY: the driver documents this entry point as
                // `CUresult f(int pid, <args struct>* args)`; a data pointer
                // argument has the same ABI whatever it points to.
                unsafe { std::mem::transmute::<*mut c_void, PidCall>(f) }
            })
        };
        let state = find(c"cuCheckpointProcessGetState")
            .ok_or_else(|| missing(c"cuCheckpointProcessGetState"))?;
        Ok(ProcessCheckpoint {
            // SAFETY: documented as `CUresult f(int pid, CUprocessState* state)`,
            // the enum being a C int.
            get_state: unsafe { std::mem::transmute::<*mut c_void, StateCall>(state) },
            lock: pid_call(c"cuCheckpointProcessLock")
                .ok_or_else(|| missing(c"cuCheckpointProcessLock"))?,
            checkpoint: pid_call(c"cuCheckpointProcessCheckpoint")
                .ok_or_else(|| missing(c"cuCheckpointProcessCheckpoint"))?,
            restore: pid_call(c"cuCheckpointProcessRestore")
                .ok_or_else(|| missing(c"cuCheckpointProcessRestore"))?,
            unlock: pid_call(c"cuCheckpointProcessUnlock")
                .ok_or_else(|| missing(c"cuCheckpointProcessUnlock"))?,
            // CUDA 13.4's caller-side storage for process checkpoints.
            storage_hook: find(c"cuCheckpointOperationComplete").is_some(),
        })
    }

    /// Whether the driver can hand a checkpoint's memory to its caller
    /// instead of staging it in the process (CUDA 13.4's
    /// `cuCheckpointOperationComplete`). zerohop does not use it yet.
    pub fn has_storage_hook(&self) -> bool {
        self.storage_hook
    }

    /// The process's state.
    pub fn state(&self, pid: u32) -> Result<ProcessState> {
        let mut state = 0u32;
        // SAFETY: writes one enum value.
        check(
            unsafe { (self.get_state)(pid_arg(pid)?, &mut state) },
            "cuCheckpointProcessGetState",
        )?;
        Ok(match state {
            0 => ProcessState::Running,
            1 => ProcessState::Locked,
            2 => ProcessState::Checkpointed,
            3 => ProcessState::Failed,
            other => ProcessState::Other(other),
        })
    }

    /// Blocks the process's further CUDA calls, once the ones in flight
    /// are done; gives up after `timeout` (the process keeps running).
    pub fn lock(&self, pid: u32, timeout: Duration) -> Result<()> {
        let mut args = LockArgs {
            timeout_ms: u32::try_from(timeout.as_millis())
                .unwrap_or(u32::MAX)
                .max(1),
            reserved0: 0,
            reserved1: [0; 7],
        };
        // SAFETY: the struct is the driver's lock arguments, zeroed where
        // reserved, alive for the call.
        check(
            unsafe { (self.lock)(pid_arg(pid)?, (&mut args as *mut LockArgs).cast()) },
            "cuCheckpointProcessLock",
        )
    }

    /// Moves the locked process's GPU state into its host memory and
    /// releases the GPU.
    pub fn checkpoint(&self, pid: u32) -> Result<()> {
        // SAFETY: the arguments are optional; null asks for the defaults.
        check(
            unsafe { (self.checkpoint)(pid_arg(pid)?, std::ptr::null_mut()) },
            "cuCheckpointProcessCheckpoint",
        )
    }

    /// Puts a checkpointed process's GPU state back (it stays locked).
    pub fn restore(&self, pid: u32) -> Result<()> {
        // SAFETY: as for `checkpoint`.
        check(
            unsafe { (self.restore)(pid_arg(pid)?, std::ptr::null_mut()) },
            "cuCheckpointProcessRestore",
        )
    }

    /// Lets the locked process's CUDA calls run again.
    pub fn unlock(&self, pid: u32) -> Result<()> {
        // SAFETY: as for `checkpoint`.
        check(
            unsafe { (self.unlock)(pid_arg(pid)?, std::ptr::null_mut()) },
            "cuCheckpointProcessUnlock",
        )
    }
}

fn pid_arg(pid: u32) -> Result<c_int> {
    c_int::try_from(pid).map_err(|_| {
        CudaError::new(
            CudaErrorKind::OutOfRange,
            "checkpoint",
            format!("{pid} is no process ID"),
        )
    })
}

/// The driver's entry point `name`, or `None` where it has none.
fn lookup(name: &CStr, version: c_int) -> Option<*mut c_void> {
    let mut f: *mut c_void = std::ptr::null_mut();
    let mut found = sys::CUdriverProcAddressQueryResult::CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    // SAFETY: `name` is NUL-terminated; the call writes one pointer and
    // one enum value.
    let status = unsafe {
        sys::cuGetProcAddress_v2(
            name.as_ptr(),
            &mut f,
            version,
            sys::CUdriverProcAddress_flags::CU_GET_PROC_ADDRESS_DEFAULT as u64,
            &mut found,
        )
    };
    (status == CUresult::CUDA_SUCCESS
        && found == sys::CUdriverProcAddressQueryResult::CU_GET_PROC_ADDRESS_SUCCESS
        && !f.is_null())
    .then_some(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_driver_is_a_typed_error() {
        // On a machine without the driver (CI) the lookup fails cleanly;
        // with one, the entry points resolve or say which is missing.
        match ProcessCheckpoint::get() {
            Ok(api) => {
                let _ = api.has_storage_hook();
            }
            Err(e) => assert!(
                matches!(
                    e.kind(),
                    CudaErrorKind::DriverNotFound | CudaErrorKind::NotSupported
                ),
                "{e}"
            ),
        }
    }

    #[test]
    fn a_pid_beyond_int_is_refused_before_the_driver() {
        assert!(pid_arg(u32::MAX).is_err());
        assert_eq!(pid_arg(42).unwrap(), 42);
    }
}
