//! The API server's answers the gate asks for: a TokenReview of each bearer token (for the gate
//! file's audiences) and a SubjectAccessReview where a rule asks one, each through its cache
//! (`keyward_gate::token_cache`) and within a deadline. When the API server does not answer in
//! time, or answers with an error, the gate fails closed: the request is refused as
//! unavailable (retryable), and nothing is cached, so the next request asks again.
//!
//! Requests that present the same uncached token at once share one TokenReview (as the API
//! server's own token cache does), and requests that need the same uncached SubjectAccessReview
//! share one: each review runs as its own task (a [`Flight`]), so a caller that goes away does
//! not cancel it for the others, and it caches its answer and ends its flight in one step.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use futures::future::{BoxFuture, FutureExt, Shared};
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec};
use keyward_gate::identity::{BoundPod, ServiceAccount, UserName};
use keyward_gate::rules::AccessReview;
use keyward_gate::rules::Caller;
use keyward_gate::token_cache::{review_key, Limits, Review, ReviewCache, TokenCache};
use kube::api::PostParams;
use kube::Api;

use super::metrics::GateMetrics;

/// How long a SubjectAccessReview's answer is kept: allowed, denied (as the apiserver's own
/// delegating authorizer caches them, a little shorter).
const ALLOWED_FOR: Duration = Duration::from_secs(60);
const DENIED_FOR: Duration = Duration::from_secs(10);
const MAX_REVIEWS: usize = 10_000;
/// TokenReviews one source address may have in flight at once: a caller sending a new made-up
/// token with each request costs the API server at most this many reviews at a time.
pub const MAX_TOKEN_REVIEWS_PER_SOURCE: usize = 4;

/// Why a caller's token names no one the gate accepts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenRefused {
    /// The API server (or the gate, reading its answer) rejected it: 401.
    Rejected(String),
    /// The API server could not be asked: the gate fails closed, 503.
    Unavailable(String),
}

/// A verified token's user (a service account, or any other user) and the groups the API
/// server gave it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Account {
    pub caller: Caller,
    pub groups: Vec<String>,
    /// The pod a service account's token is bound to, as the API server names it.
    pub pod: Option<BoundPod>,
}

pub struct Reviews {
    client: kube::Client,
    deadline: Duration,
    /// The audiences the cached answers were asked for: a reload that changes them empties
    /// the cache.
    tokens: Arc<Mutex<(Vec<String>, TokenCache)>>,
    /// The TokenReviews being asked, by [`review_key`] (no token is held as a key). Locked
    /// only while `tokens` is held, so that a review's answer is cached and its flight ended
    /// at once for every request.
    flights: Arc<Mutex<HashMap<[u8; 32], Flight<TokenAnswer>>>>,
    access: Arc<Mutex<AccessReviews>>,
    asking: InFlight,
    metrics: Arc<GateMetrics>,
}

type TokenAnswer = Result<Review, TokenRefused>;
type AccessAnswer = Result<bool, String>;

/// The SubjectAccessReviews answered (cached) and being asked, under one lock for the same
/// reason as the tokens'.
struct AccessReviews {
    cache: ReviewCache,
    flights: HashMap<AccessReview, Flight<AccessAnswer>>,
}

/// A review being asked, as a task of its own, shared by every request that needs its answer
/// meanwhile.
type Flight<T> = Shared<BoxFuture<'static, T>>;

/// Where a request's answer comes from.
enum Known<T> {
    Cached(T),
    /// Another request's review, being asked.
    Joined(Flight<T>),
    /// A review this request started.
    Asked(Flight<T>),
}

