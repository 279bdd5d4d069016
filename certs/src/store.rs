//! The serving certificate, hot-reloaded.
//!
//! [`CertStore`] is what rustls asks for a certificate on every handshake. It holds the last
//! good pair and swaps in a new one atomically (`arc-swap`), so a handshake never sees half a
//! rotation and connections in flight are untouched. A pair that fails any check (missing or
//! half-written file, key that does not match, not yet valid, expired) is refused: the last
//! good one keeps serving, the error is logged with the file and the reason, and the next
//! change or poll tries again.
//!
//! [`watch`] drives it: the *directory* is watched (the kubelet rotates a mounted Secret by
//! swapping the `..data` symlink, and a watch on `tls.crt` itself goes deaf after the first
//! rotation), and it is also polled, for filesystems that send no events.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use arc_swap::ArcSwapOption;
use notify::Watcher as _;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio::sync::{broadcast, Notify};

use crate::error::{rfc3339, Error};
use crate::pem::{read_pair, CertInfo, ServingCert};
use crate::CERT_FILE;

/// What one reload attempt did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReloadOutcome {
    /// A new certificate is now served.
    Loaded(Box<CertInfo>),
    /// The files hold the certificate already served.
    Unchanged,
    /// The files were refused; the previous certificate (if any) keeps serving.
    Failed(String),
}

impl ReloadOutcome {
    /// `loaded`, `unchanged` or `failed`: a metrics label.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Loaded(_) => "loaded",
            Self::Unchanged => "unchanged",
            Self::Failed(_) => "failed",
        }
    }
}

/// What set off a reload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    Startup,
    Watch,
    Poll,
}

/// Sent to subscribers after every reload attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReloadEvent {
    pub trigger: Trigger,
    pub outcome: ReloadOutcome,
}

type Observer = Box<dyn Fn(&ReloadOutcome) + Send + Sync>;
type Check = Box<dyn Fn(&ServingCert, &Path) -> Result<(), Error> + Send + Sync>;

/// The certificate rustls serves. Cheap to share (`Arc`); see the module docs.
pub struct CertStore {
    dir: PathBuf,
    /// What it holds, for logs: `serving certificate` unless named otherwise.
    what: &'static str,
    current: ArcSwapOption<ServingCert>,
    last_error: Mutex<Option<String>>,
    events: broadcast::Sender<ReloadEvent>,
    observer: Option<Observer>,
    /// What a pair must also pass, beyond the serving checks (a CA must be able to issue).
    check: Option<Check>,
}

impl fmt::Debug for CertStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CertStore")
            .field("dir", &self.dir)
            .field("serving", &self.current.load().as_ref().map(|c| c.info.sha256.clone()))
            .finish_non_exhaustive()
    }
}

