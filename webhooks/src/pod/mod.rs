//! The pod, as far as keyward reads it: a narrow view decoded straight from the request's JSON.
//!
//! Nothing here builds the whole pod. `request.object` stays raw; its `metadata` is decoded into
//! [`Metadata`] (labels, the annotations keyward reads, the controller owner), which is all a
//! profile needs to decide whether it selects the pod. Only for a selected pod is `spec` scanned
//! into [`Spec`], and then only for what the planned injections touch: the volumes, mounts and
//! env vars with their names or paths, the API-token volume and mounts, and the service-account
//! fields. Everything else is skipped without being allocated, and strings are borrowed from the
//! request wherever the JSON has no escapes. Time is linear in the size of the JSON, and memory
//! a small multiple of it.

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;

use crate::names::{Labels, KUBE_API_ACCESS_PREFIX, SERVICE_ACCOUNT_MOUNT_PATH};
use crate::tree::{self, Node};

mod from_tree;

// === the view ===

/// What keyward reads of `metadata`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Metadata<'a> {
    pub name: Option<Cow<'a, str>>,
    pub generate_name: Option<Cow<'a, str>>,
    /// Set by the apiserver after mutating admission (`null` in an AdmissionReview); read by
    /// the controller, which checks the admission attestation's time against it.
    pub creation_timestamp: Option<Cow<'a, str>>,
    pub labels: Labels<'a>,
    pub annotations: Annotations<'a>,
    /// The ownerReference with `controller: true`.
    pub controller_owner: Option<Owner<'a>>,
}

/// The annotations: their total size as the apiserver counts it, and the values of the keys
/// keyward reads (its own, and those profiles select on).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Annotations<'a> {
    pub state: Presence,
    /// Keys plus values, in bytes.
    pub total_bytes: usize,
    pub kept: Labels<'a>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner<'a> {
    pub api_version: Cow<'a, str>,
    pub kind: Cow<'a, str>,
    pub name: Cow<'a, str>,
    pub uid: Cow<'a, str>,
}

/// Whether a field is in the JSON: absent, `null`, or there (for an array, with its length).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Presence {
    #[default]
    Absent,
    Null,
    Present(usize),
}

impl Presence {
    /// Whether an `add` under it needs the whole array or map first.
    pub fn is_there(self) -> bool {
        matches!(self, Self::Present(_))
    }
}

/// The most init containers and containers (each list) keyward reads in a pod it injects into.
/// Past it the rest are only counted, so that a pod of tiny containers cannot make keyward hold
/// a view many times its size; the engine refuses such a pod.
pub const MAX_CONTAINERS: usize = 10_000;

/// What to look for in `spec`: the names and paths the planned injections use.
#[derive(Debug, Clone, Default)]
pub struct Wanted<'w> {
    pub volume_names: Vec<&'w str>,
    pub mount_paths: Vec<&'w str>,
    pub env_names: Vec<&'w str>,
    /// Also find the Kubernetes API token's volumes and mounts (to remove them).
    pub api_token: bool,
    /// Hits recorded so far, across the spec (see [`MAX_HITS`]).
    hits: std::cell::Cell<usize>,
}

/// The most volumes, mounts and env vars keyward records as named like an injection's or as the
/// API token's. A real pod has a handful; a pod with more would need a patch past the 10,000
/// operations a JSON patch may have, and is refused, so the rest are not held.
pub const MAX_HITS: usize = 10_001;

impl Wanted<'_> {
    /// Counts one more hit; false once there are more than [`MAX_HITS`] (record no more).
    fn room(&self) -> bool {
        let n = self.hits.get() + 1;
        self.hits.set(n);
        n <= MAX_HITS
    }
}

/// What keyward read of `spec`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Spec<'a> {
    pub volumes: Presence,
    /// The volumes named like an injected one, or (when asked) `kube-api-access-*`.
    pub volume_hits: Vec<VolumeHit<'a>>,
    pub init_containers: Vec<Container<'a>>,
    pub containers: Vec<Container<'a>>,
    /// Init containers and containers in the pod, including any past [`MAX_CONTAINERS`] that
    /// were counted but not read.
    pub container_count: usize,
    /// More than [`MAX_HITS`] volumes, mounts and env vars were hits; only the first were kept.
    pub hits_truncated: bool,
    /// `None`: absent; `Some(None)`: `null`.
    pub service_account_name: Option<Option<Cow<'a, str>>>,
    pub service_account: Option<Option<Cow<'a, str>>>,
    pub automount_service_account_token: Option<Option<bool>>,
}

