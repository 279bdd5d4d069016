//! A JSON patch built against the pod as the apiserver will apply it.
//!
//! Every operation is applied to a working copy the moment it is recorded, with the same
//! strict RFC 6902 rules the apiserver uses (`add` under a missing parent fails). Paths are
//! therefore always computed against the document as it stands after the earlier operations,
//! so removals by index stay correct, and a patch that would not apply cannot be returned.

use json_patch::jsonptr::{PointerBuf, Token};
use json_patch::{AddOperation, PatchOperation, RemoveOperation, ReplaceOperation};
use serde_json::Value;

use crate::error::Error;

/// A path segment: an object key or an array index.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Seg<'a> {
    Key(&'a str),
    Index(usize),
}

impl<'a> From<&'a str> for Seg<'a> {
    fn from(s: &'a str) -> Self {
        Seg::Key(s)
    }
}

impl From<usize> for Seg<'_> {
    fn from(i: usize) -> Self {
        Seg::Index(i)
    }
}

/// Builds a JSON pointer; keys are escaped (`~` as `~0`, `/` as `~1`), so it cannot fail.
pub(crate) fn pointer(segs: &[Seg<'_>]) -> PointerBuf {
    PointerBuf::from_tokens(segs.iter().map(|seg| match seg {
        Seg::Key(k) => Token::new(*k),
        Seg::Index(i) => Token::from(*i),
    }))
}

fn lookup<'v>(doc: &'v Value, segs: &[Seg<'_>]) -> Option<&'v Value> {
    segs.iter().try_fold(doc, |v, seg| match seg {
        Seg::Key(k) => v.get(*k),
        Seg::Index(i) => v.get(*i),
    })
}

pub(crate) struct PatchBuilder {
    doc: Value,
    ops: Vec<PatchOperation>,
}

impl PatchBuilder {
    pub fn new(doc: Value) -> Self {
        Self { doc, ops: Vec::new() }
    }

    pub fn get(&self, segs: &[Seg<'_>]) -> Option<&Value> {
        lookup(&self.doc, segs)
    }

    pub fn finish(self) -> (Vec<PatchOperation>, Value) {
        (self.ops, self.doc)
    }

    fn apply(&mut self, op: PatchOperation) -> Result<(), Error> {
        json_patch::patch(&mut self.doc, std::slice::from_ref(&op))
            .map_err(|e| Error::Internal(format!("patch operation {} does not apply: {e}", op_summary(&op))))?;
        self.ops.push(op);
        Ok(())
    }

    /// Appends `item` to the array at `parent/key`, adding the whole array when it is absent
    /// or null (an `add` to `.../-` under a missing array fails on the apiserver).
    pub fn push(&mut self, parent: &[Seg<'_>], key: &str, item: Value) -> Result<(), Error> {
        let mut path = parent.to_vec();
        path.push(Seg::Key(key));
        let op = match self.get(&path) {
            Some(Value::Array(_)) => {
                path.push(Seg::Key("-"));
                PatchOperation::Add(AddOperation { path: pointer(&path), value: item })
            }
            _ => PatchOperation::Add(AddOperation { path: pointer(&path), value: Value::Array(vec![item]) }),
        };
        self.apply(op)
    }

    /// Sets `parent/key` in a map, adding the whole map `{key: value}` when it is absent or null.
    pub fn insert(&mut self, parent: &[Seg<'_>], key: &str, value: Value) -> Result<(), Error> {
        let mut path = parent.to_vec();
        let op = match self.get(&path) {
            Some(Value::Object(map)) => {
                let exists = map.contains_key(key);
                path.push(Seg::Key(key));
                if exists {
                    PatchOperation::Replace(ReplaceOperation { path: pointer(&path), value })
                } else {
                    PatchOperation::Add(AddOperation { path: pointer(&path), value })
                }
            }
            _ => {
                let mut map = serde_json::Map::new();
                map.insert(key.to_string(), value);
                PatchOperation::Add(AddOperation { path: pointer(&path), value: Value::Object(map) })
            }
        };
        self.apply(op)
    }

    pub fn remove(&mut self, path: &[Seg<'_>]) -> Result<(), Error> {
        self.apply(PatchOperation::Remove(RemoveOperation { path: pointer(path) }))
    }
}

fn op_summary(op: &PatchOperation) -> String {
    let name = match op {
        PatchOperation::Add(_) => "add",
        PatchOperation::Remove(_) => "remove",
        PatchOperation::Replace(_) => "replace",
        PatchOperation::Move(_) => "move",
        PatchOperation::Copy(_) => "copy",
        PatchOperation::Test(_) => "test",
    };
    format!("{name} {}", op.path())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn keys_are_escaped() {
        assert_eq!(
            pointer(&["metadata".into(), "annotations".into(), "keyward.io/injected".into()]).as_str(),
            "/metadata/annotations/keyward.io~1injected"
        );
        assert_eq!(pointer(&["a~b".into(), 3.into()]).as_str(), "/a~0b/3");
    }

    #[test]
    fn push_adds_whole_array_when_absent_and_appends_otherwise() {
        let mut b = PatchBuilder::new(json!({"spec": {}}));
        b.push(&["spec".into()], "volumes", json!({"name": "a"})).unwrap();
        b.push(&["spec".into()], "volumes", json!({"name": "b"})).unwrap();
        let (ops, doc) = b.finish();
        assert_eq!(
            serde_json::to_value(&ops).unwrap(),
            json!([
                {"op": "add", "path": "/spec/volumes", "value": [{"name": "a"}]},
                {"op": "add", "path": "/spec/volumes/-", "value": {"name": "b"}}
            ])
        );
        assert_eq!(doc, json!({"spec": {"volumes": [{"name": "a"}, {"name": "b"}]}}));
    }

    #[test]
    fn insert_adds_whole_map_then_keys_then_replaces() {
        let mut b = PatchBuilder::new(json!({"metadata": {"name": "p"}}));
        b.insert(&["metadata".into(), "annotations".into()], "a/b", json!("1")).unwrap();
        b.insert(&["metadata".into(), "annotations".into()], "c", json!("2")).unwrap();
        b.insert(&["metadata".into(), "annotations".into()], "c", json!("3")).unwrap();
        let (ops, doc) = b.finish();
        assert_eq!(
            serde_json::to_value(&ops).unwrap(),
            json!([
                {"op": "add", "path": "/metadata/annotations", "value": {"a/b": "1"}},
                {"op": "add", "path": "/metadata/annotations/c", "value": "2"},
                {"op": "replace", "path": "/metadata/annotations/c", "value": "3"}
            ])
        );
        assert_eq!(doc["metadata"]["annotations"], json!({"a/b": "1", "c": "3"}));
    }

    #[test]
    fn an_op_that_does_not_apply_is_an_internal_error() {
        let mut b = PatchBuilder::new(json!({"spec": {}}));
        let err = b.remove(&["spec".into(), "volumes".into(), 0.into()]).unwrap_err();
        assert_eq!(err.to_string(), "internal error: patch operation remove /spec/volumes/0 does not apply: operation '/0' failed at path '/spec/volumes/0': path is invalid");
    }
}
