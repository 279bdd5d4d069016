//! `keyward certs`: certificates for admins and air-gapped installs. `mint` writes a CA and
//! leaves laid out as `serve --tls-dir` and `controller --client-ca-dir` read them; `inspect`
//! says what a certificate file or directory holds and whether a TLS peer would accept it.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use anyhow::{bail, Context};
use clap::{Args, Subcommand, ValueEnum};
use keyward_certs::inspect::{Certificate, Check, Inspection};
use keyward_certs::pki::{write_file, Ca, Minted};
use keyward_certs::{rfc3339, CA_FILE, CERT_FILE, KEY_FILE};
use keyward_controller::desired::{trust_domain_problem, Owner};
use keyward_engine::names::{is_dns1123_label, is_dns1123_subdomain};
use serde_json::{json, Value};

use crate::serve::config::parse_duration;

#[derive(Debug, Subcommand)]
pub enum CertsCommand {
    /// Mint a CA, a serving certificate and, with --client-identity, a client certificate.
    ///
    /// Writes OUT/ca (the CA: give it to `controller --client-ca-dir`, or to `--ca-dir` to issue
    /// again), OUT/serving (for `serve --tls-dir`) and OUT/client, each as tls.crt, tls.key and
    /// ca.crt. Keys are written 0600. Files already there are never replaced without --force.
    Mint(MintArgs),
    /// Show what a certificate file (PEM) or directory (tls.crt, and tls.key and ca.crt when
    /// there) holds, and check it: the key matches, the chain verifies, it is valid now.
    ///
    /// Exits 0 when every check passes, 3 when one fails, 1 when the input cannot be read.
    Inspect(InspectArgs),
}

#[derive(Debug, Args)]
pub struct MintArgs {
    /// The directory to write into (created if missing).
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
    /// Issue from this CA (a directory holding its tls.crt and tls.key, such as an earlier
    /// OUT/ca) instead of minting a new one: to renew leaves.
    #[arg(long, value_name = "DIR")]
    ca_dir: Option<PathBuf>,
    /// The serving certificate's DNS names (or IPs); repeat or comma-separate. The default is
    /// the Service `keyward` in `keyward-system`.
    #[arg(
        long = "dns-name",
        value_delimiter = ',',
        value_name = "NAME",
        default_values_t = ["keyward.keyward-system.svc".to_string(), "keyward.keyward-system.svc.cluster.local".to_string()]
    )]
    dns_names: Vec<String>,
    /// Also a client certificate for this identity, as the controller issues them:
    /// spiffe://TRUST-DOMAIN/ns/NAMESPACE/KIND/NAME.
    #[arg(long, value_name = "SPIFFE-ID")]
    client_identity: Option<String>,
    /// The new CA's common name.
    #[arg(long, default_value = "keyward CA")]
    ca_name: String,
    /// How long the new CA is valid (Go duration syntax).
    #[arg(long, default_value = "87600h", value_parser = parse_duration)]
    ca_validity: Duration,
    /// How long the leaves are valid.
    #[arg(long, default_value = "8760h", value_parser = parse_duration)]
    validity: Duration,
    /// Replace files that are already there.
    #[arg(long)]
    force: bool,
}

