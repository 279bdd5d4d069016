//! The gate file, loaded at start-up (a file that is refused stops the gate) and reloaded when
//! its directory changes: a good file replaces the rules for the next request, a refused one
//! changes nothing and says every problem, as `keyward check-gate` would.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arc_swap::ArcSwap;
use keyward_certs::{ReloadSource, Trigger};
use keyward_gate::config::Loaded;
use keyward_gate::owners::LiveOwner;

use super::Reload;

/// The largest gate file read.
const MAX_FILE_BYTES: u64 = 1024 * 1024;

type Observer = Box<dyn Fn(&Reload) + Send + Sync>;

pub struct GateStore {
    file: PathBuf,
    dir: PathBuf,
    current: ArcSwap<Loaded>,
    /// The text the current rules were read from, to tell a change from a poll.
    text: std::sync::Mutex<String>,
    /// The owner kinds watched since start-up: a reload cannot change them.
    watched: Vec<LiveOwner>,
    /// The callers' pods watched since start-up, and what is kept of each: nor these.
    pods: WatchedPods,
    observer: Option<Observer>,
}

impl GateStore {
    pub fn load(file: &Path) -> anyhow::Result<Self> {
        let text = read(file).map_err(anyhow::Error::msg)?;
        let loaded = keyward_gate::config::load(&file.display().to_string(), &text)
            .map_err(|problems| anyhow::anyhow!("gate file refused:\n  {}", problems.join("\n  ")))?;
        let dir = match file.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        Ok(Self {
            file: file.to_path_buf(),
            dir,
            watched: loaded.gate.live_owners().to_vec(),
            pods: watched_pods(&loaded.gate),
            current: ArcSwap::from_pointee(loaded),
            text: std::sync::Mutex::new(text),
            observer: None,
        })
    }

    pub fn with_observer(mut self, observer: impl Fn(&Reload) + Send + Sync + 'static) -> Self {
        self.observer = Some(Box::new(observer));
        self
    }

    /// The rules now in force.
    pub fn current(&self) -> Arc<Loaded> {
        self.current.load_full()
    }

    /// Reads the file again; keeps the rules it has when the file is refused.
    pub fn reload_now(&self) -> Reload {
        let mut last = self.text.lock().unwrap_or_else(|p| p.into_inner());
        let outcome = match read(&self.file) {
            Ok(text) if text == *last => Reload::Unchanged,
            Ok(text) => match keyward_gate::config::load(&self.file.display().to_string(), &text) {
                Ok(loaded) if loaded.gate.live_owners() != self.watched.as_slice() => Reload::Failed(format!(
                    "{}: spec.liveOwners is not the one the gate started with ({}): the gate watches the owner kinds it started with; restart it to watch others",
                    self.file.display(),
                    describe(&self.watched)
                )),
                Ok(loaded) if watched_pods(&loaded.gate) != self.pods => Reload::Failed(format!(
                    "{}: spec.tokenReview.pods, or the pod labels and annotations the rules read, are not those the gate started with (the gate watches the pods it started with, keeping what its rules then read); restart it",
                    self.file.display()
                )),
                Ok(loaded) => {
                    self.current.store(Arc::new(loaded));
                    *last = text;
                    Reload::Loaded(1)
                }
                Err(problems) => Reload::Failed(problems.join("; ")),
            },
            Err(e) => Reload::Failed(e),
        };
        drop(last);
        match &outcome {
            Reload::Loaded(_) => {
                tracing::info!(file = %self.file.display(), gate = %self.current().name, "gate file reloaded")
            }
            Reload::Failed(e) => tracing::warn!(
                file = %self.file.display(),
                problems = %e,
                "gate file refused; the rules in force are unchanged"
            ),
            Reload::Unchanged => {}
        }
        if let Some(observe) = &self.observer {
            observe(&outcome);
        }
        outcome
    }
}

/// The label selector of `tokenReview.pods`, and the labels and annotations rules read.
type WatchedPods = Option<(String, (Vec<String>, Vec<String>))>;

fn watched_pods(gate: &keyward_gate::rules::Gate) -> WatchedPods {
    gate.pods().map(|p| (p.label_selector.clone(), gate.pod_keys()))
}

fn describe(owners: &[LiveOwner]) -> String {
    if owners.is_empty() {
        return "none".into();
    }
    owners.iter().map(LiveOwner::describe).collect::<Vec<_>>().join(", ")
}

fn read(file: &Path) -> Result<String, String> {
    let size = std::fs::metadata(file).map_err(|e| format!("cannot read {}: {e}", file.display()))?.len();
    if size > MAX_FILE_BYTES {
        return Err(format!("{}: {size} bytes, more than a gate file's {MAX_FILE_BYTES}", file.display()));
    }
    std::fs::read_to_string(file).map_err(|e| format!("cannot read {}: {e}", file.display()))
}

impl ReloadSource for GateStore {
    fn dir(&self) -> &Path {
        &self.dir
    }

    fn reload(&self, _trigger: Trigger) {
        self.reload_now();
    }
}
