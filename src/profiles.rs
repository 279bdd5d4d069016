//! Where the profiles come from (the built-in set, a directory, or both), what `delivery: auto`
//! resolves against (the cluster facts), and the set of the moment, reloaded when `--profiles`
//! or `--cluster-facts` changes.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use anyhow::{bail, Context};
use arc_swap::ArcSwap;
use clap::Args;
use keyward_certs::Trigger;
use keyward_engine::{ClusterFacts, ProfileSet};
use tokio::sync::watch;

/// The `--operator-namespace` pins the shipped Deployments run with (deploy/base; tests/deploy.rs
/// keeps them equal): `keyward explain` applies them too unless told otherwise, so that it
/// answers as the install would.
pub const INSTALL_OPERATOR_NAMESPACES: &[(&str, &str)] = &[("lmeval", "lm-eval")];

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
    /// Only these built-in profiles, by system (lmeval, kfp) or by profile name; all of them
    /// unless given. A cluster that runs Kubeflow Pipelines alone: --builtin-profiles kfp.
    #[arg(
        long = "builtin-profiles",
        env = "KEYWARD_BUILTIN_PROFILES",
        value_delimiter = ',',
        value_name = "NAME",
        conflicts_with = "no_default_profiles"
    )]
    pub builtin_profiles: Vec<String>,
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
    /// The cluster facts file (`facts.json` of the ConfigMap keyward-cluster-facts, which
    /// keyward's controller writes from API discovery): whether keyward signs pod
    /// certificates, which decides `delivery: auto`. Reloaded with the profiles; while it is
    /// absent, `auto` delivers Secrets. (The controller and the audit ask discovery instead.)
    #[arg(long, env = "KEYWARD_CLUSTER_FACTS", value_name = "FILE")]
    pub cluster_facts: Option<PathBuf>,
}

impl ProfileArgs {
    pub fn source(&self) -> ProfileSource {
        ProfileSource {
            dir: self.profiles.clone(),
            with_builtin: !self.no_default_profiles,
            builtins: self.builtin_profiles.clone(),
            operator_namespaces: self.operator_namespaces.clone(),
            facts: match &self.cluster_facts {
                Some(file) => FactsSource::File(file.clone()),
                None => FactsSource::Known(ClusterFacts::default()),
            },
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
    /// The built-ins chosen, by system or profile name; empty: all of them.
    pub builtins: Vec<String>,
    /// `(profile, namespace)`: the operator namespace pinned in that profile's requesters.
    pub operator_namespaces: Vec<(String, String)>,
    /// What `delivery: auto` resolves against.
    pub facts: FactsSource,
}

/// Where the cluster facts come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FactsSource {
    /// `--cluster-facts FILE`, read and reloaded with the profiles; no file is no facts.
    File(PathBuf),
    /// Known to this process (the controller's discovery, or nothing known).
    Known(ClusterFacts),
}

/// What is read from disk for one set: the profile files and the facts file's text.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Files {
    profiles: Vec<(String, String)>,
    facts: Option<String>,
}

impl ProfileSource {
    pub fn load(&self) -> anyhow::Result<ProfileSet> {
        self.build(&self.read()?)
    }

    fn read(&self) -> anyhow::Result<Files> {
        let profiles = match &self.dir {
            Some(dir) => read_sources(dir)?,
            None => Vec::new(),
        };
        let facts = match &self.facts {
            FactsSource::File(file) => read_facts(file)?,
            FactsSource::Known(_) => None,
        };
        Ok(Files { profiles, facts })
    }

    /// The set from the files read from `--profiles`, over the built-ins, with the pins,
    /// `delivery: auto` resolved against the facts.
    fn build(&self, files: &Files) -> anyhow::Result<ProfileSet> {
        let builtin = if self.with_builtin { chosen_builtins(&self.builtins)? } else { ProfileSet::default() };
        let mut set = match &self.dir {
            None => builtin,
            Some(_) => builtin.overlay(ProfileSet::from_sources(files.profiles.iter().cloned())?)?,
        };
        for (profile, namespace) in &self.operator_namespaces {
            if set.get(profile).is_none() && self.left_out(profile) {
                // No profile of that name is loaded, so the pin restricts nothing: the shipped
                // Deployments' pins need no edit when --builtin-profiles leaves one out. A
                // profile of one's own with that name is pinned as any other.
                continue;
            }
            set.pin_operator_namespace(profile, namespace)
                .map_err(|e| anyhow::anyhow!("--operator-namespace {profile}={namespace}: {e}"))?;
        }
        let facts = match (&self.facts, &files.facts) {
            (FactsSource::Known(facts), _) => *facts,
            (FactsSource::File(_), None) => ClusterFacts::default(),
            (FactsSource::File(file), Some(text)) => ClusterFacts::parse(text).map_err(|e| {
                anyhow::anyhow!("--cluster-facts {}: {e} (keyward's controller writes this file; or render it with `keyward manifests cluster-facts`)", file.display())
            })?,
        };
        set.resolve(facts);
        Ok(set)
    }

