//! The controller's units of work: what a watch or the resync queues, and what [`crate::run`]
//! dispatches to the controller of its kind.

use crate::index::OwnerKey;
use crate::queue::QueueKey;

/// One unit of work; equal keys queued twice are done once.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Key {
    /// The per-namespace objects of an opted-in namespace.
    Namespace(String),
    /// A namespace opted out: remove what keyward provisioned there.
    OptOut(String),
    /// A namespace opted in: find the pods already there.
    ListPods(String),
    /// An owner's per-owner objects.
    Owner(OwnerKey),
    AllNamespaces,
    /// Removing what no profile wants any more, and what a missed opt-out left.
    Sweep,
    /// Publishing the client CA to `--publish-client-ca-to`.
    PublishClientCa,
    /// Writing the cluster facts for the webhook.
    ClusterFacts,
    /// Publishing server CAs as ClusterTrustBundles.
    ServerCaBundles,
    /// Reading the server CA sources again.
    Sources,
    /// The attestation key Secret: created, rotated, read.
    AttestationKey,
    /// The self-managed serving certificate Secret and the webhook's `caBundle`.
    ServingCert,
    /// The webhook configuration's `matchConditions`.
    MatchConditions,
    /// A PodCertificateRequest for one of keyward's signers, at the version it was seen at.
    CertificateRequest {
        version: crate::signer::ApiVersion,
        namespace: String,
        name: String,
    },
}

impl Key {
    /// What the periodic resync, and a replica that becomes leader, queue.
    pub const EVERYTHING: [Key; 9] = [
        Key::ServingCert,
        Key::MatchConditions,
        Key::AttestationKey,
        Key::Sources,
        Key::AllNamespaces,
        Key::Sweep,
        Key::PublishClientCa,
        Key::ClusterFacts,
        Key::ServerCaBundles,
    ];
}

impl QueueKey for Key {
    fn namespace(&self) -> &str {
        match self {
            Key::Namespace(ns) | Key::OptOut(ns) | Key::ListPods(ns) => ns,
            Key::Owner(o) => &o.namespace,
            Key::CertificateRequest { namespace, .. } => namespace,
            _ => "",
        }
    }
}

pub(crate) fn key_label(key: &Key) -> &'static str {
    match key {
        Key::Namespace(_) | Key::AllNamespaces => "namespace",
        Key::OptOut(_) | Key::Sweep => "sweep",
        Key::ListPods(_) | Key::Owner(_) => "owner",
        Key::PublishClientCa => "client-ca",
        Key::ClusterFacts => "cluster-facts",
        Key::ServerCaBundles => "server-ca-bundle",
        Key::Sources => "sources",
        Key::AttestationKey => "attestation-key",
        Key::ServingCert => "serving-cert",
        Key::MatchConditions => "match-conditions",
        Key::CertificateRequest { .. } => "pod-certificate",
    }
}
