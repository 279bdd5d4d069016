//! Property tests over generated pods: whatever shape the pod has, the patch applies strictly,
//! the result passes validation, and a second call on the result changes nothing.
#![allow(clippy::unwrap_used)] // a panic is the test failure report

mod support;

use keyward_engine::ProfileSet;
use proptest::prelude::*;
use serde_json::{json, Map, Value};
use support::*;

/// Which built-in profile the generated pod is shaped for, with a requester it allows.
fn target() -> impl Strategy<Value = (Value, Value, &'static str, &'static str)> {
    prop_oneof![
        Just((
            json!({"app.kubernetes.io/name": "ta-lmes"}),
            json!({"apiVersion": "trustyai.opendatahub.io/v1alpha1", "kind": "LMEvalJob", "name": "job-1", "uid": "u1", "controller": true}),
            "team-a",
            LMEVAL_OPERATOR,
        )),
        Just((
            json!({"ray.io/is-ray-node": "yes", "ray.io/cluster": "rc"}),
            json!({"apiVersion": "ray.io/v1", "kind": "RayCluster", "name": "rc", "uid": "u2", "controller": true}),
            "ray",
            KUBERAY_OPERATOR,
        )),
        Just((
            json!({"serving.kserve.io/inferencegraph": "g1"}),
            json!({"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "g1-abc", "uid": "u3", "controller": true}),
            "models",
            REPLICASET_CONTROLLER,
        )),
    ]
}

#[derive(Debug, Clone)]
struct ContainerShape {
    sidecar: bool,
    mounts: Vec<usize>,
    env: Option<Vec<usize>>,
}

fn container_shape() -> impl Strategy<Value = ContainerShape> {
    (
        any::<bool>(),
        proptest::collection::vec(0usize..4, 0..4),
        proptest::option::of(proptest::collection::vec(0usize..6, 0..4)),
    )
        .prop_map(|(sidecar, mounts, env)| ContainerShape { sidecar, mounts, env })
}

#[derive(Debug, Clone)]
struct PodShape {
    init: Vec<ContainerShape>,
    main: Vec<ContainerShape>,
    user_volumes: usize,
    api_token: bool,
    sa_fields: u8,
    annotations: Option<Vec<(String, String)>>,
    volumes_key_absent: bool,
    /// Projected tokens for the API server besides kube-api-access-* (each mounted by every
    /// container), placed before the user's volumes so that removals shift indexes.
    extra_tokens: usize,
}

fn pod_shape() -> impl Strategy<Value = PodShape> {
    (
        proptest::collection::vec(container_shape(), 0..3),
        proptest::collection::vec(container_shape(), 1..4),
        0usize..4,
        any::<bool>(),
        0u8..4,
        proptest::option::of(proptest::collection::vec(("[a-z~/.]{1,8}", "[ -~]{0,8}"), 0..3)),
        any::<bool>(),
        0usize..3,
    )
        .prop_map(
            |(init, main, user_volumes, api_token, sa_fields, annotations, volumes_key_absent, extra_tokens)| {
                PodShape {
                    init,
                    main,
                    user_volumes,
                    api_token,
                    sa_fields,
                    annotations,
                    volumes_key_absent,
                    extra_tokens,
                }
            },
        )
}

fn build(shape: &PodShape, labels: &Value, owner: &Value) -> Value {
    let mut volumes: Vec<Value> = (0..shape.extra_tokens)
        .map(|i| {
            json!({"name": format!("api-token-{i}"), "projected": {"defaultMode": 420, "sources": [
            {"serviceAccountToken": {"expirationSeconds": 3600, "path": "token"}}]}})
        })
        .collect();
    volumes.extend((0..shape.user_volumes).map(|i| json!({"name": format!("data-{i}"), "emptyDir": {}})));
    if shape.api_token {
        volumes.push(json!({"name": "kube-api-access-x7k2p", "projected": {"defaultMode": 420, "sources": [
            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
            {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}}
        ]}}));
    }
    let container = |prefix: &str, i: usize, c: &ContainerShape, init: bool| {
        let mut obj = Map::new();
        obj.insert("name".into(), json!(format!("{prefix}-{i}")));
        obj.insert("image".into(), json!("busybox:1.36"));
        obj.insert("terminationMessagePath".into(), json!("/dev/termination-log"));
        if init && c.sidecar {
            obj.insert("restartPolicy".into(), json!("Always"));
        }
        let mut mounts: Vec<Value> = Vec::new();
        for m in &c.mounts {
            if *m < shape.user_volumes && !mounts.iter().any(|x| x["name"] == json!(format!("data-{m}"))) {
                mounts.push(json!({"name": format!("data-{m}"), "mountPath": format!("/data/{m}")}));
            }
        }
        if shape.api_token {
            mounts.push(json!({"name": "kube-api-access-x7k2p", "readOnly": true, "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}));
        }
        for t in 0..shape.extra_tokens {
            mounts.push(json!({"name": format!("api-token-{t}"), "readOnly": true, "mountPath": format!("/var/run/secrets/extra-{t}")}));
        }
        if !mounts.is_empty() {
            obj.insert("volumeMounts".into(), Value::Array(mounts));
        }
        if let Some(env) = &c.env {
            let vars: Vec<Value> = env.iter().map(|e| json!({"name": format!("USER_VAR_{e}"), "value": "x"})).collect();
            obj.insert("env".into(), Value::Array(vars));
        }
        Value::Object(obj)
    };
    let init: Vec<Value> = shape.init.iter().enumerate().map(|(i, c)| container("init", i, c, true)).collect();
    let main: Vec<Value> = shape.main.iter().enumerate().map(|(i, c)| container("app", i, c, false)).collect();

    let mut spec = Map::new();
    if !(volumes.is_empty() && shape.volumes_key_absent) {
        spec.insert("volumes".into(), Value::Array(volumes));
    }
    if !init.is_empty() {
        spec.insert("initContainers".into(), Value::Array(init));
    }
    spec.insert("containers".into(), Value::Array(main));
    if !shape.api_token {
        spec.insert("automountServiceAccountToken".into(), json!(false));
    }
    match shape.sa_fields {
        0 => {}
        1 => {
            spec.insert("serviceAccountName".into(), json!("default"));
        }
        _ => {
            spec.insert("serviceAccountName".into(), json!("runner"));
            spec.insert("serviceAccount".into(), json!("runner"));
        }
    }
    let mut metadata = json!({"generateName": "pod-", "labels": labels, "ownerReferences": [owner]});
    if let Some(a) = &shape.annotations {
        let map: Map<String, Value> = a.iter().map(|(k, v)| (k.clone(), json!(v))).collect();
        metadata["annotations"] = Value::Object(map);
    }
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec})
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn patch_applies_result_is_valid_and_second_call_is_a_no_op(
        (labels, owner, namespace, user) in target(),
        shape in pod_shape(),
    ) {
        let pod = build(&shape, &labels, &owner);
        // `admit` applies the patch strictly, validates, and re-runs the engine on the result.
        let (decision, after) = admit(&create(namespace, user), &pod, &examples());
        prop_assert!(decision.profile.is_some());
        // Every container (init, sidecar, regular) got the audience-bound token.
        for field in ["initContainers", "containers"] {
            for c in after["spec"][field].as_array().into_iter().flatten() {
                prop_assert!(c["volumeMounts"].as_array().unwrap().iter().any(|m| m["name"] == "keyward-sa-token"));
            }
        }
        // Nothing the user had is lost, bar what the API-token removal takes by design.
        for i in 0..shape.user_volumes {
            let name = format!("data-{i}");
            prop_assert!(after["spec"]["volumes"].as_array().unwrap().iter().any(|v| v["name"] == json!(name)));
        }
    }
}

/// Any JSON at all, nested a few levels, with keys that look like pod fields.
fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        "[ -~]{0,12}".prop_map(Value::String),
    ];
    let keys = prop_oneof![
        Just("metadata".to_string()),
        Just("labels".to_string()),
        Just("spec".to_string()),
        Just("containers".to_string()),
        Just("volumes".to_string()),
        Just("volumeMounts".to_string()),
        Just("env".to_string()),
        Just("name".to_string()),
        Just("ownerReferences".to_string()),
        "[a-z/~.]{1,10}",
    ];
    leaf.prop_recursive(4, 48, 6, move |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            proptest::collection::btree_map(keys.clone(), inner, 0..5)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Garbage in never panics; whatever is admitted with a patch, the patch applies.
    #[test]
    fn arbitrary_objects_never_panic(object in any_json(), labelled in any::<bool>()) {
        let mut object = object;
        if labelled {
            // Steer some inputs into a profile, so the injectors see garbage too.
            if let Value::Object(map) = &mut object {
                map.insert("metadata".into(), json!({"labels": {"app.kubernetes.io/name": "ta-lmes"},
                    "ownerReferences": [{"apiVersion": "trustyai.opendatahub.io/v1alpha1", "kind": "LMEvalJob", "name": "j", "uid": "u", "controller": true}]}));
            }
        }
        let decision = decide(&create("team-a", LMEVAL_OPERATOR), &object, &examples());
        if decision.allowed() && !decision.patch().is_empty() {
            let patch: json_patch::Patch = serde_json::from_value(patch_json(&decision)).unwrap();
            let mut out = object.clone();
            prop_assert!(json_patch::patch(&mut out, &patch).is_ok());
        }
    }
}

// === generated profiles ===

/// One kind's settings, as YAML under `spec.inject`, and the env var names it sets (so pods can
/// be generated that already set some of them).
#[derive(Debug, Clone)]
struct KindYaml {
    yaml: String,
    envs: Vec<String>,
}

fn template(kind: &'static str) -> impl Strategy<Value = String> {
    prop_oneof![
        Just(format!("{kind}-fixed")),
        Just(format!("\"{{owner.name}}-{kind}\"")),
        Just(format!("\"{{namespace}}-{kind}\"")),
        Just(format!("\"{{label:team}}-{kind}\"")),
    ]
}

fn env(name: &'static str) -> impl Strategy<Value = Option<String>> {
    proptest::option::of(Just(name.to_string()))
}

/// `provider: keyward` where the name allows it (keyward issues per owner), else `user`.
fn provider(name: &str, keyward: bool, per_owner: bool) -> &'static str {
    let fits = if per_owner {
        name.contains("{owner.name}")
    } else {
        !name.contains("{owner.name}") && !name.contains("{label:")
    };
    if keyward && fits {
        "keyward"
    } else {
        "user"
    }
}

