//! `keyward certs mint` and `keyward certs inspect`, as an admin runs them: what mint writes is
//! served by `keyward serve --tls-dir` and loaded by the controller's client CA store; mint
//! never replaces keys by accident; inspect's exit codes and JSON.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic is the test failure report

mod support;

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;
use support::*;

fn keyward(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_keyward")).args(args).output().unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn mint(out: &Path, extra: &[&str]) -> Output {
    let mut args = vec!["certs", "mint", "--out", out.to_str().unwrap()];
    args.extend_from_slice(extra);
    keyward(&args)
}

#[tokio::test]
async fn minted_certificates_are_served_and_sign_client_certificates() {
    let dir = tempfile::tempdir().unwrap();
    let out = mint(dir.path(), &["--client-identity", "spiffe://cluster.local/ns/team-a/lmevaljob/evaljob-sample"]);
    assert!(out.status.success(), "{}", stderr(&out));
    for sub in ["ca", "serving", "client"] {
        for file in ["tls.crt", "tls.key", "ca.crt"] {
            let path = dir.path().join(sub).join(file);
            let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&path).unwrap().permissions());
            assert_eq!(mode & 0o777, if file == "tls.key" { 0o600 } else { 0o644 }, "{}", path.display());
        }
    }
    let ca_pem = std::fs::read(dir.path().join("ca/ca.crt")).unwrap();
    assert_eq!(std::fs::read(dir.path().join("serving/ca.crt")).unwrap(), ca_pem);

    // The webhook serves the serving pair; a client that trusts only the CA connects.
    let serving = dir.path().join("serving");
    let server = Server::start(&["--tls-dir", serving.to_str().unwrap()], ca_pem.clone());
    let (mut client, _) = server.endpoint.connect().await.unwrap();
    let (status, body) = client.request("GET", "/healthz", Vec::new()).await.unwrap();
    assert_eq!((status, body.as_slice()), (200, b"ok\n".as_slice()));

    // The controller's client CA store loads the CA (it checks that it can issue).
    let store = keyward_controller::identity::client_ca_store(&dir.path().join("ca"));
    store.reload(keyward_certs::Trigger::Poll);
    assert_eq!(store.ready(std::time::SystemTime::now()), Ok(()));

    // The client certificate carries the identity as the controller issues it.
    let client = keyward_certs::pem::read_pair(&dir.path().join("client")).unwrap();
    assert_eq!(client.info.uris, ["spiffe://cluster.local/ns/team-a/lmevaljob/evaljob-sample"]);
    assert_eq!(client.info.subject, "O=team-a, OU=lmevaljob, CN=evaljob-sample");

    // inspect: every check passes against the CA beside it, exit 0.
    let inspected = keyward(&["certs", "inspect", dir.path().join("client").to_str().unwrap(), "-o", "json"]);
    assert_eq!(inspected.status.code(), Some(0), "{}", stderr(&inspected));
    let json: Value = serde_json::from_slice(&inspected.stdout).unwrap();
    assert_eq!(json["ok"], true);
    assert_eq!(json["certificates"][0]["spiffeID"], "spiffe://cluster.local/ns/team-a/lmevaljob/evaljob-sample");
    assert_eq!(json["certificates"][0]["usages"], serde_json::json!(["clientAuth"]));
    assert_eq!(
        json["checks"]["chain"]["message"],
        "a TLS server that trusts the CA bundle accepts it as a client certificate"
    );
}

