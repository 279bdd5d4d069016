//! A pod's `spec` read once into a tree of the fields keyward reads: what the engine scans for
//! its injections ([`crate::pod::spec_of_tree`]) and what the admission attestation binds
//! ([`crate::binding`]). A pod whose spec is bound is read from the JSON once, not once for
//! the scan and again for the binding.
//!
//! Strings borrow from the JSON where they have no escapes; objects keep their entries in order,
//! duplicates included (a reader takes them in order, as a streaming decoder meets them). Depth
//! is bounded by serde_json's recursion limit; size by a budget of values, past which a scan
//! reads the spec from its JSON instead and a binding is refused (see [`MAX_SPEC_VALUES`]).

use std::borrow::Cow;
use std::cell::Cell;
use std::fmt;

use serde::de::{self, Deserialize, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Unexpected, Visitor};
use serde_json::value::RawValue;
use serde_json::Value;

/// The host namespace fields of the pod, bound as they are. The view's keys are written in
/// sorted (byte) order, so these lists are in that order.
pub(crate) const HOST_FIELDS: [&str; 4] = ["hostIPC", "hostNetwork", "hostPID", "hostUsers"];
/// The container fields bound as they are.
pub(crate) const CONTAINER_FIELDS: [&str; 9] =
    ["args", "command", "envFrom", "image", "name", "restartPolicy", "securityContext", "volumeDevices", "workingDir"];
/// The handlers whose `exec` command is bound: the view's key, and where the handler is.
pub(crate) const EXEC_HANDLERS: [(&str, &str, Option<&str>); 5] = [
    ("lifecycle.postStart.exec", "lifecycle", Some("postStart")),
    ("lifecycle.preStop.exec", "lifecycle", Some("preStop")),
    ("livenessProbe.exec", "livenessProbe", None),
    ("readinessProbe.exec", "readinessProbe", None),
    ("startupProbe.exec", "startupProbe", None),
];

/// The most values (objects, arrays, strings, numbers...) a spec's tree holds: about 1 MB of
/// tree. A real pod's kept fields are some hundred values at most (the KubeRay worker's, about
/// 100). A spec the attestation would bind with more is refused (the webhook) or not bound (the
/// controller): unbudgeted, one hostile 6.6 MB pod of empty `args` built 83 MB of tree; a spec
/// that is only scanned is scanned from its JSON instead, in memory a small multiple of its size
/// (at 100,000, four hostile 7 MB pods at once took 23 MiB more than without trees).
pub const MAX_SPEC_VALUES: usize = 20_000;

/// The most values a pod's element is decoded with to compare it with keyward's own (a volume,
/// mount or env var of the same name, or a volume mounted where keyward mounts): keyward's hold
/// a few dozen, so a larger one is unlike any of them and is not decoded. Decoded whole, one
/// 6 MB volume of 3 million `items` took 260 MB. The same as a spec tree's budget, so that an
/// element of a tree (which holds no more) never needs counting, and both readings agree.
pub const MAX_COMPARED_VALUES: usize = MAX_SPEC_VALUES;

/// `raw` as serde_json decodes it, if it holds at most `max` values (counted while reading, no
/// further than that).
pub fn value_within(raw: &RawValue, max: usize) -> Option<Value> {
    // Each value takes at least a byte of text: a short element needs no count.
    if raw.get().len() <= max {
        return serde_json::from_str(raw.get()).ok();
    }
    let budget = Budget { left: Cell::new(max), spent: Cell::new(false) };
    let mut de = serde_json::Deserializer::from_str(raw.get());
    let node = Seed { level: Level::All, budget: &budget }.deserialize(&mut de).ok()?;
    Some(node.to_value())
}

/// Why a spec over [`MAX_SPEC_VALUES`] cannot be bound (the binding's error; the webhook's
/// refusal says it with the profile and the fix).
pub fn too_large_message() -> String {
    format!("spec: more than {MAX_SPEC_VALUES} values in the fields the admission attestation binds (containers, volumes, the pod's identity and host fields)")
}