#[derive(Debug, Args)]
pub struct InspectArgs {
    /// A PEM certificate file, or a directory holding tls.crt (a Secret mounted as a volume).
    #[arg(value_name = "FILE|DIR")]
    path: PathBuf,
    /// The CA bundle to verify the chain against (default: ca.crt in the directory, if any).
    #[arg(long, value_name = "FILE")]
    ca: Option<PathBuf>,
    #[arg(short = 'o', long, value_enum, default_value_t = Output::Text)]
    output: Output,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Output {
    Text,
    Json,
}

pub fn run(command: CertsCommand) -> anyhow::Result<ExitCode> {
    match command {
        CertsCommand::Mint(args) => mint(&args, SystemTime::now()).map(|()| ExitCode::SUCCESS),
        CertsCommand::Inspect(args) => {
            let found = keyward_certs::inspect::inspect(&args.path, args.ca.as_deref(), SystemTime::now())?;
            match args.output {
                Output::Text => print!("{}", text(&found)),
                Output::Json => println!("{}", serde_json::to_string_pretty(&to_json(&found))?),
            }
            Ok(if found.ok() { ExitCode::SUCCESS } else { ExitCode::from(3) })
        }
    }
}

// === mint ===

fn mint(args: &MintArgs, now: SystemTime) -> anyhow::Result<()> {
    let client = args.client_identity.as_deref().map(spiffe_subject).transpose()?;
    let mut plan: Vec<(PathBuf, String, bool)> = Vec::new();
    let ca = match &args.ca_dir {
        Some(dir) => {
            let pair = keyward_certs::pem::read_pair(dir)?;
            Ca::from_pair(&pair, dir)?
        }
        None => {
            let ca = Ca::mint(&args.ca_name, now, args.ca_validity)?;
            let dir = args.out.join("ca");
            plan.push((dir.join(CERT_FILE), ca.cert_pem().to_string(), false));
            plan.push((dir.join(KEY_FILE), ca.key_pem(), true));
            plan.push((dir.join(CA_FILE), ca.cert_pem().to_string(), false));
            ca
        }
    };
    let mut leaf = |name: &str, minted: Minted| {
        let dir = args.out.join(name);
        plan.push((dir.join(CERT_FILE), minted.cert_pem, false));
        plan.push((dir.join(KEY_FILE), minted.key_pem, true));
        plan.push((dir.join(CA_FILE), ca.cert_pem().to_string(), false));
    };
    leaf("serving", ca.issue_serving(&args.dns_names, now, args.validity)?);
    if let (Some(id), Some((namespace, kind, name))) = (&args.client_identity, client) {
        // Issued by the controller's own code, so it is exactly what the controller issues.
        let owner = Owner { api_version: String::new(), kind, name, uid: String::new() };
        let issued = keyward_controller::identity::issue(&ca, &namespace, &owner, id, now, args.validity)?;
        leaf("client", Minted { cert_pem: issued.cert_pem, key_pem: issued.key_pem });
    }
    // Refuse before writing anything: a half-replaced directory would pair a new key with an
    // old certificate.
    if !args.force {
        let existing: Vec<String> =
            plan.iter().filter(|(path, ..)| path.exists()).map(|(path, ..)| path.display().to_string()).collect();
        if !existing.is_empty() {
            bail!(
                "{} already exist{}: keyward never replaces certificates or keys by accident; give another --out, or --force to replace them",
                existing.join(", "),
                if existing.len() == 1 { "s" } else { "" }
            );
        }
    }
    for (path, contents, private) in &plan {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("{}: cannot create the directory", dir.display()))?;
        }
        write_file(path, contents.as_bytes(), *private)?;
    }
    let dirs: Vec<&Path> = {
        let mut d: Vec<&Path> = plan.iter().filter_map(|(p, ..)| p.parent()).collect();
        d.dedup();
        d
    };
    for dir in dirs {
        let what = match dir.file_name().and_then(|n| n.to_str()) {
            Some("ca") => "the CA (controller --client-ca-dir; certs mint --ca-dir to issue again)",
            Some("serving") => "the serving certificate (serve --tls-dir)",
            _ => "the client certificate",
        };
        println!("{}: {what}", dir.display());
    }
    Ok(())
}

