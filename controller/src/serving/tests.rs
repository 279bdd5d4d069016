//! The serving certificate planner's tests: each state the Secret and `caBundle` can be in,
//! and what the plan does with it.

use super::*;

const DAY: Duration = Duration::from_secs(86_400);

fn settings() -> Settings {
    Settings::for_service("keyward", "keyward-system")
}

fn start() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000)
}

/// Applies a plan as the controller does: the Secret, the annotation, the bundle; the
/// replicas then serve the Secret's leaf when `reloaded`.
fn apply(observed: &mut Observed, plan: &Plan) {
    if let Some(files) = &plan.files {
        observed.files = files.clone();
    }
    observed.next_since = plan.next_since;
    observed.bundle = plan.bundle.clone().into_bytes();
}

fn bundle_count(plan: &Plan) -> usize {
    certificates(plan.bundle.as_bytes()).len()
}

#[test]
fn the_first_start_makes_a_ca_and_a_leaf_for_the_service() {
    let now = start();
    let plan = plan(&settings(), &Observed::default(), now).unwrap();
    assert_eq!(plan.changes, [Change::Created { replaced: None }]);
    let files = plan.files.clone().unwrap();
    assert_eq!(files.keys().collect::<Vec<_>>(), [CA_CRT, CA_KEY, TLS_CRT, TLS_KEY]);
    assert_eq!(plan.bundle.as_bytes(), files[CA_CRT].as_slice());
    assert!(plan.bundle_first, "the apiserver trusts the CA before a replica serves its leaf");
    served_as(&files[TLS_CRT], &files[CA_CRT], "keyward.keyward-system.svc.cluster.local", now).unwrap();
    // The next look: when the leaf is two thirds through its year.
    assert_eq!(plan.next, now - Duration::from_secs(300) + (DAY * 365 + Duration::from_secs(300)) * 2 / 3);
}

#[test]
fn a_valid_secret_and_bundle_are_left_alone() {
    let now = start();
    let mut observed = Observed::default();
    let first = plan(&settings(), &observed, now).unwrap();
    apply(&mut observed, &first);
    let again = plan(&settings(), &observed, now + DAY).unwrap();
    assert_eq!(again.files, None);
    assert!(again.changes.is_empty());
    assert_eq!(again.bundle.as_bytes(), observed.bundle.as_slice());
}

#[test]
fn the_leaf_is_renewed_at_two_thirds_of_its_life_by_the_same_ca() {
    let now = start();
    let mut observed = Observed::default();
    let first = plan(&settings(), &observed, now).unwrap();
    apply(&mut observed, &first);
    let later = now + DAY * 244;
    let renewed = plan(&settings(), &observed, later).unwrap();
    assert_eq!(renewed.changes, [Change::LeafRenewed { why: "two thirds of its life have passed".into() }]);
    let files = renewed.files.unwrap();
    assert_eq!(files[CA_CRT], observed.files[CA_CRT]);
    assert_ne!(files[TLS_CRT], observed.files[TLS_CRT]);
    assert_eq!(renewed.bundle.as_bytes(), observed.bundle.as_slice());
    assert!(!renewed.bundle_first);
}

