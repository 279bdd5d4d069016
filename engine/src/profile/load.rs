//! Reading profiles: YAML documents (several per file), parsed strictly, every problem kept.

use serde::Deserialize;

use super::schema::ProfileDocument;
use super::validate::validate;
use super::{Profile, ProfileSet};
use crate::error::{Error, ProfileError};

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
            Ok(Self::new(profiles))
        } else {
            Err(Error::Profiles(errors))
        }
    }
}

fn parse_documents(source: &str, text: &str, errors: &mut Vec<ProfileError>) -> Vec<ProfileDocument> {
    let mut docs = Vec::new();
    for (index, de) in serde_yaml::Deserializer::from_str(text).enumerate() {
        let value = match serde_yaml::Value::deserialize(de) {
            Ok(serde_yaml::Value::Null) => continue, // an empty document (`---` at the end)
            Ok(value) => value,
            Err(e) => {
                errors.push(ProfileError {
                    source: source.to_string(),
                    profile: None,
                    field: String::new(),
                    reason: format!("document {}: not valid YAML: {e}", index + 1),
                });
                // After a syntax error the stream cannot be resynchronised.
                break;
            }
        };
        let name = value.get("metadata").and_then(|m| m.get("name")).and_then(|n| n.as_str()).map(str::to_string);
        match serde_path_to_error::deserialize::<_, ProfileDocument>(value) {
            Ok(doc) => docs.push(doc),
            Err(e) => errors.push(ProfileError {
                source: source.to_string(),
                profile: name,
                field: match e.path().to_string().as_str() {
                    "." => String::new(),
                    path => path.to_string(),
                },
                reason: format!("document {}: {}", index + 1, e.inner()),
            }),
        }
    }
    docs
}