/// A volume, mount or env var as the pod has it, to compare with an injection's: its JSON, or
/// the tree it was read into.
#[derive(Debug, Clone, Copy)]
pub enum Element<'a> {
    Json(&'a RawValue),
    Tree(&'a Node<'a>),
}

impl Element<'_> {
    /// As serde_json decodes it; `None` when it holds more than [`tree::MAX_COMPARED_VALUES`]
    /// values (unlike any of keyward's, and not decoded) or is not JSON (which a request's
    /// element always is).
    pub fn value(&self) -> Option<serde_json::Value> {
        match self {
            Element::Json(raw) => tree::value_within(raw, tree::MAX_COMPARED_VALUES),
            // A spec's tree holds at most MAX_SPEC_VALUES (= MAX_COMPARED_VALUES) values.
            Element::Tree(node) => Some(node.to_value()),
        }
    }
}

impl PartialEq for Element<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.value() == other.value()
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct VolumeHit<'a> {
    pub index: usize,
    pub name: Cow<'a, str>,
    /// The element as sent: there whenever the hit is to be compared with an injection.
    pub raw: Option<Element<'a>>,
    /// It carries a Kubernetes API token: the ServiceAccount plugin's `kube-api-access-*`, or a
    /// projected `serviceAccountToken` requested for no audience (the API server's). Found only
    /// when [`Wanted::api_token`] asks.
    pub api_token: bool,
}

/// One init container or container.
#[derive(Debug, Clone, PartialEq)]
pub struct Container<'a> {
    pub list: ContainerList,
    pub index: usize,
    pub name: Cow<'a, str>,
    pub mounts: Presence,
    pub env: Presence,
    /// Mounts at an injected path, or (when asked) of the API token.
    pub mount_hits: Vec<MountHit<'a>>,
    /// Env vars named like an injected one.
    pub env_hits: Vec<EnvHit<'a>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContainerList {
    Init,
    Main,
}

impl ContainerList {
    /// The field under `spec`.
    pub fn field(self) -> &'static str {
        match self {
            Self::Init => "initContainers",
            Self::Main => "containers",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct MountHit<'a> {
    pub index: usize,
    pub volume: Cow<'a, str>,
    pub path: Cow<'a, str>,
    pub raw: Option<Element<'a>>,
}

impl MountHit<'_> {
    /// A mount of the Kubernetes API token.
    pub fn is_api_token(&self) -> bool {
        self.path == SERVICE_ACCOUNT_MOUNT_PATH || self.volume.starts_with(KUBE_API_ACCESS_PREFIX)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct EnvHit<'a> {
    pub index: usize,
    pub name: Cow<'a, str>,
    pub raw: Option<Element<'a>>,
}

impl<'a> Spec<'a> {
    /// Init containers first (they run first; native sidecars are init containers), then
    /// containers.
    pub fn all_containers(&self) -> impl DoubleEndedIterator<Item = &Container<'a>> {
        self.init_containers.iter().chain(self.containers.iter())
    }
}

// === decoding ===

/// The pod object, read: `metadata` decoded, `spec` still raw.
#[derive(Debug, Clone, Default)]
pub struct Read<'a> {
    pub metadata: Metadata<'a>,
    pub spec: Option<&'a RawValue>,
}

/// A decoding error without serde_json's `at line L column C`: those count in the apiserver's
/// encoding of the object, which the pod's author never sees; the field path says where.
fn reason(e: serde_json::Error) -> String {
    let text = e.to_string();
    let position = format!(" at line {} column {}", e.line(), e.column());
    match text.strip_suffix(&position) {
        Some(text) => text.to_string(),
        None => text,
    }
}

/// Reads the pod object in one pass: `metadata` decoded (keeping the values of the annotations
/// in `keep`), `spec` kept raw for later.
pub fn read<'a>(object: &'a RawValue, keep: &[String]) -> Result<Read<'a>, String> {
    if !is_object(object) {
        return Err("expected an object".into());
    }
    let mut de = serde_json::Deserializer::from_str(object.get());
    ReadSeed { keep }.deserialize(&mut de).map_err(reason)
}