#[test]
fn a_ca_rotation_keeps_both_cas_trusted_until_every_replica_serves_the_new_leaf() {
    let s = settings();
    let now = start();
    let mut observed = Observed::default();
    let first = plan(&s, &observed, now).unwrap();
    apply(&mut observed, &first);
    let old_ca = observed.files[CA_CRT].clone();
    let old_leaf = observed.files[TLS_CRT].clone();

    // Two thirds into the CA's ten years (the leaf renewed along the way is not the point).
    let t = now + DAY * 365 * 7;
    let introduce = plan(&s, &observed, t).unwrap();
    assert!(introduce.changes.contains(&Change::CaIntroduced), "{:?}", introduce.changes);
    assert!(introduce.bundle_first);
    assert_eq!(bundle_count(&introduce), 2);
    assert_eq!(introduce.next_since, Some(t));
    assert_eq!(introduce.next, t + s.switch_after);
    apply(&mut observed, &introduce);
    let leaf_meanwhile = observed.files[TLS_CRT].clone();
    assert_ne!(leaf_meanwhile, old_leaf, "the expired leaf was renewed, by the old CA");
    served_as(&leaf_meanwhile, &old_ca, &s.names[0], t).unwrap();

    // Not yet: caBundle has trusted the new CA for less than switch_after.
    let early = plan(&s, &observed, t + Duration::from_secs(30)).unwrap();
    assert_eq!(early.files, None);
    // Nor when caBundle lost the new CA meanwhile (a GitOps re-apply): it is put back first.
    let mut wiped = observed.clone();
    wiped.bundle = old_ca.clone();
    let repaired = plan(&s, &wiped, t + s.switch_after).unwrap();
    assert_eq!(repaired.files, None);
    assert_eq!(bundle_count(&repaired), 2);
    assert!(repaired.bundle_first);

    // Switch: the leaf from the new CA; both stay trusted.
    let switch = plan(&s, &observed, t + s.switch_after).unwrap();
    assert_eq!(switch.changes, [Change::CaSwitched, Change::LeafRenewed { why: "the CA was switched".into() }]);
    assert_eq!(bundle_count(&switch), 2);
    apply(&mut observed, &switch);
    assert_eq!(observed.files[CA_PREVIOUS_CRT], old_ca);
    assert!(!observed.files.contains_key(CA_NEXT_CRT));
    served_as(&observed.files[TLS_CRT], &observed.files[CA_CRT], &s.names[0], t).unwrap();

    // Replicas still serve the old leaf: nothing is retired.
    let waiting = plan(&s, &observed, t + s.switch_after * 2).unwrap();
    assert_eq!(waiting.files, None);
    assert_eq!(bundle_count(&waiting), 2);
    assert_eq!(waiting.next, t + s.switch_after * 2 + Duration::from_secs(30));

    // Every replica serves the new leaf: the old CA leaves the Secret, then caBundle.
    observed.replicas_serve_current = true;
    let retire = plan(&s, &observed, t + s.switch_after * 3).unwrap();
    assert_eq!(retire.changes, [Change::CaRetired]);
    assert!(!retire.bundle_first);
    assert_eq!(retire.bundle.as_bytes(), observed.files[CA_CRT].as_slice());
    assert!(!retire.files.unwrap().contains_key(CA_PREVIOUS_CRT));
}

#[test]
fn garbage_is_replaced_with_the_reason_and_a_still_valid_ca_stays_trusted() {
    let s = settings();
    let now = start();
    let mut observed = Observed::default();
    let first = plan(&s, &observed, now).unwrap();
    apply(&mut observed, &first);
    let old_ca = observed.files[CA_CRT].clone();

    // The CA key is junk: everything is made again, the old CA still trusted.
    let mut broken = observed.clone();
    broken.files.insert(CA_KEY.into(), b"junk".to_vec());
    let remade = plan(&s, &broken, now).unwrap();
    assert_eq!(
        remade.changes,
        [Change::Created {
            replaced: Some(
                "ca.key: no PEM private key (PKCS#8, PKCS#1 or SEC1) in the file: no PEM section (-----BEGIN …-----) in it".into()
            )
        }]
    );
    let files = remade.files.clone().unwrap();
    assert_eq!(files[CA_PREVIOUS_CRT], old_ca);
    assert_eq!(bundle_count(&remade), 2);
    assert!(remade.bundle_first);

    // A leaf whose key is another's: renewed from the same CA.
    let mut mismatched = observed.clone();
    let other = plan(&s, &Observed::default(), now).unwrap().files.unwrap();
    mismatched.files.insert(TLS_KEY.into(), other[TLS_KEY].clone());
    let renewed = plan(&s, &mismatched, now).unwrap();
    assert_eq!(
        renewed.changes,
        [Change::LeafRenewed { why: "tls.key: the private key does not match the certificate in tls.crt".into() }]
    );
    // A leaf signed by another CA.
    let mut foreign = observed.clone();
    foreign.files.insert(TLS_CRT.into(), other[TLS_CRT].clone());
    foreign.files.insert(TLS_KEY.into(), other[TLS_KEY].clone());
    let renewed = plan(&s, &foreign, now).unwrap();
    assert!(
        matches!(&renewed.changes[..], [Change::LeafRenewed { why }] if why.starts_with("a client that trusts ca.crt refuses it: invalid peer certificate: BadSignature")),
        "{:?}",
        renewed.changes
    );
    // A Service renamed: the leaf must name the new names.
    let renamed = Settings::for_service("webhook", "keyward-system");
    let renewed = plan(&renamed, &observed, now).unwrap();
    assert_eq!(renewed.changes, [Change::LeafRenewed { why: "it does not name webhook.keyward-system.svc".into() }]);
}