    /// Whether `profile`, not in the set, is a built-in that `--builtin-profiles` left out.
    fn left_out(&self, profile: &str) -> bool {
        !self.builtins.is_empty()
            && self.with_builtin
            && ProfileSet::builtin().is_ok_and(|all| all.get(profile).is_some())
    }

    /// Where the facts come from, for the log.
    pub fn describe_facts(&self) -> String {
        match &self.facts {
            FactsSource::File(file) => file.display().to_string(),
            FactsSource::Known(_) => "no --cluster-facts file".into(),
        }
    }

    pub fn describe(&self) -> String {
        let builtin = match self.builtins.as_slice() {
            [] => "built-in".to_string(),
            chosen => format!("built-in {}", chosen.join(",")),
        };
        match (&self.dir, self.with_builtin) {
            (None, _) => builtin,
            (Some(d), true) => format!("{builtin} + {}", d.display()),
            (Some(d), false) => d.display().to_string(),
        }
    }
}

/// The built-in profiles `chosen` names, each by its system (the file it ships in: `lmeval`,
/// `kfp`) or its own name; all of them when none is named. A name that is neither is refused,
/// with the choices.
fn chosen_builtins(chosen: &[String]) -> anyhow::Result<ProfileSet> {
    let all = ProfileSet::builtin()?;
    if chosen.is_empty() {
        return Ok(all);
    }
    let system =
        |p: &keyward_engine::Profile| p.source.trim_start_matches("builtin:").trim_end_matches(".yaml").to_string();
    let names = |p: &keyward_engine::Profile| [system(p), p.name.clone()];
    for wanted in chosen {
        if !all.iter().any(|p| names(p).contains(wanted)) {
            let mut systems: Vec<(String, Vec<String>)> = Vec::new();
            for p in all.iter() {
                match systems.iter_mut().find(|(s, _)| *s == system(p)) {
                    Some((_, profiles)) => profiles.push(p.name.clone()),
                    None => systems.push((system(p), vec![p.name.clone()])),
                }
            }
            let systems: Vec<String> = systems.iter().map(|(s, ps)| format!("{s} ({})", ps.join(", "))).collect();
            bail!(
                "--builtin-profiles {wanted:?}: no built-in system or profile of that name; give a system, or a profile in parentheses: {}",
                systems.join("; ")
            );
        }
    }
    Ok(all.retain(|p| names(p).iter().any(|n| chosen.contains(n))))
}

/// `profiles` with `delivery: auto` resolved as keyward's controller resolves it in the cluster
/// `client` reaches (by discovery); `None` when no profile leaves its delivery to the cluster.
pub async fn resolved_by_discovery(
    cluster: &crate::kubeconfig::Cluster,
    profiles: &ProfileSet,
) -> Result<Option<ProfileSet>, crate::kubeconfig::ClusterUnreadable> {
    use keyward_controller::signer::{cluster_facts, served_version, ApiVersion};
    if !profiles.has_auto() {
        return Ok(None);
    }
    let served = served_version(&cluster.client, ApiVersion::PLURAL).await.map_err(|e| {
        let what = format!("read the discovery of {} (for delivery: auto)", ApiVersion::GROUP);
        crate::kubeconfig::request_failed(&cluster.server, &what, &e)
    })?;
    Ok(Some(profiles.clone().resolved(cluster_facts(served))))
}

/// The facts file's text; `None` while there is none (the optional ConfigMap not written yet).
fn read_facts(file: &Path) -> anyhow::Result<Option<String>> {
    use std::io::Read;
    let opened = match std::fs::File::open(file) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(anyhow::anyhow!("--cluster-facts {}: cannot read ({e})", file.display())),
    };
    // Bounded: a facts file is a line; a larger one is refused by the parse, not read whole.
    let mut text = String::new();
    opened
        .take(64 * 1024)
        .read_to_string(&mut text)
        .with_context(|| format!("--cluster-facts {}: cannot read", file.display()))?;
    Ok(Some(text))
}

