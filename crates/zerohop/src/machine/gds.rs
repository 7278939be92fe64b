//! Whether GPUDirect Storage has a real direct path on this machine.

use std::path::Path;

/// Whether GPUDirect Storage has a real direct path here, and why.
#[derive(Debug, Clone, serde::Serialize)]
pub struct GdsSupport {
    pub direct_path: bool,
    pub nvidia_fs_loaded: bool,
    pub cufile_library: bool,
    /// `null` where the kernel's configuration cannot be read.
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
        .any(|name| library_loads(name));
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

/// Whether the dynamic loader finds and loads library `name`.
fn library_loads(name: &str) -> bool {
    let c = std::ffi::CString::new(name).expect("no NUL");
    // rustix does not wrap the dynamic loader.
    // SAFETY: loads the library only to see that it exists, and closes the
    // handle at once; nothing from it is called by us, but loading runs its
    // initialisers, which we trust as any linked library (libcufile's and
    // its dependencies', from the system's library path).
    unsafe {
        let h = libc::dlopen(c.as_ptr(), libc::RTLD_LAZY);
        if h.is_null() {
            false
        } else {
            libc::dlclose(h);
            true
        }
    }
}

fn kernel_config(key: &str) -> Option<bool> {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").ok()?;
    let text = std::fs::read_to_string(format!("/boot/config-{}", release.trim())).ok()?;
    Some(text.lines().any(|l| l == format!("{key}=y")))
}
