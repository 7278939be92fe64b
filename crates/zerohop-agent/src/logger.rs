//! Log lines on stderr: `LEVEL time message`, filtered by level; the time
//! in RFC 3339 (UTC, milliseconds), readable and sortable.

use log::{Level, LevelFilter, Log, Metadata, Record};
use std::io::Write;
use std::time::SystemTime;

struct StderrLog;

impl Log for StderrLog {
    fn enabled(&self, m: &Metadata<'_>) -> bool {
        m.level() <= log::max_level()
    }

    fn log(&self, r: &Record<'_>) {
        if !self.enabled(r.metadata()) {
            return;
        }
        let _ = writeln!(
            std::io::stderr().lock(),
            "{}",
            line(r.level(), SystemTime::now(), r.args())
        );
    }

    fn flush(&self) {}
}

fn line(level: Level, time: SystemTime, message: &std::fmt::Arguments<'_>) -> String {
    let level = match level {
        Level::Error => "ERROR",
        Level::Warn => "WARN ",
        Level::Info => "INFO ",
        Level::Debug => "DEBUG",
        Level::Trace => "TRACE",
    };
    format!(
        "{level} {} {message}",
        humantime::format_rfc3339_millis(time)
    )
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    #[test]
    fn lines_carry_a_readable_utc_time() {
        let t = UNIX_EPOCH + Duration::from_millis(1_764_547_200_250);
        assert_eq!(
            line(Level::Warn, t, &format_args!("agent pid {} stopped", 7)),
            "WARN  2025-12-01T00:00:00.250Z agent pid 7 stopped"
        );
    }
}