/// Reads one profile file, or every `*.yaml` / `*.yml` in a directory, sorted by name.
///
/// A mounted ConfigMap is a directory whose `..data` symlink points at the generation of the
/// moment (`..2026_…`), with a top-level symlink through it per key; the kubelet updates it by
/// writing a new generation and swapping `..data`. The files are read from the one generation
/// `..data` names, and read again if it moved meanwhile, so a set never mixes two versions.
fn read_sources(path: &Path) -> anyhow::Result<Vec<(String, String)>> {
    if path.is_file() {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("--profiles {}: cannot read", path.display()))?;
        return Ok(vec![(path.display().to_string(), text)]);
    }
    let data = path.join("..data");
    for _ in 0..5 {
        let Ok(generation) = std::fs::read_link(&data) else { return read_dir(path, path) };
        let read = read_dir(&path.join(&generation), path);
        if std::fs::read_link(&data).ok().as_ref() == Some(&generation) {
            return read;
        }
    }
    bail!(
        "--profiles {}: the ConfigMap volume changed five times while it was read; the next change or poll reads it again",
        path.display()
    )
}

/// The `*.yaml` / `*.yml` files of `dir`, named as if in `shown` (the directory the user gave,
/// not the kubelet's generation). Entries starting with `..` are the kubelet's own.
fn read_dir(dir: &Path, shown: &Path) -> anyhow::Result<Vec<(String, String)>> {
    let entries =
        std::fs::read_dir(dir).with_context(|| format!("--profiles {}: cannot read the directory", shown.display()))?;
    let mut names = Vec::new();
    for entry in entries {
        let entry = entry.with_context(|| format!("--profiles {}: cannot list the directory", shown.display()))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let is_yaml = name.ends_with(".yaml") || name.ends_with(".yml");
        if is_yaml && !name.starts_with("..") && dir.join(&name).is_file() {
            names.push(name);
        }
    }
    if names.is_empty() {
        bail!("--profiles {}: no *.yaml or *.yml files in the directory", shown.display());
    }
    names.sort();
    names
        .into_iter()
        .map(|name| {
            let shown = shown.join(&name);
            let text = std::fs::read_to_string(dir.join(&name))
                .with_context(|| format!("{}: cannot read", shown.display()))?;
            Ok((shown.display().to_string(), text))
        })
        .collect()
}

// === impl ProfileStore ===

/// The profile set the webhook (or the controller) works with now, shared by every request: a
/// reload swaps the whole set at once, so a decision sees the old set or the new, never a mix.
#[derive(Debug, Clone)]
pub struct Profiles(Arc<ArcSwap<ProfileSet>>);

impl Profiles {
    /// A set that never changes.
    #[cfg(test)]
    pub fn fixed(set: ProfileSet) -> Self {
        Self(Arc::new(ArcSwap::from_pointee(set)))
    }

    /// The set of the moment; hold it for one decision.
    pub fn current(&self) -> arc_swap::Guard<Arc<ProfileSet>> {
        self.0.load()
    }

    /// The set of the moment, to keep.
    pub fn current_arc(&self) -> Arc<ProfileSet> {
        self.0.load_full()
    }
}

/// What one reload attempt did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProfileReload {
    /// A new set now serves.
    Loaded,
    /// The files hold the set already served.
    Unchanged,
    /// Refused, with every problem; the last good set keeps serving.
    Failed(String),
}

impl ProfileReload {
    /// `loaded`, `unchanged` or `failed`: a metrics label.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Loaded => "loaded",
            Self::Unchanged => "unchanged",
            Self::Failed(_) => "failed",
        }
    }
}

type SetCheck = Box<dyn Fn(&ProfileSet) -> Result<(), String> + Send + Sync>;
type ReloadObserver = Box<dyn Fn(&ProfileReload) + Send + Sync>;

/// `--profiles DIR` kept current: [`keyward_certs::watch`] calls [`ProfileStore::reload`] on
/// each change in the directory and on each poll. A new set is read whole from one generation
/// of a ConfigMap volume, validated whole (the profiles, the `--operator-namespace` pins, and
/// what this process can serve), and only then swapped in.
pub struct ProfileStore {
    source: ProfileSource,
    /// What is watched: the directory, or the directory holding the file.
    watched: PathBuf,
    profiles: Profiles,
    /// The files of the set now served, to tell a change from a poll.
    files: Mutex<Files>,
    last_error: Mutex<Option<String>>,
    check: Option<SetCheck>,
    observer: Option<ReloadObserver>,
    changes: watch::Sender<Arc<ProfileSet>>,
}

