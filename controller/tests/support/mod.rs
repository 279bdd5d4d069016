//! An in-process fake of the Kubernetes API, behind a real `kube::Client`: it stores objects,
//! checks method, path and body, enforces resourceVersion preconditions and AlreadyExists,
//! filters lists by label and field selectors, streams watches, and records every call (with
//! the client that made it) so tests assert what was written, by whom.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)] // test support: a panic is the report

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt;
use http::{Request, Response, StatusCode};
use http_body::Frame;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use kube::client::Body;
use kube::Client;
use serde_json::{json, Value};
use tokio::sync::{broadcast, Notify};

type ResponseBody = UnsyncBoxBody<Bytes, Infallible>;

/// One request the fake served.
#[derive(Debug, Clone)]
pub struct Call {
    pub client: String,
    pub method: String,
    /// `group/version/resource` (`/v1/secrets` for the core group).
    pub resource: String,
    pub namespace: String,
    pub name: String,
    pub query: String,
    pub body: Option<Value>,
    pub status: u16,
    pub at: Instant,
}

impl Call {
    pub fn is_write(&self) -> bool {
        matches!(self.method.as_str(), "POST" | "PUT" | "PATCH" | "DELETE")
    }
}

#[derive(Debug, Clone)]
struct Failure {
    method: String,
    resource: String,
    code: u16,
    times: usize,
}

#[derive(Debug, Clone)]
struct Change {
    rv: u64,
    resource: String,
    namespace: String,
    kind: &'static str,
    object: Value,
    /// The object before a modification: a selector watch sees an object that stops matching
    /// as DELETED, and one that starts matching as ADDED, as the apiserver's watch cache does.
    previous: Option<Value>,
}

#[derive(Default)]
struct State {
    objects: BTreeMap<(String, String, String), Value>,
    rv: u64,
    uids: u64,
    calls: Vec<Call>,
    failures: Vec<Failure>,
    history: Vec<Change>,
    /// Refuse to create a namespaced object in a namespace that does not exist, as the
    /// apiserver does (off by default: most tests do not seed their namespaces).
    require_namespaces: bool,
}

#[derive(Clone)]
pub struct FakeApi {
    state: Arc<Mutex<State>>,
    changes: broadcast::Sender<Change>,
    notify: Arc<Notify>,
}

impl Default for FakeApi {
    fn default() -> Self {
        Self { state: Arc::default(), changes: broadcast::channel(4096).0, notify: Arc::new(Notify::new()) }
    }
}

/// `group/version/resource` of a kind, for seeding and reading.
pub fn resource_of(api_version: &str, kind: &str) -> String {
    let plural = match kind {
        "Namespace" => "namespaces".to_string(),
        "Pod" => "pods".to_string(),
        "Secret" => "secrets".to_string(),
        "ConfigMap" => "configmaps".to_string(),
        "ServiceAccount" => "serviceaccounts".to_string(),
        "RoleBinding" => "rolebindings".to_string(),
        "Lease" => "leases".to_string(),
        other => format!("{}s", other.to_ascii_lowercase()),
    };
    let gv = if api_version.contains('/') { api_version.to_string() } else { format!("/{api_version}") };
    format!("{gv}/{plural}")
}

impl FakeApi {
    /// A client whose calls are recorded as `id`'s.
    pub fn client(&self, id: &str) -> Client {
        let fake = self.clone();
        let id = id.to_string();
        let service = tower::service_fn(move |req: Request<Body>| {
            let fake = fake.clone();
            let id = id.clone();
            async move { Ok::<_, Infallible>(fake.handle(&id, req).await) }
        });
        Client::new(service, "default")
    }