impl CertStore {
    /// A store for `dir/tls.crt` and `dir/tls.key`. Nothing is served until [`Self::reload`]
    /// succeeds once.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            what: "serving certificate",
            current: ArcSwapOption::empty(),
            last_error: Mutex::new(None),
            events: broadcast::channel(64).0,
            observer: None,
            check: None,
        }
    }

    /// Names what the store holds in its log lines (e.g. `client CA`); the same checks and
    /// guarantees apply whatever it holds.
    pub fn named(mut self, what: &'static str) -> Self {
        self.what = what;
        self
    }

    /// Refuses, like any bad pair, one that fails `check` (given the pair and the directory):
    /// the last good pair stays. A client CA is loaded with [`crate::pki::can_issue`], so a
    /// CA that cannot sign is never swapped in and readiness says so.
    pub fn checked_with(
        mut self,
        check: impl Fn(&ServingCert, &Path) -> Result<(), Error> + Send + Sync + 'static,
    ) -> Self {
        self.check = Some(Box::new(check));
        self
    }

    /// Calls `observer` after every reload attempt (for metrics).
    pub fn with_observer(mut self, observer: impl Fn(&ReloadOutcome) + Send + Sync + 'static) -> Self {
        self.observer = Some(Box::new(observer));
        self
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Every reload attempt from now on, in order.
    pub fn subscribe(&self) -> broadcast::Receiver<ReloadEvent> {
        self.events.subscribe()
    }

    /// The certificate now served, if any.
    pub fn current(&self) -> Option<Arc<ServingCert>> {
        self.current.load_full()
    }

    /// `Ok` when a certificate is served and valid at `now`; otherwise why not.
    pub fn ready(&self, now: SystemTime) -> Result<(), String> {
        match self.current() {
            None => Err(match self.last_error.lock().ok().and_then(|e| e.clone()) {
                Some(e) => format!("no valid {} loaded yet: {e}", self.what),
                None => format!("no {} loaded yet", self.what),
            }),
            Some(c) => c.info.check_valid_at(&self.dir.join(CERT_FILE), now).map_err(|e| e.to_string()),
        }
    }

    /// Reads, checks and (if new) swaps in the pair on disk. Never replaces a good certificate
    /// with a bad one.
    pub fn reload(&self, trigger: Trigger) -> ReloadOutcome {
        let checked = read_pair(&self.dir).and_then(|pair| {
            pair.info.check_valid_at(&self.dir.join(CERT_FILE), SystemTime::now())?;
            if let Some(check) = &self.check {
                check(&pair, &self.dir)?;
            }
            Ok(pair)
        });
        let outcome = match checked {
            Ok(pair) if self.current().is_some_and(|c| c.info.sha256 == pair.info.sha256) => ReloadOutcome::Unchanged,
            Ok(pair) => {
                let info = pair.info.clone();
                self.current.store(Some(Arc::new(pair)));
                ReloadOutcome::Loaded(Box::new(info))
            }
            Err(e) => ReloadOutcome::Failed(e.to_string()),
        };
        self.log(trigger, &outcome);
        if let Some(observer) = &self.observer {
            observer(&outcome);
        }
        // No subscriber is fine: nobody is waiting.
        let _ = self.events.send(ReloadEvent { trigger, outcome: outcome.clone() });
        outcome
    }

    fn log(&self, trigger: Trigger, outcome: &ReloadOutcome) {
        let mut last = self.last_error.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        match outcome {
            ReloadOutcome::Loaded(info) => {
                *last = None;
                tracing::info!(
                    ?trigger,
                    dir = %self.dir.display(),
                    subject = %info.subject,
                    serial = %info.serial,
                    sha256 = %info.sha256,
                    not_after = %rfc3339(info.not_after),
                    dns_names = ?info.dns_names,
                    "{} loaded",
                    self.what
                );
            }
            ReloadOutcome::Unchanged => {
                *last = None;
                tracing::debug!(?trigger, dir = %self.dir.display(), "{} unchanged", self.what);
            }
            ReloadOutcome::Failed(error) => {
                // Say it once per distinct error; every attempt is still counted in metrics.
                if last.as_deref() != Some(error.as_str()) {
                    match self.current() {
                        Some(serving) => tracing::error!(
                            ?trigger,
                            %error,
                            still_serving = %serving.info.sha256,
                            "{} refused; keeping the last good one",
                            self.what
                        ),
                        None => tracing::error!(
                            ?trigger,
                            %error,
                            dir = %self.dir.display(),
                            "{} refused, and none loaded yet: not ready until a valid pair is written to the directory (tls.crt, tls.key); fix the files or the Secret mounted there",
                            self.what
                        ),
                    }
                }
                *last = Some(error.clone());
            }
        }
    }
}

impl ResolvesServerCert for CertStore {
    fn resolve(&self, _client_hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.current.load().as_ref().map(|c| c.key.clone())
    }
}

/// Keeps the directory watch alive; dropping it stops watching and polling.
pub struct Watch {
    _watcher: notify::RecommendedWatcher,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// How long to let a burst of file events settle before reading (the kubelet's rotation is
/// several events; `cp` writes two files one after the other).
const SETTLE: Duration = Duration::from_millis(100);

/// What [`watch`] keeps current: something read from a mounted directory.
pub trait ReloadSource: Send + Sync + 'static {
    fn dir(&self) -> &Path;
    /// Reads the directory again; keeps what it has when the files are refused.
    fn reload(&self, trigger: Trigger);
}

impl ReloadSource for CertStore {
    fn dir(&self) -> &Path {
        &self.dir
    }

    fn reload(&self, trigger: Trigger) {
        CertStore::reload(self, trigger);
    }
}

/// Watches the store's directory and polls it every `poll`, reloading on each change. Must be
/// called inside a tokio runtime.
pub fn watch<S: ReloadSource>(store: Arc<S>, poll: Duration) -> Result<Watch, Error> {
    let changed = Arc::new(Notify::new());
    let signal = changed.clone();
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        if event.is_ok_and(|e| !e.kind.is_access()) {
            signal.notify_one();
        }
    })
    .map_err(|e| Error::Watch { path: store.dir().to_path_buf(), reason: e.to_string() })?;
    watcher
        .watch(store.dir(), notify::RecursiveMode::NonRecursive)
        .map_err(|e| Error::Watch { path: store.dir().to_path_buf(), reason: e.to_string() })?;

    let task = tokio::spawn(async move {
        let mut ticker = tokio::time::interval(poll);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticker.tick().await; // the first tick is immediate; start-up already loaded
        loop {
            let trigger = tokio::select! {
                _ = changed.notified() => {
                    tokio::time::sleep(SETTLE).await;
                    Trigger::Watch
                }
                _ = ticker.tick() => Trigger::Poll,
            };
            let store = store.clone();
            // Reading files blocks; keep it off the async workers.
            if tokio::task::spawn_blocking(move || ReloadSource::reload(&*store, trigger)).await.is_err() {
                tracing::error!("certificate reload task panicked");
            }
        }
    });
    Ok(Watch { _watcher: watcher, task })
}