impl fmt::Debug for ProfileStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProfileStore").field("source", &self.source).finish_non_exhaustive()
    }
}

impl ProfileStore {
    /// Loads the set now; a bad set is an error (start-up stops on it). `check` is what this
    /// process also needs of any set (a key, a CA), applied at start-up and to every reload.
    pub fn load(
        source: ProfileSource,
        check: impl Fn(&ProfileSet) -> Result<(), String> + Send + Sync + 'static,
    ) -> anyhow::Result<Self> {
        let files = source.read()?;
        let set = source.build(&files)?;
        check(&set).map_err(|e| anyhow::anyhow!("{e}"))?;
        let watched = match &source.dir {
            Some(p) if p.is_file() => p.parent().map_or_else(|| PathBuf::from("."), Path::to_path_buf),
            Some(p) => p.clone(),
            None => PathBuf::new(),
        };
        let set = Arc::new(set);
        Ok(Self {
            source,
            watched,
            profiles: Profiles(Arc::new(ArcSwap::new(set.clone()))),
            files: Mutex::new(files),
            last_error: Mutex::new(None),
            check: Some(Box::new(check)),
            observer: None,
            changes: watch::channel(set).0,
        })
    }

    /// The same store with the facts known to this process (the controller's discovery, made
    /// after the set was checked): the set is resolved again, and so is every reload.
    pub fn with_facts(mut self, facts: ClusterFacts) -> Self {
        self.source.facts = FactsSource::Known(facts);
        let set = Arc::new(ProfileSet::clone(&self.profiles.current()).resolved(facts));
        self.profiles.0.store(set.clone());
        self.changes.send_replace(set);
        self
    }

    /// Calls `observer` after every reload attempt (for metrics).
    pub fn with_observer(mut self, observer: impl Fn(&ProfileReload) + Send + Sync + 'static) -> Self {
        self.observer = Some(Box::new(observer));
        self
    }

    /// Whether there is anything to reload (`--profiles` or `--cluster-facts` was given).
    pub fn reloads(&self) -> bool {
        self.source.dir.is_some() || matches!(self.source.facts, FactsSource::File(_))
    }

    /// Watches what the set is read from (the profiles' directory, the facts file's), each
    /// change or poll reloading the whole set. Keep the watches for as long as it serves.
    pub fn watch(self: &Arc<Self>, poll: std::time::Duration) -> anyhow::Result<Vec<keyward_certs::store::Watch>> {
        let mut watches = Vec::new();
        if self.source.dir.is_some() {
            watches.push(keyward_certs::watch(self.clone(), poll)?);
        }
        if let FactsSource::File(file) = &self.source.facts {
            let dir = match file.parent() {
                Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
                _ => PathBuf::from("."),
            };
            if !dir.is_dir() {
                bail!(
                    "--cluster-facts {}: the directory {} does not exist (mount the ConfigMap keyward-cluster-facts there, optional: true)",
                    file.display(),
                    dir.display()
                );
            }
            watches.push(keyward_certs::watch(Arc::new(FactsDir { store: self.clone(), dir }), poll)?);
        }
        Ok(watches)
    }

    pub fn profiles(&self) -> Profiles {
        self.profiles.clone()
    }

    /// Every set swapped in from now on (the latest only).
    pub fn subscribe(&self) -> watch::Receiver<Arc<ProfileSet>> {
        self.changes.subscribe()
    }

    /// Reads, validates and (if new and valid) swaps in the set on disk.
    pub fn reload(&self, trigger: Trigger) -> ProfileReload {
        let outcome = self.try_reload();
        self.log(trigger, &outcome);
        if let Some(observer) = &self.observer {
            observer(&outcome);
        }
        outcome
    }