/// Scans `spec` for what `wanted` names. A first pass reads only the fields that name each
/// volume, mount and env var; only when one is named like an injection's (a reinvocation, or a
/// collision), and so must be compared with it, does a second pass keep those elements raw.
pub fn spec<'a>(raw: Option<&'a RawValue>, wanted: &Wanted<'_>) -> Result<Spec<'a>, String> {
    let Some(raw) = raw else { return Err("spec is missing".into()) };
    narrowed(wanted, |wanted, full| scan(raw, wanted, full))
}

/// As [`spec`], for a spec already read into a tree ([`crate::tree::read_spec`]): the same
/// view, the same errors, without reading the JSON again.
pub(crate) fn spec_of_tree<'a>(tree: &'a Node<'a>, wanted: &Wanted<'_>) -> Result<Spec<'a>, String> {
    narrowed(wanted, |wanted, full| from_tree::scan(tree, wanted, full))
}

/// The two passes of [`spec`], over either reading.
fn narrowed<'a>(
    wanted: &Wanted<'_>,
    scan: impl Fn(&Wanted<'_>, bool) -> Result<Spec<'a>, String>,
) -> Result<Spec<'a>, String> {
    let spec = scan(wanted, false)?;
    // Volumes carrying the API token that are not named kube-api-access-*: their mounts are
    // found by name in the second pass (the containers may come before the volumes).
    let tokens: Vec<String> = spec
        .volume_hits
        .iter()
        .filter(|h| h.api_token && !h.name.starts_with(KUBE_API_ACCESS_PREFIX))
        .map(|h| h.name.to_string())
        .collect();
    let to_compare = !tokens.is_empty()
        || spec.volume_hits.iter().any(|h| wanted.volume_names.contains(&h.name.as_ref()))
        || spec.all_containers().any(|c| {
            !c.env_hits.is_empty()
                || c.mount_hits.iter().any(|h| {
                    wanted.mount_paths.contains(&h.path.as_ref()) || wanted.volume_names.contains(&h.volume.as_ref())
                })
        });
    if !to_compare {
        return Ok(spec);
    }
    // A mount at an injection's path of a volume not named like one: that volume is read too,
    // to tell whether it delivers the same credential (a pod its operator already wires).
    let mut others: Vec<String> = tokens;
    for hit in spec.all_containers().flat_map(|c| &c.mount_hits) {
        let other = wanted.mount_paths.contains(&hit.path.as_ref())
            && !wanted.volume_names.contains(&hit.volume.as_ref())
            && !others.iter().any(|o| *o == hit.volume);
        if other && others.len() < MAX_OTHER_VOLUMES {
            others.push(hit.volume.to_string());
        }
    }
    if others.is_empty() {
        return scan(wanted, true);
    }
    let mut wider = wanted.clone();
    wider.volume_names.extend(others.iter().map(String::as_str));
    scan(&wider, true)
}

fn scan<'a>(raw: &'a RawValue, wanted: &Wanted<'_>, full: bool) -> Result<Spec<'a>, String> {
    wanted.hits.set(0);
    let mut de = serde_json::Deserializer::from_str(raw.get());
    SpecSeed { wanted, full }.deserialize(&mut de).map_err(reason)?.ok_or_else(|| "spec is null".into())
}

/// The most volumes, besides the injections' own, read to compare with an injection's (see
/// [`spec`]). A pod with more mounts of distinct volumes at keyward's paths gets conflicts for
/// the rest rather than a scan that grows with their product.
const MAX_OTHER_VOLUMES: usize = 16;

/// A string, borrowed from the input when it has no escapes.
struct Str;

impl<'de> DeserializeSeed<'de> for Str {
    type Value = Cow<'de, str>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_str(StrVisitor)
    }
}

struct StrVisitor;

impl<'de> Visitor<'de> for StrVisitor {
    type Value = Cow<'de, str>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string")
    }
    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
        Ok(Cow::Borrowed(v))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        Ok(Cow::Owned(v.to_string()))
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
        Ok(Cow::Owned(v))
    }
}

/// A string's length, never copied (an escaped string is decoded into the parser's scratch
/// buffer and measured there).
struct StrLen;

impl<'de> DeserializeSeed<'de> for StrLen {
    type Value = usize;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<usize, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = usize;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<usize, E> {
                Ok(v.len())
            }
        }
        d.deserialize_str(V)
    }
}

