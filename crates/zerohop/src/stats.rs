//! What every transfer reports: bytes, time, rate, the path taken, host
//! memory used and CPU spent.

use std::time::Instant;

/// Which way a transfer went.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Direction {
    /// Files into device memory.
    #[default]
    Load,
    /// Device memory into files, durable when the transfer returned.
    Save,
}

/// Statistics of one transfer.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct TransferStats {
    pub direction: Direction,
    pub device: String,
    pub bytes: u64,
    pub seconds: f64,
    pub gbps: f64,
    /// Human-readable summary of the path(s) taken.
    pub path: String,
    /// Read backend used for staged reads (`io_uring` or `pread`).
    pub backend: String,
    /// Bytes read (or written) with O_DIRECT through staging slots.
    pub direct_bytes: u64,
    /// Bytes read (or written) through the page cache and staging slots.
    pub buffered_bytes: u64,
    /// Saves: bytes copied off the device but not written, because a filter
    /// found them unchanged (incremental checkpoints).
    pub skipped_bytes: u64,
    /// Saves: seconds spent making files and directories durable (fsync),
    /// included in `seconds`.
    pub sync_seconds: f64,
    /// Loads: bytes read from remote objects (ranged requests to an object
    /// store) into staging slots, or for host reads into the destination.
    /// Saves: bytes sent to remote objects, in whole parts from the slots.
    pub remote_bytes: u64,
    /// Loads: bytes the CPU copied out of file mappings (of page-cache
    /// pages) into staging slots. Saves: bytes the CPU copied out of the
    /// slots into mappings of the files (files of a memory file system that
    /// several workers write at once).
    pub mapped_bytes: u64,
    /// Bytes the GPU copied straight from registered page-cache pages.
    pub page_cache_dma_bytes: u64,
    /// Host staging memory held during the transfer.
    pub staging_bytes: u64,
    /// Whether the staging slots were pinned memory that the device copies
    /// by DMA (a GPU), rather than host memory the CPU copies.
    pub pinned_staging: bool,
    pub io_threads: usize,
    pub files: usize,
    pub windows: usize,
    /// User + system CPU time of the process during the transfer.
    pub cpu_seconds: f64,
    pub cpu_seconds_per_gb: f64,
    /// Where the I/O workers' time went.
    pub profile: WorkerProfile,
    /// Loads: from the call until the pipeline that moved the bulk of the
    /// bytes started (waiting for the caller's streams, routes, residency
    /// checks, a hot-route measurement where one ran).
    pub setup_seconds: f64,
    /// Allocating the engine's staging pool before the workers started
    /// (mapping its memory and making it present; on a GPU it is then
    /// pinned in pieces while the workers run, see
    /// `profile.staging_wait_seconds`; a transfer that measures the hot
    /// routes waits for all of it first): the engine's first transfer,
    /// unless the pool was allocated earlier (`Engine::allocate_staging`,
    /// Python's `prepare`); 0 after.
    pub staging_seconds: f64,
    /// The engine's own setup (its copy queues, a remembered hot route),
    /// reported by the engine's first transfer and 0 after: part of the
    /// wait of a first call that made the engine.
    pub engine_setup_seconds: f64,
    /// Anything the transfer did differently than configured, and why.
    pub notes: Vec<String>,
}

/// Where the I/O workers' time went, summed over workers: the profile that
/// says which side (reading, or waiting for the device) limits a transfer.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct WorkerProfile {
    /// Wall time of all workers together.
    pub worker_seconds: f64,
    /// Reading file bytes into staging slots (for hot files, the kernel's
    /// copy out of the page cache), or writing them out of the slots.
    pub io_seconds: f64,
    /// Pinning page-cache windows for the DMA route.
    pub pin_seconds: f64,
    /// Waiting for staging slots the pool was still pinning: a new
    /// engine's first transfers.
    pub staging_wait_seconds: f64,
    /// Looking at the bytes in the slots: checksums of checkpoints.
    pub check_seconds: f64,
    /// Queueing copies and recording their fences.
    pub queue_seconds: f64,
    /// Blocked until earlier copies finished, so a slot or pin was free.
    pub copy_wait_seconds: f64,
    /// Loads: from the pipeline's start (files mapped, windows cut) until
    /// the worker was ready for its first window (its thread and copy
    /// queue), summed over workers; not part of `worker_seconds`.
    pub start_seconds: f64,
}

