//! The webhook's serving certificate when keyward manages it itself (pure): given what the one
//! Secret holds and what the webhook configuration's `caBundle` holds, what both should hold.
//!
//! The Secret holds `ca.crt` and `ca.key` (the CA that signs the served leaf), `tls.crt` and
//! `tls.key` (the leaf), and during a CA rotation `ca-next.crt` and `ca-next.key` (a CA that is
//! trusted but does not sign yet) or `ca-previous.crt` (the CA of the leaf served before). A CA
//! rotation never leaves the apiserver without trust in the leaf a replica serves:
//!
//! 1. **introduce**: at two thirds of the CA's life a new CA is minted as `ca-next`; `caBundle`
//!    gets it beside the current one (written before the Secret).
//! 2. **switch**: once `caBundle` has held both for [`Settings::switch_after`], the leaf is
//!    issued by the new CA, which becomes `ca`; the old one stays as `ca-previous`.
//! 3. **retire**: once every replica serves a leaf of the new CA, `ca-previous` leaves the
//!    Secret, then `caBundle`.
//!
//! The leaf is renewed at two thirds of its life, or at once when it does not match its key,
//! is not signed by `ca`, or does not name every Service name. Anything that does not parse is
//! replaced, with the reason, and never served (the webhook refuses a bad pair on its own).

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use keyward_certs::pem::{self, CertInfo};
use keyward_certs::pki::Ca;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;

use crate::error::Error;

pub const CA_CRT: &str = "ca.crt";
pub const CA_KEY: &str = "ca.key";
pub const TLS_CRT: &str = "tls.crt";
pub const TLS_KEY: &str = "tls.key";
pub const CA_NEXT_CRT: &str = "ca-next.crt";
pub const CA_NEXT_KEY: &str = "ca-next.key";
pub const CA_PREVIOUS_CRT: &str = "ca-previous.crt";

/// How the certificates are made.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The leaf's DNS names: `<service>.<namespace>.svc` and `….svc.cluster.local`.
    pub names: Vec<String>,
    pub ca_common_name: String,
    pub ca_validity: Duration,
    pub leaf_validity: Duration,
    /// How long `caBundle` holds a new CA before a leaf it signs is served: time for every
    /// apiserver to read the webhook configuration again.
    pub switch_after: Duration,
}

impl Settings {
    /// The Service's names, and defaults: a CA of 10 years, a leaf of one, a minute to switch.
    pub fn for_service(service: &str, namespace: &str) -> Self {
        Self {
            names: vec![format!("{service}.{namespace}.svc"), format!("{service}.{namespace}.svc.cluster.local")],
            ca_common_name: format!("keyward serving CA ({namespace})"),
            ca_validity: Duration::from_secs(10 * 365 * 86_400),
            leaf_validity: Duration::from_secs(365 * 86_400),
            switch_after: Duration::from_secs(60),
        }
    }

    /// A leaf must be renewed well inside its CA's life: the CA is replaced at two thirds of
    /// its life, and the leaf it signed must stay trusted until then.
    pub fn check(&self) -> Result<(), String> {
        if self.names.is_empty() {
            return Err("the serving certificate needs at least one DNS name".into());
        }
        if self.leaf_validity.is_zero() || self.ca_validity < self.leaf_validity * 3 {
            return Err(format!(
                "the serving CA's validity ({}s) must be at least three times the leaf's ({}s): the CA is replaced at two thirds of its life, while leaves it signed are still served",
                self.ca_validity.as_secs(),
                self.leaf_validity.as_secs()
            ));
        }
        Ok(())
    }
}

/// What the Secret and the webhook configuration hold now.
#[derive(Debug, Clone, Default)]
pub struct Observed {
    /// The Secret's data; empty when there is no Secret.
    pub files: BTreeMap<String, Vec<u8>>,
    /// When `ca-next` was introduced (the Secret's annotation).
    pub next_since: Option<SystemTime>,
    /// The `caBundle` of the webhook configuration (PEM; empty when unset).
    pub bundle: Vec<u8>,
    /// Every ready replica serves a leaf signed by the Secret's `ca.crt`.
    pub replicas_serve_current: bool,
    /// An admin asked for a new leaf now (the Secret's annotation [`RENEW`]).
    pub renew_requested: bool,
    /// An admin asked for a CA rotation now (the annotation [`ROTATE_CA`]); ignored while one
    /// is under way.
    pub rotate_requested: bool,
}