/// The subject (O = namespace, OU = kind, CN = name) of a SPIFFE ID in keyward's form
/// `spiffe://TRUST-DOMAIN/ns/NAMESPACE/KIND/NAME`, as the controller issues it.
fn spiffe_subject(id: &str) -> anyhow::Result<(String, String, String)> {
    let form = "give spiffe://TRUST-DOMAIN/ns/NAMESPACE/KIND/NAME, e.g. spiffe://cluster.local/ns/team-a/lmevaljob/evaljob-sample";
    let Some(rest) = id.strip_prefix("spiffe://") else {
        bail!("--client-identity {id:?} is not a SPIFFE ID: {form}");
    };
    let parts: Vec<&str> = rest.split('/').collect();
    let [domain, "ns", namespace, kind, name] = parts[..] else {
        bail!("--client-identity {id:?} is not in keyward's form: {form}");
    };
    if let Some(problem) = trust_domain_problem(domain) {
        bail!("--client-identity {id:?}: the trust domain {problem}");
    }
    if !is_dns1123_label(namespace) {
        bail!("--client-identity {id:?}: {namespace:?} is not a namespace name (a DNS-1123 label)");
    }
    if !is_dns1123_label(kind) {
        bail!("--client-identity {id:?}: the kind {kind:?} must be a lower-case resource kind, as in `lmevaljob`");
    }
    if !is_dns1123_subdomain(name) {
        bail!("--client-identity {id:?}: {name:?} is not an object name (a DNS-1123 subdomain)");
    }
    Ok((namespace.into(), kind.into(), name.into()))
}

// === inspect ===

fn list<T: ToString>(items: &[T]) -> String {
    if items.is_empty() {
        "-".into()
    } else {
        items.iter().map(T::to_string).collect::<Vec<_>>().join(", ")
    }
}

fn text(found: &Inspection) -> String {
    let mut out = String::new();
    let count = found.certificates.len();
    for (i, c) in found.certificates.iter().enumerate() {
        out.push_str(&format!("{}: certificate {} of {count}\n", found.cert_file.display(), i + 1));
        let rows: [(&str, String); 12] = [
            ("subject", c.info.subject.clone()),
            ("issuer", c.info.issuer.clone()),
            ("serial", c.info.serial.clone()),
            ("sha256", c.info.sha256.clone()),
            ("valid", format!("{} to {}", rfc3339(c.info.not_before), rfc3339(c.info.not_after))),
            ("key", c.key_type.clone()),
            ("CA", if c.info.is_ca { "yes" } else { "no" }.into()),
            ("usages", list(&c.usages)),
            ("DNS names", list(&c.info.dns_names)),
            ("IPs", list(&c.info.ip_addresses)),
            ("URIs", list(&c.info.uris)),
            ("SPIFFE ID", c.spiffe_id.clone().unwrap_or_else(|| "-".into())),
        ];
        for (label, value) in rows {
            out.push_str(&format!("  {:<11}{value}\n", format!("{label}:")));
        }
    }
    out.push_str("checks:\n");
    let mut check = |label: &str, c: &Check| {
        let (mark, words) = match &c.result {
            Ok(w) => ("ok", w),
            Err(w) => ("FAIL", w),
        };
        let against =
            if c.against.as_os_str().is_empty() { String::new() } else { format!(" ({})", c.against.display()) };
        out.push_str(&format!("  {:<11}{mark}: {words}{against}\n", format!("{label}:")));
    };
    check("time", &found.time);
    if let Some(key) = &found.key {
        check("key", key);
    }
    if let Some(chain) = &found.chain {
        check("chain", chain);
    }
    out
}