#[test]
fn mint_never_replaces_keys_without_force_and_reissues_from_a_ca() {
    let dir = tempfile::tempdir().unwrap();
    assert!(mint(dir.path(), &[]).status.success());
    let ca_key = std::fs::read(dir.path().join("ca/tls.key")).unwrap();
    let leaf = std::fs::read(dir.path().join("serving/tls.crt")).unwrap();

    let again = mint(dir.path(), &[]);
    assert_eq!(again.status.code(), Some(1));
    let p = |s: &str| dir.path().join(s).display().to_string();
    assert_eq!(
        stderr(&again),
        format!(
            "keyward: error: {}, {}, {}, {}, {}, {} already exist: keyward never replaces certificates or keys by accident; give another --out, or --force to replace them\n",
            p("ca/tls.crt"), p("ca/tls.key"), p("ca/ca.crt"), p("serving/tls.crt"), p("serving/tls.key"), p("serving/ca.crt")
        )
    );
    assert_eq!(std::fs::read(dir.path().join("ca/tls.key")).unwrap(), ca_key, "nothing written");

    // Renewing the leaf from the same CA: the CA stays, the leaf is new and chains to it.
    let renewed = tempfile::tempdir().unwrap();
    let out = mint(renewed.path(), &["--ca-dir", &p("ca")]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(!renewed.path().join("ca").exists(), "no new CA when issuing from one");
    assert_ne!(std::fs::read(renewed.path().join("serving/tls.crt")).unwrap(), leaf);
    let inspected =
        keyward(&["certs", "inspect", &renewed.path().join("serving").display().to_string(), "--ca", &p("ca/ca.crt")]);
    assert_eq!(inspected.status.code(), Some(0), "{}", String::from_utf8_lossy(&inspected.stdout));

    let forced = mint(dir.path(), &["--force"]);
    assert!(forced.status.success(), "{}", stderr(&forced));
    assert_ne!(std::fs::read(dir.path().join("ca/tls.key")).unwrap(), ca_key);
}

#[test]
fn inspect_exits_3_when_a_check_fails() {
    let a = tempfile::tempdir().unwrap();
    let b = tempfile::tempdir().unwrap();
    assert!(mint(a.path(), &[]).status.success());
    assert!(mint(b.path(), &[]).status.success());
    // The serving pair of one, checked against the other's CA: the same name, another key, as
    // after a CA was minted again.
    let out = keyward(&[
        "certs",
        "inspect",
        &a.path().join("serving").display().to_string(),
        "--ca",
        &b.path().join("ca/ca.crt").display().to_string(),
    ]);
    assert_eq!(out.status.code(), Some(3));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("  chain:     FAIL: a TLS client that trusts the CA bundle refuses it as the server keyward.keyward-system.svc: invalid peer certificate: BadSignature (the bundle holds a CA named CN=keyward CA but with another key: the CA was replaced after this certificate was issued) ("),
        "{text}"
    );
    assert!(text.contains("  key:       ok: the key belongs to certificate 1 ("), "{text}");
    // Unreadable input: exit 1, the file named.
    let missing = keyward(&["certs", "inspect", "/nonexistent/tls.crt"]);
    assert_eq!(missing.status.code(), Some(1));
    assert_eq!(
        stderr(&missing),
        "keyward: error: /nonexistent/tls.crt: cannot read: No such file or directory (os error 2)\n"
    );
}

#[test]
fn a_client_identity_not_in_keywards_form_is_refused_with_the_form() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        ("https://x/ns/a/b/c", "--client-identity \"https://x/ns/a/b/c\" is not a SPIFFE ID: give spiffe://TRUST-DOMAIN/ns/NAMESPACE/KIND/NAME, e.g. spiffe://cluster.local/ns/team-a/lmevaljob/evaljob-sample"),
        ("spiffe://cluster.local/ns/a/b/../c", "--client-identity \"spiffe://cluster.local/ns/a/b/../c\" is not in keyward's form: give spiffe://TRUST-DOMAIN/ns/NAMESPACE/KIND/NAME, e.g. spiffe://cluster.local/ns/team-a/lmevaljob/evaljob-sample"),
        ("spiffe://cluster.local/ns/Team/job/x", "--client-identity \"spiffe://cluster.local/ns/Team/job/x\": \"Team\" is not a namespace name (a DNS-1123 label)"),
        ("spiffe://cluster.local/ns/a/LMEvalJob/x", "--client-identity \"spiffe://cluster.local/ns/a/LMEvalJob/x\": the kind \"LMEvalJob\" must be a lower-case resource kind, as in `lmevaljob`"),
    ];
    for (id, message) in cases {
        let out = mint(dir.path(), &["--client-identity", id]);
        assert_eq!(out.status.code(), Some(1), "{id}");
        assert_eq!(stderr(&out), format!("keyward: error: {message}\n"));
    }
    assert!(std::fs::read_dir(dir.path()).unwrap().next().is_none(), "nothing written");
}
