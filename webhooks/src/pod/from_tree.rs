//! The spec view of [`super::spec`], read from a tree ([`crate::tree`]) instead of the JSON: for
//! a pod whose spec is also bound, so that the spec is read once. Every rule of the JSON scan
//! holds here in the same order (the first error in document order is the one reported, in the
//! same words; each duplicate key is taken in turn, as a streaming decoder meets it; the same
//! limits on containers and hits), and a property test holds the two readings equal
//! (`tests::the_tree_and_the_json_give_the_same_view`).

use std::borrow::Cow;
use std::fmt;

use serde::de::Error as _;

use super::{
    projects_an_api_token as json_projects_an_api_token, At, Container, ContainerList, Element, EnvHit, MountHit,
    Presence, Spec, VolumeHit, Wanted, MAX_CONTAINERS, MAX_HITS,
};
use crate::names::KUBE_API_ACCESS_PREFIX;
use crate::tree::Node;

/// serde_json's words for a value of the wrong type, as its decoder says them.
fn invalid(found: &Node<'_>, expected: &str) -> String {
    serde_json::Error::invalid_type(found.unexpected(), &expected).to_string()
}

fn text<'a>(node: &'a Node<'a>) -> Result<Cow<'a, str>, String> {
    match node {
        Node::Str(s) => Ok(Cow::Borrowed(s.as_ref())),
        other => Err(invalid(other, "a string")),
    }
}

/// `None` for `null`, else what `read` makes of it.
fn nullable<'a, T>(
    node: &'a Node<'a>,
    read: impl FnOnce(&'a Node<'a>) -> Result<T, String>,
) -> Result<Option<T>, String> {
    match node {
        Node::Null => Ok(None),
        other => read(other).map(Some),
    }
}

fn entries<'a>(
    node: &'a Node<'a>,
    expected: impl FnOnce() -> String,
) -> Result<&'a [(Cow<'a, str>, Node<'a>)], String> {
    match node {
        Node::Object(entries) => Ok(entries),
        other => Err(invalid(other, &expected())),
    }
}

fn items<'a>(node: &'a Node<'a>, expected: impl FnOnce() -> String) -> Result<&'a [Node<'a>], String> {
    match node {
        Node::Array(items) => Ok(items),
        other => Err(invalid(other, &expected())),
    }
}

/// The scan of [`super::scan`], over the tree.
pub(super) fn scan<'a>(tree: &'a Node<'a>, wanted: &Wanted<'_>, full: bool) -> Result<Spec<'a>, String> {
    wanted.hits.set(0);
    let fields = match tree {
        Node::Null => return Err("spec is null".into()),
        other => entries(other, || "spec as an object".into())?,
    };
    let mut spec = Spec::default();
    let (mut init_count, mut main_count) = (0, 0);
    for (key, value) in fields {
        match key.as_ref() {
            "volumes" => {
                (spec.volumes, spec.volume_hits) = nullable(value, |v| volumes(v, wanted, full))?
                    .map_or((Presence::Null, Vec::new()), |(n, hits)| (Presence::Present(n), hits));
            }
            "initContainers" => {
                (spec.init_containers, init_count) =
                    nullable(value, |v| containers(v, wanted, ContainerList::Init, full))?.unwrap_or_default();
            }
            "containers" => {
                (spec.containers, main_count) =
                    nullable(value, |v| containers(v, wanted, ContainerList::Main, full))?.unwrap_or_default();
            }
            "serviceAccountName" => spec.service_account_name = Some(nullable(value, text)?),
            "serviceAccount" => spec.service_account = Some(nullable(value, text)?),
            "automountServiceAccountToken" => {
                spec.automount_service_account_token = Some(nullable(value, |v| match v {
                    Node::Bool(b) => Ok(*b),
                    other => Err(invalid(other, "a boolean")),
                })?)
            }
            _ => {}
        }
    }
    spec.hits_truncated = wanted.hits.get() > MAX_HITS;
    spec.container_count = init_count + main_count;
    Ok(spec)
}

/// What names an element: `name` and `mountPath`.
struct Named<'a> {
    name: Cow<'a, str>,
    mount_path: Option<Cow<'a, str>>,
}