fn client_certificate() -> impl Strategy<Value = KindYaml> {
    (template("cc"), any::<bool>(), env("CC_CERT"), env("CC_KEY"), any::<bool>()).prop_map(|(secret, custom_volume, cert, key, keyward)| {
        let mut yaml = format!(
            "    clientCertificate:\n      secretName: {secret}\n      mountPath: /var/run/secrets/keyward/client\n      provider: {}\n",
            provider(&secret, keyward, true)
        );
        if custom_volume {
            yaml.push_str("      volumeName: gen-client\n");
        }
        let mut envs = Vec::new();
        if let Some(e) = cert {
            yaml.push_str(&format!("      certFileEnv: {e}\n"));
            envs.push(e);
        }
        if let Some(e) = key {
            yaml.push_str(&format!("      keyFileEnv: {e}\n"));
            envs.push(e);
        }
        KindYaml { yaml, envs }
    })
}

fn server_ca() -> impl Strategy<Value = KindYaml> {
    (any::<bool>(), template("ca"), proptest::option::of(Just("root.pem")), env("CA_FILE"), any::<bool>()).prop_map(
        |(config_map, name, key, file, keyward)| {
            let field = if config_map { "configMapName" } else { "secretName" };
            let mut yaml = format!("    serverCA:\n      {field}: {name}\n      mountPath: /etc/keyward/ca\n");
            if provider(&name, keyward, false) == "keyward" {
                yaml.push_str("      provider: keyward\n      source: {secret: {name: server-tls}}\n");
            }
            if let Some(k) = key {
                yaml.push_str(&format!("      key: {k}\n"));
            }
            let envs: Vec<String> = file.into_iter().collect();
            for e in &envs {
                yaml.push_str(&format!("      fileEnv: {e}\n"));
            }
            KindYaml { yaml, envs }
        },
    )
}