/// A JSON value whose strings borrow from the text where they have no escapes, and whose
/// objects keep their entries in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Node<'a> {
    Null,
    Bool(bool),
    Number(serde_json::Number),
    Str(Cow<'a, str>),
    Array(Vec<Node<'a>>),
    Object(Vec<(Cow<'a, str>, Node<'a>)>),
}

// === impl Node ===

impl<'a> Node<'a> {
    /// The value of `key` in an object (the last, if it is there more than once).
    pub fn get(&self, key: &str) -> Option<&Node<'a>> {
        match self {
            Node::Object(entries) => entries.iter().rev().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Node::Str(s) => Some(s),
            _ => None,
        }
    }

    /// `null` and `[]` read as absent: Kubernetes treats them so, and the apiserver writes
    /// neither (`omitempty`), while a masked list can end up empty.
    pub fn absent(&self) -> bool {
        match self {
            Node::Null => true,
            Node::Array(items) => items.is_empty(),
            _ => false,
        }
    }

    pub fn len_hint(&self) -> usize {
        match self {
            Node::Object(entries) => entries.len() * 4,
            _ => 1,
        }
    }

    /// As serde_json would decode the same text (of duplicate keys, the last).
    pub fn to_value(&self) -> Value {
        match self {
            Node::Null => Value::Null,
            Node::Bool(b) => Value::Bool(*b),
            Node::Number(n) => Value::Number(n.clone()),
            Node::Str(s) => Value::String(s.to_string()),
            Node::Array(items) => Value::Array(items.iter().map(Node::to_value).collect()),
            Node::Object(entries) => {
                Value::Object(entries.iter().map(|(k, v)| (k.to_string(), v.to_value())).collect())
            }
        }
    }

    /// What a decoder expecting something else would say it found, in serde_json's words.
    pub fn unexpected(&self) -> Unexpected<'_> {
        match self {
            Node::Null => Unexpected::Unit,
            Node::Bool(b) => Unexpected::Bool(*b),
            Node::Number(n) => match (n.as_u64(), n.as_i64(), n.as_f64()) {
                (Some(u), _, _) => Unexpected::Unsigned(u),
                (None, Some(i), _) => Unexpected::Signed(i),
                (None, None, f) => Unexpected::Float(f.unwrap_or_default()),
            },
            Node::Str(s) => Unexpected::Str(s),
            Node::Array(_) => Unexpected::Seq,
            Node::Object(_) => Unexpected::Map,
        }
    }
}

/// Why a spec was not read into a tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadError {
    /// More than the budget of values: a scan reads it from its JSON instead; a binding is
    /// refused.
    TooLarge,
    /// Not JSON (serde_json's message).
    Json(String),
}

/// Reads a pod's `spec` into the tree of the fields keyward reads, within `max_values`.
pub fn read_spec(raw: &RawValue, max_values: usize) -> Result<Node<'_>, ReadError> {
    let budget = Budget { left: Cell::new(max_values), spent: Cell::new(false) };
    let mut de = serde_json::Deserializer::from_str(raw.get());
    let read =
        Seed { level: Level::Spec, budget: &budget }.deserialize(&mut de).and_then(|node| de.end().map(|()| node));
    read.map_err(|e| if budget.spent.get() { ReadError::TooLarge } else { ReadError::Json(e.to_string()) })
}

impl<'de: 'a, 'a> Deserialize<'de> for Node<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let budget = Budget { left: Cell::new(usize::MAX), spent: Cell::new(false) };
        Seed { level: Level::All, budget: &budget }.deserialize(d)
    }
}

/// The values a tree may still hold, and whether it ran out.
struct Budget {
    left: Cell<usize>,
    spent: Cell<bool>,
}

// === reading ===

/// How much of an object to keep while reading it: the spec and its containers keep only the
/// fields keyward reads (the rest is skipped without being built); anything below, all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Level {
    Spec,
    /// The elements of `containers` or `initContainers`.
    Containers,
    Container,
    All,
}

