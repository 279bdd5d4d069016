//! The hot-reloading store: rotations the way the kubelet and `cp` do them, and every bad
//! state keeps the last good certificate serving.
#![allow(clippy::unwrap_used)] // a panic is the test failure report

mod support;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use keyward_certs::pki::Ca;
use keyward_certs::{watch, CertStore, ReloadOutcome, Trigger};
use support::*;

fn serving(store: &CertStore) -> String {
    store.current().map(|c| c.info.sha256.clone()).unwrap_or_default()
}

#[test]
fn nothing_is_served_or_ready_until_a_valid_pair_loads() {
    let tmp = tempfile::tempdir().unwrap();
    let store = CertStore::new(tmp.path());
    let outcome = store.reload(Trigger::Startup);
    let ReloadOutcome::Failed(reason) = outcome else { panic!("{outcome:?}") };
    assert!(reason.ends_with("tls.crt: cannot read: No such file or directory (os error 2)"), "{reason}");
    assert!(store.current().is_none());
    let not_ready = store.ready(SystemTime::now()).unwrap_err();
    assert!(not_ready.starts_with("no valid serving certificate loaded yet: "), "{not_ready}");

    let ca = ca();
    let first = leaf(&ca);
    write_plain(tmp.path(), &first);
    assert!(matches!(store.reload(Trigger::Startup), ReloadOutcome::Loaded(_)));
    assert_eq!(serving(&store), sha256_of(&first));
    assert_eq!(store.ready(SystemTime::now()), Ok(()));
    assert_eq!(store.reload(Trigger::Poll), ReloadOutcome::Unchanged);
}

#[test]
fn every_bad_state_keeps_the_last_good_certificate() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let ca = ca();
    let good = leaf(&ca);
    write_plain(dir, &good);
    let store = CertStore::new(dir);
    store.reload(Trigger::Startup);
    let good_sha = serving(&store);

    let other = leaf(&ca);
    let now = SystemTime::now();
    let old_ca = Ca::mint("test CA", now - 10 * DAY, 30 * DAY).unwrap();
    let expired = old_ca.issue_serving(&["localhost".to_string()], now - 5 * DAY, DAY).unwrap();

    type BreakIt<'a> = Box<dyn Fn() + 'a>;
    let cases: Vec<(&str, BreakIt, &str)> = vec![
        ("missing key", Box::new(|| std::fs::remove_file(dir.join("tls.key")).unwrap()), "tls.key: cannot read"),
        (
            "half-written certificate",
            Box::new(|| {
                write_plain(dir, &other);
                std::fs::write(dir.join("tls.crt"), &other.cert_pem[..other.cert_pem.len() / 2]).unwrap();
            }),
            "tls.crt: ",
        ),
        (
            "key that does not match",
            Box::new(|| {
                std::fs::write(dir.join("tls.crt"), &other.cert_pem).unwrap();
                std::fs::write(dir.join("tls.key"), &good.key_pem).unwrap();
            }),
            "tls.key: the private key does not match the certificate in",
        ),
        ("expired leaf", Box::new(|| write_plain(dir, &expired)), "tls.crt: the certificate expired at"),
    ];
    for (what, break_it, expected) in cases {
        break_it();
        let outcome = store.reload(Trigger::Poll);
        let ReloadOutcome::Failed(reason) = &outcome else { panic!("{what}: {outcome:?}") };
        assert!(reason.contains(expected), "{what}: {reason}");
        assert_eq!(serving(&store), good_sha, "{what}: the good certificate must keep serving");
        assert_eq!(store.ready(SystemTime::now()), Ok(()), "{what}: still ready on the good certificate");
    }
    // Fixed: the next reload takes the new pair.
    write_plain(dir, &other);
    assert!(matches!(store.reload(Trigger::Poll), ReloadOutcome::Loaded(_)));
    assert_eq!(serving(&store), sha256_of(&other));
}

#[test]
fn the_observer_sees_every_attempt() {
    let tmp = tempfile::tempdir().unwrap();
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink = seen.clone();
    let store = CertStore::new(tmp.path()).with_observer(move |o| sink.lock().unwrap().push(o.as_str()));
    store.reload(Trigger::Startup);
    write_plain(tmp.path(), &leaf(&ca()));
    store.reload(Trigger::Poll);
    store.reload(Trigger::Poll);
    assert_eq!(*seen.lock().unwrap(), ["failed", "loaded", "unchanged"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelet_style_rotations_are_picked_up_by_the_directory_watch() {
    let tmp = tempfile::tempdir().unwrap();
    let ca = ca();
    let first = leaf(&ca);
    let mut volume = kubelet_volume(tmp.path(), &first);
    let store = Arc::new(CertStore::new(tmp.path()));
    store.reload(Trigger::Startup);
    let mut events = store.subscribe();
    // A poll period far beyond the test: only the watch can pick up the changes.
    let _watch = watch(store.clone(), Duration::from_secs(3600)).unwrap();
    for _ in 0..5 {
        let next = leaf(&ca);
        let sha = sha256_of(&next);
        volume.rotate(&pair(&next));
        let seen = wait_loaded(&mut events, &sha).await;
        assert!(seen.iter().all(|e| e.trigger == Trigger::Watch), "{seen:?}");
        assert_eq!(serving(&store), sha);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_place_rewrites_are_picked_up_too() {
    let tmp = tempfile::tempdir().unwrap();
    let ca = ca();
    write_plain(tmp.path(), &leaf(&ca));
    let store = Arc::new(CertStore::new(tmp.path()));
    store.reload(Trigger::Startup);
    let mut events = store.subscribe();
    let _watch = watch(store.clone(), Duration::from_secs(3600)).unwrap();
    for _ in 0..3 {
        let next = leaf(&ca);
        let sha = sha256_of(&next);
        write_plain(tmp.path(), &next);
        wait_loaded(&mut events, &sha).await;
        assert_eq!(serving(&store), sha);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn polling_picks_up_a_change_the_watch_cannot_see() {
    // The watched directory itself is replaced: the watch is on the old inode and hears
    // nothing, so only the poll can find the new pair.
    let tmp = tempfile::tempdir().unwrap();
    let ca = ca();
    let real = tmp.path().join("real");
    std::fs::create_dir(&real).unwrap();
    write_plain(&real, &leaf(&ca));
    let link = tmp.path().join("tls");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    let store = Arc::new(CertStore::new(&link));
    store.reload(Trigger::Startup);
    let mut events = store.subscribe();
    let _watch = watch(store.clone(), Duration::from_millis(200)).unwrap();

    let replacement = tmp.path().join("replacement");
    std::fs::create_dir(&replacement).unwrap();
    let next = leaf(&ca);
    write_plain(&replacement, &next);
    std::os::unix::fs::symlink(&replacement, tmp.path().join("tls.tmp")).unwrap();
    std::fs::rename(tmp.path().join("tls.tmp"), &link).unwrap();
    let seen = wait_loaded(&mut events, &sha256_of(&next)).await;
    assert_eq!(seen.last().map(|e| e.trigger), Some(Trigger::Poll));
}