fn token() -> impl Strategy<Value = KindYaml> {
    (template("tok"), proptest::option::of(Just("api-key")), env("TOKEN_FILE"), env("TOKEN"), any::<bool>()).prop_map(
        |(secret, key, file, value, keyward)| {
            let mut yaml = format!(
                "    token:\n      secretName: {secret}\n      mountPath: /var/run/secrets/keyward/token\n      provider: {}\n",
                provider(&secret, keyward, true)
            );
            if let Some(k) = key {
                yaml.push_str(&format!("      key: {k}\n"));
            }
            let mut envs = Vec::new();
            if let Some(e) = file {
                yaml.push_str(&format!("      fileEnv: {e}\n"));
                envs.push(e);
            }
            if let Some(e) = value {
                yaml.push_str(&format!("      valueEnv: {e}\n"));
                envs.push(e);
            }
            KindYaml { yaml, envs }
        },
    )
}

fn service_account_token() -> impl Strategy<Value = KindYaml> {
    (600i64..=172_800, prop_oneof![Just("token"), Just("sub/dir/token")], env("SA_TOKEN_FILE")).prop_map(
        |(expiration, path, file)| {
            let mut yaml = format!(
                "    serviceAccountToken:\n      audience: gen.example\n      expirationSeconds: {expiration}\n      path: {path}\n      mountPath: /var/run/secrets/keyward/sa-token\n"
            );
            let envs: Vec<String> = file.into_iter().collect();
            for e in &envs {
                yaml.push_str(&format!("      fileEnv: {e}\n"));
            }
            KindYaml { yaml, envs }
        },
    )
}