impl<T> Known<T> {
    /// The answer, and the metric's result for a shared or cached one.
    async fn answer(self) -> (T, Option<&'static str>)
    where
        T: Clone,
    {
        match self {
            Known::Cached(answer) => (answer, Some("cached")),
            Known::Joined(flight) => (flight.await, Some("shared")),
            Known::Asked(flight) => (flight.await, None),
        }
    }
}

/// A TokenReview counted against its source until it ends.
struct Asking {
    asking: Option<(InFlight, IpAddr)>,
}

/// TokenReviews in flight, by the address that made the request which started each.
type InFlight = Arc<Mutex<HashMap<IpAddr, usize>>>;

impl Drop for Asking {
    fn drop(&mut self) {
        if let Some((asking, source)) = &self.asking {
            let mut asking = lock(asking);
            if let Some(count) = asking.get_mut(source) {
                *count = count.saturating_sub(1);
                if *count == 0 {
                    asking.remove(source);
                }
            }
        }
    }
}

/// Runs `review` as a task of its own; `lost` answers if the task itself fails.
fn fly<T: Clone + Send + Sync + 'static>(
    review: impl std::future::Future<Output = T> + Send + 'static,
    lost: fn(String) -> T,
) -> Flight<T> {
    let task = tokio::spawn(review);
    async move { task.await.unwrap_or_else(|e| lost(e.to_string())) }.boxed().shared()
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Reviews {
    pub fn new(client: kube::Client, deadline: Duration, metrics: Arc<GateMetrics>) -> Self {
        Self {
            client,
            deadline,
            tokens: Arc::new(Mutex::new((Vec::new(), TokenCache::new(Limits::default())))),
            flights: Arc::default(),
            access: Arc::new(Mutex::new(AccessReviews {
                cache: ReviewCache::new(MAX_REVIEWS, ALLOWED_FOR, DENIED_FOR),
                flights: HashMap::new(),
            })),
            asking: Arc::default(),
            metrics,
        }
    }

    /// The account `token` belongs to, for `audiences`: from the cache, from a TokenReview
    /// another request is asking, or from one of its own, unless `source` (the request's
    /// address) has [`MAX_TOKEN_REVIEWS_PER_SOURCE`] in flight already.
    pub async fn token(
        &self,
        token: &str,
        audiences: &[String],
        source: Option<IpAddr>,
    ) -> Result<Account, TokenRefused> {
        let known = {
            let mut guard = lock(&self.tokens);
            let (asked_for, cache) = &mut *guard;
            if asked_for.as_slice() != audiences {
                *asked_for = audiences.to_vec();
                *cache = TokenCache::new(Limits::default());
            }
            match cache.get(token, SystemTime::now()) {
                Some(review) => Known::Cached(Ok(review.clone())),
                None => {
                    let key = review_key(token, audiences);
                    let mut flights = lock(&self.flights);
                    match flights.get(&key) {
                        Some(flight) => Known::Joined(flight.clone()),
                        None => {
                            let asking = self.begin_asking(source)?;
                            let flight = self.ask_token(key, token, audiences, asking);
                            flights.insert(key, flight.clone());
                            Known::Asked(flight)
                        }
                    }
                }
            }
        };
        let (answer, result) = known.answer().await;
        let review = answer?;
        let result = result.unwrap_or(match review {
            Review::Authenticated { .. } => "allowed",
            Review::Rejected(_) => "denied",
        });
        self.metrics.observe_review("token", result);
        match review {
            Review::Authenticated { username, groups, pod } => {
                let caller = match ServiceAccount::parse(&username) {
                    Ok(account) => Caller::ServiceAccount(account),
                    Err(_) => Caller::User(
                        UserName::parse(&username)
                            .map_err(|e| TokenRefused::Rejected(format!("the token's user: {e}")))?,
                    ),
                };
                Ok(Account { caller, groups, pod })
            }
            Review::Rejected(why) => Err(TokenRefused::Rejected(why)),
        }
    }

    /// Starts the TokenReview of `token`, which caches the answer (when the audiences are still
    /// those asked for) and ends its flight in one step.
    fn ask_token(&self, key: [u8; 32], token: &str, audiences: &[String], asking: Asking) -> Flight<TokenAnswer> {
        let (client, deadline, metrics) = (self.client.clone(), self.deadline, self.metrics.clone());
        let (tokens, flights) = (self.tokens.clone(), self.flights.clone());
        let (token, audiences) = (token.to_string(), audiences.to_vec());
        let review = async move {
            let _asking = asking;
            let result = review_token(&client, deadline, &metrics, &token, &audiences).await;
            let mut guard = lock(&tokens);
            if let Ok(review) = &result {
                if guard.0 == audiences {
                    guard.1.put(&token, review.clone(), SystemTime::now());
                }
            }
            lock(&flights).remove(&key);
            result
        };
        fly(review, |e| Err(TokenRefused::Unavailable(format!("the TokenReview failed: {e}"))))
    }

    /// One more TokenReview in flight for `source`, unless it has its share already.
    fn begin_asking(&self, source: Option<IpAddr>) -> Result<Asking, TokenRefused> {
        let Some(source) = source.map(|s| s.to_canonical()) else {
            return Ok(Asking { asking: None });
        };
        let mut asking = lock(&self.asking);
        let count = asking.entry(source).or_default();
        if *count >= MAX_TOKEN_REVIEWS_PER_SOURCE {
            self.metrics.observe_review("token", "throttled");
            return Err(TokenRefused::Unavailable(format!(
                "{MAX_TOKEN_REVIEWS_PER_SOURCE} TokenReviews for tokens from {source} are in flight already: retry once they are answered"
            )));
        }
        *count += 1;
        Ok(Asking { asking: Some((self.asking.clone(), source)) })
    }

    /// Whether the API server allows `review`: from the cache, from a SubjectAccessReview
    /// another request is asking, or from one of its own. `Err` when it cannot be asked now
    /// (the gate refuses, unavailable).
    pub async fn access(&self, review: &AccessReview) -> Result<bool, String> {
        let known = {
            let mut state = lock(&self.access);
            match state.cache.get(review, SystemTime::now()) {
                Some(allowed) => Known::Cached(Ok(allowed)),
                None => match state.flights.get(review) {
                    Some(flight) => Known::Joined(flight.clone()),
                    None => {
                        let flight = self.ask_access(review);
                        state.flights.insert(review.clone(), flight.clone());
                        Known::Asked(flight)
                    }
                },
            }
        };
        let (answer, result) = known.answer().await;
        let allowed = answer?;
        self.metrics.observe_review("access", result.unwrap_or(if allowed { "allowed" } else { "denied" }));
        Ok(allowed)
    }

    /// Starts the SubjectAccessReview of `review`, which caches the answer and ends its flight
    /// in one step.
    fn ask_access(&self, review: &AccessReview) -> Flight<AccessAnswer> {
        let (client, deadline, metrics) = (self.client.clone(), self.deadline, self.metrics.clone());
        let (state, review) = (self.access.clone(), review.clone());
        let ask = async move {
            let result = review_access(&client, deadline, &metrics, &review).await;
            let mut state = lock(&state);
            if let Ok(allowed) = result {
                state.cache.put(review.clone(), allowed, SystemTime::now());
            }
            state.flights.remove(&review);
            result
        };
        fly(ask, |e| Err(format!("the SubjectAccessReview failed: {e}")))
    }
}

/// Asks the API server whether `review` is allowed, within `deadline`.
async fn review_access(
    client: &kube::Client,
    deadline: Duration,
    metrics: &GateMetrics,
    review: &AccessReview,
) -> AccessAnswer {
    let attributes = ResourceAttributes {
        verb: Some(review.verb.clone()),
        group: Some(review.group.clone()),
        resource: Some(review.resource.clone()),
        subresource: (!review.subresource.is_empty()).then(|| review.subresource.clone()),
        namespace: (!review.namespace.is_empty()).then(|| review.namespace.clone()),
        name: (!review.name.is_empty()).then(|| review.name.clone()),
        ..Default::default()
    };
    let sar = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(review.user.clone()),
            resource_attributes: Some(attributes),
            ..Default::default()
        },
        ..Default::default()
    };
    let api = Api::<SubjectAccessReview>::all(client.clone());
    let answer = match tokio::time::timeout(deadline, api.create(&PostParams::default(), &sar)).await {
        Ok(Ok(answer)) => answer,
        Ok(Err(e)) => {
            metrics.observe_review("access", "error");
            tracing::warn!(error = %e, "SubjectAccessReview failed; refusing the request (fail closed)");
            return Err(format!("the API server did not answer the SubjectAccessReview: {}", api_error(&e)));
        }
        Err(_) => {
            metrics.observe_review("access", "error");
            tracing::warn!(deadline = ?deadline, "SubjectAccessReview not answered in time; refusing the request (fail closed)");
            return Err(format!("the API server did not answer the SubjectAccessReview within {deadline:?}"));
        }
    };
    Ok(answer.status.is_some_and(|s| s.allowed && s.denied != Some(true)))
}

