//! Injection profiles: which pods, who may create them, what to inject.
//!
//! - [`schema`]: the `InjectionProfile` document as written in YAML.
//! - `load`: reading YAML sources and the built-ins.
//! - `validate`: what serde cannot check, every problem with its file, profile and field.
//!
//! Profiles are validated as a whole before any is used, so a typo never turns into a silently
//! skipped injection.

mod load;
mod overlap;
pub mod schema;
mod validate;

pub use schema::{
    AnnotationSelector, ConflictPolicy, EnvConflictPolicy, LabelSelector, LabelSelectorRequirement, Otherwise,
    OwnerKind, ProfileDocument, ProfileSpec, Requesters, SelectorOperator, API_VERSION, KIND,
};

use crate::cluster::ClusterFacts;
use crate::error::Error;
use crate::names::{is_dns1123_label, service_account_pattern, DNS1123_LABEL_RULE};

/// A profile that passed validation. Only these reach the engine.
#[derive(Debug, Clone, PartialEq)]
pub struct Profile {
    pub name: String,
    /// Where it came from (a file path or `builtin:…`), for messages.
    pub source: String,
    pub spec: ProfileSpec,
    /// Whether keyward issues per-owner objects for its pods (a client certificate or a
    /// generated token, `provider: keyward`): then its pods carry the admission attestation.
    /// Worked out once, at load.
    pub issues_per_owner: bool,
}

impl Profile {
    /// Whether it provides, per owner, an object whose provision `wanted` accepts (its kinds
    /// planned for a stand-in pod that has an owner).
    pub fn provides_per_owner(&self, wanted: impl Fn(&crate::inject::Provision) -> bool) -> bool {
        let labels = crate::names::Labels::new();
        let ctx =
            crate::names::TemplateContext { namespace: "stand-in", owner_name: Some("stand-in"), labels: &labels };
        self.spec.inject.kinds().any(|(_, kind)| {
            kind.plan(&ctx).is_ok_and(|i| {
                i.requires.iter().any(|r| r.provided_by == crate::inject::Provider::Keyward && wanted(&r.provision))
            })
        })
    }
}

/// The profiles in force, validated together (names unique).
#[derive(Debug, Clone, PartialEq)]
pub struct ProfileSet {
    profiles: Vec<Profile>,
    /// [`Self::annotations_read`], worked out once: every request needs it.
    annotation_keys: Vec<String>,
    /// What `delivery: auto` was resolved against ([`Self::resolve`]).
    facts: ClusterFacts,
    /// [`Self::other_resolution`], worked out on first use: the controller asks for it per pod.
    other: OtherResolution,
}

/// The set resolved the other way, cached. Not part of a set's value: two sets are equal
/// whether or not either has worked it out.
#[derive(Clone, Default)]
struct OtherResolution(std::sync::OnceLock<Option<std::sync::Arc<ProfileSet>>>);

impl PartialEq for OtherResolution {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl std::fmt::Debug for OtherResolution {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OtherResolution")
    }
}

impl Default for ProfileSet {
    fn default() -> Self {
        Self::new(Vec::new())
    }
}

impl ProfileSet {
    pub(crate) fn new(profiles: Vec<Profile>) -> Self {
        let mut set = Self {
            profiles,
            annotation_keys: Vec::new(),
            facts: ClusterFacts::default(),
            other: OtherResolution::default(),
        };
        set.annotation_keys = annotation_keys(&set.profiles);
        set
    }

    /// This set, with every profile of `overrides` added; an override replaces the profile of
    /// the same name. This is how `--profiles DIR` extends or replaces the built-ins. Refused,
    /// naming both, when an added profile selects pods that another one also selects.
    pub fn overlay(mut self, overrides: ProfileSet) -> Result<Self, Error> {
        for profile in overrides.profiles {
            match self.profiles.iter_mut().find(|p| p.name == profile.name) {
                Some(slot) => *slot = profile,
                None => self.profiles.push(profile),
            }
        }
        Self::checked(self.profiles)
    }