fn service_account() -> impl Strategy<Value = KindYaml> {
    (prop_oneof![Just("gen-sa"), Just("\"{label:team}-sa\"")], prop_oneof![Just("keep"), Just("remove")], any::<bool>())
        .prop_map(|(name, token, keyward)| {
            let mut yaml = format!("    serviceAccount:\n      name: {name}\n      apiToken: {token}\n");
            if keyward && !name.contains('{') {
                yaml.push_str("      provider: keyward\n      bindings: [{kind: ClusterRole, name: gen-reader}]\n");
            }
            KindYaml { yaml, envs: vec![] }
        })
}

fn plain_env() -> impl Strategy<Value = KindYaml> {
    prop_oneof![Just("token"), Just(""), Just("a value with \\\"quotes\\\"")].prop_map(|value| KindYaml {
        yaml: format!("    env:\n      - {{name: GEN_MODE, value: \"{value}\"}}\n"),
        envs: vec!["GEN_MODE".into()],
    })
}

fn api_token() -> impl Strategy<Value = KindYaml> {
    Just(KindYaml { yaml: "    apiToken: remove\n".into(), envs: vec![] })
}

/// A profile of any kinds (at least one), with every option, for pods labelled `app: gen`.
#[derive(Debug, Clone)]
struct GeneratedProfile {
    yaml: String,
    envs: Vec<String>,
}

