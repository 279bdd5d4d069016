//! Logs: one line per event, JSON (for collectors) or text (for people).
//!
//! Anything that came from a request is logged as a string field (never with `%`, never as
//! tracing's `message`), clipped with [`keyward_engine::text::clip`]: text mode then quotes
//! and escapes it, and JSON mode encodes it, so a newline or a `key=value` in a username cannot
//! forge a line or a field.

use std::io::{IsTerminal, Write};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use std::fmt::{self, Write as _};

use clap::ValueEnum;
use tracing::field::{Field, Visit};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, MakeWriter};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::EnvFilter;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Json,
    Text,
}

/// Installs the global subscriber on stdout. `RUST_LOG` overrides the default level (`info`).
pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let buffer = BUFFER.get_or_init(|| {
        std::thread::Builder::new()
            .name("keyward-log".into())
            .spawn(|| loop {
                std::thread::sleep(FLUSH_EVERY);
                flush();
            })
            .ok();
        Arc::default()
    });
    // A second init (in tests) is harmless; keep the first.
    let _ = tracing::dispatcher::set_global_default(dispatch(
        format,
        filter,
        Buffered(buffer.clone()),
        std::io::stdout().is_terminal(),
    ));
}

/// Writes out every log line gathered so far. Call before the process exits.
pub fn flush() {
    if let Some(buffer) = BUFFER.get() {
        buffer.write_out();
    }
}

/// How long a log line may wait in memory before it is written.
const FLUSH_EVERY: Duration = Duration::from_millis(50);
/// Past this much, the line that crosses it writes the batch at once.
const FLUSH_AT: usize = 64 * 1024;

static BUFFER: OnceLock<Arc<Shared>> = OnceLock::new();

/// Log lines gathered in memory and written to stdout in batches (every 50 ms, or at 64 KiB),
/// so that a busy webhook makes one write a batch instead of one per decision.
#[derive(Debug, Default)]
struct Shared {
    lines: Mutex<Vec<u8>>,
}

impl Shared {
    fn take(&self) -> Vec<u8> {
        std::mem::take(&mut *self.lines.lock().unwrap_or_else(|p| p.into_inner()))
    }

    fn write_out(&self) {
        let batch = self.take();
        if !batch.is_empty() {
            // Nowhere to report a failed log write; the next batch tries again.
            let _ = std::io::stdout().lock().write_all(&batch);
        }
    }
}

#[derive(Debug, Clone)]
struct Buffered(Arc<Shared>);

impl<'w> MakeWriter<'w> for Buffered {
    type Writer = Line<'w>;
    fn make_writer(&'w self) -> Line<'w> {
        Line(&self.0)
    }
}

/// One event's line, added to the batch.
struct Line<'w>(&'w Shared);

impl Write for Line<'_> {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        let full = {
            let mut lines = self.0.lines.lock().unwrap_or_else(|p| p.into_inner());
            lines.extend_from_slice(bytes);
            lines.len() >= FLUSH_AT
        };
        if full {
            self.0.write_out();
        }
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The subscriber for `format`, writing to `writer`.
pub fn dispatch<W>(format: LogFormat, filter: EnvFilter, writer: W, ansi: bool) -> tracing::Dispatch
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let builder =
        tracing_subscriber::fmt().with_env_filter(filter).with_target(false).with_ansi(ansi).with_writer(writer);
    match format {
        LogFormat::Json => tracing::Dispatch::new(builder.event_format(JsonLines).finish()),
        LogFormat::Text => tracing::Dispatch::new(builder.finish()),
    }
}

/// One JSON object per event: `timestamp`, `level`, `message`, then the event's fields, written
/// straight into the line (tracing-subscriber's own JSON format gathers the fields into a map
/// of values first, which costs a decision more than the decision itself).
struct JsonLines;

impl<S, N> FormatEvent<S, N> for JsonLines
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> fmt::Result {
        writer.write_str("{\"timestamp\":\"")?;
        SystemTime.format_time(&mut writer)?;
        write!(writer, "\",\"level\":\"{}\"", event.metadata().level())?;
        let mut fields = JsonFields { out: &mut writer, result: Ok(()) };
        event.record(&mut fields);
        fields.result?;
        writer.write_str("}\n")
    }
}

struct JsonFields<'w, 'a> {
    out: &'w mut Writer<'a>,
    result: fmt::Result,
}

