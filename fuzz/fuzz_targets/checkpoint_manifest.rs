//! The checkpoint manifest decoder on arbitrary bytes: it must return a
//! manifest or an error, never panic, and a manifest it accepts must hold
//! together (entries, their pieces, and chunks inside their files, names that stay inside
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
            let mut total = 0;
            for (p, at) in e.placement() {
                let f = &m.files[p.file];
                assert!(p.offset >= f.header_bytes && p.offset + p.bytes <= f.bytes);
                assert_eq!(at, total);
                total += p.bytes;
                let _ = m.describe_chunk(p.file, p.offset);
            }
            assert_eq!(total, e.bytes);
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
