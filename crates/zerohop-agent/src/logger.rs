//! Log lines on stderr: `LEVEL time message`, filtered by level.

use log::{Level, LevelFilter, Log, Metadata, Record};
use std::io::Write;
use std::time::{SystemTime, UNIX_EPOCH};

struct StderrLog;

impl Log for StderrLog {
    fn enabled(&self, m: &Metadata<'_>) -> bool {
        m.level() <= log::max_level()
    }

    fn log(&self, r: &Record<'_>) {
        if !self.enabled(r.metadata()) {
            return;
        }
        let t = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let level = match r.level() {
            Level::Error => "ERROR",
            Level::Warn => "WARN ",
            Level::Info => "INFO ",
            Level::Debug => "DEBUG",
            Level::Trace => "TRACE",
        };
        let _ = writeln!(
            std::io::stderr().lock(),
            "{level} {}.{:03} {}",
            t.as_secs(),
            t.subsec_millis(),
            r.args()
        );
    }

    fn flush(&self) {}
}

/// Starts logging at `level` (`error`, `warn`, `info`, `debug`, `trace`).
pub fn init_logging(level: &str) -> Result<(), String> {
    let filter: LevelFilter = level
        .parse()
        .map_err(|_| format!("unknown log level {level:?}"))?;
    static LOGGER: StderrLog = StderrLog;
    log::set_logger(&LOGGER).map_err(|e| e.to_string())?;
    log::set_max_level(filter);
    Ok(())
}