impl JsonFields<'_, '_> {
    fn key(&mut self, field: &Field) -> fmt::Result {
        self.out.write_str(",")?;
        json_str(self.out, field.name())?;
        self.out.write_str(":")
    }

    fn entry(&mut self, field: &Field, value: impl FnOnce(&mut Writer<'_>) -> fmt::Result) {
        if self.result.is_ok() {
            self.result = self.key(field).and_then(|()| value(self.out));
        }
    }
}

impl Visit for JsonFields<'_, '_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.entry(field, |out| json_str(out, value));
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.entry(field, |out| write!(out, "{value}"));
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.entry(field, |out| write!(out, "{value}"));
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.entry(field, |out| write!(out, "{value}"));
    }
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        // `message` and `?field`: the text, as a JSON string.
        self.entry(field, |out| {
            out.write_str("\"")?;
            write!(Escaped(out), "{value:?}")?;
            out.write_str("\"")
        });
    }
}

/// `s` as a JSON string literal.
fn json_str(out: &mut Writer<'_>, s: &str) -> fmt::Result {
    out.write_str("\"")?;
    Escaped(out).write_str(s)?;
    out.write_str("\"")
}

/// Writes through, escaping what JSON strings must escape.
struct Escaped<'w, 'a>(&'w mut Writer<'a>);

impl fmt::Write for Escaped<'_, '_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        // By bytes: every byte JSON makes us escape is ASCII, and no byte of a multi-byte
        // UTF-8 character is, so each cut falls on a character boundary.
        let mut plain = 0;
        for (i, b) in s.bytes().enumerate() {
            let escape = match b {
                b'"' => "\\\"",
                b'\\' => "\\\\",
                b'\n' => "\\n",
                b'\r' => "\\r",
                b'\t' => "\\t",
                b if b < 0x20 => "",
                _ => continue,
            };
            self.0.write_str(&s[plain..i])?;
            if escape.is_empty() {
                write!(self.0, "\\u{b:04x}")?;
            } else {
                self.0.write_str(escape)?;
            }
            plain = i + 1;
        }
        self.0.write_str(&s[plain..])
    }
}

/// The name kubectl runs keyward under as a plugin (`kubectl keyward …`).
const KUBECTL_PLUGIN: &str = "kubectl-keyward";

/// What the user typed to run keyward: `kubectl keyward` when kubectl runs it as a plugin, so
/// that usage and errors name the command as typed.
pub fn invoked_as() -> &'static str {
    static INVOKED: std::sync::OnceLock<&'static str> = std::sync::OnceLock::new();
    INVOKED.get_or_init(|| {
        let invoked = std::env::args_os().next().unwrap_or_default();
        let as_plugin = std::path::Path::new(&invoked).file_stem().is_some_and(|stem| stem == KUBECTL_PLUGIN);
        if as_plugin {
            "kubectl keyward"
        } else {
            "keyward"
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> MakeWriter<'a> for Captured {
        type Writer = Captured;
        fn make_writer(&'a self) -> Captured {
            self.clone()
        }
    }

    #[test]
    fn json_lines_escape_every_field_and_round_trip() {
        let out = Captured::default();
        let dispatch = dispatch(LogFormat::Json, EnvFilter::new("info"), out.clone(), false);
        let nasty = "a\"b\\c\nd\re\tf\u{1}g\u{1f}h é ✓";
        tracing::dispatcher::with_default(&dispatch, || {
            tracing::info!(text = nasty, n = 42u64, m = -7i64, yes = true, dbg = ?nasty, "said {}", "hi\n");
        });
        let line = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        assert_eq!(line.matches('\n').count(), 1, "{line}");
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["message"], "said hi\n");
        assert_eq!(v["level"], "INFO");
        assert_eq!(v["text"], nasty);
        // Escaped as JSON requires and no more: UTF-8 passes through.
        assert!(line.contains(r#""text":"a\"b\\c\nd\re\tf\u0001g\u001fh é ✓""#), "{line}");
        assert_eq!((v["n"].as_u64(), v["m"].as_i64(), v["yes"].as_bool()), (Some(42), Some(-7), Some(true)));
        assert_eq!(v["dbg"], format!("{nasty:?}"));
        assert!(v["timestamp"].as_str().unwrap().ends_with('Z'), "{line}");
    }
}
