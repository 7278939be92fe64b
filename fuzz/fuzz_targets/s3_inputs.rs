//! What object storage reads from outside, on arbitrary bytes: AWS config
//! and credentials files (parsed or refused with the line, never a panic),
//! S3 error documents (their code and message picked out), and `s3://`
//! names with their wildcards.
#![no_main]

use libfuzzer_sys::fuzz_target;
use zerohop_s3::{error_field, ini, S3Url};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok(sections) = ini::parse(text) {
        // Every setting came from some line of the text.
        for settings in sections.values() {
            for value in settings.values() {
                assert!(text.contains(value.as_str()));
            }
        }
    }
    if let Some(code) = error_field(text, "Code") {
        assert!(text.contains(code.as_str()));
    }
    if let Ok(url) = S3Url::parse(text) {
        assert_eq!(S3Url::parse(&url.to_string()).ok(), Some(url.clone()));
        // Matching a pattern against arbitrary keys terminates, no panic.
        let _ = url.matches(text);
        let _ = url.matches(&url.key);
        let _ = url.pattern_prefix();
    }
});
