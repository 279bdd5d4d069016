//! Records which commit the binary is built from, for `keyward version` and the
//! `keyward_build_info` metric. `KEYWARD_BUILD_VERSION` (the Dockerfile's VERSION, from `git
//! describe`) wins; else `git describe` here; else "unknown". The date is the commit's, not
//! the build's, so that the same commit builds the same binary.
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    let text = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (out.status.success() && !text.is_empty()).then_some(text)
}

fn main() {
    println!("cargo:rerun-if-env-changed=KEYWARD_BUILD_VERSION");
    println!("cargo:rerun-if-env-changed=SOURCE_DATE_EPOCH");
    // A new commit or checkout changes HEAD or the ref it names.
    if let Some(dir) = git(&["rev-parse", "--git-dir"]) {
        println!("cargo:rerun-if-changed={dir}/HEAD");
        if let Some(head) = git(&["symbolic-ref", "-q", "HEAD"]) {
            println!("cargo:rerun-if-changed={dir}/{head}");
        }
    }
    let commit = std::env::var("KEYWARD_BUILD_VERSION")
        .ok()
        .filter(|v| !v.is_empty())
        .or_else(|| git(&["describe", "--tags", "--always", "--dirty"]))
        .unwrap_or_else(|| "unknown".into());
    let date = std::env::var("SOURCE_DATE_EPOCH")
        .ok()
        .filter(|v| !v.is_empty())
        .map(|epoch| format!("@{epoch}"))
        .or_else(|| git(&["log", "-1", "--format=%cI"]))
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=KEYWARD_COMMIT={commit}");
    println!("cargo:rustc-env=KEYWARD_COMMIT_DATE={date}");
}