/// `kubectl annotate secret keyward-serving keyward.io/renew-certificate=now`: a new leaf at
/// the next pass. The annotation is removed with the write.
pub const RENEW: &str = "keyward.io/renew-certificate";
/// `kubectl annotate secret keyward-serving keyward.io/rotate-ca=now`: a CA rotation starts at
/// the next pass (introduce, switch, retire, as at two thirds of the CA's life).
pub const ROTATE_CA: &str = "keyward.io/rotate-ca";

/// What to write, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The Secret's data, when it must change.
    pub files: Option<BTreeMap<String, Vec<u8>>>,
    /// When `ca-next` was introduced, to record on the Secret (None: no `ca-next`).
    pub next_since: Option<SystemTime>,
    /// What `caBundle` must hold: each CA certificate to trust, PEM, oldest first.
    pub bundle: String,
    /// Write `caBundle` before the Secret (it gains a CA), else after (it loses one).
    pub bundle_first: bool,
    /// What changed and why, for the log.
    pub changes: Vec<Change>,
    /// When to look again at the latest.
    pub next: SystemTime,
}

/// One change a plan makes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// A CA and a leaf where there were none (or only what could not be used, said here).
    Created {
        replaced: Option<String>,
    },
    LeafRenewed {
        why: String,
    },
    CaIntroduced,
    CaSwitched,
    CaRetired,
    /// Something in the Secret that cannot be used was dropped.
    Dropped {
        file: &'static str,
        why: String,
    },
}

impl Change {
    /// The metric label.
    pub fn as_str(&self) -> &'static str {
        match self {
            Change::Created { .. } => "created",
            Change::LeafRenewed { .. } => "leaf-renewed",
            Change::CaIntroduced => "ca-introduced",
            Change::CaSwitched => "ca-switched",
            Change::CaRetired => "ca-retired",
            Change::Dropped { .. } => "dropped",
        }
    }

    /// The log line's words.
    pub fn describe(&self) -> String {
        match self {
            Change::Created { replaced: None } => "serving CA and certificate created".into(),
            Change::Created { replaced: Some(why) } => {
                format!("serving CA and certificate replaced, since the Secret's could not be used: {why}")
            }
            Change::LeafRenewed { why } => format!("serving certificate renewed: {why}"),
            Change::CaIntroduced => "a new serving CA added to caBundle; it signs nothing until every apiserver has read it".into(),
            Change::CaSwitched => "the serving certificate is now signed by the new CA; the old CA stays in caBundle until every replica serves the new certificate".into(),
            Change::CaRetired => "every replica serves the new certificate; the old CA removed from caBundle".into(),
            Change::Dropped { file, why } => format!("{file} dropped from the Secret: {why}"),
        }
    }
}

// === plan ===

