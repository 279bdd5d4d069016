//! The JSON patch keyward returns. Each operation is planned against the pod as the apiserver
//! holds it (see `plan`) and refers to the injection whose volume, mount or env var it adds;
//! it becomes RFC 6902 JSON, with escaped pointers, only when written into the response, so
//! planning allocates nothing per operation.

use std::fmt;

use serde::ser::{SerializeMap, SerializeSeq, Serializer};
use serde::Serialize;

use crate::inject::Injection;
use crate::pod::ContainerList;

/// One operation. keyward only adds, removes and replaces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PatchOp {
    pub op: Op,
    pub path: Path,
    pub value: OpValue,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Op {
    Add,
    Remove,
    Replace,
}

/// Where an operation applies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Path {
    /// `/spec/<field>`
    SpecField(&'static str),
    /// `/spec/volumes`, `/spec/volumes/-` or `/spec/volumes/<i>`
    Volumes(Item),
    /// `/spec/volumes/<volume>/projected/sources/<source>/serviceAccountToken/expirationSeconds`
    TokenLifetime { volume: usize, source: usize },
    /// `/spec/<initContainers|containers>/<index>/<volumeMounts|env>`, then `/-` or `/<i>`
    Container { list: ContainerList, index: usize, field: ContainerField, item: Item },
    /// `/metadata/annotations`, or one key under it
    Annotations(Option<&'static str>),
    /// `/metadata/labels`, or one key under it
    Labels(Option<&'static str>),
    /// A pointer under `/spec` made of fixed field names and indices only (keyward gate's
    /// placement: `/spec/initContainers/-`, `/spec/containers/1/args/0`).
    Spec(String),
}

/// Where in an array.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Item {
    /// The array itself.
    Whole,
    /// Its end (`-`), to append.
    End,
    At(usize),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContainerField {
    VolumeMounts,
    Env,
}

/// What an operation sets: mostly a part of an injection, by its index in the injections.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpValue {
    None,
    Bool(bool),
    Int(i64),
    /// The service account of injection `i`.
    ServiceAccount(usize),
    /// The volume of injection `i`; `array`: as a one-item list.
    Volume {
        injection: usize,
        array: bool,
    },
    Mount {
        injection: usize,
        array: bool,
    },
    Env {
        injection: usize,
        var: usize,
        array: bool,
    },
    Str(String),
    /// `{key: value}`
    Map(&'static str, String),
    /// Any JSON (keyward gate's container and volume).
    Json(serde_json::Value),
}

impl PatchOp {
    pub fn add(path: Path, value: OpValue) -> Self {
        Self { op: Op::Add, path, value }
    }

    pub fn replace(path: Path, value: OpValue) -> Self {
        Self { op: Op::Replace, path, value }
    }

    pub fn remove(path: Path) -> Self {
        Self { op: Op::Remove, path, value: OpValue::None }
    }
}

/// Appends a JSON-pointer token, escaped (`~` as `~0`, `/` as `~1`).
fn token(f: &mut fmt::Formatter<'_>, key: &str) -> fmt::Result {
    f.write_str("/")?;
    if !key.contains(['~', '/']) {
        return f.write_str(key);
    }
    for c in key.chars() {
        match c {
            '~' => f.write_str("~0")?,
            '/' => f.write_str("~1")?,
            c => fmt::Write::write_char(f, c)?,
        }
    }
    Ok(())
}

impl fmt::Display for Item {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Whole => Ok(()),
            Self::End => f.write_str("/-"),
            Self::At(i) => write!(f, "/{i}"),
        }
    }
}

impl fmt::Display for Path {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::SpecField(field) => {
                f.write_str("/spec")?;
                token(f, field)
            }
            Self::Volumes(item) => write!(f, "/spec/volumes{item}"),
            Self::TokenLifetime { volume, source } => {
                write!(f, "/spec/volumes/{volume}/projected/sources/{source}/serviceAccountToken/expirationSeconds")
            }
            Self::Container { list, index, field, item } => {
                let field = match field {
                    ContainerField::VolumeMounts => "volumeMounts",
                    ContainerField::Env => "env",
                };
                write!(f, "/spec/{}/{index}/{field}{item}", list.field())
            }
            Self::Spec(pointer) => write!(f, "/spec{pointer}"),
            Self::Annotations(key) | Self::Labels(key) => {
                f.write_str(if matches!(self, Self::Labels(_)) {
                    "/metadata/labels"
                } else {
                    "/metadata/annotations"
                })?;
                match key {
                    Some(key) => token(f, key),
                    None => Ok(()),
                }
            }
        }
    }
}

/// A patch with the injections its operations refer to: serialises as RFC 6902 JSON.
#[derive(Debug, Clone, Copy)]
pub struct Patch<'a> {
    pub ops: &'a [PatchOp],
    pub injections: &'a [(&'static str, Injection)],
}

impl Patch<'_> {
    /// Writes the patch as RFC 6902 JSON. Paths hold only keyward's own field names, indices
    /// and escaped keys, none of which JSON must escape, so they are written as they are.
    pub fn write_json(&self, out: &mut Vec<u8>) -> Result<(), serde_json::Error> {
        use std::io::Write;
        out.push(b'[');
        for (i, op) in self.ops.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            out.extend_from_slice(match op.op {
                Op::Add => b"{\"op\":\"add\",\"path\":\"",
                Op::Remove => b"{\"op\":\"remove\",\"path\":\"",
                Op::Replace => b"{\"op\":\"replace\",\"path\":\"",
            });
            write!(out, "{}", op.path).map_err(serde_json::Error::io)?;
            out.push(b'"');
            if op.value != OpValue::None {
                out.extend_from_slice(b",\"value\":");
                serde_json::to_writer(&mut *out, &ValueJson { value: &op.value, injections: self.injections })?;
            }
            out.push(b'}');
        }
        out.push(b']');
        Ok(())
    }

    pub fn empty() -> Patch<'static> {
        Patch { ops: &[], injections: &[] }
    }

    pub fn len(&self) -> usize {
        self.ops.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }
}