#[test]
fn an_admin_can_ask_for_a_new_leaf_or_a_ca_rotation() {
    let s = settings();
    let now = start();
    let mut observed = Observed::default();
    let first = plan(&s, &observed, now).unwrap();
    apply(&mut observed, &first);

    observed.renew_requested = true;
    let renewed = plan(&s, &observed, now).unwrap();
    assert_eq!(
        renewed.changes,
        [Change::LeafRenewed { why: "renewal requested (keyward.io/renew-certificate)".into() }]
    );
    observed.renew_requested = false;

    observed.rotate_requested = true;
    let introduced = plan(&s, &observed, now).unwrap();
    assert_eq!(introduced.changes, [Change::CaIntroduced]);
    apply(&mut observed, &introduced);
    // Asked again while it is under way: nothing new starts, the request is still answered
    // by a write (that removes its annotation).
    let again = plan(&s, &observed, now).unwrap();
    assert!(again.changes.is_empty());
    assert_eq!(again.files.as_ref(), Some(&observed.files));
}

#[test]
fn a_wiped_ca_bundle_is_restored_without_touching_the_secret() {
    let now = start();
    let mut observed = Observed::default();
    let first = plan(&settings(), &observed, now).unwrap();
    apply(&mut observed, &first);
    observed.bundle.clear();
    let repaired = plan(&settings(), &observed, now).unwrap();
    assert_eq!(repaired.files, None);
    assert_eq!(repaired.bundle.as_bytes(), observed.files[CA_CRT].as_slice());
    assert!(repaired.bundle_first);
}

#[test]
fn settings_refuse_a_ca_that_does_not_outlive_its_leaves() {
    let mut s = settings();
    s.ca_validity = DAY * 365 * 2;
    assert_eq!(
        s.check(),
        Err("the serving CA's validity (63072000s) must be at least three times the leaf's (31536000s): the CA is replaced at two thirds of its life, while leaves it signed are still served".into())
    );
    assert_eq!(settings().check(), Ok(()));
    // Exactly three times is enough (mutation: `<` for `<=` refuses it).
    let s = Settings { ca_validity: DAY * 3, leaf_validity: DAY, ..settings() };
    assert_eq!(s.check(), Ok(()));
}

/// A rotation's next CA is used only whole: a Secret holding `ca-next.crt` without its key
/// (or the key alone) loses it, and says so (mutation: `||` for `&&` keeps a lone half).
#[test]
fn half_of_a_next_ca_is_dropped_with_the_reason() {
    let now = start();
    let mut observed = Observed::default();
    let first = plan(&settings(), &observed, now).unwrap();
    apply(&mut observed, &first);
    let other = Ca::mint("another CA", now, DAY * 3650).unwrap();
    for (file, pem) in [(CA_NEXT_CRT, other.cert_pem().as_bytes()), (CA_NEXT_KEY, other.key_pem().as_bytes())] {
        let mut half = observed.clone();
        half.files.insert(file.into(), pem.to_vec());
        let fixed = plan(&settings(), &half, now).unwrap();
        assert!(
            matches!(fixed.changes.as_slice(), [Change::Dropped { file: CA_NEXT_CRT, .. }]),
            "{file}: {:?}",
            fixed.changes
        );
        let files = fixed.files.unwrap();
        assert!(!files.contains_key(CA_NEXT_CRT) && !files.contains_key(CA_NEXT_KEY), "{file}");
        assert_eq!(fixed.next_since, None);
    }
}