fn to_json(found: &Inspection) -> Value {
    let cert = |c: &Certificate| {
        json!({
            "subject": c.info.subject, "issuer": c.info.issuer, "serial": c.info.serial, "sha256": c.info.sha256,
            "notBefore": rfc3339(c.info.not_before), "notAfter": rfc3339(c.info.not_after),
            "keyType": c.key_type, "isCA": c.info.is_ca, "usages": c.usages,
            "dnsNames": c.info.dns_names, "ipAddresses": c.info.ip_addresses.iter().map(ToString::to_string).collect::<Vec<_>>(),
            "uris": c.info.uris, "spiffeID": c.spiffe_id,
        })
    };
    let check = |c: &Check| {
        let against = (!c.against.as_os_str().is_empty()).then(|| c.against.display().to_string());
        match &c.result {
            Ok(w) => json!({"ok": true, "against": against, "message": w}),
            Err(w) => json!({"ok": false, "against": against, "message": w}),
        }
    };
    json!({
        "file": found.cert_file.display().to_string(),
        "certificates": found.certificates.iter().map(cert).collect::<Vec<_>>(),
        "checks": {
            "time": check(&found.time),
            "key": found.key.as_ref().map(check),
            "chain": found.chain.as_ref().map(check),
        },
        "ok": found.ok(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use keyward_certs::inspect::inspect;
    use rustls::pki_types::pem::PemObject;
    use std::time::UNIX_EPOCH;

    const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/certs");

    /// 2027-06-01T00:00:00Z: inside the fixtures' validity (minted 2026-12-01 for a year).
    fn june_2027() -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(1_811_808_000)
    }

    fn shown(path: &Path, ca: Option<&Path>, now: SystemTime) -> (String, Inspection) {
        let found = inspect(path, ca, now).unwrap();
        (text(&found).replace(&format!("{FIXTURES}/"), ""), found)
    }

    #[test]
    fn inspect_says_what_a_serving_directory_holds_and_that_it_works() {
        let (text, found) = shown(&Path::new(FIXTURES).join("serving"), None, june_2027());
        assert_eq!(
            text,
            "serving/tls.crt: certificate 1 of 1
  subject:   CN=keyward.keyward-system.svc
  issuer:    CN=keyward CA
  serial:    33:98:60:89:4d:46:68:11:94:ae:1e:88:2a:ec:4c
  sha256:    b4436f7adec0b6accb9d8260e490debbc736a2d7a05c790f49145f61e2f4d072
  valid:     2026-12-01T16:01:01Z to 2027-12-01T16:06:01Z
  key:       ECDSA P-256
  CA:        no
  usages:    serverAuth
  DNS names: keyward.keyward-system.svc
  IPs:       10.96.0.10
  URIs:      -
  SPIFFE ID: -
checks:
  time:      ok: valid now, until 2027-12-01T16:06:01Z (183 days left)
  key:       ok: the key belongs to certificate 1 (serving/tls.key)
  chain:     ok: a TLS client that trusts the CA bundle accepts it as the server keyward.keyward-system.svc (serving/ca.crt)
"
        );
        assert!(found.ok());
    }

    #[test]
    fn inspect_reports_each_failed_check() {
        // The serving certificate with the client's key, against a CA that did not sign it.
        let dir = tempfile::tempdir().unwrap();
        let fixture = |p: &str| std::fs::read(Path::new(FIXTURES).join(p)).unwrap();
        std::fs::write(dir.path().join("tls.crt"), fixture("serving/tls.crt")).unwrap();
        std::fs::write(dir.path().join("tls.key"), fixture("client/tls.key")).unwrap();
        let other = Ca::mint("another CA", june_2027() - Duration::from_secs(86_400), Duration::from_secs(86_400 * 30))
            .unwrap();
        let other_ca = dir.path().join("other-ca.crt");
        std::fs::write(&other_ca, other.cert_pem()).unwrap();
        let found = inspect(dir.path(), Some(&other_ca), june_2027()).unwrap();
        assert!(!found.ok());
        assert_eq!(
            found.key.unwrap().result,
            Err("the key does not belong to certificate 1: the Secret's tls.key and tls.crt are from different issuances"
                .to_string())
        );
        assert_eq!(
            found.chain.unwrap().result,
            Err("a TLS client that trusts the CA bundle refuses it as the server keyward.keyward-system.svc: invalid peer certificate: UnknownIssuer (the bundle does not hold its issuer, CN=keyward CA)".to_string())
        );

        // After it expired, against its own CA: the time check and the chain both say so.
        let after = june_2027() + Duration::from_secs(365 * 86_400);
        let found = inspect(&Path::new(FIXTURES).join("serving"), None, after).unwrap();
        assert_eq!(found.time.result, Err("expired at 2027-12-01T16:06:01Z".to_string()));
        assert!(found.chain.unwrap().result.unwrap_err().contains("certificate expired"));
        assert_eq!(found.key.unwrap().result, Ok("the key belongs to certificate 1".to_string()));
    }

    #[test]
    fn inspect_on_mints_top_folder_names_the_folders_to_inspect() {
        let dir = tempfile::tempdir().unwrap();
        for sub in ["serving", "client"] {
            std::fs::create_dir(dir.path().join(sub)).unwrap();
            std::fs::copy(Path::new(FIXTURES).join(sub).join("tls.crt"), dir.path().join(sub).join("tls.crt")).unwrap();
        }
        std::fs::create_dir(dir.path().join("ca")).unwrap();
        let err = inspect(dir.path(), None, june_2027()).unwrap_err().to_string();
        let d = dir.path().display();
        assert_eq!(
            err,
            format!("{d}: no tls.crt here, but in {d}/client, {d}/serving: inspect one of those (as `keyward certs mint --out` writes them)")
        );
        // A folder with nothing below: the plain reading error, as before.
        let empty = tempfile::tempdir().unwrap();
        assert!(inspect(empty.path(), None, june_2027()).unwrap_err().to_string().contains("tls.crt: cannot read"));
    }

    #[test]
    fn inspect_json_names_the_identity_of_a_client_certificate() {
        let found = inspect(&Path::new(FIXTURES).join("client"), None, june_2027()).unwrap();
        let mut json = to_json(&found);
        let file = json["file"].as_str().unwrap().replace(&format!("{FIXTURES}/"), "");
        json["file"] = file.into();
        for check in ["key", "chain"] {
            let against = json["checks"][check]["against"].as_str().unwrap().replace(&format!("{FIXTURES}/"), "");
            json["checks"][check]["against"] = against.into();
        }
        let sha256 = found.certificates[0].info.sha256.clone();
        let serial = found.certificates[0].info.serial.clone();
        assert_eq!(
            json,
            json!({
                "file": "client/tls.crt",
                "certificates": [{
                    "subject": "O=team-a, OU=lmevaljob, CN=evaljob-sample", "issuer": "CN=keyward CA",
                    "serial": serial, "sha256": sha256,
                    "notBefore": "2026-12-01T16:01:01Z", "notAfter": "2027-12-01T16:06:01Z",
                    "keyType": "ECDSA P-256", "isCA": false, "usages": ["clientAuth"],
                    "dnsNames": [], "ipAddresses": [],
                    "uris": ["spiffe://cluster.local/ns/team-a/lmevaljob/evaljob-sample"],
                    "spiffeID": "spiffe://cluster.local/ns/team-a/lmevaljob/evaljob-sample",
                }],
                "checks": {
                    "time": {"ok": true, "against": null, "message": "valid now, until 2027-12-01T16:06:01Z (183 days left)"},
                    "key": {"ok": true, "against": "client/tls.key", "message": "the key belongs to certificate 1"},
                    "chain": {"ok": true, "against": "client/ca.crt", "message": "a TLS server that trusts the CA bundle accepts it as a client certificate"},
                },
                "ok": true,
            })
        );
        // The sha256 is the DER's, as openssl prints it.
        let pem = std::fs::read(Path::new(FIXTURES).join("client/tls.crt")).unwrap();
        let der = rustls::pki_types::CertificateDer::pem_slice_iter(&pem).next().unwrap().unwrap();
        let digest = ring::digest::digest(&ring::digest::SHA256, der.as_ref());
        assert_eq!(sha256, digest.as_ref().iter().map(|b| format!("{b:02x}")).collect::<String>());
    }

    #[test]
    fn the_spiffe_subject_is_the_controllers() {
        assert_eq!(
            spiffe_subject("spiffe://example.org/ns/lm-eval/lmevaljob/job-1").unwrap(),
            ("lm-eval".to_string(), "lmevaljob".to_string(), "job-1".to_string())
        );
    }
}
