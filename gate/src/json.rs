//! What a JSON request names: a string or whole-number field, by a dotted path of object keys,
//! read from the one body the gate forwards.
//!
//! The gate compares such a field with the caller (an evaluation pod may post events only of
//! its own benchmark), so it must never read a value other than the one the server acts on.
//! Where JSON readers differ, the body is refused: a key named twice in one object (Go's
//! `encoding/json` takes the last, others the first), two keys that differ only in case (Go
//! matches a struct's fields ignoring case, Unicode's simple folding included: `"K"` and the
//! Kelvin sign are one key to it), a number with a fraction or an exponent where a field is
//! compared (Go refuses it for an integer field, a float reader would round it), invalid UTF-8,
//! a lone surrogate, anything after the document. Every object in the body is checked, not
//! only those on a path read: a server may read a field through another struct. Time and
//! memory are linear in the body; nesting is bounded by `serde_json`'s limit of 128.

use std::cell::RefCell;
use std::collections::HashSet;
use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

use crate::Error;

/// The largest JSON body the gate reads: the same bound as a gRPC message's.
pub const MAX_BODY_BYTES: usize = crate::grpc::MAX_MESSAGE_BYTES;
/// The most keys a field path may have.
pub const MAX_PATH_SEGMENTS: usize = 16;

/// A field's path, checked: `status.benchmark_index` is `["status", "benchmark_index"]`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct FieldPath {
    text: String,
    segments: Vec<String>,
}

/// A field's value, as a rule compares it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    /// A string, or a whole number in decimal (`7`, `-1`): JSON's `7` and `"7"` compare alike,
    /// as a label's value (always a string) is compared with either.
    Scalar(String),
    /// Something a rule cannot compare: its JSON type (`an object`, `a number with a
    /// fraction or an exponent`), for the refusal.
    Other(&'static str),
}

/// The fields a request's body holds, for the paths asked: `None` where the body has none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fields {
    values: Vec<(FieldPath, Option<Value>)>,
}

// === impl FieldPath ===

impl FieldPath {
    /// Reads `a.b.c`: object keys, each non-empty, joined by dots (a key holding a dot, or an
    /// array element, cannot be named).
    pub fn parse(text: &str) -> Result<Self, String> {
        let segments: Vec<String> = text.split('.').map(str::to_string).collect();
        if segments.iter().any(String::is_empty) {
            return Err(format!("JSON field {text:?} is not a dotted path of object keys (as status.benchmark_index)"));
        }
        if segments.len() > MAX_PATH_SEGMENTS {
            return Err(format!("JSON field {text:?} has more than {MAX_PATH_SEGMENTS} keys"));
        }
        Ok(Self { text: text.to_string(), segments })
    }
}

impl fmt::Display for FieldPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

// === impl Fields ===

impl Fields {
    /// The value at `path` (as written, `a.b`), if it was asked for and the body has it.
    pub fn get(&self, path: &str) -> Option<&Value> {
        self.values.iter().find(|(p, _)| p.text == path).and_then(|(_, v)| v.as_ref())
    }
}

/// Reads `body` as one JSON document whose top level is an object, and the values of `paths`
/// in it. Refused: anything [the module](self) says servers could read another way.
pub fn read(body: &[u8], paths: &[FieldPath]) -> Result<Fields, Error> {
    if body.len() > MAX_BODY_BYTES {
        return Err(Error::Json(format!(
            "the request body is {} bytes, more than the {MAX_BODY_BYTES} the gate reads",
            body.len()
        )));
    }
    let found = RefCell::new(vec![None; paths.len()]);
    let problem = RefCell::new(None);
    let walk =
        Walk { paths, live: (0..paths.len()).collect(), depth: 0, at: String::new(), found: &found, problem: &problem };
    let mut de = serde_json::Deserializer::from_slice(body);
    let top = walk.deserialize(&mut de).and_then(|top| de.end().map(|()| top));
    if let Some(why) = problem.into_inner() {
        return Err(Error::Json(why));
    }
    match top {
        Ok(Kind::Object) => {}
        Ok(kind) => return Err(Error::Json(format!("the request body is {}, not a JSON object", kind.describe()))),
        Err(e) => return Err(Error::Json(format!("the request body is not JSON: {e}"))),
    }
    let values = paths.iter().cloned().zip(found.into_inner()).collect();
    Ok(Fields { values })
}

/// A JSON value's type, as [`Walk`] reports it up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Object,
    Array,
    String,
    Whole,
    Fraction,
    Bool,
    Null,
}