    /// A set of profiles validated one by one: refused when two select a common pod.
    fn checked(profiles: Vec<Profile>) -> Result<Self, Error> {
        let mut errors = overlap::overlaps(&profiles);
        errors.extend(shared_signers(&profiles));
        if errors.is_empty() {
            Ok(Self::new(profiles))
        } else {
            Err(Error::Profiles(errors))
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = &Profile> {
        self.profiles.iter()
    }

    /// This set with only the profiles `keep` accepts (`--builtin-profiles`).
    pub fn retain(mut self, keep: impl Fn(&Profile) -> bool) -> Self {
        self.profiles.retain(|p| keep(p));
        Self::new(self.profiles)
    }

    pub fn len(&self) -> usize {
        self.profiles.len()
    }

    pub fn is_empty(&self) -> bool {
        self.profiles.is_empty()
    }

    pub fn get(&self, name: &str) -> Option<&Profile> {
        self.profiles.iter().find(|p| p.name == name)
    }

    /// Resolves every `delivery: auto` against `facts` (pod certificates where keyward signs
    /// them, else Secrets). Resolving again re-decides from what the profiles say.
    pub fn resolve(&mut self, facts: ClusterFacts) {
        self.facts = facts;
        self.other = OtherResolution::default();
        for cc in self.profiles.iter_mut().filter_map(|p| p.spec.inject.client_certificate.as_mut()) {
            cc.resolve(facts.pod_certificates.signed());
        }
    }

    /// This set, resolved against `facts`.
    pub fn resolved(mut self, facts: ClusterFacts) -> Self {
        self.resolve(facts);
        self
    }

    /// The set with every `delivery: auto` resolved the other way, when a profile has one: what
    /// a webhook that has not read the latest cluster facts admits pods under. `None` when no
    /// profile leaves its delivery to the cluster. Worked out once per set.
    pub fn other_resolution(&self) -> Option<&ProfileSet> {
        use crate::cluster::PodCertificates;
        let other = self.other.0.get_or_init(|| {
            if !self.has_auto() {
                return None;
            }
            let pod_certificates = match self.facts.pod_certificates {
                PodCertificates::Off => PodCertificates::V1,
                PodCertificates::V1 | PodCertificates::V1beta1 => PodCertificates::Off,
            };
            Some(std::sync::Arc::new(self.clone().resolved(ClusterFacts { pod_certificates })))
        });
        other.as_deref()
    }

    /// The facts `delivery: auto` was resolved against.
    pub fn facts(&self) -> ClusterFacts {
        self.facts
    }

    /// Whether a profile leaves its delivery to the cluster (`delivery: auto`).
    pub fn has_auto(&self) -> bool {
        self.profiles.iter().any(|p| {
            p.spec.inject.client_certificate.as_ref().is_some_and(|cc| cc.delivery == crate::kinds::Delivery::Auto)
        })
    }

    /// The annotations whose values the engine reads: keyward's own, and those the profiles
    /// select on (every annotation is counted for its size).
    pub fn annotations_read(&self) -> &[String] {
        &self.annotation_keys
    }

    /// Pins the operator's namespace in a profile's requesters: every
    /// `system:serviceaccount:NAMESPACE:NAME` pattern whose namespace is a wildcard gets
    /// `namespace` instead, so that only the operator's own account (not a tenant's account of
    /// the same name) may create the profile's pods. Returns the patterns now in force.
    pub fn pin_operator_namespace(&mut self, profile: &str, namespace: &str) -> Result<Vec<String>, String> {
        if !is_dns1123_label(namespace) {
            return Err(format!("{namespace:?} is not a namespace name ({DNS1123_LABEL_RULE})"));
        }
        let known = self.profiles.iter().map(|p| p.name.as_str()).collect::<Vec<_>>().join(", ");
        let Some(p) = self.profiles.iter_mut().find(|p| p.name == profile) else {
            return Err(format!("no profile named {profile:?} (profiles: {known})"));
        };
        let mut pinned = 0;
        for pattern in &mut p.spec.requesters.usernames {
            if let Some((ns, name)) = service_account_pattern(pattern) {
                if ns.contains(['*', '?']) {
                    *pattern = format!("system:serviceaccount:{namespace}:{name}");
                    pinned += 1;
                }
            }
        }
        if pinned == 0 {
            return Err(format!(
                "profile {profile:?} has no requester of the form system:serviceaccount:*:NAME to pin (requesters: {})",
                p.spec.requesters.usernames.join(", ")
            ));
        }
        Ok(p.spec.requesters.usernames.clone())
    }
}

/// A signer name serves one profile: the signer checks a request against its profile, and the
/// profile's trust bundle is named after it, so two profiles on one signer would each be
/// checked against, and published as, the other.
fn shared_signers(profiles: &[Profile]) -> Vec<crate::error::ProfileError> {
    let mut errors = Vec::new();
    let signer = |p: &Profile| {
        let pc = p.spec.inject.client_certificate.as_ref()?.pod_certificate.as_ref()?;
        Some(pc.signer_name.clone())
    };
    for (i, profile) in profiles.iter().enumerate() {
        let Some(name) = signer(profile) else { continue };
        if let Some(first) = profiles[..i].iter().find(|p| signer(p).as_ref() == Some(&name)) {
            errors.push(crate::error::ProfileError {
                source: profile.source.clone(),
                profile: Some(profile.name.clone()),
                field: "spec.inject.clientCertificate.podCertificate.signerName".into(),
                reason: format!(
                    "{name:?} is already profile {:?}'s signer ({}); a signer serves one profile: give this one its own, e.g. keyward.io/{}",
                    first.name, first.source, profile.name
                ),
            });
        }
    }
    errors
}

fn annotation_keys(profiles: &[Profile]) -> Vec<String> {
    let mut keys = vec![
        crate::audit::ANNOTATION_INJECTED.to_string(),
        crate::audit::ANNOTATION_ORIGINAL_SA.to_string(),
        crate::audit::ANNOTATION_ATTESTATION.to_string(),
    ];
    for key in profiles.iter().flat_map(|p| p.spec.annotation_selector.keys()) {
        if !keys.iter().any(|k| k == key) {
            keys.push(key.to_string());
        }
    }
    keys
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(yaml: &str) -> Result<ProfileSet, Vec<String>> {
        ProfileSet::from_sources([("profiles/test.yaml".to_string(), yaml.to_string())]).map_err(|e| match e {
            Error::Profiles(errs) => errs.iter().map(ToString::to_string).collect(),
            other => vec![other.to_string()],
        })
    }

    const VALID: &str = r#"
apiVersion: keyward.io/v1alpha1
kind: InjectionProfile
metadata:
  name: demo
spec:
  selector:
    matchLabels:
      app: demo
  requesters:
    usernames: ["system:serviceaccount:*:demo-operator"]
  inject:
    serviceAccountToken:
      audience: https://control-plane.example
      mountPath: /var/run/secrets/keyward/sa-token
"#;

    #[test]
    fn builtin_profiles_are_valid() {
        let set = ProfileSet::builtin().unwrap();
        let names: Vec<_> = set.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["lmeval", "kfp-persistence-agent", "kfp-scheduled-workflow"]);
    }

    #[test]
    fn defaults_fill_in() {
        let set = load(VALID).unwrap();
        let sat = set.get("demo").unwrap().spec.inject.service_account_token.clone().unwrap();
        assert_eq!(sat.expiration_seconds, 3600);
        assert_eq!(sat.path, "token");
        assert_eq!(sat.volume_name, "keyward-sa-token");
        assert_eq!(set.get("demo").unwrap().spec.requesters.otherwise, Otherwise::Skip);
    }

    #[test]
    fn unknown_field_is_refused_with_file_and_profile() {
        let errs = load(&VALID.replace("audience:", "audiense:")).unwrap_err();
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert!(
            errs[0].starts_with("profiles/test.yaml: profile \"demo\": spec.inject.serviceAccountToken.audiense: document 1, line 14 column 7: unknown field `audiense`, expected one of `audience`"),
            "{}",
            errs[0]
        );
    }

    #[test]
    fn short_expiration_is_refused() {
        let errs = load(
            &VALID.replace("audience: https://control-plane.example", "audience: a\n      expirationSeconds: 599"),
        )
        .unwrap_err();
        assert_eq!(errs.len(), 1);
        assert_eq!(
            errs[0],
            "profiles/test.yaml: profile \"demo\": spec.inject.serviceAccountToken.expirationSeconds: is 599; the apiserver refuses projected tokens under 600 seconds (10 minutes): use 600 or more (3600 is usual)"
        );
    }

    #[test]
    fn bad_names_and_paths_are_each_reported() {
        let yaml = VALID.replace(
            "      mountPath: /var/run/secrets/keyward/sa-token\n",
            "      mountPath: /var/run/secrets/keyward/sa-token\n      volumeName: kube-api-access-x\n      path: ../token\n    token:\n      secretName: api-key\n      volumeName: Bad_Name\n      mountPath: relative/path\n      fileEnv: 1BAD\n    serverCA:\n      secretName: ca\n      mountPath: /var/run/secrets/keyward/sa-token\n",
        );
        let errs = load(&yaml).unwrap_err();
        let joined = errs.join("\n");
        for needle in [
            "spec.inject.serviceAccountToken.volumeName: \"kube-api-access-x\" starts with \"kube-api-access-\"",
            "spec.inject.serviceAccountToken.path: must not contain a '..' segment",
            "spec.inject.token.volumeName: \"Bad_Name\" is not a DNS-1123 label",
            "spec.inject.token.mountPath: \"relative/path\" must be an absolute path",
            "spec.inject.token.fileEnv: \"1BAD\" is not a valid environment variable name",
            "spec.inject.serviceAccountToken.mountPath: mount path \"/var/run/secrets/keyward/sa-token\" is already used by spec.inject.serverCA.mountPath",
        ] {
            assert!(joined.contains(needle), "missing {needle:?} in:\n{joined}");
        }
    }

    #[test]
    fn requester_patterns_must_name_someone() {
        for (pattern, reason) in [
            ("*", "would allow anyone"),
            ("*:*", "would allow anyone"),
            ("system:serviceaccount:*:*", "would allow every service account"),
            ("system:serviceaccount::op", "has an empty ':'-separated segment"),
        ] {
            let joined = load(&VALID.replace("system:serviceaccount:*:demo-operator", pattern)).unwrap_err().join("\n");
            assert!(joined.contains(&format!("spec.requesters.usernames[0]: {pattern:?} {reason}")), "{joined}");
        }
    }

    #[test]
    fn selector_keys_and_values_follow_kubernetes() {
        let yaml = VALID.replace(
            "    matchLabels:\n      app: demo\n",
            "    matchLabels:\n      app: \"-bad\"\n    matchExpressions:\n      - {key: \"Bad Key\", operator: In, values: [ok, \"not ok\"]}\n",
        );
        let joined = load(&yaml).unwrap_err().join("\n");
        for needle in [
            "spec.selector.matchLabels[\"app\"]: \"-bad\" is not a valid label value",
            "spec.selector.matchExpressions[0].key: \"Bad Key\" is not a valid label key",
            "spec.selector.matchExpressions[0].values[1]: \"not ok\" is not a valid label value",
        ] {
            assert!(joined.contains(needle), "missing {needle:?} in:\n{joined}");
        }
    }

    #[test]
    fn the_operator_namespace_can_be_pinned() {
        let mut set = ProfileSet::builtin().unwrap();
        let pinned = set.pin_operator_namespace("lmeval", "lm-eval").unwrap();
        assert_eq!(pinned, ["system:serviceaccount:lm-eval:lm-eval-controller-manager"]);
        let err = set.pin_operator_namespace("no-such", "x").unwrap_err();
        assert!(err.starts_with("no profile named \"no-such\" (profiles: lmeval, "), "{err}");
        let err = set.pin_operator_namespace("kfp-persistence-agent", "kubeflow").unwrap_err();
        assert!(err.contains("has no requester of the form system:serviceaccount:*:NAME"), "{err}");
        let err = set.pin_operator_namespace("lmeval", "Bad_NS").unwrap_err();
        assert!(err.starts_with("\"Bad_NS\" is not a namespace name"), "{err}");
    }

    #[test]
    fn empty_selector_and_open_requesters_are_refused() {
        let yaml = VALID
            .replace("    matchLabels:\n      app: demo\n", "    matchLabels: {}\n")
            .replace("[\"system:serviceaccount:*:demo-operator\"]", "[\"*\"]");
        let joined = load(&yaml).unwrap_err().join("\n");
        assert!(joined.contains("spec.selector: must not be empty"), "{joined}");
        assert!(joined.contains("spec.requesters.usernames[0]: \"*\" would allow anyone"), "{joined}");
    }

    #[test]
    fn duplicate_names_are_refused_and_overlay_replaces() {
        let two = format!("{VALID}\n---\n{VALID}");
        let errs = load(&two).unwrap_err();
        assert!(errs[0].contains("already defined in profiles/test.yaml"), "{errs:?}");

        let base = ProfileSet::builtin().unwrap();
        let user = load(&VALID.replace("name: demo", "name: lmeval")).unwrap();
        let merged = base.clone().overlay(user).unwrap();
        assert_eq!(merged.len(), base.len());
        assert_eq!(merged.get("lmeval").unwrap().source, "profiles/test.yaml");
    }

    #[test]
    fn two_profiles_cannot_share_a_signer_and_auto_resolves_with_the_set() {
        let cert = "    clientCertificate:\n      delivery: auto\n      secretName: \"{owner.name}-c\"\n      podCertificate: {signerName: keyward.io/demo}\n      mountPath: /c\n";
        let one = format!("{VALID}{cert}")
            .replace("  inject:\n", "  controllerOwners: [{apiGroup: batch, kind: Job}]\n  inject:\n");
        let other = one.replace("name: demo\n", "name: other\n").replace("app: demo", "app: other");
        let errs = load(&format!("{one}---\n{other}")).unwrap_err();
        assert_eq!(
            errs,
            ["profiles/test.yaml: profile \"other\": spec.inject.clientCertificate.podCertificate.signerName: \"keyward.io/demo\" is already profile \"demo\"'s signer (profiles/test.yaml); a signer serves one profile: give this one its own, e.g. keyward.io/other"]
        );
        let set = load(&format!("{one}---\n{}", other.replace("keyward.io/demo", "keyward.io/other"))).unwrap();
        assert!(set.has_auto());
        let delivery = |set: &ProfileSet| {
            let cc = set.get("demo").unwrap().spec.inject.client_certificate.clone().unwrap();
            (cc.effective(), cc.signer().map(str::to_string))
        };
        assert_eq!(delivery(&set), (crate::kinds::Delivery::Secret, None));
        let signed = ClusterFacts { pod_certificates: crate::cluster::PodCertificates::V1beta1 };
        let set = set.resolved(signed);
        assert_eq!(set.facts(), signed);
        assert_eq!(delivery(&set), (crate::kinds::Delivery::PodCertificate, Some("keyward.io/demo".into())));
        let other = set.other_resolution().unwrap();
        assert_eq!(delivery(other), (crate::kinds::Delivery::Secret, None));
        assert_eq!(delivery(other.other_resolution().unwrap()).0, crate::kinds::Delivery::PodCertificate);
        let set = set.resolved(ClusterFacts::default());
        assert_eq!(delivery(&set), (crate::kinds::Delivery::Secret, None));
        assert!(!ProfileSet::builtin().unwrap().has_auto());
        assert!(ProfileSet::builtin().unwrap().other_resolution().is_none());
    }

    #[test]
    fn profiles_that_select_a_common_pod_are_refused_naming_both_and_the_pod() {
        let other = VALID
            .replace("name: demo", "name: demo-wide")
            .replace(
                "    matchLabels:\n      app: demo\n",
                "    matchExpressions:\n      - {key: app, operator: In, values: [web, demo]}\n",
            )
            .replace("  requesters:", "  namespaces: [\"team-*\"]\n  requesters:");
        let errs = load(&format!("{VALID}---\n{other}")).unwrap_err();
        assert_eq!(
            errs,
            [
                "profiles/test.yaml: profile \"demo-wide\": spec.selector: selects pods that profile \"demo\" (profiles/test.yaml) selects too, for example a pod in namespace \"team-a\" with labels {app=\"demo\"}; keyward would refuse every such pod rather than guess which credentials it gets. Narrow spec.selector, spec.annotationSelector, spec.controllerOwners or spec.namespaces of one of them so that no pod matches both"
            ]
        );
        // Narrowed apart by one term (a label value, a namespace, an owner): both load.
        let in_ns = |ns: &str| VALID.replace("  requesters:", &format!("  namespaces: [{ns}]\n  requesters:"));
        let owned = |yaml: &str, kind: &str| {
            yaml.replace(
                "  requesters:",
                &format!("  controllerOwners: [{{apiGroup: batch, kind: {kind}}}]\n  requesters:"),
            )
        };
        for (a, b) in [
            (VALID.to_string(), other.replace("[web, demo]", "[web]")),
            (in_ns("prod-a"), other.clone()),
            // Both globs match "team-", which no namespace can be called.
            (in_ns("\"*-\""), other.clone()),
            (owned(VALID, "Job"), owned(&other, "CronJob")),
        ] {
            assert_eq!(load(&format!("{a}---\n{b}")).map(|s| s.len()), Ok(2), "{a}---\n{b}");
        }
        assert!(load(&format!("{}---\n{other}", in_ns("team-b"))).is_err());
        // One that selects only some of another's pods is never used: refused. Two that meet
        // only on pods carrying both their labels are not: such a pod is refused at admission.
        let narrower = VALID
            .replace("name: demo", "name: demo-gpu")
            .replace("      app: demo\n", "      app: demo\n      tier: gpu\n");
        let errs = load(&format!("{VALID}---\n{narrower}")).unwrap_err();
        assert!(
            errs[0].contains("for example a pod in any namespace with labels {app=\"demo\", tier=\"gpu\"}"),
            "{errs:?}"
        );
        let elsewhere = narrower.replace("      app: demo\n", "");
        assert_eq!(load(&format!("{VALID}---\n{elsewhere}")).map(|s| s.len()), Ok(2));

        // A profile added to the built-ins that selects their pods: the fix names the built-in.
        let lmeval = VALID
            .replace("name: demo", "name: my-lmeval")
            .replace("app: demo", "app.kubernetes.io/name: fms-lm-eval-service");
        let err = ProfileSet::builtin().unwrap().overlay(load(&lmeval).unwrap()).unwrap_err().to_string();
        assert_eq!(
            err,
            "profiles/test.yaml: profile \"my-lmeval\": spec.selector: selects pods that profile \"lmeval\" (builtin:lmeval.yaml) selects too, for example a pod in any namespace with labels {app.kubernetes.io/name=\"fms-lm-eval-service\"} owned by a foundation-model-stack.github.com.github.com/LMEvalJob; keyward would refuse every such pod rather than guess which credentials it gets. Narrow spec.selector, spec.annotationSelector, spec.controllerOwners or spec.namespaces of one of them so that no pod matches both (to replace the built-in instead, name yours \"lmeval\")"
        );
    }

    #[test]
    fn annotation_selectors_are_checked_like_label_selectors() {
        let yaml = VALID.replace(
            "    matchLabels:\n      app: demo\n",
            "    matchLabels: {}\n  annotationSelector:\n    matchAnnotations:\n      \"bad key\": \"any value at all\"\n    matchExpressions:\n      - {key: example.com/auth, operator: Exists, values: [x]}\n      - {key: example.com/mode, operator: In}\n",
        );
        let joined = load(&yaml).unwrap_err().join("\n");
        for needle in [
            "spec.annotationSelector.matchAnnotations[\"bad key\"]: \"bad key\" is not a valid annotation key",
            "spec.annotationSelector.matchExpressions[0].values: must be empty with operator Exists",
            "spec.annotationSelector.matchExpressions[1].values: must not be empty with operator In",
        ] {
            assert!(joined.contains(needle), "missing {needle:?} in:\n{joined}");
        }
        // An annotation selector alone is enough to select; an operator must be one Kubernetes knows.
        let alone = VALID.replace(
            "    matchLabels:\n      app: demo\n",
            "    matchLabels: {}\n  annotationSelector:\n    matchAnnotations: {example.com/auth: \"true\"}\n",
        );
        assert!(load(&alone).is_ok());
        let joined = load(&alone.replace(
            "matchAnnotations: {example.com/auth: \"true\"}",
            "matchExpressions: [{key: a, operator: Contains, values: [x]}]",
        ))
        .unwrap_err()
        .join("\n");
        assert!(
            joined.contains("spec.annotationSelector.matchExpressions[0].operator: document 1, line 10 column 43: unknown variant `Contains`, expected one of `In`, `NotIn`, `Exists`, `DoesNotExist`"),
            "{joined}"
        );
    }

    #[test]
    fn a_plain_env_var_may_not_collide_with_another_kinds() {
        let yaml = VALID.replace(
            "      mountPath: /var/run/secrets/keyward/sa-token\n",
            "      mountPath: /var/run/secrets/keyward/sa-token\n      fileEnv: TOKEN_FILE\n    env:\n      - {name: TOKEN_FILE, value: /elsewhere}\n",
        );
        let joined = load(&yaml).unwrap_err().join("\n");
        assert!(
            joined.contains("spec.inject.env.[0].name: env var \"TOKEN_FILE\" is already used by spec.inject.serviceAccountToken.fileEnv"),
            "{joined}"
        );
    }

    /// A misspelt field does not hide the rest of its profile's problems: the document without
    /// it is checked too (and problems the pruning itself may cause are not reported).
    #[test]
    fn a_typo_does_not_hide_the_profiles_other_problems() {
        let faulty = VALID
            .replace("audience:", "audiense:")
            .replace("  inject:\n", "  inject:\n    env:\n      - {name: \"bad name\", value: x}\n");
        let errs = load(&faulty).unwrap_err();
        assert_eq!(errs.len(), 2, "{errs:#?}");
        assert!(
            errs[0].contains(
                "spec.inject.serviceAccountToken.audiense: document 1, line 16 column 7: unknown field `audiense`"
            ),
            "{errs:#?}"
        );
        assert!(errs[1].ends_with("spec.inject.env.[0].name: \"bad name\" is not a valid environment variable name (letters, digits, '_', '-' and '.', not starting with a digit or '..')"), "{errs:#?}");
        // Fixed, the typo alone: the one problem.
        let errs = load(&VALID.replace("audience:", "audiense:")).unwrap_err();
        assert_eq!(errs.len(), 1, "{errs:#?}");
    }

    #[test]
    fn every_fault_in_a_document_is_reported_with_its_line_and_column() {
        // Seven faults: four misspelt fields, two wrong types, one unknown variant.
        let faulty = VALID
            .replace("audience:", "audiense:")
            .replace("  inject:\n", "  onConflict: ignore\n  onEnvConflict: 3\n  inject:\n")
            .replace("selector:", "selektor:")
            .replace(
                "      mountPath: /var/run/secrets/keyward/sa-token\n",
                "      mountPath: /var/run/secrets/keyward/sa-token\n      path: [token]\n      pth: x\n",
            )
            .replace("metadata:\n", "metadata:\n  labls: {}\n");
        let errs = load(&faulty).unwrap_err();
        assert_eq!(errs.len(), 7, "{errs:#?}");
        for (field, at) in [
            ("metadata.labls", "line 5 column 3: unknown field `labls`"),
            ("spec.selektor", "line 8 column 3: unknown field `selektor`"),
            ("spec.onConflict", "line 13 column 15: unknown variant `ignore`"),
            ("spec.onEnvConflict", "line 14 column 18: invalid type: integer `3`"),
            ("spec.inject.serviceAccountToken.audiense", "line 17 column 7: unknown field `audiense`"),
            ("spec.inject.serviceAccountToken.path", "line 19 column 13: invalid type: sequence"),
            ("spec.inject.serviceAccountToken.pth", "line 20 column 7: unknown field `pth`"),
        ] {
            let prefix = format!("profiles/test.yaml: profile \"demo\": {field}: document 1, {at}");
            assert!(errs.iter().any(|e| e.starts_with(&prefix)), "{prefix} not in {errs:#?}");
        }
    }

    #[test]
    fn on_conflict_takes_deny_or_skip() {
        let set = load(&VALID.replace("  inject:\n", "  onConflict: skip\n  inject:\n")).unwrap();
        assert_eq!(set.get("demo").unwrap().spec.on_conflict, ConflictPolicy::Skip);
        assert_eq!(load(VALID).unwrap().get("demo").unwrap().spec.on_conflict, ConflictPolicy::Deny);
        let joined = load(&VALID.replace("  inject:\n", "  onConflict: ignore\n  inject:\n")).unwrap_err().join("\n");
        assert!(
            joined.contains(
                "spec.onConflict: document 1, line 12 column 15: unknown variant `ignore`, expected `deny` or `skip`"
            ),
            "{joined}"
        );
    }

    #[test]
    fn bad_yaml_and_bad_template_name_the_problem() {
        let errs = load("spec: [unclosed").unwrap_err();
        assert_eq!(errs, ["profiles/test.yaml: not valid YAML: unclosed bracket '[' at line 1, column 7"]);
        let errs = load(&VALID.replace(
            "    serviceAccountToken:",
            "    serviceAccount:\n      name: \"{pod.name}-sa\"\n    serviceAccountToken:",
        ))
        .unwrap_err();
        assert!(
            errs[0].contains(
                "spec.inject.serviceAccount.name: document 1, line 14 column 13: unknown placeholder {pod.name}"
            ),
            "{errs:?}"
        );
    }
}