/// `null`, or what `inner` reads.
struct Nullable<S>(S);

impl<'de, S: DeserializeSeed<'de>> DeserializeSeed<'de> for Nullable<S> {
    type Value = Option<S::Value>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        struct V<S>(S);
        impl<'de, S: DeserializeSeed<'de>> Visitor<'de> for V<S> {
            type Value = Option<S::Value>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a value or null")
            }
            fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(None)
            }
            fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(None)
            }
            fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
                self.0.deserialize(d).map(Some)
            }
        }
        d.deserialize_option(V(self.0))
    }
}

// --- the pod object ---

/// Reads a pod object where it stands in a larger document (the AdmissionReview), so that the
/// pod is not scanned twice.
#[derive(Debug, Clone, Copy)]
pub struct ReadSeed<'k> {
    pub keep: &'k [String],
}

impl<'de> DeserializeSeed<'de> for ReadSeed<'_> {
    type Value = Read<'de>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for ReadSeed<'_> {
    type Value = Read<'de>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a Pod object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut meta = None;
        let mut spec = None;
        while let Some(key) = map.next_key_seed(Str)? {
            match key.as_ref() {
                "metadata" => meta = map.next_value_seed(MetadataSeed { keep: self.keep })?,
                "spec" => spec = map.next_value::<Option<&'de RawValue>>()?,
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(Read { metadata: meta.unwrap_or_default(), spec })
    }
}

// --- metadata ---

struct MetadataSeed<'k> {
    keep: &'k [String],
}

impl<'de> DeserializeSeed<'de> for MetadataSeed<'_> {
    type Value = Option<Metadata<'de>>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        Nullable(MetadataMap { keep: self.keep }).deserialize(d)
    }
}

struct MetadataMap<'k> {
    keep: &'k [String],
}

impl<'de> DeserializeSeed<'de> for MetadataMap<'_> {
    type Value = Metadata<'de>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for MetadataMap<'_> {
    type Value = Metadata<'de>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("metadata as an object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut meta = Metadata::default();
        while let Some(key) = map.next_key_seed(Str)? {
            match key.as_ref() {
                "name" => meta.name = map.next_value_seed(Nullable(Str))?,
                "generateName" => meta.generate_name = map.next_value_seed(Nullable(Str))?,
                "creationTimestamp" => meta.creation_timestamp = map.next_value_seed(Nullable(Str))?,
                "labels" => meta.labels = map.next_value_seed(Nullable(StringMap))?.unwrap_or_default(),
                "annotations" => {
                    meta.annotations = map
                        .next_value_seed(Nullable(AnnotationsSeed { keep: self.keep }))?
                        .unwrap_or(Annotations { state: Presence::Null, ..Annotations::default() })
                }
                "ownerReferences" => meta.controller_owner = map.next_value_seed(Nullable(OwnersSeed))?.flatten(),
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(meta)
    }
}

/// A map of strings to strings (labels).
struct StringMap;

impl<'de> DeserializeSeed<'de> for StringMap {
    type Value = Labels<'de>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for StringMap {
    type Value = Labels<'de>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a map of strings to strings")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut out = Labels::new();
        while let Some(key) = map.next_key_seed(Str)? {
            let value = map.next_value_seed(Str)?;
            out.insert(key, value);
        }
        Ok(out)
    }
}

struct AnnotationsSeed<'k> {
    keep: &'k [String],
}

impl<'de> DeserializeSeed<'de> for AnnotationsSeed<'_> {
    type Value = Annotations<'de>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for AnnotationsSeed<'_> {
    type Value = Annotations<'de>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("annotations as a map of strings to strings")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut out = Annotations { state: Presence::Present(0), ..Annotations::default() };
        let mut count = 0;
        while let Some(key) = map.next_key_seed(Str)? {
            count += 1;
            if self.keep.iter().any(|k| k == key.as_ref()) {
                let value = map.next_value_seed(Str)?;
                out.total_bytes += key.len() + value.len();
                out.kept.insert(key, value);
            } else {
                out.total_bytes += key.len() + map.next_value_seed(StrLen)?;
            }
        }
        out.state = Presence::Present(count);
        Ok(out)
    }
}

/// The ownerReferences: only the controller is kept.
struct OwnersSeed;