/// The element at `what[index]`, named: only its naming fields (the JSON scan's first pass), or
/// (`full`) as the JSON scan decodes an element it keeps whole, with its own words for errors.
fn named<'a>(node: &'a Node<'a>, what: impl fmt::Display, index: usize, full: bool) -> Result<Named<'a>, String> {
    if full {
        return whole(node).map_err(|e| format!("{what}[{index}]: {e}"));
    }
    let fields = entries(node, || format!("{what}[{index}] as an object"))?;
    let (mut name, mut mount_path) = (None, None);
    for (key, value) in fields {
        match key.as_ref() {
            "name" => name = Some(text(value)?),
            "mountPath" => mount_path = Some(text(value)?),
            _ => {}
        }
    }
    let name = name.ok_or_else(|| format!("{what}[{index}]: missing field `name`"))?;
    Ok(Named { name, mount_path })
}

/// An element kept whole, named as serde's derived decoder names it: an object, each field at
/// most once, `name` a string, `mountPath` a string or `null`.
fn whole<'a>(node: &'a Node<'a>) -> Result<Named<'a>, String> {
    let Node::Object(fields) = node else { return Err("expected an object".into()) };
    let (mut name, mut mount_path) = (None, None);
    for (key, value) in fields {
        match key.as_ref() {
            "name" if name.is_some() => return Err(serde_json::Error::duplicate_field("name").to_string()),
            "name" => name = Some(text(value)?),
            "mountPath" if mount_path.is_some() => {
                return Err(serde_json::Error::duplicate_field("mountPath").to_string())
            }
            "mountPath" => mount_path = Some(nullable(value, text)?),
            _ => {}
        }
    }
    let name = name.ok_or_else(|| serde_json::Error::missing_field("name").to_string())?;
    Ok(Named { name, mount_path: mount_path.flatten() })
}

fn volumes<'a>(node: &'a Node<'a>, wanted: &Wanted<'_>, full: bool) -> Result<(usize, Vec<VolumeHit<'a>>), String> {
    let list = items(node, || "spec.volumes as a list".into())?;
    let mut hits = Vec::new();
    // Removing the API token needs each volume's sources, not only its name.
    let whole = full || wanted.api_token;
    for (index, volume) in list.iter().enumerate() {
        let Named { name, .. } = named(volume, "spec.volumes", index, whole)?;
        let api_token = wanted.api_token && (name.starts_with(KUBE_API_ACCESS_PREFIX) || projects_an_api_token(volume));
        let is_wanted = wanted.volume_names.contains(&name.as_ref()) || api_token;
        if is_wanted && wanted.room() {
            hits.push(VolumeHit { index, name, raw: full.then_some(Element::Tree(volume)), api_token });
        }
    }
    Ok((list.len(), hits))
}

fn containers<'a>(
    node: &'a Node<'a>,
    wanted: &Wanted<'_>,
    list: ContainerList,
    full: bool,
) -> Result<(Vec<Container<'a>>, usize), String> {
    let all = items(node, || format!("spec.{} as a list", list.field()))?;
    // Past the limit, only counted.
    let read = all.iter().take(MAX_CONTAINERS).enumerate();
    let out = read.map(|(index, c)| container(c, wanted, list, index, full)).collect::<Result<Vec<_>, _>>()?;
    Ok((out, all.len()))
}

fn container<'a>(
    node: &'a Node<'a>,
    wanted: &Wanted<'_>,
    list: ContainerList,
    index: usize,
    full: bool,
) -> Result<Container<'a>, String> {
    let field = list.field();
    let fields = entries(node, || format!("spec.{field}[{index}] as an object"))?;
    let mut name = None;
    let mut c = Container {
        list,
        index,
        name: Cow::Borrowed(""),
        mounts: Presence::Absent,
        env: Presence::Absent,
        mount_hits: Vec::new(),
        env_hits: Vec::new(),
    };
    for (key, value) in fields {
        match key.as_ref() {
            "name" => name = Some(text(value)?),
            "volumeMounts" => {
                let at = At { list, index, field: "volumeMounts" };
                (c.mounts, c.mount_hits) = nullable(value, |v| mounts(v, wanted, at, full))?
                    .map_or((Presence::Null, Vec::new()), |(n, hits)| (Presence::Present(n), hits));
            }
            "env" => {
                let at = At { list, index, field: "env" };
                (c.env, c.env_hits) = nullable(value, |v| env(v, wanted, at, full))?
                    .map_or((Presence::Null, Vec::new()), |(n, hits)| (Presence::Present(n), hits));
            }
            _ => {}
        }
    }
    c.name = name.ok_or_else(|| format!("spec.{field}[{index}].name: required"))?;
    Ok(c)
}