impl Level {
    /// Whether `key` of an object at this level is kept, and the level of its value.
    fn keep(self, key: &str) -> Option<Level> {
        match self {
            Level::Spec => match key {
                "containers" | "initContainers" => Some(Level::Containers),
                "volumes"
                | "serviceAccountName"
                | "serviceAccount"
                | "automountServiceAccountToken"
                | "securityContext"
                | "shareProcessNamespace" => Some(Level::All),
                _ if HOST_FIELDS.contains(&key) => Some(Level::All),
                _ => None,
            },
            Level::Container => match key {
                "env" | "volumeMounts" => Some(Level::All),
                _ if CONTAINER_FIELDS.contains(&key) => Some(Level::All),
                _ if EXEC_HANDLERS.iter().any(|(_, at, _)| *at == key) => Some(Level::All),
                _ => None,
            },
            Level::Containers | Level::All => Some(Level::All),
        }
    }

    /// The level of an array's elements.
    fn items(self) -> Level {
        match self {
            Level::Containers => Level::Container,
            _ => Level::All,
        }
    }
}

/// Reads one value at `level`, spending one unit of `budget` per value.
#[derive(Clone, Copy)]
struct Seed<'b> {
    level: Level,
    budget: &'b Budget,
}

impl Seed<'_> {
    fn spend<E: de::Error>(self) -> Result<(), E> {
        match self.budget.left.get().checked_sub(1) {
            Some(left) => {
                self.budget.left.set(left);
                Ok(())
            }
            None => {
                self.budget.spent.set(true);
                Err(E::custom("the spec has too many values to read as a tree"))
            }
        }
    }

    fn at(self, level: Level) -> Self {
        Self { level, ..self }
    }
}

impl<'de> DeserializeSeed<'de> for Seed<'_> {
    type Value = Node<'de>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Seed<'_> {
    type Value = Node<'de>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("JSON")
    }
    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        self.spend()?;
        Ok(Node::Null)
    }
    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        self.spend()?;
        Ok(Node::Null)
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Self::Value, E> {
        self.spend()?;
        Ok(Node::Bool(v))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
        self.spend()?;
        Ok(Node::Number(v.into()))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
        self.spend()?;
        Ok(Node::Number(v.into()))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Self::Value, E> {
        self.spend()?;
        // JSON has no NaN or infinity: a finite number always converts.
        Ok(serde_json::Number::from_f64(v).map_or(Node::Null, Node::Number))
    }
    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
        self.spend()?;
        Ok(Node::Str(Cow::Borrowed(v)))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        self.spend()?;
        Ok(Node::Str(Cow::Owned(v.to_string())))
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
        self.spend()?;
        Ok(Node::Str(Cow::Owned(v)))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        self.spend()?;
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(64));
        while let Some(item) = seq.next_element_seed(self.at(self.level.items()))? {
            items.push(item);
        }
        Ok(Node::Array(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        self.spend()?;
        // A container list's elements are containers; an object there is read as one.
        let level = if self.level == Level::Containers { Level::Container } else { self.level };
        let mut entries = Vec::new();
        while let Some(Key(key)) = map.next_key()? {
            match level.keep(&key) {
                Some(inner) => entries.push((key, map.next_value_seed(self.at(inner))?)),
                None => {
                    map.next_value::<de::IgnoredAny>()?;
                }
            }
        }
        Ok(Node::Object(entries))
    }
}

/// An object key, borrowed where it has no escapes.
struct Key<'a>(Cow<'a, str>);