impl<'de> DeserializeSeed<'de> for OwnersSeed {
    type Value = Option<Owner<'de>>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for OwnersSeed {
    type Value = Option<Owner<'de>>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ownerReferences as a list")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Reference<'a> {
            #[serde(borrow)]
            api_version: Cow<'a, str>,
            #[serde(borrow)]
            kind: Cow<'a, str>,
            #[serde(borrow)]
            name: Cow<'a, str>,
            #[serde(borrow)]
            uid: Cow<'a, str>,
            #[serde(default)]
            controller: Option<bool>,
        }
        let mut controller = None;
        let mut index = 0;
        while let Some(raw) = seq.next_element::<&'de RawValue>()? {
            let r: Reference<'de> = element(raw, "metadata.ownerReferences", index)?;
            index += 1;
            if controller.is_none() && r.controller == Some(true) {
                controller = Some(Owner { api_version: r.api_version, kind: r.kind, name: r.name, uid: r.uid });
            }
        }
        Ok(controller)
    }
}

// --- spec ---

struct SpecSeed<'w> {
    wanted: &'w Wanted<'w>,
    full: bool,
}

impl<'de> DeserializeSeed<'de> for SpecSeed<'_> {
    type Value = Option<Spec<'de>>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        Nullable(SpecMap { wanted: self.wanted, full: self.full }).deserialize(d)
    }
}

struct SpecMap<'w> {
    wanted: &'w Wanted<'w>,
    full: bool,
}