/// A leaf renewed late in its CA's life lives past the CA's own two thirds: the next look is
/// when the CA is due, not the leaf (mutation: `!` deleted before the `ca-next` test).
#[test]
fn the_next_look_is_the_cas_two_thirds_when_that_comes_before_the_leafs() {
    let now = start();
    let mut observed = Observed::default();
    let first = plan(&settings(), &observed, now).unwrap();
    apply(&mut observed, &first);
    observed.renew_requested = true;
    let late = plan(&settings(), &observed, now + DAY * 2300).unwrap();
    let files = late.files.unwrap();
    let ca_due = renew_at(&files[CA_CRT]);
    assert!(ca_due < renew_at(&files[TLS_CRT]), "the new leaf is due after the CA");
    assert_eq!(late.next, ca_due);
}

/// The CA a rotation replaced stays trusted only while it is a CA and valid: an expired one,
/// or a certificate that is no CA, leaves the Secret and `caBundle` (mutation: `||` for `&&`
/// in that check).
#[test]
fn a_previous_ca_that_is_expired_or_no_ca_is_dropped() {
    let now = start();
    let mut observed = Observed::default();
    let first = plan(&settings(), &observed, now).unwrap();
    apply(&mut observed, &first);
    let expired = Ca::mint("expired CA", now - DAY * 400, DAY * 100).unwrap();
    let leaf = first.files.as_ref().unwrap()[TLS_CRT].clone();
    for (what, pem) in [("expired", expired.cert_pem().as_bytes().to_vec()), ("no CA", leaf)] {
        let mut with = observed.clone();
        with.files.insert(CA_PREVIOUS_CRT.into(), pem);
        let fixed = plan(&settings(), &with, now).unwrap();
        assert_eq!(
            fixed.changes,
            [Change::Dropped { file: CA_PREVIOUS_CRT, why: "not a valid CA certificate".into() }],
            "{what}"
        );
        assert!(!fixed.files.as_ref().unwrap().contains_key(CA_PREVIOUS_CRT), "{what}");
        assert_eq!(bundle_count(&fixed), 1, "{what}");
    }
}

/// Just before the leaf is due, the next look is a second away, never sooner: a requeue in
/// the past would spin the loop (mutation: `now - 1s` for `now + 1s` in the last clamp).
#[test]
fn the_next_look_is_at_least_a_second_away() {
    let now = start();
    let mut observed = Observed::default();
    let first = plan(&settings(), &observed, now).unwrap();
    apply(&mut observed, &first);
    let due = renew_at(&observed.files[TLS_CRT]);
    let just_before = due - Duration::from_millis(500);
    let p = plan(&settings(), &observed, just_before).unwrap();
    assert_eq!(p.files, None, "not due yet");
    assert_eq!(p.next, just_before + Duration::from_secs(1));
}

/// The words of each change's log line name what happened and why (mutation: an empty or
/// made-up description).
#[test]
fn each_change_says_what_happened_in_its_log_line() {
    assert_eq!(Change::Created { replaced: None }.describe(), "serving CA and certificate created");
    assert_eq!(
        Change::Created { replaced: Some("ca.key: junk".into()) }.describe(),
        "serving CA and certificate replaced, since the Secret's could not be used: ca.key: junk"
    );
    assert_eq!(
        Change::Dropped { file: CA_NEXT_CRT, why: "no key".into() }.describe(),
        "ca-next.crt dropped from the Secret: no key"
    );
    assert!(Change::CaSwitched.describe().contains("signed by the new CA"));
}