impl<'de: 'a, 'a> Deserialize<'de> for Key<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object key")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(Key(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Key(Cow::Owned(v.to_string())))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
                Ok(Key(Cow::Owned(v)))
            }
        }
        d.deserialize_str(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(json: &str) -> Box<RawValue> {
        RawValue::from_string(json.to_string()).unwrap()
    }

    #[test]
    fn a_spec_keeps_what_keyward_reads_and_borrows_its_strings() {
        let spec = raw(
            r#"{"nodeName":"n1","serviceAccount":"a","containers":[{"name":"c","ports":[1],"env":[{"name":"A\u0042"}]}]}"#,
        );
        let tree = read_spec(&spec, MAX_SPEC_VALUES).unwrap();
        assert_eq!(tree.get("nodeName"), None, "not read");
        assert!(matches!(tree.get("serviceAccount"), Some(Node::Str(Cow::Borrowed("a")))));
        let Some(Node::Array(containers)) = tree.get("containers") else { panic!("containers") };
        assert_eq!(containers[0].get("ports"), None, "a container keeps only what is read");
        assert_eq!(containers[0].to_value(), serde_json::json!({"name": "c", "env": [{"name": "AB"}]}));
    }

    #[test]
    fn an_element_is_decoded_for_comparison_only_within_its_budget() {
        let element =
            |items: usize| raw(&serde_json::json!({"name": "v", "secret": {"items": vec![0; items]}}).to_string());
        // The object, its name, the secret, its items list: 4 values besides the items.
        let small = element(3);
        assert_eq!(value_within(&small, 4096), serde_json::from_str(small.get()).ok(), "short text: no count");
        assert_eq!(value_within(&small, 7), serde_json::from_str(small.get()).ok(), "counted: 7 values");
        assert_eq!(value_within(&small, 6), None);
        let long = element(4096 - 4);
        assert_eq!(value_within(&long, 4096), serde_json::from_str(long.get()).ok());
        assert_eq!(value_within(&element(4096 - 3), 4096), None, "one value over");
        assert_eq!(value_within(&raw("[[[]]]"), 2), None);
        assert!(value_within(&element(MAX_COMPARED_VALUES - 4), MAX_COMPARED_VALUES).is_some());
        assert_eq!(value_within(&element(MAX_COMPARED_VALUES - 3), MAX_COMPARED_VALUES), None);
    }

    #[test]
    fn past_the_budget_the_spec_is_too_large_and_bad_json_says_why() {
        let spec = raw(r#"{"volumes":[{"name":"a"},{"name":"b"}]}"#);
        // The spec, the list, two objects and two strings: six values.
        assert!(read_spec(&spec, 6).is_ok());
        assert_eq!(read_spec(&spec, 5), Err(ReadError::TooLarge));
        let dup = raw(r#"{"volumes":[],"volumes":[1]}"#);
        let Node::Object(entries) = read_spec(&dup, 10).unwrap() else { panic!("object") };
        assert_eq!(entries.len(), 2, "duplicates are kept, in order");
    }

    /// While parsing, the spec and its containers keep only what the binding's view and the
    /// spec scan read: their other fields (resources, ports, tolerations, affinity) are skipped,
    /// never built. The view writes only bound fields by name, so keeping more would not change
    /// a binding, only its cost (mutations: each guard of `keep` forced true, `==` for `!=`, the
    /// containers' elements kept whole).
    #[test]
    fn parsing_keeps_only_the_fields_the_view_reads() {
        for key in ["containers", "initContainers"] {
            assert_eq!(Level::Spec.keep(key), Some(Level::Containers), "{key}");
        }
        for key in [
            "volumes",
            "serviceAccountName",
            "serviceAccount",
            "automountServiceAccountToken",
            "hostNetwork",
            "hostUsers",
        ] {
            assert_eq!(Level::Spec.keep(key), Some(Level::All), "{key}");
        }
        for key in ["nodeName", "tolerations", "affinity", "dnsPolicy", "imagePullSecrets", "priority"] {
            assert_eq!(Level::Spec.keep(key), None, "spec.{key}");
        }
        assert_eq!(Level::Containers.items(), Level::Container);
        for key in ["image", "command", "env", "volumeMounts", "livenessProbe", "lifecycle", "securityContext"] {
            assert_eq!(Level::Container.keep(key), Some(Level::All), "{key}");
        }
        for key in ["resources", "ports", "imagePullPolicy", "terminationMessagePath", "stdin"] {
            assert_eq!(Level::Container.keep(key), None, "container.{key}");
        }
        assert_eq!(Level::All.keep("anything"), Some(Level::All));
        assert_eq!(Level::All.items(), Level::All);
    }
}
