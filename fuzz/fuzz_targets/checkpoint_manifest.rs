//! The checkpoint manifest decoder on arbitrary bytes: it must return a
//! manifest or an error, never panic, and a manifest it accepts must hold
//! together (entries and chunks inside their files, names that stay inside
//! the checkpoint directory) and encode back to itself.
#![no_main]

use libfuzzer_sys::fuzz_target;
use zerohop_checkpoint::{chunk_checksum, Manifest};

fuzz_target!(|data: &[u8]| {
    // A first byte of 1 wraps the rest with its correct checksum, so the
    // field checks behind the checksum get fuzzed too.
    let wrapped;
    let input = match data.split_first() {
        Some((1, body)) => {
            wrapped = [
                format!(r#"{{"xxh3":"{}","manifest":"#, chunk_checksum(body)).as_bytes(),
                body,
                b"}",
            ]
            .concat();
            &wrapped[..]
        }
        _ => data,
    };
    if let Ok(m) = Manifest::decode(input) {
        for e in &m.entries {
            let f = &m.files[e.file];
            assert!(e.offset >= f.header_bytes && e.offset + e.bytes <= f.bytes);
            let _ = m.describe_chunk(e.file, e.offset);
        }
        for c in &m.chunks {
            assert!(c.len > 0 && c.offset + c.len <= m.files[c.file].bytes);
        }
        for name in m.files.iter().map(|f| &f.name).chain(m.parent.iter()) {
            assert!(!name.contains('/') && !name.starts_with('.'));
        }
        assert_eq!(Manifest::decode(&m.encode()).unwrap(), m);
    }
});
