//! A gate file: one YAML document, `apiVersion: keyward.io/v1alpha1`, `kind: Gate`, checked as
//! profiles are (`keyward check`): every problem at once, each with its line and field.

use serde::Deserialize;

use keyward_engine::yaml;

use crate::rules::{Gate, GateSpec};

pub const API_VERSION: &str = "keyward.io/v1alpha1";
pub const KIND: &str = "Gate";

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct GateFile {
    api_version: String,
    kind: String,
    metadata: Metadata,
    spec: GateSpec,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Metadata {
    name: String,
}

/// A named, checked gate.
#[derive(Debug, Clone)]
pub struct Loaded {
    pub name: String,
    pub gate: Gate,
}

/// Reads a gate file; the errors are every problem found, one line each, `source` first.
pub fn load(source: &str, text: &str) -> Result<Loaded, Vec<String>> {
    let documents = yaml::documents(text).map_err(|e| vec![format!("{source}: not YAML: {}", e.message)])?;
    let [document] = documents.as_slice() else {
        return Err(vec![format!("{source}: holds {} documents; a gate file holds one (kind: Gate)", documents.len())]);
    };
    let (problems, file) = yaml::check_all::<GateFile>(document);
    let mut out: Vec<String> = problems
        .iter()
        .map(|p| {
            let at = p.position.map_or(String::new(), |pos| format!(" ({pos})"));
            let field = if p.path.is_empty() { String::new() } else { format!("{}: ", p.path) };
            format!("{source}{at}: {field}{}", p.message)
        })
        .collect();
    let Some(file) = file else { return Err(out) };
    if file.api_version != API_VERSION || file.kind != KIND {
        out.push(format!(
            "{source}: apiVersion {:?} kind {:?}; a gate file is apiVersion {API_VERSION} kind {KIND}",
            file.api_version, file.kind
        ));
    }
    let gate = Gate::new(file.spec).map_err(|problems| problems.into_iter().map(|p| format!("{source}: {p}")));
    match gate {
        Ok(gate) if out.is_empty() => Ok(Loaded { name: file.metadata.name, gate }),
        Ok(_) => Err(out),
        Err(more) => {
            out.extend(more);
            Err(out)
        }
    }
}
