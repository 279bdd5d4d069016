//! What keyward knows of the cluster it serves: the facts `delivery: auto` resolves against.
//!
//! The webhook makes no API call, so it cannot ask the API server what it serves. Instead the
//! controller (which runs discovery) writes these facts into the ConfigMap
//! `keyward-cluster-facts`, key [`FILE_NAME`], which the webhook mounts and reloads with its
//! profiles; `keyward manifests cluster-facts` renders the same ConfigMap offline. The
//! controller and `keyward audit` resolve `auto` from their own discovery, so all agree.

use serde::{Deserialize, Serialize};

/// The ConfigMap key (and so the file name) the facts are written under.
pub const FILE_NAME: &str = "facts.json";
/// The ConfigMap the controller writes them to, in keyward's namespace.
pub const CONFIG_MAP: &str = "keyward-cluster-facts";
/// A facts file is a few dozen bytes; anything past this is not one.
const MAX_BYTES: usize = 16 * 1024;

/// The cluster as keyward's controller found it. Facts this version does not know are ignored,
/// so a newer controller's file does not stop an older webhook during an upgrade.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterFacts {
    /// The `certificates.k8s.io` version at which keyward's controller signs
    /// PodCertificateRequests, or `off` (the API is not served, or signing is turned off).
    #[serde(default)]
    pub pod_certificates: PodCertificates,
}

/// Whether, and at which API version, keyward signs pod certificates.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum PodCertificates {
    /// Not signed here: `delivery: auto` delivers Secrets. What holds when nothing is known.
    #[default]
    Off,
    V1beta1,
    V1,
}

impl PodCertificates {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Off => "off",
            Self::V1beta1 => "v1beta1",
            Self::V1 => "v1",
        }
    }

    pub fn signed(self) -> bool {
        self != Self::Off
    }
}

impl ClusterFacts {
    /// The facts in `text` (the file's content), or why it is not a facts file.
    pub fn parse(text: &str) -> Result<Self, String> {
        if text.len() > MAX_BYTES {
            return Err(format!("{} bytes; a facts file is under {MAX_BYTES}", text.len()));
        }
        serde_json::from_str(text).map_err(|e| {
            format!("not keyward's cluster facts ({e}); expected e.g. {{\"podCertificates\": \"v1beta1\"}}")
        })
    }

    /// The file's content, as the controller writes it.
    pub fn to_text(&self) -> String {
        // A struct of enums: serialising cannot fail.
        serde_json::to_string(self).unwrap_or_default() + "\n"
    }

    /// One line for people: `pod certificates signed at v1beta1`.
    pub fn describe(&self) -> String {
        match self.pod_certificates {
            PodCertificates::Off => "pod certificates not signed (delivery: auto delivers Secrets)".into(),
            v => {
                format!("pod certificates signed at certificates.k8s.io/{} (delivery: auto delivers them)", v.as_str())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_round_trips_and_unknown_facts_are_ignored() {
        for v in [PodCertificates::Off, PodCertificates::V1beta1, PodCertificates::V1] {
            let facts = ClusterFacts { pod_certificates: v };
            assert_eq!(facts.to_text(), format!("{{\"podCertificates\":\"{}\"}}\n", v.as_str()));
            assert_eq!(ClusterFacts::parse(&facts.to_text()), Ok(facts));
        }
        let newer = ClusterFacts::parse("{\"podCertificates\": \"v1\", \"somethingNew\": 1}").unwrap();
        assert_eq!(newer.pod_certificates, PodCertificates::V1);
        assert_eq!(ClusterFacts::parse("{}"), Ok(ClusterFacts::default()));
        assert!(!ClusterFacts::default().pod_certificates.signed());
    }

    #[test]
    fn a_file_that_is_not_facts_is_refused_saying_what_was_expected() {
        let err = ClusterFacts::parse("{\"podCertificates\": \"v2\"}").unwrap_err();
        assert!(err.starts_with("not keyward's cluster facts (unknown variant `v2`"), "{err}");
        assert!(err.ends_with("expected e.g. {\"podCertificates\": \"v1beta1\"}"), "{err}");
        let err = ClusterFacts::parse(&" ".repeat(MAX_BYTES + 1)).unwrap_err();
        assert_eq!(err, format!("{} bytes; a facts file is under {MAX_BYTES}", MAX_BYTES + 1));
    }
}
