//! Where the profiles come from: the built-in set, a directory, or both.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use clap::Args;
use keyward_engine::ProfileSet;

#[derive(Debug, Args)]
/// The flags that say which profiles to load, shared by every subcommand.
pub struct ProfileArgs {
    /// A directory of profile YAML files (*.yaml, *.yml), or one file. A profile named like a
    /// built-in one replaces it; others are added.
    #[arg(long, env = "KEYWARD_PROFILES", value_name = "DIR|FILE")]
    pub profiles: Option<PathBuf>,
    /// Use only the profiles from --profiles, not the built-in ones.
    #[arg(long, env = "KEYWARD_NO_DEFAULT_PROFILES", requires = "profiles")]
    pub no_default_profiles: bool,
    /// PROFILE=NAMESPACE: only the operator's service account in NAMESPACE may create the
    /// profile's pods (its `system:serviceaccount:*:NAME` requesters get that namespace).
    /// Repeat, or comma-separate, for several profiles.
    #[arg(
        long = "operator-namespace",
        env = "KEYWARD_OPERATOR_NAMESPACES",
        value_delimiter = ',',
        value_name = "PROFILE=NAMESPACE",
        value_parser = parse_pin
    )]
    pub operator_namespaces: Vec<(String, String)>,
}

impl ProfileArgs {
    pub fn source(&self) -> ProfileSource {
        ProfileSource {
            dir: self.profiles.clone(),
            with_builtin: !self.no_default_profiles,
            operator_namespaces: self.operator_namespaces.clone(),
        }
    }
}

fn parse_pin(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((profile, namespace)) if !profile.is_empty() && !namespace.is_empty() => {
            Ok((profile.to_string(), namespace.to_string()))
        }
        _ => Err(format!("{s:?}: expected PROFILE=NAMESPACE, e.g. lmeval=lm-eval")),
    }
}

/// Which profiles to load. Built-ins first; a directory's profile replaces the built-in of the
/// same name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProfileSource {
    pub dir: Option<PathBuf>,
    pub with_builtin: bool,
    /// `(profile, namespace)`: the operator namespace pinned in that profile's requesters.
    pub operator_namespaces: Vec<(String, String)>,
}

impl ProfileSource {
    pub fn load(&self) -> anyhow::Result<ProfileSet> {
        let builtin = if self.with_builtin { ProfileSet::builtin()? } else { ProfileSet::default() };
        let mut set = match &self.dir {
            None => builtin,
            Some(dir) => builtin.overlay(ProfileSet::from_sources(read_sources(dir)?)?)?,
        };
        for (profile, namespace) in &self.operator_namespaces {
            set.pin_operator_namespace(profile, namespace)
                .map_err(|e| anyhow::anyhow!("--operator-namespace {profile}={namespace}: {e}"))?;
        }
        Ok(set)
    }

    pub fn describe(&self) -> String {
        match (&self.dir, self.with_builtin) {
            (None, _) => "built-in".into(),
            (Some(d), true) => format!("built-in + {}", d.display()),
            (Some(d), false) => d.display().to_string(),
        }
    }
}

/// Reads one profile file, or every `*.yaml` / `*.yml` in a directory, sorted by name. Entries
/// starting with `..` are the kubelet's own (`..data`, `..2024_…`) when the directory is a
/// mounted ConfigMap; they are skipped, and the top-level symlinks into them are read.
fn read_sources(dir: &Path) -> anyhow::Result<Vec<(String, String)>> {
    if dir.is_file() {
        let text =
            std::fs::read_to_string(dir).with_context(|| format!("--profiles {}: cannot read", dir.display()))?;
        return Ok(vec![(dir.display().to_string(), text)]);
    }
    let entries =
        std::fs::read_dir(dir).with_context(|| format!("--profiles {}: cannot read the directory", dir.display()))?;
    let mut paths = Vec::new();
    for entry in entries {
        let path = entry.with_context(|| format!("--profiles {}: cannot list the directory", dir.display()))?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        let is_yaml = name.ends_with(".yaml") || name.ends_with(".yml");
        if is_yaml && !name.starts_with("..") && path.is_file() {
            paths.push(path);
        }
    }
    if paths.is_empty() {
        bail!("--profiles {}: no *.yaml or *.yml files in the directory", dir.display());
    }
    paths.sort();
    paths
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).with_context(|| format!("{}: cannot read", p.display()))?;
            Ok((p.display().to_string(), text))
        })
        .collect()
}