impl WorkerProfile {
    pub(crate) fn add(&mut self, o: WorkerProfile) {
        self.worker_seconds += o.worker_seconds;
        self.io_seconds += o.io_seconds;
        self.pin_seconds += o.pin_seconds;
        self.staging_wait_seconds += o.staging_wait_seconds;
        self.check_seconds += o.check_seconds;
        self.queue_seconds += o.queue_seconds;
        self.copy_wait_seconds += o.copy_wait_seconds;
        self.start_seconds += o.start_seconds;
    }

    /// One line: each part's share of the workers' time.
    pub fn describe(&self) -> String {
        let share = |x: f64| {
            if self.worker_seconds > 0.0 {
                100.0 * x / self.worker_seconds
            } else {
                0.0
            }
        };
        format!(
            "workers' time: file I/O {:.0}%, pin {:.0}%, wait for staging {:.0}%, checksums {:.0}%, queue copies {:.0}%, wait for copies {:.0}%",
            share(self.io_seconds),
            share(self.pin_seconds),
            share(self.staging_wait_seconds),
            share(self.check_seconds),
            share(self.queue_seconds),
            share(self.copy_wait_seconds)
        )
    }
}

impl TransferStats {
    /// How a save's bytes travelled. Uploads to an object store are never
    /// mixed with file writes in one save, and bytes of unchanged chunks
    /// (`skipped_bytes`) are neither written nor uploaded.
    fn save_path(&self) -> String {
        let written = self.direct_bytes + self.buffered_bytes + self.mapped_bytes;
        let kind = match (self.direct_bytes > 0, self.buffered_bytes > 0) {
            (true, true) => "O_DIRECT and buffered",
            (true, false) => "O_DIRECT",
            _ => "buffered",
        };
        let writes = match (
            self.direct_bytes + self.buffered_bytes > 0,
            self.mapped_bytes > 0,
        ) {
            (true, true) => format!("{} {kind} + CPU copies into file mappings", self.backend),
            (false, true) => "CPU copies into file mappings".to_string(),
            _ => format!("{} {kind}", self.backend),
        };
        let kept = if self.skipped_bytes > 0 {
            "; unchanged chunks kept by reference to the parent"
        } else {
            ""
        };
        if self.remote_bytes > 0 {
            format!(
                "staged ({} -> object parts, uploaded whole){kept}",
                self.staging_words(true)
            )
        } else if written > 0 {
            format!(
                "staged ({} -> {writes}) + fsync{kept}",
                self.staging_words(true)
            )
        } else if self.skipped_bytes > 0 {
            "nothing written: every chunk unchanged, kept by reference to the parent".into()
        } else {
            "nothing to move, files synced".into()
        }
    }

    pub(crate) fn finish(&mut self, started: Instant, cpu_before: f64) {
        self.seconds = started.elapsed().as_secs_f64();
        self.gbps = if self.seconds > 0.0 {
            self.bytes as f64 / self.seconds / 1e9
        } else {
            0.0
        };
        self.cpu_seconds = (cpu_seconds() - cpu_before).max(0.0);
        self.cpu_seconds_per_gb = if self.bytes > 0 {
            self.cpu_seconds / (self.bytes as f64 / 1e9)
        } else {
            0.0
        };
        let mut parts = Vec::new();
        if self.direction == Direction::Save {
            self.path = self.save_path();
            return;
        }
        if self.direct_bytes > 0 {
            parts.push(format!(
                "staged ({} O_DIRECT -> {})",
                self.backend,
                self.staging_words(false)
            ));
        }
        if self.buffered_bytes > 0 {
            parts.push(format!(
                "staged ({} buffered -> {})",
                self.backend,
                self.staging_words(false)
            ));
        }
        if self.remote_bytes > 0 {
            parts.push(format!(
                "staged (ranged object reads -> {})",
                self.staging_words(false)
            ));
        }
        if self.mapped_bytes > 0 {
            parts.push(format!(
                "mapped (mmap -> CPU copy -> {})",
                self.staging_words(false)
            ));
        }
        if self.page_cache_dma_bytes > 0 {
            parts.push(
                "page-cache DMA (mmap + read-only registration -> async copy, no CPU copy)".into(),
            );
        }
        if parts.is_empty() {
            parts.push("nothing to move".into());
        }
        self.path = parts.join(" + ");
    }

