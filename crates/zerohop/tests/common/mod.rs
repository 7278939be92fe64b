//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// A directory removed on drop.
pub struct TestDir(pub PathBuf);

impl TestDir {
    pub fn new(tag: &str) -> Self {
        Self::under(&std::env::temp_dir(), tag)
    }

    pub fn under(base: &Path, tag: &str) -> Self {
        static N: AtomicU64 = AtomicU64::new(0);
        let p = base.join(format!(
            "zerohop-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&p).unwrap();
        TestDir(p)
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Deterministic bytes that differ at every position modulo a large prime,
/// so misplaced copies show.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 24) as u8
        })
        .collect()
}

pub fn write(path: &Path, data: &[u8]) -> PathBuf {
    std::fs::write(path, data).unwrap();
    path.to_owned()
}

/// Says that a test, or a part of one, cannot run here. Cargo has no
/// runtime skip, so where the `CI` environment variable is set (CI
/// provides what these tests need) this fails; elsewhere it prints a line
/// starting `skipped:`, which `--nocapture` and failures show.
pub fn skip(why: &str) {
    assert!(
        std::env::var_os("CI").is_none(),
        "{why}: CI must run this test, not skip it"
    );
    eprintln!("skipped: {why}");
}