impl Kind {
    fn describe(self) -> &'static str {
        match self {
            Kind::Object => "an object",
            Kind::Array => "an array",
            Kind::String => "a string",
            Kind::Whole => "a number",
            Kind::Fraction => "a number with a fraction or an exponent",
            Kind::Bool => "true or false",
            Kind::Null => "null",
        }
    }
}

/// One value of the document: checks it, and records it where a path asked ends here.
struct Walk<'w> {
    paths: &'w [FieldPath],
    /// The paths whose first `depth` keys led here.
    live: Vec<usize>,
    depth: usize,
    /// Where this value is, for a refusal (`status.x`; empty at the top).
    at: String,
    found: &'w RefCell<Vec<Option<Value>>>,
    /// The first refusal the walk found (a JSON error would lose its words).
    problem: &'w RefCell<Option<String>>,
}

impl Walk<'_> {
    fn record(&self, value: impl Fn() -> Value) {
        let mut found = self.found.borrow_mut();
        for &i in &self.live {
            if self.paths[i].segments.len() == self.depth {
                found[i] = Some(value());
            }
        }
    }

    fn child(&self, live: Vec<usize>, key: &str) -> Walk<'_> {
        let at = if self.depth == 0 { key.to_string() } else { format!("{}.{key}", self.at) };
        Walk { paths: self.paths, live, depth: self.depth + 1, at, found: self.found, problem: self.problem }
    }

    fn refuse<E: de::Error>(&self, why: String) -> E {
        let mut problem = self.problem.borrow_mut();
        if problem.is_none() {
            *problem = Some(why);
        }
        E::custom("refused")
    }
}

