//! The docs against the code and against themselves: lists a reader relies on (metric reasons,
//! the fields of the decision log line) name exactly what keyward emits, and every relative link
//! and anchor in every page leads somewhere.
#![allow(clippy::unwrap_used)] // a panic is the test failure report

mod support;

use std::collections::BTreeSet;

use support::*;

/// A page of the docs, by its path from the repository's root.
fn page(path: &str) -> String {
    std::fs::read_to_string(format!("{}/{path}", env!("CARGO_MANIFEST_DIR"))).unwrap()
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

/// The text of a page between `start` and the next `end` after it.
fn between<'a>(text: &'a str, start: &str, end: &str) -> &'a str {
    let from = text.find(start).unwrap_or_else(|| panic!("no {start:?}")) + start.len();
    let to = text[from..].find(end).unwrap_or_else(|| panic!("no {end:?} after {start:?}"));
    &text[from..from + to]
}

#[test]
fn the_cli_page_lists_every_reason_a_decision_can_have() {
    // Reason::as_str is an exhaustive match: its strings are every reason there is.
    let source = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/webhooks/src/decision.rs")).unwrap();
    let as_str = between(&source, "pub fn as_str(self) -> &'static str {", "\n    }\n");
    let reasons: BTreeSet<String> = as_str
        .lines()
        .filter_map(|l| l.split_once("=> \""))
        .map(|(_, r)| r.trim_end_matches("\",").to_string())
        .collect();
    assert!(reasons.len() >= 14, "{reasons:?}");
    let cli = page("docs/cli.md");
    let documented = backticked(between(&cli, "`reason` one of", "|"));
    assert_eq!(documented, reasons, "docs/cli.md's reasons for keyward_admission_requests_total");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_page_names_every_field_of_the_decision_log_line() {
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
    let cli = page("docs/cli.md");
    let documented = backticked(between(&cli, "one line per admission decision with", "; one per"));
    assert_eq!(documented, fields, "docs/cli.md's fields of the decision log line");
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

// === links and anchors ===

/// Every Markdown page of the repository a reader is sent to: the front page, the docs and the
/// maps beside them (not `target/` or the mirrors of other projects).
fn pages() -> Vec<String> {
    let root = env!("CARGO_MANIFEST_DIR");
    let mut pages: Vec<String> =
        ["README.md", "ARCHITECTURE.md", "BENCHMARKS.md", "CHANGELOG.md", "tests/fixtures/README.md"]
            .map(String::from)
            .to_vec();
    for entry in std::fs::read_dir(format!("{root}/docs")).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        if name.ends_with(".md") {
            pages.push(format!("docs/{name}"));
        }
    }
    pages.sort();
    pages
}

/// The lines of a page outside fenced code blocks.
fn prose(text: &str) -> Vec<&str> {
    let mut fenced = false;
    text.lines()
        .filter(|line| {
            if line.starts_with("```") {
                fenced = !fenced;
                return false;
            }
            !fenced
        })
        .collect()
}

/// A heading's anchor as GitHub makes it: lower case, everything but letters, digits, spaces,
/// `-` and `_` dropped, spaces turned to `-`.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of a page's headings, a repeated one numbered as GitHub numbers it (`-1`, `-2`).
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen = std::collections::BTreeMap::<String, usize>::new();
    let mut anchors = BTreeSet::new();
    for line in prose(text) {
        let hashes = line.chars().take_while(|c| *c == '#').count();
        if (1..=6).contains(&hashes) && line[hashes..].starts_with(' ') {
            let base = slug(&line[hashes + 1..]);
            let n = seen.entry(base.clone()).or_default();
            anchors.insert(if *n == 0 { base.clone() } else { format!("{base}-{n}") });
            *n += 1;
        }
        // An anchor of its own (`<a id="…"></a>`), which GitHub keeps: where an old link lands.
        let mut rest = line;
        while let Some(at) = rest.find("<a id=\"") {
            rest = &rest[at + "<a id=\"".len()..];
            if let Some(end) = rest.find('"') {
                anchors.insert(rest[..end].to_string());
            }
        }
    }
    anchors
}