/// What the Secret and `caBundle` must hold at `now`.
pub fn plan(settings: &Settings, observed: &Observed, now: SystemTime) -> Result<Plan, Error> {
    let mut changes = Vec::new();
    let mut files = observed.files.clone();
    let mut next_since = observed.next_since;

    // The signing CA: used as is, or everything starts again.
    let mut ca = match ca_pair(&files, CA_CRT, CA_KEY, now) {
        Ok(ca) => ca,
        Err(why) => {
            let replaced = (!files.is_empty()).then_some(why);
            // A CA certificate that is still valid may sign the leaf a replica serves now:
            // trusted until the new leaf is everywhere.
            let previous = files.get(CA_CRT).filter(|pem| is_valid_ca(pem, now)).cloned();
            let ca = Ca::mint(&settings.ca_common_name, now, settings.ca_validity)?;
            files.clear();
            write_ca(&mut files, CA_CRT, CA_KEY, &ca);
            if let Some(previous) = previous {
                files.insert(CA_PREVIOUS_CRT.into(), previous);
            }
            next_since = None;
            changes.push(Change::Created { replaced });
            ca
        }
    };
    let created = !changes.is_empty();

    // A rotation's other CAs, when usable.
    if files.contains_key(CA_NEXT_CRT) || files.contains_key(CA_NEXT_KEY) {
        if let Err(why) = ca_pair(&files, CA_NEXT_CRT, CA_NEXT_KEY, now) {
            files.remove(CA_NEXT_CRT);
            files.remove(CA_NEXT_KEY);
            next_since = None;
            changes.push(Change::Dropped { file: CA_NEXT_CRT, why });
        }
    } else {
        next_since = None;
    }
    if let Some(previous) = files.get(CA_PREVIOUS_CRT) {
        if !is_valid_ca(previous, now) {
            files.remove(CA_PREVIOUS_CRT);
            changes.push(Change::Dropped { file: CA_PREVIOUS_CRT, why: "not a valid CA certificate".into() });
        }
    }

    // 1. introduce a new CA at two thirds of the current one's life.
    let ca_renew_at = renew_at(ca.cert_pem().as_bytes());
    let rotating = files.contains_key(CA_NEXT_CRT) || files.contains_key(CA_PREVIOUS_CRT);
    if !rotating && !created && (now >= ca_renew_at || observed.rotate_requested) {
        let next = Ca::mint(&settings.ca_common_name, now, settings.ca_validity)?;
        write_ca(&mut files, CA_NEXT_CRT, CA_NEXT_KEY, &next);
        next_since = Some(now);
        changes.push(Change::CaIntroduced);
    }
    // 2. switch to it once caBundle has trusted it long enough.
    let mut leaf_why = None;
    if let (Some(since), Some(next_pem)) = (next_since, files.get(CA_NEXT_CRT).cloned()) {
        let trusted = bundle_holds(&observed.bundle, &next_pem);
        if trusted && now >= since + settings.switch_after {
            if let Ok(next) = ca_pair(&files, CA_NEXT_CRT, CA_NEXT_KEY, now) {
                let old = files.get(CA_CRT).cloned().unwrap_or_default();
                files.remove(CA_NEXT_CRT);
                files.remove(CA_NEXT_KEY);
                write_ca(&mut files, CA_CRT, CA_KEY, &next);
                files.insert(CA_PREVIOUS_CRT.into(), old);
                next_since = None;
                ca = next;
                changes.push(Change::CaSwitched);
                leaf_why = Some("the CA was switched".to_string());
            }
        }
    }
    // 3. retire the previous CA once no replica serves a leaf it signed.
    let switched = changes.contains(&Change::CaSwitched);
    if files.contains_key(CA_PREVIOUS_CRT) && observed.replicas_serve_current && !switched && !created {
        files.remove(CA_PREVIOUS_CRT);
        changes.push(Change::CaRetired);
    }

    // The leaf.
    let leaf_why = leaf_why
        .or_else(|| leaf_problem(settings, &files, &ca, now))
        .or_else(|| observed.renew_requested.then(|| format!("renewal requested ({RENEW})")));
    if let Some(why) = leaf_why {
        let leaf = ca.issue_serving(&settings.names, now, settings.leaf_validity)?;
        files.insert(TLS_CRT.into(), leaf.cert_pem.into_bytes());
        files.insert(TLS_KEY.into(), leaf.key_pem.into_bytes());
        if !created {
            changes.push(Change::LeafRenewed { why });
        }
    }

    let bundle: String = [CA_PREVIOUS_CRT, CA_CRT, CA_NEXT_CRT]
        .iter()
        .filter_map(|f| files.get(*f))
        .map(|pem| String::from_utf8_lossy(pem).into_owned())
        .collect();
    let gains = certificates(bundle.as_bytes()).iter().any(|c| !certificates(&observed.bundle).contains(c));

    let mut next = renew_at(files.get(TLS_CRT).map_or(&[][..], |v| v));
    if !files.contains_key(CA_NEXT_CRT) && !files.contains_key(CA_PREVIOUS_CRT) {
        next = next.min(renew_at(ca.cert_pem().as_bytes()));
    }
    if let Some(since) = next_since {
        next = next.min((since + settings.switch_after).max(now + Duration::from_secs(1)));
    }
    if files.contains_key(CA_PREVIOUS_CRT) {
        // Waiting for the replicas to serve the new leaf: look often.
        next = next.min(now + Duration::from_secs(30));
    }
    // A request is answered by a write, which also removes its annotation.
    let requested = observed.renew_requested || observed.rotate_requested;
    let files = (requested || files != observed.files).then_some(files);
    Ok(Plan { files, next_since, bundle, bundle_first: gains, changes, next: next.max(now + Duration::from_secs(1)) })
}

