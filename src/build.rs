//! What this binary is: `keyward version`, and the `keyward_build_info` metric.

/// The crate's version (Cargo.toml).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
/// `git describe` of the commit built (or the image's VERSION), "unknown" without git.
pub const COMMIT: &str = env!("KEYWARD_COMMIT");
/// The commit's date (RFC 3339), or `@<SOURCE_DATE_EPOCH>`: reproducible, unlike a build time.
pub const COMMIT_DATE: &str = env!("KEYWARD_COMMIT_DATE");

/// `keyward version`'s output.
pub fn describe() -> String {
    format!("keyward {VERSION}\ncommit: {COMMIT}\ncommit date: {COMMIT_DATE}\n")
}