/// The targets of the inline links `[text](target)` in a page's prose.
fn links(text: &str) -> Vec<String> {
    let mut targets = Vec::new();
    for line in prose(text) {
        let mut rest = line;
        while let Some(at) = rest.find("](") {
            rest = &rest[at + 2..];
            if let Some(end) = rest.find(')') {
                targets.push(rest[..end].to_string());
                rest = &rest[end..];
            }
        }
    }
    targets
}

#[test]
fn the_anchors_are_githubs() {
    assert_eq!(slug("`keyward serve`"), "keyward-serve");
    assert_eq!(slug("Security: what the controller trusts"), "security-what-the-controller-trusts");
    assert_eq!(slug("What is in `deploy/`"), "what-is-in-deploy");
    assert_eq!(
        anchors("# A\n```\n# not a heading\n```\n## A\n#no\n### B b\n"),
        ["a", "a-1", "b-b"].map(String::from).into()
    );
    assert!(anchors("| <a id=\"old-place\"></a>Old | [new](x.md) |\n").contains("old-place"));
    assert_eq!(links("see [x](a.md#b) and [y](#c)\n```\n[z](d.md)\n```\n"), ["a.md#b", "#c"]);
}

#[test]
fn every_relative_link_and_anchor_in_the_docs_leads_somewhere() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let pages = pages();
    assert!(pages.len() >= 12, "{pages:?}");
    let mut broken = Vec::new();
    let mut checked = 0;
    for page in &pages {
        let dir = std::path::Path::new(page).parent().unwrap();
        for target in links(&self::page(page)) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            checked += 1;
            let (path, anchor) = target.split_once('#').unwrap_or((&target, ""));
            let file = if path.is_empty() { std::path::PathBuf::from(page) } else { dir.join(path) };
            if !root.join(&file).exists() {
                broken.push(format!("{page}: {target}: no file {}", file.display()));
                continue;
            }
            if !anchor.is_empty() {
                let text = std::fs::read_to_string(root.join(&file)).unwrap();
                if !anchors(&text).contains(anchor) {
                    broken.push(format!("{page}: {target}: no heading #{anchor} in {}", file.display()));
                }
            }
        }
    }
    assert!(checked > 40, "{checked} links");
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn the_readme_is_a_front_page_that_reaches_every_page_of_the_docs() {
    let readme = page("README.md");
    let lines = readme.lines().count();
    assert!(lines <= 400, "README.md has {lines} lines: move reference material to docs/");
    // It starts with the two commands: the webhook on the embedded default, and the tests.
    assert!(readme.starts_with("# keyward\n\n```sh\ncargo run -- serve "), "{}", &readme[..80]);
    assert!(readme.contains("\ncargo test --workspace --locked "));
    let linked: BTreeSet<String> =
        links(&readme).into_iter().map(|t| t.split('#').next().unwrap().to_string()).collect();
    for page in pages().into_iter().filter(|p| p.starts_with("docs/") && p != "docs/mutants.md") {
        assert!(linked.contains(&page), "README.md does not link {page}");
    }
}

// === examples that run ===

/// The fenced blocks of `lang` in a page.
fn fenced<'a>(text: &'a str, lang: &str) -> Vec<&'a str> {
    let open = format!("```{lang}\n");
    text.split(open.as_str()).skip(1).filter_map(|rest| rest.split("\n```").next()).collect()
}

