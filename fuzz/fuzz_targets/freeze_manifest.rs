//! The freeze manifest decoder (`FREEZE.json`) on arbitrary bytes: it must
//! return a manifest or an error, never panic; a manifest it accepts names
//! only files inside its image directory, one sum per chunk, a total that
//! adds up and a relative parent, and encodes to bytes it accepts again.
#![no_main]

use libfuzzer_sys::fuzz_target;
use zerohop_process::freeze::decode_manifest;

fuzz_target!(|data: &[u8]| {
    if let Ok(m) = decode_manifest(data) {
        for f in &m.images {
            assert!(!f.name.contains('/') && f.name != ".." && f.name != ".");
        }
        assert_eq!(m.images.iter().map(|f| f.size).sum::<u64>(), m.image_bytes);
        if let Some(p) = &m.parent {
            assert!(!p.starts_with('/'));
        }
        let again = serde_json::to_vec(&m).unwrap();
        let back = decode_manifest(&again).unwrap();
        assert_eq!(serde_json::to_vec(&back).unwrap(), again);
    }
});
