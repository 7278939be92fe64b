//! How many CPUs this process may use: a fact of the machine that the
//! engine's default settings also size themselves by.

/// Number of CPUs this process may run on.
pub fn available_cpus() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}