// === reading the Secret ===

/// The CA in `crt` and `key` of `files`, if it is one, valid at `now`, that can sign.
pub(crate) fn ca_pair(files: &BTreeMap<String, Vec<u8>>, crt: &str, key: &str, now: SystemTime) -> Result<Ca, String> {
    let (Some(cert), Some(key_pem)) = (files.get(crt), files.get(key)) else {
        return Err(format!("{crt} or {key} is missing"));
    };
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    let info = pem::cert_info(cert, crt.as_ref()).map_err(|e| e.to_string())?;
    info.check_valid_at(crt.as_ref(), now).map_err(|e| e.to_string())?;
    Ca::from_pem(&text(cert), &text(key_pem), crt.as_ref(), key.as_ref()).map_err(|e| e.to_string())
}

fn is_valid_ca(pem: &[u8], now: SystemTime) -> bool {
    pem::cert_info(pem, CA_CRT.as_ref()).is_ok_and(|i: CertInfo| i.is_ca && i.check_valid_at("".as_ref(), now).is_ok())
}

fn write_ca(files: &mut BTreeMap<String, Vec<u8>>, crt: &str, key: &str, ca: &Ca) {
    files.insert(crt.into(), ca.cert_pem().as_bytes().to_vec());
    files.insert(key.into(), ca.key_pem().into_bytes());
}

/// Two thirds into the life of the first certificate of `pem` (at once, for anything
/// unreadable).
fn renew_at(pem: &[u8]) -> SystemTime {
    crate::identity::renew_at(Some(pem)).unwrap_or(SystemTime::UNIX_EPOCH)
}

/// Why the leaf must be issued again, if it must.
fn leaf_problem(settings: &Settings, files: &BTreeMap<String, Vec<u8>>, ca: &Ca, now: SystemTime) -> Option<String> {
    let (Some(cert), Some(key)) = (files.get(TLS_CRT), files.get(TLS_KEY)) else {
        return Some("there is no leaf".into());
    };
    let pair = match pem::load_pair(cert, key, TLS_CRT.as_ref(), TLS_KEY.as_ref()) {
        Ok(pair) => pair,
        Err(e) => return Some(e.to_string()),
    };
    if let Some(missing) = settings.names.iter().find(|n| !pair.info.covers(n)) {
        return Some(format!("it does not name {missing}"));
    }
    if pair.info.chain_len != 1 {
        return Some("it carries a chain; keyward's leaf is signed by its CA directly".into());
    }
    if let Err(e) = served_as(cert, ca.cert_pem().as_bytes(), &settings.names[0], now) {
        return Some(format!("a client that trusts ca.crt refuses it: {e}"));
    }
    if now >= renew_at(cert) {
        return Some("two thirds of its life have passed".into());
    }
    None
}

/// Whether a TLS client that trusts `ca_pem` accepts the leaf of `leaf_pem` as the server `name`
/// at `now`.
pub fn served_as(leaf_pem: &[u8], ca_pem: &[u8], name: &str, now: SystemTime) -> Result<(), String> {
    let leaf = CertificateDer::from_pem_slice(leaf_pem).map_err(|e| e.to_string())?;
    keyward_certs::inspect::accepted_as_server(&[leaf], &certificates(ca_pem), name, now).map_err(|e| e.to_string())
}

fn certificates(pem: &[u8]) -> Vec<CertificateDer<'static>> {
    CertificateDer::pem_slice_iter(pem).filter_map(Result::ok).collect()
}

/// Whether `bundle` holds the (first) certificate of `pem`.
fn bundle_holds(bundle: &[u8], pem: &[u8]) -> bool {
    let held = certificates(bundle);
    certificates(pem).first().is_some_and(|c| held.contains(c))
}

#[cfg(test)]
mod tests;
