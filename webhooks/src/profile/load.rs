//! Reading profiles: YAML documents (several per file), parsed strictly, every problem kept.

use super::schema::ProfileDocument;
use super::validate::validate;
use super::{Profile, ProfileSet};
use crate::error::{Error, ProfileError};
use crate::yaml;

/// The built-in profiles, shipped inside the binary.
const BUILTIN_SOURCES: &[(&str, &str)] = &[
    ("builtin:lmeval.yaml", include_str!("../../profiles/lmeval.yaml")),
    ("builtin:kfp.yaml", include_str!("../../profiles/kfp.yaml")),
];

impl ProfileSet {
    /// The profiles that ship with keyward.
    pub fn builtin() -> Result<Self, Error> {
        Self::from_sources(BUILTIN_SOURCES.iter().map(|(s, t)| (s.to_string(), t.to_string())))
    }

    /// Parses and validates `(source name, YAML text)` pairs. Every problem in every source is
    /// reported, not just the first.
    pub fn from_sources(sources: impl IntoIterator<Item = (String, String)>) -> Result<Self, Error> {
        let mut errors = Vec::new();
        let mut profiles: Vec<Profile> = Vec::new();
        for (source, text) in sources {
            for doc in parse_documents(&source, &text, &mut errors) {
                if let Some(profile) = validate(&source, doc, &mut errors) {
                    if let Some(first) = profiles.iter().find(|p| p.name == profile.name) {
                        errors.push(ProfileError {
                            source: source.clone(),
                            profile: Some(profile.name.clone()),
                            field: "metadata.name".into(),
                            reason: format!(
                                "a profile with this name is already defined in {}; profile names must be unique",
                                first.source
                            ),
                        });
                    } else {
                        profiles.push(profile);
                    }
                }
            }
        }
        if errors.is_empty() {
            Self::checked(profiles)
        } else {
            Err(Error::Profiles(errors))
        }
    }
}

/// Every document of a source, each checked whole: every problem in it is reported, with its
/// field and where it is (`document 2, line 14 column 7`), not only the first.
fn parse_documents(source: &str, text: &str, errors: &mut Vec<ProfileError>) -> Vec<ProfileDocument> {
    let documents = match yaml::documents(text) {
        Ok(documents) => documents,
        Err(e) => {
            errors.push(ProfileError {
                source: source.to_string(),
                profile: None,
                field: String::new(),
                reason: format!("not valid YAML: {}", e.message),
            });
            // After a syntax error the stream cannot be resynchronised.
            return Vec::new();
        }
    };
    let mut docs = Vec::new();
    for document in documents {
        let name = document.value.pointer("/metadata/name").and_then(serde_json::Value::as_str).map(str::to_string);
        match yaml::check_all::<ProfileDocument>(&document) {
            (problems, Some(doc)) if problems.is_empty() => docs.push(doc),
            (mut problems, rest) => {
                let pruned: Vec<String> = problems.iter().map(|p| p.path.clone()).collect();
                // In the order they are in the file; those without a place last.
                problems.sort_by_key(|p| p.position.map_or((usize::MAX, 0), |p| (p.line, p.column)));
                for problem in problems {
                    let at = problem.position.map(|p| format!(", {p}")).unwrap_or_default();
                    errors.push(ProfileError {
                        source: source.to_string(),
                        profile: name.clone(),
                        field: problem.path,
                        reason: format!("document {}{at}: {}", document.index, problem.message),
                    });
                }
                // The rest of the document, without the fields that have problems, is checked
                // too; the profile it makes is never used (the set is refused).
                if let Some(rest) = rest {
                    let mut more = Vec::new();
                    validate(source, rest, &mut more);
                    // Not what the pruning itself may have caused: about a field pruned, one
                    // inside it, a parent of one, or a sibling (`selektor` pruned leaves
                    // `selector` empty). Problems deeper in a sibling are reported.
                    let parent = |path: &str| path.rsplit_once('.').map_or(String::new(), |(p, _)| p.to_string());
                    let caused = |field: &str| {
                        pruned.iter().any(|p| {
                            p == field
                                || p.starts_with(&format!("{field}."))
                                || field.starts_with(&format!("{p}."))
                                || parent(p) == parent(field)
                        })
                    };
                    errors.extend(more.into_iter().filter(|e| !caused(&e.field)));
                }
            }
        }
    }
    docs
}