/// Asks the API server whether `token` is good for `audiences`, within `deadline`.
async fn review_token(
    client: &kube::Client,
    deadline: Duration,
    metrics: &GateMetrics,
    token: &str,
    audiences: &[String],
) -> Result<Review, TokenRefused> {
    let review = TokenReview {
        spec: TokenReviewSpec {
            token: Some(token.to_string()),
            audiences: if audiences.is_empty() { None } else { Some(audiences.to_vec()) },
        },
        ..Default::default()
    };
    let api = Api::<TokenReview>::all(client.clone());
    let answer = match tokio::time::timeout(deadline, api.create(&PostParams::default(), &review)).await {
        Ok(Ok(answer)) => answer,
        Ok(Err(e)) => {
            metrics.observe_review("token", "error");
            tracing::warn!(error = %e, "TokenReview failed; refusing the request (fail closed)");
            return Err(TokenRefused::Unavailable(format!(
                "the API server did not review the token: {}",
                api_error(&e)
            )));
        }
        Err(_) => {
            metrics.observe_review("token", "error");
            tracing::warn!(deadline = ?deadline, "TokenReview not answered in time; refusing the request (fail closed)");
            return Err(TokenRefused::Unavailable(format!(
                "the API server did not answer the TokenReview within {:?}",
                deadline
            )));
        }
    };
    Ok(read_token_review(answer, audiences))
}

