//! Helpers: mint pairs, lay them out the way the kubelet and `cp` do, wait on reload events.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)] // test helpers: a panic is the failure report

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use keyward_certs::pki::{Ca, Minted};
use keyward_certs::{ReloadEvent, ReloadOutcome};
use tokio::sync::broadcast;

pub const DAY: Duration = Duration::from_secs(24 * 3600);

pub fn ca() -> Ca {
    Ca::mint("test CA", SystemTime::now(), 30 * DAY).unwrap()
}

pub fn leaf(ca: &Ca) -> Minted {
    ca.issue_serving(&["keyward.keyward-system.svc".to_string(), "127.0.0.1".to_string()], SystemTime::now(), DAY)
        .unwrap()
}

pub fn sha256_of(minted: &Minted) -> String {
    let dir = tempfile::tempdir().unwrap();
    write_plain(dir.path(), minted);
    keyward_certs::pem::read_pair(dir.path()).unwrap().info.sha256
}

/// `tls.crt` and `tls.key` as plain files (how `cp` or an editor leaves them).
pub fn write_plain(dir: &Path, minted: &Minted) {
    std::fs::write(dir.join("tls.key"), &minted.key_pem).unwrap();
    std::fs::write(dir.join("tls.crt"), &minted.cert_pem).unwrap();
}

/// The kubelet's atomic writer: files in a timestamped directory, `..data` pointing at it,
/// and `tls.crt` / `tls.key` pointing through `..data`.
pub struct KubeletVolume {
    pub dir: PathBuf,
    generation: u32,
}

impl KubeletVolume {
    pub fn new(dir: &Path, minted: &Minted) -> Self {
        let mut v = Self { dir: dir.to_path_buf(), generation: 0 };
        v.rotate(minted);
        for f in ["tls.crt", "tls.key"] {
            std::os::unix::fs::symlink(format!("..data/{f}"), dir.join(f)).unwrap();
        }
        v
    }

    /// Writes a new timestamped directory, points `..data_tmp` at it, renames it over
    /// `..data`, and removes the old directory, exactly as the kubelet does.
    pub fn rotate(&mut self, minted: &Minted) {
        self.generation += 1;
        let ts = format!("..2026_11_30_08_00_00.{:09}", self.generation);
        let new = self.dir.join(&ts);
        std::fs::create_dir(&new).unwrap();
        std::fs::write(new.join("tls.crt"), &minted.cert_pem).unwrap();
        std::fs::write(new.join("tls.key"), &minted.key_pem).unwrap();
        let old = std::fs::read_link(self.dir.join("..data")).ok();
        std::os::unix::fs::symlink(&ts, self.dir.join("..data_tmp")).unwrap();
        std::fs::rename(self.dir.join("..data_tmp"), self.dir.join("..data")).unwrap();
        if let Some(old) = old {
            std::fs::remove_dir_all(self.dir.join(old)).unwrap();
        }
    }
}

/// Waits for a reload event that loaded the certificate with `sha256`. The timeout only
/// turns a hang into a failure; the test proceeds the moment the event arrives.
pub async fn wait_loaded(events: &mut broadcast::Receiver<ReloadEvent>, sha256: &str) -> Vec<ReloadEvent> {
    let mut seen = Vec::new();
    let wait = async {
        loop {
            match events.recv().await {
                Ok(e) => {
                    let done = matches!(&e.outcome, ReloadOutcome::Loaded(info) if info.sha256 == sha256);
                    seen.push(e);
                    if done {
                        return;
                    }
                }
                Err(broadcast::error::RecvError::Lagged(_)) => continue,
                Err(e) => panic!("reload events closed: {e}"),
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(30), wait).await.unwrap_or_else(|_| panic!("no reload loaded {sha256}"));
    seen
}
