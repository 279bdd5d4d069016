//! Helpers: mint pairs, lay them out the way the kubelet and `cp` do, wait on reload events.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)] // test helpers: a panic is the failure report

use std::path::Path;
use std::time::{Duration, SystemTime};

use keyward_certs::pki::{Ca, Minted};
pub use keyward_certs::testing::KubeletVolume;
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

/// A kubelet-style volume holding `minted` as tls.crt and tls.key.
pub fn kubelet_volume(dir: &Path, minted: &Minted) -> KubeletVolume {
    KubeletVolume::new(dir, &pair(minted))
}

pub fn pair(minted: &Minted) -> [(&'static str, &[u8]); 2] {
    [("tls.crt", minted.cert_pem.as_bytes()), ("tls.key", minted.key_pem.as_bytes())]
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