#[test]
fn every_example_profile_in_the_docs_loads_as_written() {
    let mut checked = 0;
    for name in ["README.md", "docs/profiles.md"] {
        for (n, yaml) in fenced(&page(name), "yaml").into_iter().enumerate() {
            if !yaml.contains("kind: InjectionProfile") {
                continue;
            }
            let dir = tempfile::tempdir().unwrap();
            let file = dir.path().join("example.yaml");
            std::fs::write(&file, yaml).unwrap();
            let out = std::process::Command::new(env!("CARGO_BIN_EXE_keyward"))
                .args(["check-profiles", "--profiles", file.to_str().unwrap()])
                .env_remove("KEYWARD_PROFILES")
                .output()
                .unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success(), "{name}, YAML block {}: {stderr}", n + 1);
            checked += 1;
        }
    }
    assert!(checked >= 2, "{checked} example profiles");
}

/// Links to the README's sections from before it became a front page (issue 28) still land
/// on it, next to where each section went.
#[test]
fn links_to_the_readmes_old_sections_still_land() {
    let readme = page("README.md");
    let anchors = anchors(&readme);
    let old = [
        "how-a-pod-is-decided",
        "profiles",
        "built-in-profiles",
        "keyward-serve",
        "keyward-explain",
        "keyward-audit",
        "keyward-check-profiles",
        "keyward-certs",
        "what-keyward-guarantees-about-the-pod",
        "deploy",
        "changing-profiles-in-a-running-cluster",
        "the-webhook-configuration-follows-the-profiles",
        "alerts",
        "keywardwebhookdown",
        "keywardcontrollerdown",
        "keywardreplicasunavailable",
        "keywardservingcertificateexpiring",
        "keywardclientcaexpiring",
        "keywardcertificatereloadfailing",
        "keywardprofilereloadfailing",
        "keywardwebhookconfigdrifting",
        "keywardpodcertificatesnotissued",
        "keywarddenialsrising",
        "keywardadmissionslow",
        "keywardissuancefailing",
        "keywardcontrollernoleader",
        "keywardforgedorunverifiableowners",
        "the-controller",
        "security-what-the-controller-trusts",
        "what-an-attestation-binds",
        "when-the-api-server-misbehaves",
        "what-it-costs",
        "pod-certificates",
        "development",
    ];
    for anchor in old {
        assert!(anchors.contains(anchor), "README.md lost #{anchor}, which links from before issue 28 point to");
    }
}

// === commands ===

/// The code in a page: every line of its fenced blocks and every inline code span.
fn code(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.starts_with("```") {
            fenced = !fenced;
        } else if fenced {
            out.push(line.to_string());
        } else {
            out.extend(line.split('`').skip(1).step_by(2).map(str::to_string));
        }
    }
    out
}

/// `keyward SUBCOMMAND [...] --flag` in code: the subcommand's words and the flags given it,
/// up to what ends the command (a pipe, `;`, `&&`, a comment).
fn commands(code: &str, subcommands: &[String]) -> Vec<(Vec<String>, Vec<String>)> {
    let mut found = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find("keyward ") {
        let before = rest[..at].chars().last();
        let after = &rest[at + "keyward ".len()..];
        rest = after;
        if before.is_some_and(|c| c.is_alphanumeric() || c == '-' || c == '/' || c == '.') {
            continue;
        }
        let words: Vec<&str> = after
            .split_whitespace()
            .take_while(|w| !matches!(*w, "|" | "&&" | ";" | "#" | "\\") && !w.starts_with('#'))
            .collect();
        let Some(first) = words.first().filter(|w| subcommands.iter().any(|s| s == *w)) else { continue };
        let mut command = vec![first.to_string()];
        // `manifests webhook`, `certs mint`: a second word that is not a flag or a file.
        if matches!(*first, "manifests" | "certs") {
            if let Some(second) = words.get(1).filter(|w| w.chars().all(|c| c.is_ascii_lowercase() || c == '-')) {
                command.push(second.to_string());
            }
        }
        let flags = words
            .iter()
            .filter(|w| w.starts_with("--") && w.len() > 2)
            .map(|w| w.split('=').next().unwrap_or(w).trim_end_matches([',', ')', '`', ']']).to_string())
            .collect();
        found.push((command, flags));
    }
    found
}

