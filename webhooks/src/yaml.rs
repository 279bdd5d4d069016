//! YAML (and JSON, its subset) documents read for people: each node's line and column kept,
//! and a document checked against a type with *every* problem reported, each where it is.
//!
//! serde stops at the first error. To report them all, a document is read into a tree, checked,
//! and the node the error names is pruned before checking again, until it passes or the error
//! cannot be pruned past (a missing field). Positions come from the parser's events, by path,
//! in the form serde_path_to_error prints (`spec.containers[0].name`).
//!
//! Booleans are YAML 1.2's (`true`, `false`): `y`, `yes`, `on` stay strings, as Kubernetes reads
//! them.

use std::collections::HashMap;
use std::fmt;

use serde::de::DeserializeOwned;
use serde_json::Value;
use serde_saphyr::granit_parser::{Event, Parser};

/// Where a node is: 1-based line, 1-based column.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Position {
    pub line: usize,
    pub column: usize,
}

impl fmt::Display for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {} column {}", self.line, self.column)
    }
}

/// Where each node of a document is, by path.
#[derive(Debug, Clone, Default)]
pub struct Positions {
    /// A mapping entry's key.
    keys: HashMap<String, Position>,
    /// A node's value.
    values: HashMap<String, Position>,
}

impl Positions {
    /// Where the node at `path` is: its value, else its key.
    pub fn value(&self, path: &str) -> Option<Position> {
        self.values.get(path).or_else(|| self.keys.get(path)).copied()
    }

    /// Where the key of the entry at `path` is, else its value.
    pub fn key(&self, path: &str) -> Option<Position> {
        self.keys.get(path).or_else(|| self.values.get(path)).copied()
    }
}

/// One document: its tree, and where each node is.
#[derive(Debug, Clone)]
pub struct Document {
    /// 1-based, in the stream.
    pub index: usize,
    pub value: Value,
    pub positions: Positions,
}

impl Document {
    /// The node at `keys` (`["request", "object"]`) as a document of its own, its positions
    /// kept: problems found in it have paths relative to it, and positions in the whole text.
    pub fn subtree(&self, keys: &[&str]) -> Option<Document> {
        let mut value = &self.value;
        for key in keys {
            value = value.get(key)?;
        }
        Some(self.under(value, &keys.join(".")))
    }

    /// Item `index` of the list at `key` (`items` of a `List`) as a document of its own, like
    /// [`Self::subtree`].
    pub fn item(&self, key: &str, index: usize) -> Option<Document> {
        let value = self.value.get(key)?.get(index)?;
        Some(self.under(value, &format!("{key}[{index}]")))
    }

    fn under(&self, value: &Value, prefix: &str) -> Document {
        let relative = |map: &HashMap<String, Position>| -> HashMap<String, Position> {
            map.iter()
                .filter_map(|(path, at)| {
                    let rest = match path.strip_prefix(prefix)? {
                        rest if rest.is_empty() || rest.starts_with('[') => rest,
                        rest => rest.strip_prefix('.')?,
                    };
                    Some((rest.to_string(), *at))
                })
                .collect()
        };
        let positions = Positions { keys: relative(&self.positions.keys), values: relative(&self.positions.values) };
        Document { index: self.index, value: value.clone(), positions }
    }
}

/// A document that is not YAML, with where.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct SyntaxError {
    pub message: String,
}

/// One problem found in a document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// The field, as serde_path_to_error prints it (empty: the document itself).
    pub path: String,
    pub position: Option<Position>,
    pub message: String,
}

/// Every document in `text` (empty ones left out), with positions.
pub fn documents(text: &str) -> Result<Vec<Document>, SyntaxError> {
    let options = serde_saphyr::options! {
        strict_booleans: true,
        with_snippet: false,
    };
    let values: Vec<Value> = serde_saphyr::from_str_multiple_with_options(text, options)
        .map_err(|e| SyntaxError { message: one_line(&e.to_string()) })?;
    // The parser leaves empty documents out; the positions say which were which.
    let mut positions = positions(text).into_iter().filter(|(_, p)| !p.values.is_empty());
    Ok(values
        .into_iter()
        .map(|value| {
            let (index, positions) = positions.next().unwrap_or_default();
            Document { index, value, positions }
        })
        .filter(|d| !d.value.is_null())
        .collect())
}

/// `message` on one line (the parser's may span several).
fn one_line(message: &str) -> String {
    let message = message.trim().trim_start_matches("error: ");
    message.lines().next().unwrap_or_default().trim().to_string()
}

/// The most problems reported for one document: past this many, the rest are not looked for.
pub const MAX_PROBLEMS: usize = 50;