    /// Stores an object as if created (uid and resourceVersion assigned), as the test's setup.
    pub fn seed(&self, mut object: Value) -> Value {
        let resource = resource_of(object["apiVersion"].as_str().unwrap(), object["kind"].as_str().unwrap());
        let ns = object["metadata"]["namespace"].as_str().unwrap_or_default().to_string();
        let name = object["metadata"]["name"].as_str().unwrap().to_string();
        let mut state = self.state.lock().unwrap();
        state.rv += 1;
        state.uids += 1;
        if object["metadata"]["uid"].is_null() {
            object["metadata"]["uid"] = json!(format!("uid-{}", state.uids));
        }
        object["metadata"]["resourceVersion"] = json!(state.rv.to_string());
        let previous = state.objects.insert((resource.clone(), ns.clone(), name), object.clone());
        let kind = if previous.is_some() { "MODIFIED" } else { "ADDED" };
        let change = Change { rv: state.rv, resource, namespace: ns, kind, object: object.clone(), previous };
        state.history.push(change.clone());
        drop(state);
        let _ = self.changes.send(change);
        self.notify.notify_waiters();
        object
    }

    pub fn remove(&self, api_version: &str, kind: &str, namespace: &str, name: &str) {
        let resource = resource_of(api_version, kind);
        let mut state = self.state.lock().unwrap();
        if let Some(object) = state.objects.remove(&(resource.clone(), namespace.to_string(), name.to_string())) {
            state.rv += 1;
            let change =
                Change { rv: state.rv, resource, namespace: namespace.into(), kind: "DELETED", object, previous: None };
            state.history.push(change.clone());
            drop(state);
            let _ = self.changes.send(change);
            self.notify.notify_waiters();
        }
    }

    pub fn get(&self, api_version: &str, kind: &str, namespace: &str, name: &str) -> Option<Value> {
        let resource = resource_of(api_version, kind);
        self.state.lock().unwrap().objects.get(&(resource, namespace.to_string(), name.to_string())).cloned()
    }

    pub fn calls(&self) -> Vec<Call> {
        self.state.lock().unwrap().calls.clone()
    }

    pub fn writes(&self) -> Vec<Call> {
        self.calls().into_iter().filter(|c| c.is_write() && !c.resource.starts_with("events.k8s.io")).collect()
    }

    pub fn clear_calls(&self) {
        self.state.lock().unwrap().calls.clear();
    }

    /// From now on, creating an object in a namespace with no Namespace object fails with 404
    /// `namespaces "NAME" not found`, as it does on a real apiserver.
    pub fn require_namespaces(&self) {
        self.state.lock().unwrap().require_namespaces = true;
    }

    /// The next `times` calls of `method` on `resource` fail with `code`.
    pub fn fail(&self, method: &str, resource: &str, code: u16, times: usize) {
        self.state.lock().unwrap().failures.push(Failure {
            method: method.into(),
            resource: resource.into(),
            code,
            times,
        });
    }