/// issue 58: the operations runbook sent people to `check-gate --path`, a flag that does not
/// exist. Every flag the docs give a keyward command is one its `--help` lists.
#[test]
fn every_flag_the_docs_give_a_command_is_one_it_takes() {
    let help = |args: &[&str]| -> String {
        let out = std::process::Command::new(keyward_bin()).args(args).arg("--help").output().unwrap();
        assert!(out.status.success(), "keyward {args:?} --help: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    let top = help(&[]);
    let subcommands: Vec<String> = between(&top, "Commands:\n", "\n\n")
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect();
    assert!(subcommands.contains(&"check-gate".to_string()), "{subcommands:?}");
    let mut helps: std::collections::BTreeMap<Vec<String>, String> = Default::default();
    let mut wrong = Vec::new();
    let mut checked = 0;
    // The changelog and the benchmarks' history speak of flags as they were.
    for page_path in pages().into_iter().filter(|p| p != "CHANGELOG.md" && p != "BENCHMARKS.md") {
        let text = page(&page_path);
        for code in code(&text) {
            for (command, flags) in commands(&code, &subcommands) {
                let text = helps
                    .entry(command.clone())
                    .or_insert_with(|| help(&command.iter().map(String::as_str).collect::<Vec<_>>()));
                checked += 1;
                for flag in flags {
                    let listed = [" ", "\n", ",", "=", "["].iter().any(|end| text.contains(&format!("{flag}{end}")));
                    if !listed {
                        wrong.push(format!("{page_path}: keyward {} {flag}", command.join(" ")));
                    }
                }
            }
        }
    }
    assert!(wrong.is_empty(), "flags the docs give that the command does not take:\n{}", wrong.join("\n"));
    // The docs show 95 commands (2026-12-07): a parser that finds few checks nothing.
    assert!(checked > 80, "only {checked} keyward commands found in the docs");
}

/// BENCHMARKS.md opens with its answer (issue 57): before any other section, one table of the
/// current targets, each row with its figure, the reference from the same run, whether it is
/// met, and the run; and its history is a line or three a run, not the runs again.
#[test]
fn the_benchmarks_page_opens_with_its_targets_and_keeps_a_short_history() {
    let text = page("BENCHMARKS.md");
    let sections: Vec<&str> = text.lines().filter(|l| l.starts_with("## ")).collect();
    assert_eq!(sections.first().copied(), Some("## Where keyward stands"), "{sections:?}");
    let opening = between(&text, "## Where keyward stands\n", "\n## ");
    let rows: Vec<&str> = opening.lines().filter(|l| l.starts_with('|')).collect();
    assert_eq!(rows.first().copied(), Some("| target | figure | reference, same run | met | run |"));
    assert!(rows.len() >= 2 + 11, "{} rows: one a target of issue 59", rows.len() - 2);
    for row in &rows[2..] {
        let cells: Vec<&str> = row.trim_matches('|').split(" | ").map(str::trim).collect();
        assert_eq!(cells.len(), 5, "{row}");
        let met = cells[3];
        assert!(
            ["**met**", "**not met**", "**not measured**"].contains(&met),
            "{row}: say met, not met or not measured"
        );
        let names_a_run = cells[4]
            .split(|c: char| !c.is_ascii_alphanumeric())
            .any(|w| w.len() == 7 && w.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
        assert!(names_a_run || met == "**not measured**", "{row}: name the run's commit");
        assert!(cells[1] != "—" || met == "**not measured**", "{row}: give the figure");
    }
    let history = between(&text, "## History\n", "\n### ");
    let entries: Vec<&str> = history.split("\n- ").skip(1).collect();
    assert!(entries.len() >= 10, "{} runs in the history", entries.len());
    for entry in entries {
        assert!(entry.trim_end().lines().count() <= 3, "a history entry of more than three lines: {entry}");
    }
}