    fn try_reload(&self) -> ProfileReload {
        if !self.reloads() {
            return ProfileReload::Unchanged;
        }
        let files = match self.source.read() {
            Ok(files) => files,
            Err(e) => return ProfileReload::Failed(format!("{e:#}")),
        };
        if *lock(&self.files) == files {
            return ProfileReload::Unchanged;
        }
        let set = match self.source.build(&files) {
            Ok(set) => set,
            Err(e) => return ProfileReload::Failed(format!("{e:#}")),
        };
        if let Some(Err(e)) = self.check.as_ref().map(|check| check(&set)) {
            return ProfileReload::Failed(e);
        }
        let set = Arc::new(set);
        self.profiles.0.store(set.clone());
        *lock(&self.files) = files;
        self.changes.send_replace(set);
        ProfileReload::Loaded
    }

    fn log(&self, trigger: Trigger, outcome: &ProfileReload) {
        let mut last = lock(&self.last_error);
        match outcome {
            ProfileReload::Loaded => {
                *last = None;
                let set = self.profiles.current();
                tracing::info!(
                    ?trigger,
                    source = %self.source.describe(),
                    cluster = %set.facts().describe(),
                    count = set.len(),
                    profiles = ?set.iter().map(|p| p.name.as_str()).collect::<Vec<_>>(),
                    "profiles reloaded"
                );
            }
            ProfileReload::Unchanged => {
                *last = None;
                tracing::debug!(?trigger, "profiles unchanged");
            }
            ProfileReload::Failed(error) => {
                // Said once per distinct error; every attempt is counted in metrics.
                if last.as_deref() != Some(error.as_str()) {
                    let set = self.profiles.current();
                    tracing::error!(
                        ?trigger,
                        source = %self.source.describe(),
                        %error,
                        still_serving = ?set.iter().map(|p| p.name.as_str()).collect::<Vec<_>>(),
                        "profiles refused; keeping the last good set (fix the files, or the ConfigMap mounted there)"
                    );
                }
                *last = Some(error.clone());
            }
        }
    }
}

impl keyward_certs::ReloadSource for ProfileStore {
    fn dir(&self) -> &Path {
        &self.watched
    }

    fn reload(&self, trigger: Trigger) {
        ProfileStore::reload(self, trigger);
    }
}

/// The facts file's directory, watched for the same store: a change reloads the whole set.
struct FactsDir {
    store: Arc<ProfileStore>,
    dir: PathBuf,
}

impl keyward_certs::ReloadSource for FactsDir {
    fn dir(&self) -> &Path {
        &self.dir
    }

