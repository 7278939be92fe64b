//! What the commands print about a transfer, in words true to the device
//! it used. The engine's own `path` text speaks of a GPU (pinned slots,
//! async copies, checksums on the device); on host memory none of that
//! happens, so there the words are built from the transfer's counters.

use zerohop::stats::Direction;
use zerohop::{DeviceKind, TransferStats};
use zerohop_checkpoint::ChecksumSite;

/// Whether `kind` is a GPU (else host memory stands in for one).
pub fn is_gpu(kind: DeviceKind) -> bool {
    matches!(kind, DeviceKind::Cuda(_))
}

/// The route the bytes took.
pub fn path(s: &TransferStats, kind: DeviceKind) -> String {
    if is_gpu(kind) {
        return s.path.clone();
    }
    let io = match (s.direct_bytes > 0, s.buffered_bytes > 0) {
        (true, true) => "O_DIRECT and buffered",
        (true, false) => "O_DIRECT",
        (false, true) => "buffered",
        (false, false) => "no",
    };
    let route = match s.direction {
        Direction::Save => format!(
            "CPU copies into host staging slots (not pinned) -> {} {io} writes + fsync",
            s.backend
        ),
        Direction::Load => {
            let mut parts = Vec::new();
            if s.direct_bytes + s.buffered_bytes > 0 {
                parts.push(format!(
                    "{} {io} reads into host staging slots (not pinned) -> CPU copies",
                    s.backend
                ));
            }
            if s.page_cache_dma_bytes > 0 {
                parts.push("page cache mapped -> CPU copies".to_string());
            }
            if parts.is_empty() {
                parts.push("nothing to move".to_string());
            }
            parts.join(" + ")
        }
    };
    format!("{route} (host memory, no GPU)")
}

/// Where the checkpoint's chunks were checksummed.
pub fn checksums(site: &ChecksumSite, kind: DeviceKind) -> String {
    if is_gpu(kind) {
        return site.to_string();
    }
    match site {
        ChecksumSite::Device {
            seconds,
            overlapped,
        } => format!(
            "by the CPU (host memory, no GPU) {}, in {:.1} ms",
            if *overlapped {
                "while the data was written"
            } else {
                "before the copies"
            },
            seconds * 1e3
        ),
        ChecksumSite::Host { .. } => {
            "by the CPU as each chunk passed through staging (host memory, no GPU)".to_string()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(direction: Direction) -> TransferStats {
        TransferStats {
            direction,
            backend: "io_uring".into(),
            buffered_bytes: 1 << 20,
            path: "staged (io_uring buffered -> pinned slots -> async copy)".into(),
            ..TransferStats::default()
        }
    }

    #[test]
    fn host_words_speak_of_no_gpu_and_no_pinning() {
        for d in [Direction::Load, Direction::Save] {
            let text = path(&stats(d), DeviceKind::Simulated);
            assert!(
                !text.contains("pinned slots") && text.contains("not pinned"),
                "{text}"
            );
            assert!(
                text.contains("CPU copies") && text.contains("io_uring buffered"),
                "{text}"
            );
        }
        let site = ChecksumSite::Device {
            seconds: 0.5,
            overlapped: true,
        };
        let text = checksums(&site, DeviceKind::Simulated);
        assert!(
            text.starts_with("by the CPU") && !text.contains("device"),
            "{text}"
        );
    }

    #[test]
    fn gpu_words_are_the_engines() {
        let s = stats(Direction::Load);
        assert_eq!(path(&s, DeviceKind::Cuda(0)), s.path);
        let site = ChecksumSite::Host { why: "x".into() };
        assert_eq!(checksums(&site, DeviceKind::Cuda(0)), site.to_string());
    }
}
