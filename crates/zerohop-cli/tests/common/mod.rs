//! What the CLI's test binaries share.

use std::process::Output;

/// `out`, from running the CLI with `args`, is a failure with a clear error
/// naming `needle` on stderr, not a panic.
pub fn assert_clear_failure(out: &Output, args: &[&str], needle: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{args:?} succeeded");
    assert!(
        err.contains("error") && err.contains(needle),
        "{args:?}: {err}"
    );
    assert!(!err.contains("panicked"), "{args:?} panicked: {err}");
}