impl<'de> DeserializeSeed<'de> for SpecMap<'_> {
    type Value = Spec<'de>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for SpecMap<'_> {
    type Value = Spec<'de>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("spec as an object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut spec = Spec::default();
        let (mut init_count, mut main_count) = (0, 0);
        while let Some(key) = map.next_key_seed(Str)? {
            match key.as_ref() {
                "volumes" => {
                    (spec.volumes, spec.volume_hits) = map
                        .next_value_seed(Nullable(VolumesSeed { wanted: self.wanted, full: self.full }))?
                        .map_or((Presence::Null, Vec::new()), |(n, hits)| (Presence::Present(n), hits));
                }
                "initContainers" => {
                    let seed = ContainersSeed { wanted: self.wanted, list: ContainerList::Init, full: self.full };
                    let (list, count) = map.next_value_seed(Nullable(seed))?.unwrap_or_default();
                    spec.init_containers = list;
                    init_count = count;
                }
                "containers" => {
                    let seed = ContainersSeed { wanted: self.wanted, list: ContainerList::Main, full: self.full };
                    let (list, count) = map.next_value_seed(Nullable(seed))?.unwrap_or_default();
                    spec.containers = list;
                    main_count = count;
                }
                "serviceAccountName" => spec.service_account_name = Some(map.next_value_seed(Nullable(Str))?),
                "serviceAccount" => spec.service_account = Some(map.next_value_seed(Nullable(Str))?),
                "automountServiceAccountToken" => {
                    spec.automount_service_account_token = Some(map.next_value::<Option<bool>>()?)
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        spec.hits_truncated = self.wanted.hits.get() > MAX_HITS;
        spec.container_count = init_count + main_count;
        Ok(spec)
    }
}

/// Whether a raw value is a JSON object (serde's derived structs would also take a list).
fn is_object(raw: &RawValue) -> bool {
    raw.get().trim_start().starts_with('{')
}

/// The fields a volume, mount or env var is known by.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Named<'a> {
    #[serde(borrow)]
    name: Cow<'a, str>,
    #[serde(borrow, default)]
    mount_path: Option<Cow<'a, str>>,
}

/// Reads only `name` and `mountPath` of an element, skipping the rest.
struct NamedSeed<W> {
    what: W,
    index: usize,
}

impl<'de, W: fmt::Display> DeserializeSeed<'de> for NamedSeed<W> {
    type Value = Named<'de>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de, W: fmt::Display> Visitor<'de> for NamedSeed<W> {
    type Value = Named<'de>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}[{}] as an object", self.what, self.index)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let (mut name, mut mount_path) = (None, None);
        while let Some(key) = map.next_key_seed(Str)? {
            match key.as_ref() {
                "name" => name = Some(map.next_value_seed(Str)?),
                "mountPath" => mount_path = Some(map.next_value_seed(Str)?),
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        let name =
            name.ok_or_else(|| de::Error::custom(format_args!("{}[{}]: missing field `name`", self.what, self.index)))?;
        Ok(Named { name, mount_path })
    }
}

/// The next element of a list: only the fields that name it, or (`full`) those and the element
/// itself, raw.
fn next_named<'de, A: SeqAccess<'de>, W: fmt::Display + Copy>(
    seq: &mut A,
    full: bool,
    what: W,
    index: usize,
) -> Result<Option<(Named<'de>, Option<&'de RawValue>)>, A::Error> {
    if full {
        match seq.next_element::<&'de RawValue>()? {
            Some(raw) => Ok(Some((element(raw, what, index)?, Some(raw)))),
            None => Ok(None),
        }
    } else {
        Ok(seq.next_element_seed(NamedSeed { what, index })?.map(|named| (named, None)))
    }
}

/// A list element kept raw, with the fields that name it read from it.
fn element<'de, T: Deserialize<'de>, E: de::Error>(
    raw: &'de RawValue,
    what: impl fmt::Display,
    index: usize,
) -> Result<T, E> {
    if !is_object(raw) {
        return Err(E::custom(format_args!("{what}[{index}]: expected an object")));
    }
    serde_json::from_str(raw.get()).map_err(|e| E::custom(format_args!("{what}[{index}]: {}", reason(e))))
}

struct VolumesSeed<'w> {
    wanted: &'w Wanted<'w>,
    full: bool,
}

impl<'de> DeserializeSeed<'de> for VolumesSeed<'_> {
    type Value = (usize, Vec<VolumeHit<'de>>);
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for VolumesSeed<'_> {
    type Value = (usize, Vec<VolumeHit<'de>>);
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("spec.volumes as a list")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut hits = Vec::new();
        let mut index = 0;
        // Removing the API token needs each volume's sources, not only its name.
        let full = self.full || self.wanted.api_token;
        while let Some((Named { name, .. }, raw)) = next_named(&mut seq, full, "spec.volumes", index)? {
            let api_token = self.wanted.api_token
                && (name.starts_with(KUBE_API_ACCESS_PREFIX) || raw.is_some_and(projects_an_api_token));
            let wanted = self.wanted.volume_names.contains(&name.as_ref()) || api_token;
            if wanted && self.wanted.room() {
                hits.push(VolumeHit { index, name, raw: raw.filter(|_| self.full).map(Element::Json), api_token });
            }
            index += 1;
        }
        Ok((index, hits))
    }
}

/// Whether a volume projects a service account token for no audience (the API server's).
fn projects_an_api_token(raw: &RawValue) -> bool {
    #[derive(Deserialize)]
    struct Volume<'a> {
        #[serde(borrow, default)]
        projected: Option<Projected<'a>>,
    }
    #[derive(Deserialize)]
    struct Projected<'a> {
        #[serde(borrow, default)]
        sources: Option<Vec<Projection<'a>>>,
    }
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Projection<'a> {
        #[serde(borrow, default)]
        service_account_token: Option<Token<'a>>,
    }
    #[derive(Deserialize)]
    struct Token<'a> {
        #[serde(borrow, default)]
        audience: Option<Cow<'a, str>>,
    }
    let Ok(volume) = serde_json::from_str::<Volume<'_>>(raw.get()) else { return false };
    volume
        .projected
        .and_then(|p| p.sources)
        .into_iter()
        .flatten()
        .filter_map(|s| s.service_account_token)
        .any(|t| t.audience.as_deref().is_none_or(str::is_empty))
}

struct ContainersSeed<'w> {
    wanted: &'w Wanted<'w>,
    list: ContainerList,
    full: bool,
}

impl<'de> DeserializeSeed<'de> for ContainersSeed<'_> {
    type Value = (Vec<Container<'de>>, usize);
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for ContainersSeed<'_> {
    type Value = (Vec<Container<'de>>, usize);
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "spec.{} as a list", self.list.field())
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut out = Vec::new();
        while out.len() < MAX_CONTAINERS {
            let seed = ContainerSeed { wanted: self.wanted, list: self.list, index: out.len(), full: self.full };
            match seq.next_element_seed(seed)? {
                Some(c) => out.push(c),
                None => {
                    let count = out.len();
                    return Ok((out, count));
                }
            }
        }
        // Past the limit, only counted.
        let mut count = out.len();
        while seq.next_element::<IgnoredAny>()?.is_some() {
            count += 1;
        }
        Ok((out, count))
    }
}