/// The API server's TokenReview answer, read as the gate trusts it: authenticated, with a
/// username, and, when audiences were asked for, valid for one of them (the API server returns
/// the audiences the token is good for; an answer that names none of those asked is not one).
fn read_token_review(answer: TokenReview, audiences: &[String]) -> Review {
    let Some(status) = answer.status else {
        return Review::Rejected("the API server's TokenReview has no status".into());
    };
    if status.authenticated != Some(true) {
        let why = status.error.filter(|e| !e.is_empty()).unwrap_or_else(|| "not authenticated".into());
        // The API server's own words, cut short: they never hold the token.
        return Review::Rejected(format!("the token is not accepted: {}", keyward_engine::text::clip(&why, 256)));
    }
    if !audiences.is_empty() {
        let granted = status.audiences.unwrap_or_default();
        if !granted.iter().any(|a| audiences.contains(a)) {
            return Review::Rejected(format!(
                "the token is not for this gate's audiences ({}); request one with a projected token's audience",
                audiences.join(", ")
            ));
        }
    }
    let Some(user) = status.user else {
        return Review::Rejected("the API server's TokenReview names no user".into());
    };
    let pod = match BoundPod::from_extra(&user.extra.unwrap_or_default()) {
        Ok(pod) => pod,
        Err(e) => return Review::Rejected(e.to_string()),
    };
    match user.username {
        Some(username) if !username.is_empty() => {
            Review::Authenticated { username, groups: user.groups.unwrap_or_default(), pod }
        }
        _ => Review::Rejected("the API server's TokenReview names no user".into()),
    }
}

fn api_error(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(status) => format!("{} {}", status.code, keyward_engine::text::clip(&status.message, 200)),
        other => keyward_engine::text::clip(&other.to_string(), 200).into_owned(),
    }
}