/// `document` as a `T`, or every problem in it (at most [`MAX_PROBLEMS`]), each with its field
/// and position.
pub fn check<T: DeserializeOwned>(document: &Document) -> Result<T, Vec<Problem>> {
    match check_all(document) {
        (problems, Some(t)) if problems.is_empty() => Ok(t),
        (problems, _) => Err(problems),
    }
}

/// Like [`check`], and with the problems, the document as a `T` once every field with a
/// problem is pruned (when what is left still is one): its other fields can then be checked
/// too, so that one typo does not hide the rest of a document's problems.
pub fn check_all<T: DeserializeOwned>(document: &Document) -> (Vec<Problem>, Option<T>) {
    let mut value = document.value.clone();
    let mut problems = Vec::new();
    let mut removed = Removed::default();
    // Maps a child was pruned from: a field they now miss is the pruning's doing, not the
    // author's, and is not reported.
    let mut touched: Vec<String> = Vec::new();
    loop {
        match serde_path_to_error::deserialize::<_, T>(&value) {
            Ok(t) => return (problems, Some(t)),
            Err(e) => {
                let segments: Vec<Segment> = e.path().iter().filter_map(segment).collect();
                let path = removed.original(&segments);
                let message = e.inner().to_string();
                let missing = message.starts_with("missing field");
                if !(missing && touched.contains(&path)) {
                    let unknown = message.starts_with("unknown field");
                    let position =
                        if unknown { document.positions.key(&path) } else { document.positions.value(&path) };
                    problems.push(Problem { path, position, message });
                }
                // Prune the node (a map missing a field goes whole) and look again; the
                // document itself cannot go.
                if segments.is_empty() || problems.len() >= MAX_PROBLEMS {
                    return (problems, None);
                }
                touched.push(removed.original(&segments[..segments.len() - 1]));
                if !removed.prune(&mut value, &segments) {
                    return (problems, None);
                }
            }
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Segment {
    Key(String),
    Index(usize),
}

fn segment(s: &serde_path_to_error::Segment) -> Option<Segment> {
    match s {
        serde_path_to_error::Segment::Map { key } => Some(Segment::Key(key.clone())),
        serde_path_to_error::Segment::Seq { index } => Some(Segment::Index(*index)),
        _ => None,
    }
}

/// The list elements pruned so far, by the list's path in the original document, so that later
/// errors' indexes are told in the original's terms.
#[derive(Debug, Default)]
struct Removed {
    by_list: HashMap<String, Vec<usize>>,
}

impl Removed {
    /// The path of `segments` (in the pruned tree) in the original document.
    fn original(&self, segments: &[Segment]) -> String {
        let mut path = String::new();
        for s in segments {
            match s {
                Segment::Key(k) => {
                    if !path.is_empty() {
                        path.push('.');
                    }
                    path.push_str(k);
                }
                Segment::Index(i) => {
                    let i = self.original_index(&path, *i);
                    path.push_str(&format!("[{i}]"));
                }
            }
        }
        path
    }

    fn original_index(&self, list: &str, mut index: usize) -> usize {
        let mut gone = self.by_list.get(list).cloned().unwrap_or_default();
        gone.sort_unstable();
        for g in gone {
            if g <= index {
                index += 1;
            }
        }
        index
    }

    /// Removes the node at `segments` from `value`; false when there is none.
    fn prune(&mut self, value: &mut Value, segments: &[Segment]) -> bool {
        let Some((last, parents)) = segments.split_last() else { return false };
        let mut node = value;
        for s in parents {
            node = match (s, node) {
                (Segment::Key(k), Value::Object(map)) => match map.get_mut(k) {
                    Some(child) => child,
                    None => return false,
                },
                (Segment::Index(i), Value::Array(list)) => match list.get_mut(*i) {
                    Some(child) => child,
                    None => return false,
                },
                _ => return false,
            };
        }
        match (last, node) {
            (Segment::Key(k), Value::Object(map)) => map.remove(k).is_some(),
            (Segment::Index(i), Value::Array(list)) if *i < list.len() => {
                list.remove(*i);
                let list_path = self.original(parents);
                let original = self.original_index(&list_path, *i);
                self.by_list.entry(list_path).or_default().push(original);
                true
            }
            _ => false,
        }
    }
}

/// Where each node is, per document (with its 1-based number in the stream), from the parser's
/// events. Best effort: a stream that does not parse gives what was read before the error (the
/// syntax error is reported on its own).
fn positions(text: &str) -> Vec<(usize, Positions)> {
    enum Frame {
        Map { path: String, key: Option<String> },
        Seq { path: String, index: usize },
    }
    fn child(stack: &[Frame]) -> String {
        match stack.last() {
            None => String::new(),
            Some(Frame::Map { path, key }) => join(path, key.as_deref().unwrap_or_default()),
            Some(Frame::Seq { path, index }) => format!("{path}[{index}]"),
        }
    }
    fn join(path: &str, key: &str) -> String {
        if path.is_empty() {
            key.to_string()
        } else {
            format!("{path}.{key}")
        }
    }
    /// After a value: a map waits for its next key, a list moves to its next element.
    fn done(stack: &mut [Frame]) {
        match stack.last_mut() {
            Some(Frame::Map { key, .. }) => *key = None,
            Some(Frame::Seq { index, .. }) => *index += 1,
            None => {}
        }
    }
    let mut docs = Vec::new();
    let mut current = Positions::default();
    let mut stack: Vec<Frame> = Vec::new();
    let mut index = 0;
    for event in Parser::new_from_str(text) {
        let Ok((event, span)) = event else { break };
        let at = Position { line: span.start.line(), column: span.start.col() + 1 };
        // In a map with no key yet, a scalar is the key.
        let is_key = matches!(stack.last(), Some(Frame::Map { key: None, .. }));
        match event {
            Event::DocumentStart(..) => {
                current = Positions::default();
                stack.clear();
                index += 1;
            }
            Event::DocumentEnd => docs.push((index, std::mem::take(&mut current))),
            Event::Scalar(value, ..) if is_key => {
                if let Some(Frame::Map { path, key }) = stack.last_mut() {
                    current.keys.insert(join(path, &value), at);
                    *key = Some(value.into_owned());
                }
            }
            // An empty document reads as a null scalar at the root (`~`): not a node, and the
            // parser leaves such documents out.
            Event::Scalar(value, ..) if stack.is_empty() && matches!(value.as_ref(), "" | "~" | "null") => {}
            Event::Scalar(..) | Event::Alias(_) => {
                current.values.insert(child(&stack), at);
                done(&mut stack);
            }
            Event::MappingStart(..) => {
                let path = child(&stack);
                current.values.insert(path.clone(), at);
                stack.push(Frame::Map { path, key: None });
            }
            Event::SequenceStart(..) => {
                let path = child(&stack);
                current.values.insert(path.clone(), at);
                stack.push(Frame::Seq { path, index: 0 });
            }
            Event::MappingEnd | Event::SequenceEnd => {
                stack.pop();
                done(&mut stack);
            }
            _ => {}
        }
    }
    docs
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    #[allow(dead_code)]
    struct Doc {
        api_version: String,
        spec: Spec,
    }

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Spec {
        name: String,
        count: u32,
        #[serde(default)]
        items: Vec<Item>,
    }

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Item {
        a: u32,
    }

    #[test]
    fn every_problem_is_reported_where_it_is() {
        let text = "apiVersion: v1\nspec:\n  nme: x\n  name: y\n  count: nope\n  items:\n    - a: 1\n    - a: x\n    - b: 2\n    - a: z\n";
        let docs = documents(text).unwrap();
        let problems = check::<Doc>(&docs[0]).unwrap_err();
        let found: Vec<String> = problems
            .iter()
            .map(|p| format!("{} {}: {}", p.position.map(|p| p.to_string()).unwrap_or_default(), p.path, p.message))
            .collect();
        assert_eq!(
            found,
            [
                "line 5 column 10 spec.count: invalid type: string \"nope\", expected u32",
                "line 8 column 10 spec.items[1].a: invalid type: string \"x\", expected u32",
                "line 9 column 7 spec.items[2].b: unknown field `b`, expected `a`",
                "line 10 column 10 spec.items[3].a: invalid type: string \"z\", expected u32",
                "line 3 column 3 spec.nme: unknown field `nme`, expected one of `name`, `count`, `items`",
            ]
        );
    }

    #[test]
    fn a_subtree_keeps_its_positions_in_the_whole_text() {
        let text = "request:\n  uid: u\n  object:\n    spec:\n      name: 3\n      count: x\n  objectx: {}\n";
        let docs = documents(text).unwrap();
        let object = docs[0].subtree(&["request", "object"]).unwrap();
        assert_eq!(object.value, serde_json::json!({"spec": {"name": 3, "count": "x"}}));
        assert_eq!(object.positions.value("spec.count"), Some(Position { line: 6, column: 14 }));
        assert_eq!(object.positions.key("spec"), Some(Position { line: 4, column: 5 }));
        assert!(object.positions.value("x").is_none());
        assert!(docs[0].subtree(&["request", "missing"]).is_none());
    }

    #[test]
    fn y_yes_and_on_stay_strings_and_documents_are_numbered_in_the_stream() {
        let docs = documents("---\n---\nname: y\nother: on\n---\n").unwrap();
        assert_eq!(docs.len(), 1);
        assert_eq!(docs[0].index, 2);
        assert_eq!(docs[0].value, serde_json::json!({"name": "y", "other": "on"}));
        let err = documents("a: [1, 2\nb: c\n").unwrap_err();
        assert!(err.message.contains("line"), "{err}");
    }
}