struct ContainerSeed<'w> {
    wanted: &'w Wanted<'w>,
    list: ContainerList,
    index: usize,
    full: bool,
}

impl<'de> DeserializeSeed<'de> for ContainerSeed<'_> {
    type Value = Container<'de>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for ContainerSeed<'_> {
    type Value = Container<'de>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "spec.{}[{}] as an object", self.list.field(), self.index)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let at = |field: &'static str| At { list: self.list, index: self.index, field };
        let mut name = None;
        let mut c = Container {
            list: self.list,
            index: self.index,
            name: Cow::Borrowed(""),
            mounts: Presence::Absent,
            env: Presence::Absent,
            mount_hits: Vec::new(),
            env_hits: Vec::new(),
        };
        while let Some(key) = map.next_key_seed(Str)? {
            match key.as_ref() {
                "name" => name = Some(map.next_value_seed(Str)?),
                "volumeMounts" => {
                    let seed = MountsSeed { wanted: self.wanted, at: at("volumeMounts"), full: self.full };
                    (c.mounts, c.mount_hits) = map
                        .next_value_seed(Nullable(seed))?
                        .map_or((Presence::Null, Vec::new()), |(n, hits)| (Presence::Present(n), hits));
                }
                "env" => {
                    let seed = EnvSeed { wanted: self.wanted, at: at("env"), full: self.full };
                    (c.env, c.env_hits) = map
                        .next_value_seed(Nullable(seed))?
                        .map_or((Presence::Null, Vec::new()), |(n, hits)| (Presence::Present(n), hits));
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        c.name = name.ok_or_else(|| de::Error::custom(format_args!("{}: required", at("name"))))?;
        Ok(c)
    }
}

/// Where a list sits in a container, for messages (formatted only when one is needed).
#[derive(Debug, Clone, Copy)]
struct At {
    list: ContainerList,
    index: usize,
    field: &'static str,
}

impl fmt::Display for At {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "spec.{}[{}].{}", self.list.field(), self.index, self.field)
    }
}

struct MountsSeed<'w> {
    wanted: &'w Wanted<'w>,
    at: At,
    full: bool,
}

impl<'de> DeserializeSeed<'de> for MountsSeed<'_> {
    type Value = (usize, Vec<MountHit<'de>>);
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for MountsSeed<'_> {
    type Value = (usize, Vec<MountHit<'de>>);
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} as a list", self.at)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut hits = Vec::new();
        let mut index = 0;
        while let Some((Named { name, mount_path }, raw)) = next_named(&mut seq, self.full, self.at, index)? {
            let mount_path = mount_path
                .ok_or_else(|| de::Error::custom(format_args!("{}[{index}]: missing field `mountPath`", self.at)))?;
            let hit = MountHit { index, volume: name, path: mount_path, raw: raw.map(Element::Json) };
            // At an injection's path, of an injected volume (wherever mounted), or the token's.
            let wanted = self.wanted.mount_paths.contains(&hit.path.as_ref())
                || self.wanted.volume_names.contains(&hit.volume.as_ref())
                || (self.wanted.api_token && hit.is_api_token());
            if wanted && self.wanted.room() {
                hits.push(hit);
            }
            index += 1;
        }
        Ok((index, hits))
    }
}

struct EnvSeed<'w> {
    wanted: &'w Wanted<'w>,
    at: At,
    full: bool,
}