    fn reload(&self, trigger: Trigger) {
        self.store.reload(trigger);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use keyward_certs::testing::KubeletVolume;

    fn profile(name: &str, value: &str) -> String {
        format!(
            "apiVersion: keyward.io/v1alpha1\nkind: InjectionProfile\nmetadata: {{name: {name}}}\nspec:\n  selector: {{matchLabels: {{app: {name}}}}}\n  requesters: {{usernames: [bot]}}\n  inject:\n    env:\n      - {{name: GENERATION, value: \"{value}\"}}\n"
        )
    }

    fn source(dir: &Path) -> ProfileSource {
        ProfileSource {
            dir: Some(dir.to_path_buf()),
            with_builtin: false,
            builtins: vec![],
            operator_namespaces: vec![],
            facts: FactsSource::Known(ClusterFacts::default()),
        }
    }

    fn names(set: &ProfileSet) -> Vec<String> {
        set.iter().map(|p| p.name.clone()).collect()
    }

    fn env_value(set: &ProfileSet, name: &str) -> String {
        let p = set.iter().find(|p| p.name == name).unwrap();
        serde_json::to_value(&p.spec.inject).unwrap()["env"][0]["value"].as_str().unwrap().to_string()
    }

    #[test]
    fn a_configmap_update_swaps_the_whole_set_and_a_bad_one_keeps_the_last_good() {
        let tmp = tempfile::tempdir().unwrap();
        let (a1, b1) = (profile("a", "1"), profile("b", "1"));
        let mut volume = KubeletVolume::new(tmp.path(), &[("a.yaml", a1.as_bytes()), ("b.yaml", b1.as_bytes())]);
        let outcomes = Arc::new(Mutex::new(Vec::new()));
        let seen = outcomes.clone();
        let store = ProfileStore::load(source(tmp.path()), |_| Ok(()))
            .unwrap()
            .with_observer(move |o| lock(&seen).push(o.as_str()));
        let mut changes = store.subscribe();
        let profiles = store.profiles();
        assert_eq!(names(&profiles.current()), ["a", "b"]);
        // The names are the user's directory, not the kubelet's generation.
        assert_eq!(profiles.current().iter().next().unwrap().source, tmp.path().join("a.yaml").display().to_string());

        // A poll with nothing new.
        assert_eq!(store.reload(Trigger::Poll), ProfileReload::Unchanged);
        assert!(!changes.has_changed().unwrap());

        // One key changed, one removed, one added: all at once.
        let (a2, c2) = (profile("a", "2"), profile("c", "2"));
        volume.rotate(&[("a.yaml", a2.as_bytes()), ("c.yaml", c2.as_bytes())]);
        assert_eq!(store.reload(Trigger::Watch), ProfileReload::Loaded);
        assert_eq!(names(&profiles.current()), ["a", "c"]);
        assert_eq!(env_value(&profiles.current(), "a"), "2");
        assert!(changes.has_changed().unwrap());
        assert_eq!(names(&changes.borrow_and_update()), ["a", "c"]);

        // Two problems in two files: refused with both, the last good set serving.
        let broken = profile("a", "3").replace("name: GENERATION", "name: \"1BAD\"");
        let empty_selector = profile("d", "3").replace("  selector: {matchLabels: {app: d}}\n", "");
        volume.rotate(&[("a.yaml", broken.as_bytes()), ("d.yaml", empty_selector.as_bytes())]);
        let ProfileReload::Failed(error) = store.reload(Trigger::Watch) else { panic!("accepted") };
        assert!(error.contains("a.yaml") && error.contains("1BAD"), "{error}");
        assert!(error.contains("d.yaml") && error.contains("spec.selector"), "{error}");
        assert_eq!(names(&profiles.current()), ["a", "c"]);
        assert_eq!(env_value(&profiles.current(), "a"), "2");
        assert!(!changes.has_changed().unwrap());
        // Polled again while still bad: still refused (and counted), nothing swapped.
        assert!(matches!(store.reload(Trigger::Poll), ProfileReload::Failed(_)));

        // Fixed: taken.
        volume.rotate(&[("a.yaml", profile("a", "4").as_bytes())]);
        assert_eq!(store.reload(Trigger::Poll), ProfileReload::Loaded);
        assert_eq!(names(&profiles.current()), ["a"]);
        assert_eq!(*lock(&outcomes), ["unchanged", "loaded", "failed", "failed", "loaded"]);
    }

    #[test]
    fn what_the_process_needs_of_a_set_is_checked_at_start_and_on_every_reload() {
        let tmp = tempfile::tempdir().unwrap();
        let mut volume = KubeletVolume::new(tmp.path(), &[("a.yaml", profile("a", "1").as_bytes())]);
        let check = |set: &ProfileSet| match set.iter().any(|p| p.name == "forbidden") {
            true => Err("profile forbidden needs a restart with --flag".to_string()),
            false => Ok(()),
        };
        let store = ProfileStore::load(source(tmp.path()), check).unwrap();
        volume.rotate(&[("a.yaml", profile("a", "1").as_bytes()), ("f.yaml", profile("forbidden", "1").as_bytes())]);
        assert_eq!(
            store.reload(Trigger::Watch),
            ProfileReload::Failed("profile forbidden needs a restart with --flag".into())
        );
        assert_eq!(names(&store.profiles().current()), ["a"]);
        // And at start-up, the same check stops it.
        let err = ProfileStore::load(source(tmp.path()), check).unwrap_err().to_string();
        assert_eq!(err, "profile forbidden needs a restart with --flag");
    }

    #[test]
    fn an_operator_namespace_pin_that_no_longer_names_a_profile_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let pinnable =
            |name: &str| profile(name, "1").replace("usernames: [bot]", "usernames: [\"system:serviceaccount:*:op\"]");
        let mut volume = KubeletVolume::new(tmp.path(), &[("a.yaml", pinnable("a").as_bytes())]);
        let mut source = source(tmp.path());
        source.operator_namespaces = vec![("a".into(), "ops".into())];
        let store = ProfileStore::load(source, |_| Ok(())).unwrap();
        volume.rotate(&[("b.yaml", pinnable("b").as_bytes())]);
        let ProfileReload::Failed(error) = store.reload(Trigger::Watch) else { panic!("accepted") };
        assert!(error.starts_with("--operator-namespace a=ops: no profile named \"a\""), "{error}");
        assert_eq!(names(&store.profiles().current()), ["a"]);
    }