impl<'de> DeserializeSeed<'de> for Walk<'_> {
    type Value = Kind;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Kind, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Walk<'_> {
    type Value = Kind;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Kind, E> {
        self.record(|| Value::Scalar(v.to_string()));
        Ok(Kind::String)
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Kind, E> {
        self.record(|| Value::Scalar(v.to_string()));
        Ok(Kind::Whole)
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Kind, E> {
        self.record(|| Value::Scalar(v.to_string()));
        Ok(Kind::Whole)
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Kind, E> {
        self.record(|| Value::Other(Kind::Fraction.describe()));
        Ok(Kind::Fraction)
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Kind, E> {
        self.record(|| Value::Other(Kind::Bool.describe()));
        Ok(Kind::Bool)
    }

    fn visit_unit<E: de::Error>(self) -> Result<Kind, E> {
        self.record(|| Value::Other(Kind::Null.describe()));
        Ok(Kind::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Kind, A::Error> {
        self.record(|| Value::Other(Kind::Array.describe()));
        let mut index = 0usize;
        // Elements are checked (their objects' keys), never addressed.
        while seq.next_element_seed(self.child(Vec::new(), &format!("[{index}]")))?.is_some() {
            index += 1;
        }
        Ok(Kind::Array)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Kind, A::Error> {
        self.record(|| Value::Other(Kind::Object.describe()));
        let mut seen: HashSet<String> = HashSet::new();
        while let Some(key) = map.next_key::<String>()? {
            if !seen.insert(fold(&key)) {
                let at = if self.depth == 0 { key.clone() } else { format!("{}.{key}", self.at) };
                return Err(self.refuse(format!(
                    "the request body names field {} twice (keys equal, or equal but for case, in one object): servers differ in which one they read, so the gate reads neither",
                    keyward_engine::text::quoted(&at, 64)
                )));
            }
            let live: Vec<usize> = self
                .live
                .iter()
                .copied()
                .filter(|&i| self.paths[i].segments.get(self.depth).is_some_and(|s| fold(s) == fold(&key)))
                .collect();
            map.next_value_seed(self.child(live, &key))?;
        }
        Ok(Kind::Object)
    }
}

/// A key as Go's `encoding/json` matches it to a field: Unicode's simple case folding, which
/// takes `ſ` to `s` and the Kelvin sign to `k` (upper, then lower case, gets both).
fn fold(key: &str) -> String {
    key.chars().flat_map(char::to_uppercase).flat_map(char::to_lowercase).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paths(p: &[&str]) -> Vec<FieldPath> {
        p.iter().map(|p| FieldPath::parse(p).unwrap()).collect()
    }

    fn refusal(body: &str) -> String {
        read(body.as_bytes(), &paths(&["benchmark_index"])).unwrap_err().to_string()
    }

    #[test]
    fn strings_and_whole_numbers_are_read_by_their_path() {
        let p = paths(&["benchmark_index", "provider_id", "status.state", "missing", "status", "ratio"]);
        let body = br#"{"benchmark_index": 3, "provider_id": "lm_evaluation_harness", "status": {"state": "running", "n": -1}, "ratio": 0.5, "list": [{"a": 1}]}"#;
        let fields = read(body, &p).unwrap();
        assert_eq!(fields.get(&p[0].text), Some(&Value::Scalar("3".into())));
        assert_eq!(fields.get(&p[1].text), Some(&Value::Scalar("lm_evaluation_harness".into())));
        assert_eq!(fields.get(&p[2].text), Some(&Value::Scalar("running".into())));
        assert_eq!(fields.get(&p[3].text), None);
        assert_eq!(fields.get(&p[4].text), Some(&Value::Other("an object")));
        assert_eq!(fields.get(&p[5].text), Some(&Value::Other("a number with a fraction or an exponent")));
        // Keys match as Go matches them to a struct's fields: case aside.
        let fields = read(br#"{"Benchmark_Index": -2}"#, &p).unwrap();
        assert_eq!(fields.get(&p[0].text), Some(&Value::Scalar("-2".into())));
        // An escaped key is the key it spells.
        let fields = read(br#"{"provider_\u0069d": "x"}"#, &p).unwrap();
        assert_eq!(fields.get(&p[1].text), Some(&Value::Scalar("x".into())));
    }

    #[test]
    fn a_body_two_readers_could_read_apart_is_refused() {
        for (body, says) in [
            (r#"{"benchmark_index": 0, "benchmark_index": 7}"#, "names field \"benchmark_index\" twice"),
            (r#"{"benchmark_index": 0, "BENCHMARK_INDEX": 7}"#, "names field \"BENCHMARK_INDEX\" twice"),
            (r#"{"benchmark_index": 0, "benchmar\u212a_index": 7}"#, "twice"),
            (r#"{"s": {"a": 1, "\u0061": 2}}"#, "names field \"s.a\" twice"),
            (r#"{"list": [{"x": 1, "x": 2}]}"#, "names field \"list.[0].x\" twice"),
            (r#"{"list": [{"x": 1}, {"y": 1}, {"x": 1, "x": 2}]}"#, "names field \"list.[2].x\" twice"),
            (r#"{"benchmark_index": 0} {"benchmark_index": 7}"#, "not JSON: trailing characters"),
            (r#"{"benchmark_index": 0"#, "not JSON: EOF while parsing"),
            (r#"{"benchmark_index": "\ud800"}"#, "not JSON: unexpected end of hex escape"),
            (r#"[{"benchmark_index": 0}]"#, "is an array, not a JSON object"),
            ("7", "is a number, not a JSON object"),
            ("", "not JSON: EOF while parsing"),
            ("\u{feff}{}", "not JSON"),
        ] {
            let e = refusal(body);
            assert!(e.starts_with("JSON request: "), "{body}: {e}");
            assert!(e.contains(says), "{body}: {e} (wanted {says:?})");
        }
        let e = read(b"{\"a\": \"\xff\"}", &[]).unwrap_err().to_string();
        assert!(e.contains("not JSON: invalid unicode"), "{e}");
    }

    #[test]
    fn nesting_and_size_are_bounded() {
        let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
        assert!(refusal(&deep).contains("recursion limit exceeded"), "{}", refusal(&deep));
        let fits = format!("{{\"a\": \"{}\"}}", "x".repeat(MAX_BODY_BYTES - 9));
        assert_eq!(fits.len(), MAX_BODY_BYTES);
        assert!(read(fits.as_bytes(), &[]).is_ok());
        let over = format!("{{\"a\": \"{}\"}}", "x".repeat(MAX_BODY_BYTES - 8));
        assert!(refusal(&over).contains(&format!("more than the {MAX_BODY_BYTES} the gate reads")));
    }

    #[test]
    fn a_field_path_is_dotted_keys() {
        assert_eq!(FieldPath::parse("a.b").unwrap().segments, ["a", "b"]);
        for bad in ["", ".a", "a.", "a..b"] {
            assert!(FieldPath::parse(bad).unwrap_err().contains("not a dotted path"), "{bad:?}");
        }
        let long = vec!["k"; MAX_PATH_SEGMENTS + 1].join(".");
        assert!(FieldPath::parse(&long).unwrap_err().contains("more than 16 keys"));
        assert!(FieldPath::parse(&vec!["k"; MAX_PATH_SEGMENTS].join(".")).is_ok());
    }
}