impl<'de> DeserializeSeed<'de> for EnvSeed<'_> {
    type Value = (usize, Vec<EnvHit<'de>>);
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for EnvSeed<'_> {
    type Value = (usize, Vec<EnvHit<'de>>);
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} as a list", self.at)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut hits = Vec::new();
        let mut index = 0;
        while let Some((Named { name, .. }, raw)) = next_named(&mut seq, self.full, self.at, index)? {
            if self.wanted.env_names.contains(&name.as_ref()) && self.wanted.room() {
                hits.push(EnvHit { index, name, raw: raw.map(Element::Json) });
            }
            index += 1;
        }
        Ok((index, hits))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(json: &str) -> Box<RawValue> {
        RawValue::from_string(json.to_string()).unwrap()
    }

    #[test]
    fn metadata_keeps_labels_owner_and_only_the_annotations_asked_for() {
        let pod =
            raw(r#"{"apiVersion":"v1","kind":"Pod","metadata":{"generateName":"job-","labels":{"app":"x","a\/b":"y"},
            "annotations":{"keyward.io/injected":"{}","big":"aa\"bb"},
            "ownerReferences":[{"apiVersion":"apps/v1","kind":"ReplicaSet","name":"rs","uid":"u0"},
                               {"apiVersion":"batch/v1","kind":"Job","name":"j","uid":"u1","controller":true}]},
            "spec":{"containers":[]}}"#);
        let meta = read(&pod, &["keyward.io/injected".to_string()]).unwrap().metadata;
        assert_eq!(meta.generate_name.as_deref(), Some("job-"));
        assert_eq!(meta.labels.get("a/b").map(|v| v.as_ref()), Some("y"), "escaped keys are decoded");
        assert_eq!(meta.annotations.kept.len(), 1);
        // keys and decoded values: "keyward.io/injected" + "{}" + "big" + `aa"bb`
        assert_eq!(meta.annotations.total_bytes, 19 + 2 + 3 + 5);
        let owner = meta.controller_owner.unwrap();
        assert_eq!((owner.kind.as_ref(), owner.name.as_ref(), owner.uid.as_ref()), ("Job", "j", "u1"));
        assert!(matches!(owner.name, Cow::Borrowed(_)), "unescaped strings are borrowed");
    }

    #[test]
    fn spec_records_only_what_is_wanted() {
        let pod = raw(
            r#"{"spec":{"volumes":[{"name":"data","emptyDir":{}},{"name":"kube-api-access-x","projected":{}},{"name":"keyward-token","secret":{}}],
            "initContainers":[{"name":"init","volumeMounts":[{"name":"kube-api-access-x","mountPath":"/var/run/secrets/kubernetes.io/serviceaccount"}]}],
            "containers":[{"name":"main","image":"x","env":[{"name":"A","value":"1"},{"name":"TOKEN","value":"2"}],
               "volumeMounts":[{"name":"data","mountPath":"/data"},{"name":"x","mountPath":"/t"}]}],
            "serviceAccountName":"default","automountServiceAccountToken":null}}"#,
        );
        let wanted = Wanted {
            volume_names: vec!["keyward-token"],
            mount_paths: vec!["/t"],
            env_names: vec!["TOKEN"],
            api_token: true,
            ..Wanted::default()
        };
        let spec = spec(read(&pod, &[]).unwrap().spec, &wanted).unwrap();
        assert_eq!(spec.volumes, Presence::Present(3));
        let hits: Vec<(usize, &str)> = spec.volume_hits.iter().map(|h| (h.index, h.name.as_ref())).collect();
        assert_eq!(hits, [(1, "kube-api-access-x"), (2, "keyward-token")]);
        assert!(spec.init_containers[0].mount_hits[0].is_api_token());
        let main = &spec.containers[0];
        assert_eq!((main.mounts, main.env), (Presence::Present(2), Presence::Present(2)));
        assert_eq!(main.mount_hits.len(), 1);
        assert_eq!(main.mount_hits[0].index, 1);
        assert_eq!(main.env_hits[0].index, 1);
        assert_eq!(spec.service_account_name, Some(Some(Cow::Borrowed("default"))));
        assert_eq!(spec.service_account, None);
        assert_eq!(spec.automount_service_account_token, Some(None));
    }

    #[test]
    fn wrong_types_are_errors_that_say_where() {
        let pod = raw(r#"{"spec":{"containers":[{"name":"c","env":"nope"}]}}"#);
        let err = spec(read(&pod, &[]).unwrap().spec, &Wanted::default()).unwrap_err();
        assert!(err.starts_with("invalid type: string \"nope\", expected spec.containers[0].env as a list"), "{err}");
        let pod = raw(r#"{"spec":{"containers":[{"image":"x"}]}}"#);
        let err = spec(read(&pod, &[]).unwrap().spec, &Wanted::default()).unwrap_err();
        assert!(err.starts_with("spec.containers[0].name: required"), "{err}");
        let pod = raw(r#"{"metadata":{"labels":["a"]}}"#);
        let err = read(&pod, &[]).unwrap_err();
        assert!(err.contains("expected a map of strings to strings"), "{err}");
        assert_eq!(read(&raw("[1]"), &[]).unwrap_err(), "expected an object");
    }
}
