//! The process's table of file descriptors, grown ahead of the transfers
//! that open many files.

use rustix::fs::{Mode, OFlags};
use rustix::process::{getrlimit, Resource};
use std::io;

/// Descriptors a process may hold before its table has to grow again: a
/// checkpoint opens one or two per data file (32 by default), beside the
/// fifty-odd a CUDA program holds already.
const DESCRIPTORS_AHEAD: u64 = 1024;

/// Grows this process's descriptor table to hold `DESCRIPTORS_AHEAD`
/// descriptors (at most its `RLIMIT_NOFILE`), once. Linux grows the table as `open`s need
/// it, doubling from 64; when several threads share the table, each growth
/// waits for an RCU grace period inside that `open`: 14 - 26 ms of a
/// checkpoint's first save or load that opened its 32 data files in a
/// CUDA program (an H100 machine, `bench/probe/checkpoint_phases.py
/// --sample`). Called where the wait costs nothing: on a background thread,
/// or before a process starts its threads. The table never shrinks, so
/// later calls return at once.
pub fn grow_descriptor_table() -> io::Result<()> {
    let limit = getrlimit(Resource::Nofile)
        .current
        .unwrap_or(DESCRIPTORS_AHEAD);
    let Some(highest) = DESCRIPTORS_AHEAD.min(limit).checked_sub(1) else {
        return Ok(());
    };
    let highest =
        i32::try_from(highest).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    let null = rustix::fs::open("/dev/null", OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty())?;
    // The lowest free descriptor at or above `highest`: the table grows to
    // hold it, and no descriptor of the program's is touched. Both close
    // when dropped.
    let _high = rustix::io::fcntl_dupfd_cloexec(&null, highest)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_holds_the_count_after_and_the_high_descriptor_is_closed() {
        grow_descriptor_table().unwrap();
        let limit = getrlimit(Resource::Nofile)
            .current
            .unwrap_or(DESCRIPTORS_AHEAD);
        let want = DESCRIPTORS_AHEAD.min(limit);
        // The kernel reports the table's size as FDSize.
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let size: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix("FDSize:"))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert!(size >= want, "FDSize {size}, wanted {want}");
        // The descriptor that grew it is closed again (other tests open
        // files meanwhile, but never a thousand at once).
        let high = format!("/proc/self/fd/{}", want - 1);
        assert!(!std::path::Path::new(&high).exists(), "{high} is open");
    }
}