    /// Waits until `check` holds, re-checking on every change the fake sees; panics after
    /// `limit` (a failure report, not a sleep).
    pub async fn until<T>(&self, limit: Duration, mut check: impl FnMut(&FakeApi) -> Option<T>) -> T {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let notified = self.notify.notified();
            if let Some(v) = check(self) {
                return v;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                if let Some(v) = check(self) {
                    return v;
                }
                panic!(
                    "condition not met within {limit:?}; calls: {:#?}",
                    self.calls()
                        .iter()
                        .map(|c| format!(
                            "{} {} {} {}/{} -> {}",
                            c.client, c.method, c.resource, c.namespace, c.name, c.status
                        ))
                        .collect::<Vec<_>>()
                );
            }
        }
    }

    async fn handle(&self, client: &str, req: Request<Body>) -> Response<ResponseBody> {
        let (parts, body) = req.into_parts();
        let bytes = body.collect_bytes().await.unwrap_or_default();
        let body: Option<Value> = if bytes.is_empty() { None } else { serde_json::from_slice(&bytes).ok() };
        let method = parts.method.as_str().to_string();
        let path = parts.uri.path().to_string();
        let query = parts.uri.query().unwrap_or_default().to_string();
        let (resource, namespace, name) = parse_path(&path);
        let params: BTreeMap<String, String> = query
            .split('&')
            .filter(|p| !p.is_empty())
            .filter_map(|p| p.split_once('='))
            .map(|(k, v)| (k.to_string(), decode(v)))
            .collect();
        let watch = params.get("watch").is_some_and(|v| v == "true" || v == "1");
        let (status, response) = if watch {
            (200, None)
        } else {
            self.respond(&method, &resource, &namespace, &name, &params, body.clone())
        };
        self.state.lock().unwrap().calls.push(Call {
            client: client.to_string(),
            method: method.clone(),
            resource: resource.clone(),
            namespace: namespace.clone(),
            name: name.clone(),
            query,
            body,
            status,
            at: Instant::now(),
        });
        self.notify.notify_waiters();
        if watch {
            let since: u64 = params.get("resourceVersion").and_then(|v| v.parse().ok()).unwrap_or(0);
            return self.watch(resource, namespace, params, since);
        }
        let bytes = serde_json::to_vec(&response.unwrap_or(Value::Null)).unwrap();
        Response::builder()
            .status(status)
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(bytes)).boxed_unsync())
            .unwrap()
    }

    fn respond(
        &self,
        method: &str,
        resource: &str,
        namespace: &str,
        name: &str,
        params: &BTreeMap<String, String>,
        body: Option<Value>,
    ) -> (u16, Option<Value>) {
        let mut state = self.state.lock().unwrap();
        if let Some(f) =
            state.failures.iter_mut().find(|f| f.times > 0 && f.method == method && resource.ends_with(&f.resource))
        {
            f.times -= 1;
            let code = f.code;
            return (code, Some(status(code, "InternalError", "injected failure")));
        }
        let key = (resource.to_string(), namespace.to_string(), name.to_string());
        let mut previous = None;
        let (code, object, change) = match method {
            "GET" if !name.is_empty() => match state.objects.get(&key) {
                Some(o) => (200, o.clone(), None),
                None => return (404, Some(status(404, "NotFound", &format!("{resource} {name:?} not found")))),
            },
            "GET" => {
                let selector = params.get("labelSelector").cloned().unwrap_or_default();
                let fields = params.get("fieldSelector").cloned().unwrap_or_default();
                let items: Vec<Value> = state
                    .objects
                    .iter()
                    .filter(|((r, ns, _), o)| {
                        r == resource && (namespace.is_empty() || ns == namespace) && matches(o, &selector, &fields)
                    })
                    .map(|(_, o)| o.clone())
                    .collect();
                let list = json!({"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": state.rv.to_string()}, "items": items});
                return (200, Some(list));
            }
            "POST" => {
                let mut object = body.unwrap_or(Value::Null);
                let Some(name) = object["metadata"]["name"].as_str().map(str::to_string) else {
                    return (422, Some(status(422, "Invalid", "metadata.name: Required value")));
                };
                let key = (resource.to_string(), namespace.to_string(), name.clone());
                let namespace_key = ("/v1/namespaces".to_string(), String::new(), namespace.to_string());
                if state.require_namespaces && !namespace.is_empty() && !state.objects.contains_key(&namespace_key) {
                    return (404, Some(status(404, "NotFound", &format!("namespaces {namespace:?} not found"))));
                }
                if state.objects.contains_key(&key) {
                    return (409, Some(status(409, "AlreadyExists", &format!("{resource} {name:?} already exists"))));
                }
                state.rv += 1;
                state.uids += 1;
                object["metadata"]["uid"] = json!(format!("uid-{}", state.uids));
                object["metadata"]["resourceVersion"] = json!(state.rv.to_string());
                if !namespace.is_empty() {
                    object["metadata"]["namespace"] = json!(namespace);
                }
                state.objects.insert(key, object.clone());
                (201, object, Some("ADDED"))
            }
            "PUT" => {
                let mut object = body.unwrap_or(Value::Null);
                let Some(current) = state.objects.get(&key) else {
                    return (404, Some(status(404, "NotFound", &format!("{resource} {name:?} not found"))));
                };
                if object["metadata"]["resourceVersion"] != current["metadata"]["resourceVersion"] {
                    return (409, Some(status(409, "Conflict", "the object has been modified; please apply your changes to the latest version and try again")));
                }
                object["metadata"]["uid"] = current["metadata"]["uid"].clone();
                state.rv += 1;
                object["metadata"]["resourceVersion"] = json!(state.rv.to_string());
                previous = state.objects.insert(key, object.clone());
                (200, object, Some("MODIFIED"))
            }
            "PATCH" => {
                let Some(current) = state.objects.get(&key).cloned() else {
                    return (404, Some(status(404, "NotFound", "not found")));
                };
                let mut object = current;
                merge(&mut object, &body.unwrap_or(Value::Null));
                state.rv += 1;
                object["metadata"]["resourceVersion"] = json!(state.rv.to_string());
                previous = state.objects.insert(key, object.clone());
                (200, object, Some("MODIFIED"))
            }
            "DELETE" => match state.objects.remove(&key) {
                Some(o) => {
                    state.rv += 1;
                    (200, o, Some("DELETED"))
                }
                None => return (404, Some(status(404, "NotFound", "not found"))),
            },
            _ => return (405, Some(status(405, "MethodNotAllowed", method))),
        };
        if let Some(kind) = change {
            let change = Change {
                rv: state.rv,
                resource: resource.to_string(),
                namespace: namespace.to_string(),
                kind,
                object: object.clone(),
                previous,
            };
            state.history.push(change.clone());
            let _ = self.changes.send(change);
        }
        (code, Some(object))
    }

    fn watch(
        &self,
        resource: String,
        namespace: String,
        params: BTreeMap<String, String>,
        since: u64,
    ) -> Response<ResponseBody> {
        let selector = params.get("labelSelector").cloned().unwrap_or_default();
        let fields = params.get("fieldSelector").cloned().unwrap_or_default();
        let rx = self.changes.subscribe();
        let past: Vec<Change> = self.state.lock().unwrap().history.iter().filter(|c| c.rv > since).cloned().collect();
        // What a watch with these selectors sends for a change, if anything.
        let seen = move |c: &Change| -> Option<&'static str> {
            if c.resource != resource || !(namespace.is_empty() || c.namespace == namespace) {
                return None;
            }
            let now = matches(&c.object, &selector, &fields);
            let before = c.previous.as_ref().is_some_and(|p| matches(p, &selector, &fields));
            match (c.kind, before, now) {
                ("MODIFIED", true, false) => Some("DELETED"),
                ("MODIFIED", false, true) => Some("ADDED"),
                ("MODIFIED", false, false) => None,
                (kind, _, true) => Some(kind),
                _ => None,
            }
        };
        let wanted = {
            let seen = seen.clone();
            move |c: &Change| seen(c).is_some()
        };
        let line = move |c: &Change| {
            let kind = seen(c).unwrap_or(c.kind);
            let mut text = serde_json::to_vec(&json!({"type": kind, "object": c.object})).unwrap();
            text.push(b'\n');
            Ok::<_, Infallible>(Frame::data(Bytes::from(text)))
        };
        let wanted2 = wanted.clone();
        let line2 = line.clone();
        let replay = futures::stream::iter(
            past.into_iter().filter(move |c| wanted(c)).map(move |c| line2(&c)).collect::<Vec<_>>(),
        );
        let live = futures::stream::unfold(rx, |mut rx| async move {
            loop {
                match rx.recv().await {
                    Ok(c) => return Some((c, rx)),
                    Err(broadcast::error::RecvError::Lagged(_)) => continue,
                    Err(broadcast::error::RecvError::Closed) => return None,
                }
            }
        })
        .filter(move |c| futures::future::ready(wanted2(c)))
        .map(move |c| line(&c));
        let stream = replay.chain(live);
        Response::builder()
            .status(StatusCode::OK)
            .header("content-type", "application/json")
            .body(StreamBody::new(stream).boxed_unsync())
            .unwrap()
    }
}

