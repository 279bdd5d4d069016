//! The README against the code: lists a reader relies on (metric reasons, the fields of the
//! decision log line) must name exactly what keyward emits.
#![allow(clippy::unwrap_used)] // a panic is the test failure report

mod support;

use std::collections::BTreeSet;

use support::*;

fn readme() -> String {
    std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap()
}

/// The backticked words in `text`, outside parentheses (which explain, not list).
fn backticked(text: &str) -> BTreeSet<String> {
    let mut outside = String::new();
    let mut depth = 0usize;
    for c in text.chars() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            c if depth == 0 => outside.push(c),
            _ => {}
        }
    }
    outside.split('`').skip(1).step_by(2).map(str::to_string).collect()
}

/// The text of the README between `start` and the next `end` after it.
fn between<'a>(text: &'a str, start: &str, end: &str) -> &'a str {
    let from = text.find(start).unwrap_or_else(|| panic!("README has no {start:?}")) + start.len();
    let to = text[from..].find(end).unwrap_or_else(|| panic!("README has no {end:?} after {start:?}"));
    &text[from..from + to]
}

#[test]
fn the_readme_lists_every_reason_a_decision_can_have() {
    // Reason::as_str is an exhaustive match: its strings are every reason there is.
    let source = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/webhooks/src/decision.rs")).unwrap();
    let as_str = between(&source, "pub fn as_str(self) -> &'static str {", "\n    }\n");
    let reasons: BTreeSet<String> = as_str
        .lines()
        .filter_map(|l| l.split_once("=> \""))
        .map(|(_, r)| r.trim_end_matches("\",").to_string())
        .collect();
    assert!(reasons.len() >= 14, "{reasons:?}");
    let readme = readme();
    let documented = backticked(between(&readme, "`reason` one of", "|"));
    assert_eq!(documented, reasons, "README's reasons for keyward_admission_requests_total");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_names_every_field_of_the_decision_log_line() {
    let tls = TlsDir::new();
    let mut server = tls.start(&[]);
    let (mut client, _) = server.connect().await.unwrap();
    // One admitted, one refused (so that the refusal's field is there too).
    client.mutate(&fixture("admissionreview-lmeval.json")).await.unwrap();
    let refused = review_of("lmeval-fms-driver-pod.json", "team-a", "system:serviceaccount:team-a:someone", "u-2");
    assert_eq!(client.mutate(&refused).await.unwrap()["response"]["allowed"], false);
    let mut fields = BTreeSet::new();
    for uid in ["705ab4f5-6393-11e8-b7cc-42010a800002", "u-2"] {
        let line = server.wait_log(|v| v["message"] == "admission decision" && v["uid"] == uid);
        fields.extend(line.as_object().unwrap().keys().cloned());
    }
    for envelope in ["timestamp", "level", "target", "message"] {
        fields.remove(envelope);
    }
    let readme = readme();
    let documented = backticked(between(&readme, "one line per admission decision with", "; one per"));
    assert_eq!(documented, fields, "README's fields of the decision log line");
}

#[test]
fn every_path_the_architecture_map_names_exists() {
    let root = env!("CARGO_MANIFEST_DIR");
    let map = std::fs::read_to_string(format!("{root}/ARCHITECTURE.md")).unwrap();
    let tops = ["src/", "webhooks/", "certs/", "controller/", "deploy/", "tests/", "benches/", "scripts/"];
    // Every backticked word, parentheses included (paths are often named in them).
    let paths: Vec<&str> =
        map.split('`').skip(1).step_by(2).filter(|p| tops.iter().any(|t| p.starts_with(t))).collect();
    assert!(paths.len() > 20, "{paths:?}");
    let missing: Vec<&&str> = paths.iter().filter(|p| !std::path::Path::new(root).join(p).exists()).collect();
    assert!(missing.is_empty(), "ARCHITECTURE.md names paths that do not exist: {missing:?}");
}