    /// The staging hop in words true to the device: pinned slots and DMA
    /// copies on a GPU, plain host slots and CPU copies on host memory.
    fn staging_words(&self, to_slots: bool) -> &'static str {
        match (self.pinned_staging, to_slots) {
            (true, false) => "pinned slots -> async copy",
            (true, true) => "async copy -> pinned slots",
            (false, false) => "host slots -> CPU copy",
            (false, true) => "CPU copy -> host slots",
        }
    }
}

/// CPU seconds (user + system) used by this process so far.
pub fn cpu_seconds() -> f64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    t.tv_sec as f64 + t.tv_nsec as f64 / 1e9
}

/// A byte count for people: `512 B`, `4 MiB`, `63.2 MiB`, `1.5 GiB`.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [(&str, u64); 4] = [
        ("KiB", 1 << 10),
        ("MiB", 1 << 20),
        ("GiB", 1 << 30),
        ("TiB", 1 << 40),
    ];
    let Some((name, size)) = UNITS.iter().rev().find(|(_, size)| n >= *size) else {
        return format!("{n} B");
    };
    let text = format!("{:.2}", n as f64 / *size as f64);
    let text = text.trim_end_matches('0').trim_end_matches('.');
    format!("{text} {name}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_as_people_write_them() {
        assert_eq!(human_bytes(0), "0 B");
        assert_eq!(human_bytes(1023), "1023 B");
        assert_eq!(human_bytes(4 << 20), "4 MiB");
        assert_eq!(human_bytes(66_270_000), "63.2 MiB");
        assert_eq!(human_bytes(u64::MAX), "16777216 TiB");
        assert_eq!(human_bytes(3 << 29), "1.5 GiB");
    }

    #[test]
    fn a_save_path_says_how_its_bytes_travelled() {
        let save = |direct, buffered, remote, skipped| {
            let s = TransferStats {
                direction: Direction::Save,
                backend: "pwrite".into(),
                direct_bytes: direct,
                buffered_bytes: buffered,
                remote_bytes: remote,
                skipped_bytes: skipped,
                ..Default::default()
            };
            s.save_path()
        };
        let kept = "; unchanged chunks kept by reference to the parent";
        assert!(save(8, 1, 0, 0).ends_with("-> pwrite O_DIRECT and buffered) + fsync"));
        assert!(save(0, 8, 0, 4).ends_with(&format!("-> pwrite buffered) + fsync{kept}")));
        assert!(save(0, 0, 8, 0).ends_with("-> object parts, uploaded whole)"));
        assert!(save(0, 0, 8, 4).ends_with(&format!("uploaded whole){kept}")));
        // An incremental save where nothing changed, to files or objects:
        // nothing was written, and no write or fsync is claimed.
        assert_eq!(
            save(0, 0, 0, 8),
            "nothing written: every chunk unchanged, kept by reference to the parent"
        );
        assert_eq!(save(0, 0, 0, 0), "nothing to move, files synced");
    }

    #[test]
    fn cpu_time_advances_with_work() {
        let before = cpu_seconds();
        let mut x = 0u64;
        let t = std::time::Instant::now();
        while t.elapsed().as_millis() < 30 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
        }
        std::hint::black_box(x);
        assert!(cpu_seconds() > before);
    }
}
