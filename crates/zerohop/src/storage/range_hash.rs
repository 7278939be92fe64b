//! The xxh3-64 of byte ranges of files, hashed side by side by several
//! threads in bounded pieces: a checkpoint's verification, a freeze's
//! image sums.

use super::source_file::SourceFile;
use crate::{Error, Result};
use std::hash::Hasher;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use twox_hash::XxHash3_64;

/// Bytes read and hashed at a time, whatever size a range claims.
const PIECE: usize = 8 << 20;

/// `len` bytes of `files[file]` from `offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileRange {
    pub file: usize,
    pub offset: u64,
    pub len: u64,
}

/// The xxh3-64 (seed 0) of each of `ranges`, in their order, hashed by
/// `threads` threads (1 to 64); `progress` hears of the bytes hashed. The
/// first read that fails (a file shorter than a range too) is the error.
pub fn range_sums(
    files: &[SourceFile],
    ranges: &[FileRange],
    threads: usize,
    // `zerohop::Progress`, spelt out: storage sits below the engine.
    progress: Option<&(dyn Fn(u64) + Sync)>,
) -> Result<Vec<u64>> {
    let next = AtomicUsize::new(0);
    let sums = Mutex::new(vec![0u64; ranges.len()]);
    let failed: Mutex<Option<Error>> = Mutex::new(None);
    let workers = threads.clamp(1, 64).min(ranges.len().max(1));
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| {
                let mut buf = vec![0u8; PIECE];
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(r) = ranges.get(i) else { return };
                    let mut hash = XxHash3_64::with_seed(0);
                    let mut at = 0;
                    while at < r.len {
                        let n = PIECE.min((r.len - at) as usize);
                        if let Err(e) = files[r.file].read_exact_at(&mut buf[..n], r.offset + at) {
                            failed.lock().unwrap().get_or_insert(e);
                            return;
                        }
                        hash.write(&buf[..n]);
                        at += n as u64;
                        if let Some(p) = progress {
                            p(n as u64);
                        }
                    }
                    sums.lock().unwrap()[i] = hash.finish();
                }
            });
        }
    });
    match failed.into_inner().unwrap() {
        Some(e) => Err(e),
        None => Ok(sums.into_inner().unwrap()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_hash_as_their_bytes_do_and_a_short_file_fails() {
        let dir = std::env::temp_dir().join(format!("zerohop-range-hash-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let bytes: Vec<u8> = (0..PIECE as u32 * 2 + 11)
            .map(|i| (i % 253) as u8)
            .collect();
        std::fs::write(dir.join("a"), &bytes).unwrap();
        std::fs::write(dir.join("b"), b"tiny").unwrap();
        let files = [
            SourceFile::open(&dir.join("a")).unwrap(),
            SourceFile::open(&dir.join("b")).unwrap(),
        ];
        let ranges = [
            FileRange {
                file: 0,
                offset: 3,
                len: bytes.len() as u64 - 3,
            },
            FileRange {
                file: 1,
                offset: 0,
                len: 4,
            },
            FileRange {
                file: 0,
                offset: 0,
                len: 0,
            },
        ];
        let seen = AtomicUsize::new(0);
        let count = |n: u64| {
            seen.fetch_add(n as usize, Ordering::Relaxed);
        };
        let sums = range_sums(&files, &ranges, 3, Some(&count)).unwrap();
        let want = [
            XxHash3_64::oneshot(&bytes[3..]),
            XxHash3_64::oneshot(b"tiny"),
            XxHash3_64::oneshot(b""),
        ];
        assert_eq!(sums, want);
        assert_eq!(seen.into_inner(), bytes.len() - 3 + 4);
        let beyond = [FileRange {
            file: 1,
            offset: 2,
            len: 4,
        }];
        assert!(range_sums(&files, &beyond, 1, None).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
