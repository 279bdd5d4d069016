//! The JSON patch keyward returns: RFC 6902 operations with escaped JSON pointers, planned
//! against the pod as the apiserver holds it (see [`crate::plan`]).

use serde::Serialize;
use serde_json::Value;

/// One operation. keyward only adds, removes and replaces.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PatchOp {
    pub op: Op,
    pub path: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub value: Option<Value>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Op {
    Add,
    Remove,
    Replace,
}

impl PatchOp {
    pub fn add(path: String, value: Value) -> Self {
        Self { op: Op::Add, path, value: Some(value) }
    }

    pub fn replace(path: String, value: Value) -> Self {
        Self { op: Op::Replace, path, value: Some(value) }
    }

    pub fn remove(path: String) -> Self {
        Self { op: Op::Remove, path, value: None }
    }
}

/// A JSON pointer built one token at a time; keys are escaped (`~` as `~0`, `/` as `~1`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pointer(String);

impl Pointer {
    pub fn root() -> Self {
        Self(String::new())
    }

    pub fn key(mut self, key: &str) -> Self {
        self.0.push('/');
        for c in key.chars() {
            match c {
                '~' => self.0.push_str("~0"),
                '/' => self.0.push_str("~1"),
                c => self.0.push(c),
            }
        }
        self
    }

    pub fn index(mut self, index: usize) -> Self {
        self.0.push('/');
        self.0.push_str(&index.to_string());
        self
    }

    /// The end of an array, for appending.
    pub fn end(mut self) -> Self {
        self.0.push_str("/-");
        self
    }

    pub fn into_string(self) -> String {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn keys_are_escaped() {
        let p = Pointer::root().key("metadata").key("annotations").key("keyward.io/injected");
        assert_eq!(p.into_string(), "/metadata/annotations/keyward.io~1injected");
        assert_eq!(Pointer::root().key("a~b").index(3).into_string(), "/a~0b/3");
        assert_eq!(Pointer::root().key("spec").key("volumes").end().into_string(), "/spec/volumes/-");
    }

    #[test]
    fn operations_serialise_as_rfc_6902() {
        let ops = [
            PatchOp::add("/a".into(), json!(1)),
            PatchOp::remove("/b/0".into()),
            PatchOp::replace("/c".into(), json!("x")),
        ];
        assert_eq!(
            serde_json::to_value(ops).unwrap(),
            json!([{"op": "add", "path": "/a", "value": 1}, {"op": "remove", "path": "/b/0"}, {"op": "replace", "path": "/c", "value": "x"}])
        );
    }
}