fn status(code: u16, reason: &str, message: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message, "reason": reason, "code": code})
}

/// Percent-decoding of a query value (`+` is a space).
fn decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = (bytes[i] == b'%' && i + 3 <= bytes.len())
            .then(|| std::str::from_utf8(&bytes[i + 1..i + 3]).ok().and_then(|h| u8::from_str_radix(h, 16).ok()))
            .flatten();
        match (hex, bytes[i]) {
            (Some(b), _) => {
                out.push(b);
                i += 3;
            }
            (None, b'+') => {
                out.push(b' ');
                i += 1;
            }
            (None, b) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `(group/version/resource, namespace, name)` of an API path.
fn parse_path(path: &str) -> (String, String, String) {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (gv, rest) = match segments.first() {
        Some(&"api") => (format!("/{}", segments.get(1).unwrap_or(&"")), &segments[2.min(segments.len())..]),
        _ => (
            format!("{}/{}", segments.get(1).unwrap_or(&""), segments.get(2).unwrap_or(&"")),
            &segments[3.min(segments.len())..],
        ),
    };
    let (namespace, resource, name) = if rest.first() == Some(&"namespaces") && rest.len() >= 3 {
        (rest[1], rest[2], rest.get(3).copied().unwrap_or(""))
    } else {
        ("", rest.first().copied().unwrap_or(""), rest.get(1).copied().unwrap_or(""))
    };
    (format!("{gv}/{resource}"), namespace.to_string(), name.to_string())
}

fn merge(target: &mut Value, patch: &Value) {
    match (target, patch) {
        (Value::Object(t), Value::Object(p)) => {
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        (t, p) => *t = p.clone(),
    }
}

/// Whether an object matches a label selector (`k=v`, `k!=v`, `k`, `!k`, `k in (a,b)`,
/// `k notin (a,b)`) and a field selector (`metadata.name=x`, `metadata.namespace=x`).
pub fn matches(object: &Value, selector: &str, fields: &str) -> bool {
    let labels = object["metadata"]["labels"].as_object().cloned().unwrap_or_default();
    let label = |k: &str| labels.get(k).and_then(Value::as_str).map(str::to_string);
    let mut terms = Vec::new();
    let mut depth = 0;
    let mut start = 0;
    for (i, c) in selector.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                terms.push(&selector[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    terms.push(&selector[start..]);
    let labels_ok = terms.iter().map(|t| t.trim()).filter(|t| !t.is_empty()).all(|t| {
        if let Some((k, rest)) = t.split_once(" notin ") {
            let values: Vec<&str> = rest.trim_matches(|c| c == '(' || c == ')').split(',').collect();
            label(k).is_none_or(|v| !values.contains(&v.as_str()))
        } else if let Some((k, rest)) = t.split_once(" in ") {
            let values: Vec<&str> = rest.trim_matches(|c| c == '(' || c == ')').split(',').collect();
            label(k).is_some_and(|v| values.contains(&v.as_str()))
        } else if let Some((k, v)) = t.split_once("!=") {
            label(k).as_deref() != Some(v)
        } else if let Some((k, v)) = t.split_once("==").or_else(|| t.split_once('=')) {
            label(k).as_deref() == Some(v)
        } else if let Some(k) = t.strip_prefix('!') {
            label(k).is_none()
        } else {
            label(t).is_some()
        }
    });
    let fields_ok = fields.split(',').filter(|f| !f.is_empty()).all(|f| match f.split_once('=') {
        Some(("metadata.name", v)) => object["metadata"]["name"] == json!(v),
        Some(("metadata.namespace", v)) => object["metadata"]["namespace"] == json!(v),
        _ => true,
    });
    labels_ok && fields_ok
}