fn mounts<'a>(
    node: &'a Node<'a>,
    wanted: &Wanted<'_>,
    at: At,
    full: bool,
) -> Result<(usize, Vec<MountHit<'a>>), String> {
    let list = items(node, || format!("{at} as a list"))?;
    let mut hits = Vec::new();
    for (index, mount) in list.iter().enumerate() {
        let Named { name, mount_path } = named(mount, at, index, full)?;
        let mount_path = mount_path.ok_or_else(|| format!("{at}[{index}]: missing field `mountPath`"))?;
        let hit = MountHit { index, volume: name, path: mount_path, raw: full.then_some(Element::Tree(mount)) };
        // At an injection's path, of an injected volume (wherever mounted), or the token's.
        let is_wanted = wanted.mount_paths.contains(&hit.path.as_ref())
            || wanted.volume_names.contains(&hit.volume.as_ref())
            || (wanted.api_token && hit.is_api_token());
        if is_wanted && wanted.room() {
            hits.push(hit);
        }
    }
    Ok((list.len(), hits))
}

fn env<'a>(node: &'a Node<'a>, wanted: &Wanted<'_>, at: At, full: bool) -> Result<(usize, Vec<EnvHit<'a>>), String> {
    let list = items(node, || format!("{at} as a list"))?;
    let mut hits = Vec::new();
    for (index, var) in list.iter().enumerate() {
        let Named { name, .. } = named(var, at, index, full)?;
        if wanted.env_names.contains(&name.as_ref()) && wanted.room() {
            hits.push(EnvHit { index, name, raw: full.then_some(Element::Tree(var)) });
        }
    }
    Ok((list.len(), hits))
}

/// Whether a volume projects a service account token for no audience, decided as the JSON
/// scan decides it: the volume decoded as `{projected: {sources: [{serviceAccountToken:
/// {audience}}]}}` by serde's derived decoder, any error (a duplicate field, a wrong type)
/// meaning no. Objects are judged here; a list where a struct is expected (which serde's
/// decoder reads field by field) is written back to JSON and judged by the JSON scan's code.
fn projects_an_api_token(volume: &Node<'_>) -> bool {
    match token_audiences(volume) {
        Ok(audiences) => audiences.iter().any(|a| a.is_none_or(str::is_empty)),
        Err(Unusual) => {
            let mut json = Vec::new();
            write_json(volume, &mut json);
            let json = String::from_utf8(json).unwrap_or_default();
            serde_json::value::RawValue::from_string(json).is_ok_and(|raw| json_projects_an_api_token(&raw))
        }
    }
}

/// A struct written as a list: judged by the JSON scan's own code.
struct Unusual;

/// The audiences of the volume's projected tokens (`None`: no audience); `Ok(vec![])` also
/// when decoding fails, which means no token.
fn token_audiences<'a>(volume: &'a Node<'a>) -> Result<Vec<Option<&'a str>>, Unusual> {
    let none = Ok(Vec::new());
    let Ok([projected]) = fields(volume, ["projected"]) else { return none };
    let Some(projected) = projected.filter(|p| !matches!(p, Node::Null)) else { return none };
    let Ok([sources]) = fields(struct_of(projected)?, ["sources"]) else { return none };
    let Some(sources) = sources.filter(|s| !matches!(s, Node::Null)) else { return none };
    let Node::Array(sources) = sources else { return none };
    let mut audiences = Vec::new();
    for source in sources {
        if matches!(source, Node::Null) {
            return none;
        }
        let Ok([token]) = fields(struct_of(source)?, ["serviceAccountToken"]) else { return none };
        let Some(token) = token.filter(|t| !matches!(t, Node::Null)) else { continue };
        let Ok([audience]) = fields(struct_of(token)?, ["audience"]) else { return none };
        match audience {
            None | Some(Node::Null) => audiences.push(None),
            Some(Node::Str(a)) => audiences.push(Some(a.as_ref())),
            Some(_) => return none,
        }
    }
    Ok(audiences)
}

