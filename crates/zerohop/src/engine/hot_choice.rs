//! The measured choice between the two hot routes, kept by the engine and,
//! when it is given a file for it, across processes (so a fresh process does
//! not pay for measuring again).

use crate::plan::Route;
use crate::storage::atomic;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

/// What the engine measured for each hot route.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct HotChoice {
    pub mapped_gbps: f64,
    pub dma_gbps: f64,
}

/// How much faster page-cache DMA must measure to be chosen. The choice is
/// kept for every later process, and one measurement can be disturbed (on
/// the H200 machine, a first load after writing the file measured both
/// routes at 6.4 GB/s, and page-cache DMA then ran every later load at 12
/// GB/s where mapped copies ran at 40): a tie or a near one keeps mapped
/// copies, which pin no page-cache pages.
const DMA_MARGIN: f64 = 1.25;

impl HotChoice {
    pub(crate) fn route(&self) -> Route {
        if self.dma_gbps >= DMA_MARGIN * self.mapped_gbps {
            Route::PageCacheDma
        } else {
            Route::MappedCopy
        }
    }

    pub(crate) fn describe(&self) -> String {
        let chose = if self.route() == Route::PageCacheDma {
            "page-cache DMA"
        } else {
            "mapped copies"
        };
        format!(
            "mapped copies {:.1} GB/s, page-cache DMA {:.1} GB/s; chose {chose}",
            self.mapped_gbps, self.dma_gbps
        )
    }
}

/// `$XDG_CACHE_HOME/zerohop/hot-route.json`, else under `$HOME/.cache`.
pub fn default_file() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("zerohop").join("hot-route.json"))
}

/// The key a measurement is stored under: the device and the kernel, since
/// either changes which route is faster.
pub(crate) fn key(device: &str) -> String {
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    format!("{device} | kernel {}", kernel.trim())
}

pub(crate) fn load(path: &Path, key: &str) -> Option<HotChoice> {
    let text = std::fs::read(path).ok()?;
    let mut all: BTreeMap<String, HotChoice> = serde_json::from_slice(&text).ok()?;
    all.remove(key)
}

/// Best effort: a cache that cannot be written costs a re-measurement later.
/// Engines of one process (one per GPU) store one at a time, so neither
/// loses the other's entry; another process storing at the same moment can
/// still replace this one's, which costs it the same re-measurement.
pub(crate) fn store(path: &Path, key: &str, choice: HotChoice) {
    static STORING: Mutex<()> = Mutex::new(());
    let _one_at_a_time = STORING.lock().unwrap_or_else(PoisonError::into_inner);
    atomic::remove_stale_temps(path);
    let mut all: BTreeMap<String, HotChoice> = std::fs::read(path)
        .ok()
        .and_then(|t| serde_json::from_slice(&t).ok())
        .unwrap_or_default();
    all.insert(key.to_string(), choice);
    // A name of its own (pid and a counter): writers never share one.
    let (Some(dir), Ok(tmp)) = (path.parent(), atomic::temp_sibling(path)) else {
        return;
    };
    let written = std::fs::create_dir_all(dir)
        .and_then(|()| {
            std::fs::write(
                &tmp,
                serde_json::to_vec_pretty(&all).expect("choices serialize"),
            )
        })
        .and_then(|()| std::fs::rename(&tmp, path));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn choices_round_trip_per_key() {
        let dir = std::env::temp_dir().join(format!("zerohop-hot-choice-{}", std::process::id()));
        let file = dir.join("sub").join("hot-route.json");
        let a = HotChoice {
            mapped_gbps: 30.0,
            dma_gbps: 10.0,
        };
        let b = HotChoice {
            mapped_gbps: 12.0,
            dma_gbps: 28.0,
        };
        assert_eq!(load(&file, "gpu a"), None);
        store(&file, "gpu a", a);
        store(&file, "gpu b", b);
        assert_eq!(load(&file, "gpu a"), Some(a));
        assert_eq!(
            load(&file, "gpu b").map(|c| c.route()),
            Some(Route::PageCacheDma)
        );
        assert_eq!(a.route(), Route::MappedCopy);
        for (mapped_gbps, dma_gbps) in [(6.4, 6.4), (20.0, 24.0)] {
            let near = HotChoice {
                mapped_gbps,
                dma_gbps,
            };
            assert_eq!(near.route(), Route::MappedCopy, "{near:?}");
        }
        std::fs::write(&file, "not json").unwrap();
        assert_eq!(load(&file, "gpu a"), None, "a corrupt cache is ignored");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn engines_storing_at_once_keep_every_entry() {
        let dir =
            std::env::temp_dir().join(format!("zerohop-hot-choice-many-{}", std::process::id()));
        let file = dir.join("hot-route.json");
        let choice = HotChoice {
            mapped_gbps: 20.0,
            dma_gbps: 25.0,
        };
        std::thread::scope(|s| {
            for i in 0..8 {
                let file = &file;
                s.spawn(move || store(file, &format!("gpu {i}"), choice));
            }
        });
        for i in 0..8 {
            assert_eq!(load(&file, &format!("gpu {i}")), Some(choice), "gpu {i}");
        }
        let left: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(left, ["hot-route.json"], "no temporary file is left");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
