//! Logs: one line per event, JSON (for collectors) or text (for people).
//!
//! Anything that came from a request is logged as a string field (never with `%`, never as
//! tracing's `message`), clipped with [`keyward_engine::text::clip`]: text mode then quotes
//! and escapes it, and JSON mode encodes it, so a newline or a `key=value` in a username cannot
//! forge a line or a field.

use std::io::{IsTerminal, Write};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
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
        let shared = Arc::<Shared>::default();
        let flusher = shared.clone();
        std::thread::Builder::new()
            .name("keyward-log".into())
            .spawn(move || flusher.flush_batches(std::thread::sleep, to_stdout))
            .ok();
        shared
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

/// Log lines gathered in memory and written to stdout in batches (50 ms after a batch's first
/// line, or at 64 KiB), so that a busy webhook makes one write a batch instead of one per
/// decision, and an idle one (a gate sidecar in every job pod) is never woken to write nothing.
#[derive(Debug, Default)]
struct Shared {
    lines: Mutex<Vec<u8>>,
    /// Signalled when a line lands in an empty batch.
    arrived: Condvar,
}

impl Shared {
    fn lines(&self) -> MutexGuard<'_, Vec<u8>> {
        self.lines.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn take(&self) -> Vec<u8> {
        std::mem::take(&mut *self.lines())
    }

    fn write_out(&self) {
        let batch = self.take();
        if !batch.is_empty() {
            to_stdout(&batch);
        }
    }

    /// The flusher's loop: sleeps until a batch has its first line, lets the batch gather for
    /// [`FLUSH_EVERY`], and hands it to `write`. Never returns.
    fn flush_batches(&self, sleep: impl Fn(Duration), mut write: impl FnMut(&[u8])) {
        loop {
            let mut lines = self.lines();
            while lines.is_empty() {
                lines = self.arrived.wait(lines).unwrap_or_else(|p| p.into_inner());
            }
            drop(lines);
            sleep(FLUSH_EVERY);
            let batch = self.take();
            // Empty when a line that filled the batch wrote it out meanwhile.
            if !batch.is_empty() {
                write(&batch);
            }
        }
    }
}