/// A node where serde's derived decoder expects a struct: an object (or anything else, which
/// fails to decode), never a list, which that decoder reads in its own way.
fn struct_of<'a>(node: &'a Node<'a>) -> Result<&'a Node<'a>, Unusual> {
    match node {
        Node::Array(_) => Err(Unusual),
        other => Ok(other),
    }
}

/// The values of `names` in an object, each at most once; `Err` when it is not an object or a
/// field is there twice (serde's derived decoder refuses both).
fn fields<'a, const N: usize>(node: &'a Node<'a>, names: [&str; N]) -> Result<[Option<&'a Node<'a>>; N], ()> {
    let Node::Object(entries) = node else { return Err(()) };
    let mut found = [None; N];
    for (key, value) in entries {
        if let Some(n) = names.iter().position(|name| name == key) {
            if found[n].is_some() {
                return Err(());
            }
            found[n] = Some(value);
        }
    }
    Ok(found)
}

/// A node as JSON text, duplicates and order kept.
fn write_json(node: &Node<'_>, out: &mut Vec<u8>) {
    match node {
        Node::Object(entries) => {
            out.push(b'{');
            for (i, (key, value)) in entries.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                let _ = serde_json::to_writer(&mut *out, key);
                out.push(b':');
                write_json(value, out);
            }
            out.push(b'}');
        }
        Node::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_json(item, out);
            }
            out.push(b']');
        }
        leaf => {
            // A leaf always serialises.
            let _ = serde_json::to_writer(&mut *out, &leaf.to_value());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tree::read_spec;

    /// Trees without a budget: these tests hold the readings equal; the budget has its own.
    const ANY: usize = usize::MAX;
    use proptest::prelude::*;
    use serde_json::value::RawValue;

    /// JSON text as a generator makes it: objects may repeat keys.
    #[derive(Debug, Clone)]
    enum Json {
        Null,
        Bool(bool),
        Int(i64),
        Float(f64),
        Str(String),
        List(Vec<Json>),
        Object(Vec<(String, Json)>),
    }

    impl Json {
        fn write(&self, out: &mut String) {
            match self {
                Json::Null => out.push_str("null"),
                Json::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
                Json::Int(i) => out.push_str(&i.to_string()),
                Json::Float(f) => out.push_str(&format!("{f:?}")),
                Json::Str(s) => out.push_str(&serde_json::to_string(s).unwrap()),
                Json::List(items) => {
                    out.push('[');
                    for (i, item) in items.iter().enumerate() {
                        if i > 0 {
                            out.push(',');
                        }
                        item.write(out);
                    }
                    out.push(']');
                }
                Json::Object(entries) => {
                    out.push('{');
                    for (i, (key, value)) in entries.iter().enumerate() {
                        if i > 0 {
                            out.push(',');
                        }
                        out.push_str(&serde_json::to_string(key).unwrap());
                        out.push(':');
                        value.write(out);
                    }
                    out.push('}');
                }
            }
        }

        fn text(&self) -> String {
            let mut out = String::new();
            self.write(&mut out);
            out
        }
    }

    const NAMES: [&str; 9] = [
        "",
        "v",
        "kube-api-access-7xq2m",
        "keyward-client-cert",
        "/var/run/secrets/kubernetes.io/serviceaccount",
        "/etc/keyward/client",
        "TOKEN",
        "token",
        "a\"b\\c\u{1}",
    ];

    fn text() -> impl Strategy<Value = Json> {
        prop::sample::select(NAMES.to_vec()).prop_map(|s| Json::Str(s.to_string()))
    }

    /// Any JSON at all, shallow: what a hostile spec puts where a field is expected.
    fn junk() -> impl Strategy<Value = Json> {
        let leaf = prop_oneof![
            Just(Json::Null),
            any::<bool>().prop_map(Json::Bool),
            (-2i64..3).prop_map(Json::Int),
            Just(Json::Float(1.5)),
            Just(Json::Float(-0.0)),
            text(),
        ];
        leaf.prop_recursive(2, 8, 3, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..3).prop_map(Json::List),
                prop::collection::vec((prop::sample::select(vec!["name", "mountPath", "x"]), inner), 0..3)
                    .prop_map(|e| Json::Object(e.into_iter().map(|(k, v)| (k.to_string(), v)).collect())),
            ]
        })
    }

    /// Mostly `good`, sometimes anything else.
    fn or_junk(good: impl Strategy<Value = Json> + 'static) -> BoxedStrategy<Json> {
        prop_oneof![6 => good, 1 => junk()].boxed()
    }

    /// An object of fields drawn from `fields` (a key may come twice, or not at all).
    fn object(fields: Vec<(&'static str, BoxedStrategy<Json>)>) -> BoxedStrategy<Json> {
        let choices: Vec<BoxedStrategy<(String, Json)>> =
            fields.into_iter().map(|(key, value)| value.prop_map(move |v| (key.to_string(), v)).boxed()).collect();
        prop::collection::vec(prop::strategy::Union::new(choices), 0..5).prop_map(Json::Object).boxed()
    }

    fn list(item: BoxedStrategy<Json>) -> BoxedStrategy<Json> {
        or_junk(prop::collection::vec(item, 0..4).prop_map(Json::List))
    }

    fn spec() -> BoxedStrategy<Json> {
        let token = object(vec![("audience", or_junk(text())), ("path", text().boxed())]);
        let source = or_junk(object(vec![("serviceAccountToken", or_junk(token))]));
        let projected = object(vec![("sources", list(source))]);
        let volume = or_junk(object(vec![
            ("name", or_junk(text())),
            ("projected", or_junk(projected)),
            ("emptyDir", Just(Json::Object(Vec::new())).boxed()),
        ]));
        let mount = or_junk(object(vec![
            ("name", or_junk(text())),
            ("mountPath", or_junk(text())),
            ("readOnly", any::<bool>().prop_map(Json::Bool).boxed()),
        ]));
        let var = or_junk(object(vec![("name", or_junk(text())), ("value", text().boxed())]));
        let container = or_junk(object(vec![
            ("name", or_junk(text())),
            ("image", text().boxed()),
            ("volumeMounts", list(mount)),
            ("env", list(var)),
        ]));
        or_junk(object(vec![
            ("volumes", list(volume)),
            ("containers", list(container.clone())),
            ("initContainers", list(container)),
            ("serviceAccountName", or_junk(text())),
            ("serviceAccount", or_junk(text())),
            ("automountServiceAccountToken", or_junk(any::<bool>().prop_map(Json::Bool))),
            ("nodeName", text().boxed()),
        ]))
    }

    fn wanted() -> impl Strategy<Value = Wanted<'static>> {
        let some = |of: &'static [&'static str]| prop::sample::subsequence(of.to_vec(), 0..=of.len());
        (
            some(&["v", "keyward-client-cert", "token"]),
            some(&["/etc/keyward/client", "/var/run/secrets/kubernetes.io/serviceaccount"]),
            some(&["TOKEN", "v"]),
            any::<bool>(),
        )
            .prop_map(|(volume_names, mount_paths, env_names, api_token)| Wanted {
                volume_names,
                mount_paths,
                env_names,
                api_token,
                ..Wanted::default()
            })
    }

    /// Both readings of `spec` for `wanted`: the JSON scan's, and the tree's.
    fn both<'a>(raw: &'a RawValue, tree: &'a Node<'a>, wanted: &Wanted<'_>) -> [Result<Spec<'a>, String>; 2] {
        [super::super::spec(Some(raw), &wanted.clone()), super::super::spec_of_tree(tree, &wanted.clone())]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(3000))]
        #[test]
        fn the_tree_and_the_json_give_the_same_view(spec in spec(), wanted in wanted()) {
            let raw = RawValue::from_string(spec.text()).unwrap();
            let tree = read_spec(&raw, ANY).unwrap();
            let [json, from_tree] = both(&raw, &tree, &wanted);
            prop_assert_eq!(json, from_tree, "spec {}", raw.get());
            // And the binding, read from the same tree.
            let masks = crate::binding::Masks::default();
            prop_assert_eq!(crate::binding::of_raw(Some(&raw), &masks).ok(), Some(crate::binding::of_tree(&tree, &masks)));
        }
    }

    /// Every pod the tests hold (the systems keyward serves, as the apiserver sends them), for
    /// each profile's wants, with and without the API token.
    #[test]
    fn on_every_fixture_the_tree_and_the_json_give_the_same_view() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures");
        let mut specs = 0;
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_none_or(|e| e != "json") {
                continue;
            }
            let doc: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
            let pod = doc.pointer("/request/object").unwrap_or(&doc);
            let Some(spec) = pod.get("spec") else { continue };
            let raw = serde_json::value::to_raw_value(spec).unwrap();
            let tree = read_spec(&raw, ANY).unwrap();
            let names = ["keyward-client-cert", "kube-api-access-7xq2m", "ray-token"];
            let paths = ["/etc/keyward/client", "/var/run/secrets/kubernetes.io/serviceaccount"];
            for api_token in [false, true] {
                let wanted = Wanted {
                    volume_names: names.to_vec(),
                    mount_paths: paths.to_vec(),
                    env_names: vec!["KEYWARD_TOKEN", "RAY_AUTH_TOKEN"],
                    api_token,
                    ..Wanted::default()
                };
                let [json, from_tree] = both(&raw, &tree, &wanted);
                assert_eq!(json, from_tree, "{}", path.display());
                assert!(json.is_ok(), "{}: {json:?}", path.display());
            }
            specs += 1;
        }
        assert!(specs >= 10, "only {specs} pods among the fixtures");
    }

    #[test]
    fn past_the_hits_both_readings_keep_as_many_and_say_so() {
        for (vars, truncated) in [(MAX_HITS, false), (MAX_HITS + 1, true)] {
            let env: Vec<&str> = vec![r#"{"name":"TOKEN","value":"x"}"#; vars];
            let spec = format!(r#"{{"containers":[{{"name":"c","env":[{}]}}]}}"#, env.join(","));
            let raw = RawValue::from_string(spec).unwrap();
            let tree = read_spec(&raw, ANY).unwrap();
            let wanted = Wanted { env_names: vec!["TOKEN"], ..Wanted::default() };
            let [json, from_tree] = both(&raw, &tree, &wanted);
            assert_eq!(json, from_tree);
            let spec = from_tree.unwrap();
            assert_eq!((spec.hits_truncated, spec.containers[0].env_hits.len()), (truncated, MAX_HITS), "{vars} vars");
        }
    }

    #[test]
    fn a_list_where_a_struct_is_expected_is_judged_as_the_json_scan_judges_it() {
        // serde's derived decoder reads a struct written as a list field by field.
        let spec = r#"{"volumes":[{"name":"t","projected":[[[{"path":"token"}]]]},{"name":"w","projected":[[{"x":1},{"serviceAccountToken":{"path":"t"}}]]},{"name":"u","projected":{"sources":[{"serviceAccountToken":{"audience":"a","audience":"b"}}]}}]}"#;
        let raw = RawValue::from_string(spec.into()).unwrap();
        let tree = read_spec(&raw, ANY).unwrap();
        let wanted = Wanted { api_token: true, ..Wanted::default() };
        let [json, from_tree] = both(&raw, &tree, &wanted);
        assert_eq!(json, from_tree);
        let hits: Vec<(String, bool)> =
            json.unwrap().volume_hits.iter().map(|h| (h.name.to_string(), h.api_token)).collect();
        let token = |name: &str| (name.to_string(), true);
        assert_eq!(hits, [token("t"), token("w")], "a duplicate field fails the decoding: not a token");
    }

    #[test]
    fn an_element_kept_whole_has_each_field_once() {
        // The mount is of an injected volume, so the second pass keeps it whole: there a
        // duplicate field is an error, as serde's derived decoder makes it.
        for (dup, field) in
            [(r#""mountPath":"/a","mountPath":"/b""#, "mountPath"), (r#""mountPath":"/a","name":"v""#, "name")]
        {
            let spec = format!(r#"{{"containers":[{{"name":"c","volumeMounts":[{{"name":"v",{dup}}}]}}]}}"#);
            let raw = RawValue::from_string(spec).unwrap();
            let tree = read_spec(&raw, ANY).unwrap();
            let wanted = Wanted { volume_names: vec!["v"], ..Wanted::default() };
            let [json, from_tree] = both(&raw, &tree, &wanted);
            assert_eq!(json, from_tree);
            assert_eq!(
                from_tree.unwrap_err(),
                format!("spec.containers[0].volumeMounts[0]: duplicate field `{field}`")
            );
        }
    }
}
