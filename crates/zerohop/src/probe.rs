//! What this machine supports: facts for `info`, the path choice and the
//! benchmarks.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// Fraction of `len` bytes of `file` resident in the page cache.
pub fn page_cache_residency(file: &File, len: u64) -> std::io::Result<f64> {
    if len == 0 {
        return Ok(1.0);
    }
    let page = crate::hot::page_size() as u64;
    // SAFETY: a fresh read-only mapping, unmapped below; mincore only reads
    // page-table state and writes one byte per page into `vec`.
    unsafe {
        let ptr = libc::mmap(
            std::ptr::null_mut(),
            len as usize,
            libc::PROT_READ,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            0,
        );
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let pages = len.div_ceil(page) as usize;
        let mut vec = vec![0u8; pages];
        let rc = libc::mincore(ptr, len as usize, vec.as_mut_ptr());
        let err = std::io::Error::last_os_error();
        libc::munmap(ptr, len as usize);
        if rc != 0 {
            return Err(err);
        }
        Ok(vec.iter().filter(|&&b| b & 1 == 1).count() as f64 / pages as f64)
    }
}

/// Whether the kernel lets this process create an io_uring.
pub fn io_uring_available() -> Result<(), String> {
    crate::storage::UringBackend::probe()
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// Whether the file system holding `path` (a file or directory) accepts
/// O_DIRECT reads, with the reason when it does not.
pub fn o_direct_supported(path: &Path) -> Result<(), String> {
    let probe_file;
    let target = if path.is_dir() {
        probe_file = tempfile_in(path).map_err(|e| format!("cannot create a probe file: {e}"))?;
        probe_file.0.as_path()
    } else {
        path
    };
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(target)
        .map_err(|e| format!("open(O_DIRECT) refused: {e}"))?;
    let layout = std::alloc::Layout::from_size_align(4096, 4096).expect("valid layout");
    // SAFETY: non-zero size; freed below.
    let buf = unsafe { std::alloc::alloc(layout) };
    // SAFETY: aligned 4096-byte buffer for an aligned read at offset 0.
    let rc = unsafe { libc::pread(f.as_raw_fd(), buf.cast(), 4096, 0) };
    let err = std::io::Error::last_os_error();
    // SAFETY: allocated above with this layout.
    unsafe { std::alloc::dealloc(buf, layout) };
    if rc < 0 {
        return Err(format!("an aligned O_DIRECT read failed: {err}"));
    }
    Ok(())
}

/// A file that removes itself on drop.
struct TempPath(std::path::PathBuf);
impl Drop for TempPath {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn tempfile_in(dir: &Path) -> std::io::Result<TempPath> {
    let p = dir.join(format!(".zerohop-probe-{}", std::process::id()));
    std::fs::write(&p, vec![0u8; 8192])?;
    Ok(TempPath(p))
}

/// Whether GPUDirect Storage has a real direct path here, and why.
#[derive(Debug, Clone, serde::Serialize)]
pub struct GdsSupport {
    pub direct_path: bool,
    pub nvidia_fs_loaded: bool,
    pub cufile_library: bool,
    pub pci_p2pdma_kernel: Option<bool>,
    pub reason: String,
}

/// Looks for the nvidia-fs kernel module, the cuFile library and kernel
/// PCI P2PDMA support. cuFile's compatibility mode (a host bounce) is never
/// counted as a direct path.
pub fn gds_support() -> GdsSupport {
    let nvidia_fs_loaded = Path::new("/sys/module/nvidia_fs").exists()
        || std::fs::read_to_string("/proc/modules")
            .is_ok_and(|m| m.lines().any(|l| l.starts_with("nvidia_fs ")));
    let cufile_library = ["libcufile.so.0", "libcufile.so.1", "libcufile.so"]
        .iter()
        .any(|name| {
            let c = std::ffi::CString::new(*name).expect("no NUL");
            // SAFETY: loads the library only to see that it exists; the handle
            // is closed at once and nothing from it is called.
            unsafe {
                let h = libc::dlopen(c.as_ptr(), libc::RTLD_LAZY);
                if h.is_null() {
                    false
                } else {
                    libc::dlclose(h);
                    true
                }
            }
        });
    let pci_p2pdma_kernel = kernel_config("CONFIG_PCI_P2PDMA");
    let direct_path = cufile_library && (nvidia_fs_loaded || pci_p2pdma_kernel == Some(true));
    let reason = if direct_path {
        if nvidia_fs_loaded {
            "nvidia-fs is loaded and libcufile is present".to_string()
        } else {
            "the kernel has PCI P2PDMA and libcufile is present (needs a P2PDMA-capable NVMe and GPU driver)".into()
        }
    } else {
        let mut why = Vec::new();
        if !nvidia_fs_loaded {
            why.push("the nvidia-fs kernel module is not loaded");
        }
        if pci_p2pdma_kernel != Some(true) {
            why.push("kernel PCI P2PDMA support is absent or unknown");
        }
        if !cufile_library {
            why.push("libcufile is not installed");
        }
        format!(
            "no direct path: {}; the staged pipeline is used",
            why.join(", ")
        )
    };
    GdsSupport {
        direct_path,
        nvidia_fs_loaded,
        cufile_library,
        pci_p2pdma_kernel,
        reason,
    }
}

fn kernel_config(key: &str) -> Option<bool> {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").ok()?;
    let text = std::fs::read_to_string(format!("/boot/config-{}", release.trim())).ok()?;
    Some(text.lines().any(|l| l == format!("{key}=y")))
}

/// How the page cache was emptied for a file (for cold measurements).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CacheDrop {
    /// `/proc/sys/vm/drop_caches` (root): every clean page dropped.
    DropCaches,
    /// `posix_fadvise(DONTNEED)` on the file only.
    Fadvise,
}

/// Drops `path` from the page cache: drop_caches where permitted, else
/// fadvise DONTNEED. Says which was done and the residency afterwards.
pub fn drop_from_page_cache(path: &Path) -> std::io::Result<(CacheDrop, f64)> {
    let f = File::open(path)?;
    // SAFETY: plain syscalls on an open descriptor.
    unsafe {
        libc::fdatasync(f.as_raw_fd());
        libc::sync();
    }
    let how = match std::fs::write("/proc/sys/vm/drop_caches", "1") {
        Ok(()) => CacheDrop::DropCaches,
        Err(_) => {
            // SAFETY: advice on an open descriptor.
            let rc = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
            if rc != 0 {
                return Err(std::io::Error::from_raw_os_error(rc));
            }
            CacheDrop::Fadvise
        }
    };
    let len = f.metadata()?.len();
    Ok((how, page_cache_residency(&f, len).unwrap_or(0.0)))
}

/// Number of CPUs this process may run on.
pub fn cpus() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}
