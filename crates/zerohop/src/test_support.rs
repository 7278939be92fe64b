//! Helpers for this crate's unit tests.

/// `Rss` of the mapping that holds address `at`, from /proc/self/smaps:
/// how much of it is in this process's page tables (the kernel may have
/// merged the mapping with a neighbour of the same kind).
pub(crate) fn resident_kib(at: usize) -> u64 {
    let rss = smaps_field(at, "Rss:");
    rss.split_whitespace().next().unwrap().parse().unwrap()
}

/// What follows `field` (e.g. `"VmFlags:"`) in the /proc/self/smaps entry
/// of the mapping that holds address `at`.
pub(crate) fn smaps_field(at: usize, field: &str) -> String {
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let holds = |line: &str| {
        let range = line.split_whitespace().next().unwrap_or("");
        let Some((start, end)) = range.split_once('-') else {
            return false;
        };
        match (
            usize::from_str_radix(start, 16),
            usize::from_str_radix(end, 16),
        ) {
            (Ok(start), Ok(end)) => (start..end).contains(&at),
            _ => false,
        }
    };
    let mut lines = smaps.lines().skip_while(|l| !holds(l));
    assert!(lines.next().is_some(), "no mapping holds {at:x}");
    let line = lines
        .find(|l| l.starts_with(field))
        .unwrap_or_else(|| panic!("no {field} in the smaps entry of {at:x}"));
    line[field.len()..].trim().to_string()
}
