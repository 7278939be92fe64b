//! Progress bars on stderr for long transfers. Drawn on terminals only
//! (indicatif's stderr target stays quiet elsewhere) and never with
//! `--json`, whose output is for programs.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressFinish, ProgressStyle};

const TEMPLATE: &str =
    "{msg:>9} [{bar:20}] {percent:>3}% of {binary_total_bytes}, {binary_bytes_per_sec}, {eta} left";

/// A bar counting `total` bytes, labelled `label`; hidden when `quiet`.
/// It clears itself when done or dropped (on an error too), so what the
/// command prints next starts on a clean line: call `finish_and_clear`
/// before printing results.
pub fn bytes_bar(label: &str, total: u64, quiet: bool) -> ProgressBar {
    let target = if quiet {
        ProgressDrawTarget::hidden()
    } else {
        ProgressDrawTarget::stderr()
    };
    ProgressBar::with_draw_target(Some(total), target)
        .with_style(style())
        .with_message(label.to_string())
        .with_finish(ProgressFinish::AndClear)
}

fn style() -> ProgressStyle {
    ProgressStyle::with_template(TEMPLATE)
        .expect("the template is valid (tested)")
        .progress_chars("#> ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_template_parses_and_a_quiet_bar_is_hidden() {
        ProgressStyle::with_template(TEMPLATE).unwrap();
        let bar = bytes_bar("loading", 100, true);
        assert!(bar.is_hidden());
        bar.inc(40);
        assert_eq!(bar.position(), 40);
    }
}