    #[test]
    fn delivery_auto_follows_the_cluster_facts_file_as_it_appears_changes_and_goes() {
        let auto = "apiVersion: keyward.io/v1alpha1\nkind: InjectionProfile\nmetadata: {name: a}\nspec:\n  selector: {matchLabels: {app: a}}\n  requesters: {usernames: [bot]}\n  controllerOwners: [{apiGroup: batch, kind: Job}]\n  inject:\n    clientCertificate:\n      delivery: auto\n      secretName: \"{owner.name}-c\"\n      podCertificate: {signerName: keyward.io/a}\n      mountPath: /c\n";
        let profiles_dir = tempfile::tempdir().unwrap();
        let _profiles = KubeletVolume::new(profiles_dir.path(), &[("a.yaml", auto.as_bytes())]);
        // The optional ConfigMap, not written yet: its directory is there, empty.
        let facts_dir = tempfile::tempdir().unwrap();
        let file = facts_dir.path().join(keyward_engine::cluster::FILE_NAME);
        let mut source = source(profiles_dir.path());
        source.facts = FactsSource::File(file.clone());
        let store = Arc::new(ProfileStore::load(source, |_| Ok(())).unwrap());
        assert!(store.reloads());
        let delivery = |store: &ProfileStore| {
            let set = store.profiles().current_arc();
            let cc = set.get("a").unwrap().spec.inject.client_certificate.clone().unwrap();
            (cc.effective(), set.facts().pod_certificates.as_str())
        };
        use keyward_engine::kinds::Delivery;
        assert_eq!(delivery(&store), (Delivery::Secret, "off"));

        // The controller writes the facts: the next reload delivers pod certificates.
        let mut volume =
            KubeletVolume::new(facts_dir.path(), &[("facts.json", b"{\"podCertificates\":\"v1beta1\"}\n")]);
        assert_eq!(store.reload(Trigger::Watch), ProfileReload::Loaded);
        assert_eq!(delivery(&store), (Delivery::PodCertificate, "v1beta1"));
        assert_eq!(store.reload(Trigger::Poll), ProfileReload::Unchanged);

        // A file that is not facts: refused, naming the flag; the last good set serves on.
        volume.rotate(&[("facts.json", b"{\"podCertificates\": 1}")]);
        let ProfileReload::Failed(error) = store.reload(Trigger::Watch) else { panic!("accepted") };
        assert!(
            error.starts_with(&format!("--cluster-facts {}: not keyward's cluster facts", file.display())),
            "{error}"
        );
        assert!(
            error.ends_with(
                "(keyward's controller writes this file; or render it with `keyward manifests cluster-facts`)"
            ),
            "{error}"
        );
        assert_eq!(delivery(&store), (Delivery::PodCertificate, "v1beta1"));

        // The controller no longer signs (the API was turned off): Secrets again.
        volume.rotate(&[("facts.json", b"{\"podCertificates\":\"off\"}\n")]);
        assert_eq!(store.reload(Trigger::Watch), ProfileReload::Loaded);
        assert_eq!(delivery(&store), (Delivery::Secret, "off"));
    }

    #[test]
    fn a_facts_directory_that_does_not_exist_is_refused_at_start_saying_what_to_mount() {
        let store = Arc::new(
            ProfileStore::load(
                ProfileSource {
                    dir: None,
                    with_builtin: true,
                    builtins: vec![],
                    operator_namespaces: vec![],
                    facts: FactsSource::File("/nonexistent/keyward/facts.json".into()),
                },
                |_| Ok(()),
            )
            .unwrap(),
        );
        let Err(err) = store.watch(std::time::Duration::from_secs(3600)) else { panic!("watched") };
        let err = err.to_string();
        assert_eq!(
            err,
            "--cluster-facts /nonexistent/keyward/facts.json: the directory /nonexistent/keyward does not exist (mount the ConfigMap keyward-cluster-facts there, optional: true)"
        );
    }

    #[test]
    fn without_a_directory_there_is_nothing_to_reload() {
        let store = ProfileStore::load(
            ProfileSource {
                dir: None,
                with_builtin: true,
                builtins: vec![],
                operator_namespaces: vec![],
                facts: FactsSource::Known(ClusterFacts::default()),
            },
            |_| Ok(()),
        )
        .unwrap();
        assert!(!store.reloads());
        assert_eq!(store.reload(Trigger::Poll), ProfileReload::Unchanged);
        assert_eq!(store.profiles().current().len(), ProfileSet::builtin().unwrap().len());
    }
}
