//! A published device iov's record (`zerohop-usrbio`), read from another
//! process's memfd, on arbitrary bytes: it decodes or is refused, never
//! panics; what decodes has a range that does not wrap and encodes back to
//! the same bytes.
#![no_main]

use hf3fs_api_shared::published::DeviceRecord;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Some(r) = DeviceRecord::decode(data) {
        assert!(r.offset.checked_add(r.size).is_some());
        assert_eq!(r.encode(), data);
    }
});