/// Writes a batch of lines. Nowhere to report a failed log write; the next batch tries again.
fn to_stdout(batch: &[u8]) {
    let _ = std::io::stdout().lock().write_all(batch);
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
        let (first, full) = {
            let mut lines = self.0.lines();
            let first = lines.is_empty();
            lines.extend_from_slice(bytes);
            (first, lines.len() >= FLUSH_AT)
        };
        if full {
            self.0.write_out();
        } else if first {
            self.0.arrived.notify_one();
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
        match rfc3339_micros(std::time::SystemTime::now()).as_ref().map(|at| std::str::from_utf8(at)) {
            Some(Ok(at)) => writer.write_str(at)?,
            _ => SystemTime.format_time(&mut writer)?,
        }
        writer.write_str("\",\"level\":\"")?;
        writer.write_str(event.metadata().level().as_str())?;
        writer.write_str("\"")?;
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
        self.entry(field, |out| out.write_str(if value { "true" } else { "false" }));
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.entry(field, |out| decimal(out, false, value));
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.entry(field, |out| decimal(out, value < 0, value.unsigned_abs()));
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

/// `n` in decimal (after a `-` when `negative`), without `core::fmt`'s machinery: a decision's
/// line writes a few numbers, and formatting them was a visible part of its cost.
fn decimal(out: &mut Writer<'_>, negative: bool, mut n: u64) -> fmt::Result {
    let mut digits = [0u8; 21];
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    if negative {
        at -= 1;
        digits[at] = b'-';
    }
    // Only ASCII digits and '-' were written.
    out.write_str(std::str::from_utf8(&digits[at..]).map_err(|_| fmt::Error)?)
}

/// `at` as tracing's `SystemTime` writes it (RFC 3339, UTC, microseconds:
/// `2026-12-03T23:00:09.894798Z`), built in a buffer without `core::fmt`'s machinery. `None`
/// past the year 9999, which four digits cannot hold.
fn rfc3339_micros(at: std::time::SystemTime) -> Option<[u8; 27]> {
    let since = at.duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let (secs, micros) = (since.as_secs(), u64::from(since.subsec_micros()));
    let (year, month, day) = civil_date(secs / 86_400);
    if year > 9999 {
        return None;
    }
    let time = secs % 86_400;
    let mut out = [0u8; 27];
    let mut put = |at: usize, width: usize, mut n: u64| {
        for i in (at..at + width).rev() {
            out[i] = b'0' + (n % 10) as u8;
            n /= 10;
        }
    };
    put(0, 4, year);
    put(5, 2, month);
    put(8, 2, day);
    put(11, 2, time / 3600);
    put(14, 2, time / 60 % 60);
    put(17, 2, time % 60);
    put(20, 6, micros);
    for (i, c) in [(4, b'-'), (7, b'-'), (10, b'T'), (13, b':'), (16, b':'), (19, b'.'), (26, b'Z')] {
        out[i] = c;
    }
    Some(out)
}

/// The proleptic Gregorian date `days` after 1970-01-01 (Howard Hinnant's `civil_from_days`).
fn civil_date(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    (year, month, day)
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

    /// How long a test waits for the flusher before it fails (instead of hanging).
    const WAIT: Duration = Duration::from_secs(10);

    /// The flusher sleeps until a line arrives, not on a timer: it lets one batch gather (one
    /// sleep) and writes it whole, and was not woken while nothing was logged.
    #[test]
    fn the_flusher_waits_for_a_line_then_writes_the_batch_once() {
        let shared = Arc::<Shared>::default();
        let (slept, sleeps) = std::sync::mpsc::channel();
        let (written, batches) = std::sync::mpsc::channel();
        let flusher = shared.clone();
        std::thread::spawn(move || {
            flusher.flush_batches(|pause| slept.send(pause).unwrap(), |batch| written.send(batch.to_vec()).unwrap())
        });
        Line(&shared).write_all(b"{\"n\":1}\n").unwrap();
        Line(&shared).write_all(b"{\"n\":2}\n").unwrap();
        let batch = batches.recv_timeout(WAIT).unwrap();
        // Both lines in one batch when the second arrived before the first's pause ended;
        // the first alone otherwise: never an empty write, never a line twice.
        let mut all = batch.clone();
        if batch == b"{\"n\":1}\n" {
            all.extend(batches.recv_timeout(WAIT).unwrap());
        }
        assert_eq!(all, b"{\"n\":1}\n{\"n\":2}\n");
        let pauses: Vec<Duration> = sleeps.try_iter().collect();
        assert!(pauses.iter().all(|p| *p == FLUSH_EVERY), "{pauses:?}");
        assert_eq!(pauses.len(), if batch == all { 1 } else { 2 }, "one pause a batch, none while idle");
        assert!(shared.take().is_empty());
    }

    /// A batch that a line crossing [`FLUSH_AT`] wrote out while the flusher paused leaves it
    /// nothing to write: no empty write, and the next line is the next batch.
    #[test]
    fn the_flusher_skips_a_batch_written_out_during_its_pause() {
        let shared = Arc::<Shared>::default();
        let (written, batches) = std::sync::mpsc::channel();
        let flusher = shared.clone();
        let during_pause = shared.clone();
        let pauses = std::sync::atomic::AtomicUsize::new(0);
        std::thread::spawn(move || {
            flusher.flush_batches(
                |_| {
                    // The first pause: what a full batch's writer does meanwhile.
                    if pauses.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0 {
                        assert_eq!(during_pause.take(), b"{\"n\":1}\n");
                    }
                },
                |batch| written.send(batch.to_vec()).unwrap(),
            )
        });
        Line(&shared).write_all(b"{\"n\":1}\n").unwrap();
        // The first batch is gone before the second line can land in an empty batch and wake
        // the flusher again: wait for it to be taken.
        let deadline = std::time::Instant::now() + WAIT;
        while !shared.lines().is_empty() {
            assert!(std::time::Instant::now() < deadline, "the flusher never woke for the first line");
            std::thread::yield_now();
        }
        Line(&shared).write_all(b"{\"n\":2}\n").unwrap();
        assert_eq!(batches.recv_timeout(WAIT).unwrap(), b"{\"n\":2}\n");
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

    fn stamp(secs: u64, micros: u32) -> Option<String> {
        let at = std::time::UNIX_EPOCH + Duration::new(secs, micros * 1000);
        rfc3339_micros(at).map(|b| String::from_utf8(b.to_vec()).unwrap())
    }

    #[test]
    fn timestamps_are_written_as_tracing_writes_them() {
        for (secs, micros, want) in [
            (0, 0, "1970-01-01T00:00:00.000000Z"),
            (951_782_400, 500_000, "2000-02-29T00:00:00.500000Z"),
            (1_796_196_142, 123_456, "2026-12-02T07:22:22.123456Z"),
            (4_107_542_399, 999_999, "2100-02-28T23:59:59.999999Z"),
            (253_402_300_799, 1, "9999-12-31T23:59:59.000001Z"),
        ] {
            assert_eq!(stamp(secs, micros).as_deref(), Some(want), "{secs}");
        }
        assert_eq!(stamp(253_402_300_800, 0), None, "year 10000: tracing's own formatter writes it");
        // The shape of tracing's: the same length, the same separators.
        let mut theirs = String::new();
        SystemTime.format_time(&mut Writer::new(&mut theirs)).unwrap();
        let ours = stamp(1_796_196_142, 0).unwrap();
        let shape = |s: &str| s.chars().map(|c| if c.is_ascii_digit() { '0' } else { c }).collect::<String>();
        assert_eq!(shape(&ours), shape(&theirs));
    }

    proptest::proptest! {
        #[test]
        fn any_time_reads_back_as_itself(secs in 0u64..253_402_300_800, micros in 0u32..1_000_000) {
            let text = stamp(secs, micros).unwrap();
            let back = keyward_certs::parse_rfc3339(&text).unwrap();
            proptest::prop_assert_eq!(back, std::time::UNIX_EPOCH + Duration::new(secs, micros * 1000), "{}", text);
        }
    }

    #[test]
    fn numbers_are_written_in_decimal() {
        for (negative, n, want) in [
            (false, 0, "0"),
            (false, 7, "7"),
            (false, 10, "10"),
            (false, u64::MAX, "18446744073709551615"),
            (true, 1, "-1"),
            (true, i64::MIN.unsigned_abs(), "-9223372036854775808"),
        ] {
            let mut out = String::new();
            decimal(&mut Writer::new(&mut out), negative, n).unwrap();
            assert_eq!(out, want);
        }
    }
}
