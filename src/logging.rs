//! Logs: one line per event, JSON (for collectors) or text (for people).
//!
//! Anything that came from a request is logged as a string field (never with `%`, never as
//! tracing's `message`), clipped with [`keyward_engine::text::clip`]: text mode then quotes
//! and escapes it, and JSON mode encodes it, so a newline or a `key=value` in a username cannot
//! forge a line or a field.

use std::io::IsTerminal;

use clap::ValueEnum;
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::EnvFilter;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Json,
    Text,
}

/// Installs the global subscriber on stdout. `RUST_LOG` overrides the default level (`info`).
pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    // A second init (in tests) is harmless; keep the first.
    let _ = tracing::dispatcher::set_global_default(dispatch(
        format,
        filter,
        std::io::stdout,
        std::io::stdout().is_terminal(),
    ));
}

/// The subscriber for `format`, writing to `writer`.
pub fn dispatch<W>(format: LogFormat, filter: EnvFilter, writer: W, ansi: bool) -> tracing::Dispatch
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let builder =
        tracing_subscriber::fmt().with_env_filter(filter).with_target(false).with_ansi(ansi).with_writer(writer);
    match format {
        LogFormat::Json => tracing::Dispatch::new(builder.json().flatten_event(true).with_current_span(false).finish()),
        LogFormat::Text => tracing::Dispatch::new(builder.finish()),
    }
}