fn generated_profile() -> impl Strategy<Value = GeneratedProfile> {
    (
        proptest::option::of(client_certificate()),
        proptest::option::of(server_ca()),
        proptest::option::of(token()),
        proptest::option::of(service_account_token()),
        proptest::option::of(service_account()),
        (proptest::option::of(plain_env()), proptest::option::of(api_token())),
        prop_oneof![Just(None), Just(Some("[app-0, init-0, missing]")), Just(Some("[app-1]"))],
        (any::<bool>(), any::<bool>()),
    )
        .prop_filter("at least one kind", |(a, b, c, d, e, (f, g), _, _)| {
            a.is_some() || b.is_some() || c.is_some() || d.is_some() || e.is_some() || f.is_some() || g.is_some()
        })
        .prop_map(|(a, b, c, d, e, (f, g), containers, (keep_user, skip))| {
            let kinds: Vec<KindYaml> = [a, b, c, d, f, e, g].into_iter().flatten().collect();
            let mut yaml = "apiVersion: keyward.io/v1alpha1\nkind: InjectionProfile\nmetadata: {name: gen}\nspec:\n  selector: {matchLabels: {app: gen}}\n  controllerOwners: [{apiGroup: batch, kind: Job}]\n  requesters: {usernames: [gen-bot]}\n".to_string();
            if let Some(list) = containers {
                yaml.push_str(&format!("  containers: {list}\n"));
            }
            if keep_user {
                yaml.push_str("  onEnvConflict: keepUser\n");
            }
            if skip {
                yaml.push_str("  onConflict: skip\n");
            }
            yaml.push_str("  inject:\n");
            let mut envs = Vec::new();
            for k in kinds {
                yaml.push_str(&k.yaml);
                envs.extend(k.envs);
            }
            GeneratedProfile { yaml, envs }
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Any profile, any pod shape: admitted ones get a patch that applies strictly, a valid pod,
    /// and a no-op second call; refused ones get no patch and a reason.
    #[test]
    fn generated_profiles_keep_the_three_properties(
        profile in generated_profile(),
        shape in pod_shape(),
        with_team in any::<bool>(),
        preset in proptest::collection::vec((0usize..8, any::<bool>()), 0..3),
        attested in any::<bool>(),
    ) {
        let set = ProfileSet::from_sources([("gen.yaml".to_string(), profile.yaml.clone())])
            .unwrap_or_else(|e| panic!("generated profile does not load: {e}\n{}", profile.yaml));
        let labels = if with_team { json!({"app": "gen", "team": "blue"}) } else { json!({"app": "gen"}) };
        let owner = json!({"apiVersion": "batch/v1", "kind": "Job", "name": "job-1", "uid": "u1", "controller": true});
        let mut pod = build(&shape, &labels, &owner);
        // Some containers already set one of the profile's env vars: to a value of their own.
        for (i, own) in preset {
            if let (Some(name), Some(c)) = (profile.envs.get(i % profile.envs.len().max(1)), pod["spec"]["containers"][0].as_object_mut()) {
                let value = if own { "mine".to_string() } else { "/elsewhere".to_string() };
                let env = c.entry("env").or_insert_with(|| json!([]));
                if let Some(list) = env.as_array_mut() {
                    if !list.iter().any(|e| e["name"] == json!(name)) {
                        list.push(json!({"name": name, "value": value}));
                    }
                }
            }
        }
        let attestor = TestAttestor { key: Some(7) };
        let facts = if attested { create("team-a", "gen-bot").attested_by(&attestor) } else { create("team-a", "gen-bot") };
        let decision = decide(&facts, &pod, &set);
        if decision.allowed() {
            let after = apply(&pod, &decision);
            assert_valid(&after);
            // `apiToken: remove` leaves no token for the API server anywhere in the pod.
            if profile.yaml.contains("apiToken: remove") && decision.reason == keyward_engine::Reason::Injected {
                let volumes = after["spec"]["volumes"].as_array().cloned().unwrap_or_default();
                let tokens: Vec<&Value> = volumes.iter().filter(|v| {
                    v["projected"]["sources"].as_array().is_some_and(|s| s.iter().any(|p| p["serviceAccountToken"].is_object() && p["serviceAccountToken"]["audience"].is_null()))
                }).collect();
                prop_assert!(tokens.is_empty(), "API tokens left: {tokens:?}");
            }
            let again = decide(&facts, &after, &set);
            prop_assert!(again.allowed(), "second call denied: {:?}", again.message());
            prop_assert!(again.patch().is_empty(), "second call not a no-op: {}", patch_json(&again));
        } else {
            prop_assert!(decision.patch().is_empty());
            let message = decision.message().unwrap_or_default();
            prop_assert!(message.starts_with("keyward: profile \"gen\""), "{message}");
        }
    }
}

// === hostile envelopes and bodies ===

fn any_string() -> impl Strategy<Value = Value> {
    prop_oneof![
        "[ -~]{0,16}".prop_map(Value::String),
        Just(Value::String("CREATE".into())),
        Just(Value::Null),
        any::<i64>().prop_map(|n| json!(n)),
    ]
}

fn any_envelope() -> impl Strategy<Value = Value> {
    (
        prop_oneof![Just(json!("admission.k8s.io/v1")), any_string()],
        prop_oneof![Just(json!("AdmissionReview")), any_string()],
        any_string(),
        prop_oneof![Just(json!({"group": "", "version": "v1", "resource": "pods"})), any_json()],
        prop_oneof![Just(json!("CREATE")), any_string()],
        prop_oneof![Just(json!({"username": "system:serviceaccount:a:trustyai-service-operator-controller-manager"})), any_json()],
        any_json(),
        any::<bool>(),
    )
        .prop_map(|(api_version, kind, uid, resource, operation, user_info, object, labelled)| {
            let mut object = object;
            if labelled {
                if let Value::Object(map) = &mut object {
                    map.insert("metadata".into(), json!({"labels": {"app.kubernetes.io/name": "ta-lmes"},
                        "ownerReferences": [{"apiVersion": "trustyai.opendatahub.io/v1alpha1", "kind": "LMEvalJob", "name": "j", "uid": "u", "controller": true}]}));
                }
            }
            json!({"apiVersion": api_version, "kind": kind, "request": {
                "uid": uid, "resource": resource, "operation": operation, "namespace": "team-a",
                "userInfo": user_info, "object": object}})
        })
}

/// Whatever the body, the answer is a well-formed response or a one-line refusal.
fn answer(body: &[u8], set: &ProfileSet) {
    use keyward_engine::engine::decide_object;
    use keyward_engine::review;
    for request in [review::read_request(body, set.annotations_read()), review::parse_request(body)] {
        match request {
            Ok(request) => {
                let decision = decide_object(&request.facts(), &request.object, set);
                let response: Value = serde_json::from_slice(&review::respond(&request.uid, &decision)).unwrap();
                assert_eq!(response["response"]["uid"], json!(request.uid.as_ref()));
                assert_eq!(response["response"]["allowed"], json!(decision.allowed()));
            }
            Err(e) => assert_eq!(e.to_string().lines().count(), 1, "{e}"),
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_envelopes_never_panic(envelope in any_envelope()) {
        answer(&serde_json::to_vec(&envelope).unwrap(), &examples());
    }

    #[test]
    fn arbitrary_bytes_never_panic(body in proptest::collection::vec(any::<u8>(), 0..512), valid_prefix in any::<bool>()) {
        let mut bytes = if valid_prefix { br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","#.to_vec() } else { Vec::new() };
        bytes.extend(body);
        answer(&bytes, &examples());
    }
}

// === the two readings of a review: the pod read in the review's pass, or kept raw ===

/// An attestor whose nonce never changes, so that two readings of one review can be compared
/// byte for byte.
#[derive(Debug)]
struct Steady(TestAttestor);

impl keyward_engine::Attestor for Steady {
    fn now(&self) -> u64 {
        self.0.now()
    }
    fn nonce(&self) -> String {
        "steady".into()
    }
    fn sign(&self, payload: &[u8]) -> Option<keyward_engine::attest::Signature> {
        self.0.sign(payload)
    }
    fn verifies(&self, payload: &[u8], key_id: &str, tag: &str) -> bool {
        self.0.verifies(payload, key_id, tag)
    }
}

/// The webhook's answer to `body` when the pod is read in the review's pass (its metadata
/// decoded as the envelope is read: the one-pass reading), and when the review's object is kept
/// raw and read after (the old reading): the same bytes, or the same refusal. With the
/// attestation key loaded, as keyward serves, so that attested pods' specs are read into the
/// tree the scan and the binding share.
fn same_answer_either_reading(body: &[u8], set: &ProfileSet) -> Result<(), TestCaseError> {
    use keyward_engine::engine::decide_object;
    use keyward_engine::review;
    use keyward_engine::Attestor;
    let attestor = Steady(TestAttestor { key: Some(7) });
    let answer = |request: &review::AdmissionRequest<'_>| {
        let facts = request.facts().admitting(Some(&attestor as &dyn Attestor));
        review::respond(&request.uid, &decide_object(&facts, &request.object, set))
    };
    match (review::read_request(body, set.annotations_read()), review::parse_request(body)) {
        (Ok(read), Ok(raw)) => {
            let (a, b) = (answer(&read), answer(&raw));
            prop_assert_eq!(String::from_utf8_lossy(&a), String::from_utf8_lossy(&b));
        }
        (Err(a), Err(b)) => prop_assert_eq!(a.to_string(), b.to_string()),
        (a, b) => prop_assert!(false, "one reading failed: {:?} / {:?}", a.err(), b.err()),
    }
    Ok(())
}

/// The built-ins and the examples, as the benchmarks serve them.
fn served() -> ProfileSet {
    ProfileSet::builtin().unwrap().overlay(examples()).unwrap()
}

const OPERATORS: [&str; 4] = [
    "system:serviceaccount:lm-eval:lm-eval-controller-manager",
    "system:serviceaccount:opendatahub:trustyai-service-operator-controller-manager",
    "system:serviceaccount:ray-system:kuberay-operator",
    "system:serviceaccount:kubeflow:ml-pipeline",
];

/// A review of a pod the served profiles select (or not): the metadata and spec of the
/// fixtures' pods, crossed, or a spec that is `null`, missing or anything at all; its fields in
/// the apiserver's order or not.
fn any_pod_review() -> impl Strategy<Value = String> {
    let pods: Vec<Value> =
        ["lmeval-fms-driver-pod.json", "lmeval-driver-pod.json", "kuberay-worker-pod.json"].map(fixture).to_vec();
    let metadata = prop::sample::select(
        pods.iter()
            .map(|p| p["metadata"].to_string())
            .chain([json!({}).to_string(), "null".into()])
            .collect::<Vec<_>>(),
    );
    let spec = prop_oneof![
        3 => prop::sample::select(pods.iter().map(|p| Some(p["spec"].to_string())).collect::<Vec<_>>()),
        1 => Just(Some("null".to_string())),
        1 => Just(None),
        1 => any_json().prop_map(|v| Some(v.to_string())),
    ];
    (metadata, spec, any::<bool>(), any::<bool>(), prop::sample::select(OPERATORS.to_vec())).prop_map(
        |(metadata, spec, metadata_first, facts_first, user)| {
            let metadata = format!(r#""metadata":{metadata}"#);
            let object = match (spec, metadata_first) {
                (None, _) => format!(r#"{{"kind":"Pod",{metadata}}}"#),
                (Some(spec), true) => format!(r#"{{"kind":"Pod",{metadata},"spec":{spec}}}"#),
                (Some(spec), false) => format!(r#"{{"kind":"Pod","spec":{spec},{metadata}}}"#),
            };
            let facts = format!(r#""namespace":"team-a","userInfo":{{"username":"{user}"}}"#);
            let request = if facts_first {
                format!(r#"{{"uid":"u-1","operation":"CREATE","resource":{{"group":"","version":"v1","resource":"pods"}},{facts},"object":{object}}}"#)
            } else {
                format!(r#"{{"uid":"u-1","operation":"CREATE","resource":{{"group":"","version":"v1","resource":"pods"}},"object":{object},{facts}}}"#)
            };
            format!(r#"{{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{request}}}"#)
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1024, ..ProptestConfig::default() })]

    #[test]
    fn the_one_pass_reading_and_the_raw_one_answer_alike(envelope in any_envelope()) {
        same_answer_either_reading(&serde_json::to_vec(&envelope).unwrap(), &served())?;
    }

    #[test]
    fn the_one_pass_reading_and_the_raw_one_answer_alike_on_real_pods(review in any_pod_review()) {
        same_answer_either_reading(review.as_bytes(), &served())?;
    }
}

/// Every pod the tests hold, created by the operator each profile expects, in the order the
/// apiserver writes a review (metadata before spec).
#[test]
fn on_every_fixture_the_one_pass_reading_and_the_raw_one_answer_alike() {
    let set = served();
    let dir = format!("{}/../tests/fixtures", env!("CARGO_MANIFEST_DIR"));
    let mut pods = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "json") {
            continue;
        }
        let doc: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let pod = doc.pointer("/request/object").cloned().unwrap_or(doc);
        let metadata = serde_json::to_string(&pod["metadata"]).unwrap();
        let spec = serde_json::to_string(&pod["spec"]).unwrap();
        for user in OPERATORS {
            let body = format!(
                r#"{{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{{"uid":"u-1","resource":{{"group":"","version":"v1","resource":"pods"}},"namespace":"team-a","operation":"CREATE","userInfo":{{"username":"{user}"}},"object":{{"apiVersion":"v1","kind":"Pod","metadata":{metadata},"spec":{spec}}}}}}}"#
            );
            if let Err(e) = same_answer_either_reading(body.as_bytes(), &set) {
                panic!("{}, created by {user}: {e}", path.display());
            }
        }
        pods += 1;
    }
    assert!(pods >= 10, "only {pods} pods among the fixtures");
}