/// `value`, or a one-item list of it.
struct One<'a, T>(&'a T, bool);

impl<T: Serialize> Serialize for One<'_, T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        if self.1 {
            let mut seq = serializer.serialize_seq(Some(1))?;
            seq.serialize_element(self.0)?;
            seq.end()
        } else {
            self.0.serialize(serializer)
        }
    }
}

impl Serialize for Patch<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut seq = serializer.serialize_seq(Some(self.ops.len()))?;
        for op in self.ops {
            seq.serialize_element(&OpJson { op, injections: self.injections })?;
        }
        seq.end()
    }
}

/// `{key: value}`.
struct OneEntry<'a>(&'a str, &'a str);

impl Serialize for OneEntry<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(1))?;
        map.serialize_entry(self.0, self.1)?;
        map.end()
    }
}

struct OpJson<'a> {
    op: &'a PatchOp,
    injections: &'a [(&'static str, Injection)],
}

impl Serialize for OpJson<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(None)?;
        map.serialize_entry("op", &self.op.op)?;
        map.serialize_entry("path", &format_args!("{}", self.op.path))?;
        if self.op.value != OpValue::None {
            map.serialize_entry("value", &ValueJson { value: &self.op.value, injections: self.injections })?;
        }
        map.end()
    }
}

/// An operation's value, looked up in the injections.
struct ValueJson<'a> {
    value: &'a OpValue,
    injections: &'a [(&'static str, Injection)],
}

impl Serialize for ValueJson<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::Error;
        let missing = || S::Error::custom("a patch operation refers to an injection that is not there");
        let injection = |i: usize| self.injections.get(i).map(|(_, inj)| inj).ok_or_else(missing);
        match self.value {
            OpValue::None => serializer.serialize_unit(),
            OpValue::Bool(b) => serializer.serialize_bool(*b),
            OpValue::Int(n) => serializer.serialize_i64(*n),
            OpValue::ServiceAccount(i) => {
                serializer.serialize_str(injection(*i)?.service_account.as_deref().ok_or_else(missing)?)
            }
            OpValue::Volume { injection: i, array } => {
                let (volume, _) = injection(*i)?.volume.as_ref().ok_or_else(missing)?;
                One(volume, *array).serialize(serializer)
            }
            OpValue::Mount { injection: i, array } => {
                let (_, mount) = injection(*i)?.volume.as_ref().ok_or_else(missing)?;
                One(mount, *array).serialize(serializer)
            }
            OpValue::Env { injection: i, var, array } => {
                One(injection(*i)?.env.get(*var).ok_or_else(missing)?, *array).serialize(serializer)
            }
            OpValue::Str(s) => serializer.serialize_str(s),
            OpValue::Map(key, value) => OneEntry(key, value).serialize(serializer),
            OpValue::Json(value) => value.serialize(serializer),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn paths_are_escaped_pointers() {
        assert_eq!(
            Path::Annotations(Some("keyward.io/injected")).to_string(),
            "/metadata/annotations/keyward.io~1injected"
        );
        assert_eq!(Path::Annotations(Some("a~b")).to_string(), "/metadata/annotations/a~0b");
        assert_eq!(Path::Volumes(Item::End).to_string(), "/spec/volumes/-");
        assert_eq!(Path::Volumes(Item::At(3)).to_string(), "/spec/volumes/3");
        let p = Path::Container { list: ContainerList::Init, index: 0, field: ContainerField::Env, item: Item::Whole };
        assert_eq!(p.to_string(), "/spec/initContainers/0/env");
        assert_eq!(Path::SpecField("serviceAccountName").to_string(), "/spec/serviceAccountName");
        assert_eq!(
            Path::TokenLifetime { volume: 2, source: 0 }.to_string(),
            "/spec/volumes/2/projected/sources/0/serviceAccountToken/expirationSeconds"
        );
    }

    #[test]
    fn operations_serialise_as_rfc_6902() {
        let ops = [
            PatchOp::add(Path::SpecField("automountServiceAccountToken"), OpValue::Bool(false)),
            PatchOp::remove(Path::Volumes(Item::At(0))),
            PatchOp::replace(Path::Annotations(Some("k")), OpValue::Str("x".into())),
            PatchOp::add(Path::Annotations(None), OpValue::Map("k", "v".into())),
            PatchOp::replace(Path::TokenLifetime { volume: 1, source: 0 }, OpValue::Int(21600)),
        ];
        assert_eq!(
            serde_json::to_value(Patch { ops: &ops, injections: &[] }).unwrap(),
            json!([
                {"op": "add", "path": "/spec/automountServiceAccountToken", "value": false},
                {"op": "remove", "path": "/spec/volumes/0"},
                {"op": "replace", "path": "/metadata/annotations/k", "value": "x"},
                {"op": "add", "path": "/metadata/annotations", "value": {"k": "v"}},
                {"op": "replace", "path": "/spec/volumes/1/projected/sources/0/serviceAccountToken/expirationSeconds", "value": 21600}
            ])
        );
        let dangling = [PatchOp::add(Path::Volumes(Item::End), OpValue::Volume { injection: 4, array: false })];
        assert!(serde_json::to_value(Patch { ops: &dangling, injections: &[] }).is_err());
    }
}
