//! The safetensors header parser on arbitrary bytes: it must return a
//! header or an error, never panic, and never accept a header whose tensors
//! leave the file or overlap. A header it accepts, written again by the
//! serializer, parses back the same (whatever its names and metadata hold).
#![no_main]

use libfuzzer_sys::fuzz_target;
use zerohop::safetensors::{parse_header, serialize_header};

fuzz_target!(|data: &[u8]| {
    // The first 8 bytes say how long the claimed file is beyond the input,
    // so offsets past the input (a truncated read) are exercised too.
    let (extra, bytes) = match data.split_first_chunk::<8>() {
        Some((n, rest)) => (u64::from_le_bytes(*n) % (1 << 20), rest),
        None => (0, data),
    };
    let file_len = bytes.len() as u64 + extra;
    if let Ok(h) = parse_header(bytes, file_len) {
        assert_eq!(h.data_start + h.data_len, file_len);
        let mut end = 0;
        for t in &h.tensors {
            assert!(t.begin == end && t.end >= t.begin && t.end <= h.data_len);
            assert_eq!(t.dtype.byte_len(&t.shape).ok(), Some(t.len()));
            end = t.end;
        }
        let again = serialize_header(&h.tensors, &h.metadata, 8);
        let back = parse_header(&again, again.len() as u64 + h.data_len)
            .expect("a header written by serialize_header parses");
        assert_eq!(back.tensors, h.tensors);
        assert_eq!(back.metadata, h.metadata);
    }
});
