//! The AdmissionReview v1 envelope, as the apiserver sends it and expects it back.
//!
//! Only the fields keyward reads or writes are typed; `request.object` stays raw JSON so the
//! patch is computed against exactly what the apiserver holds.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::engine::{Decision, RequestFacts, Requester};
use crate::error::Error;
use crate::text::{clip, quoted};

pub const API_VERSION: &str = "admission.k8s.io/v1";
/// The longest `request.uid` keyward echoes back (the apiserver's are 36-character UUIDs).
pub const MAX_UID_BYTES: usize = 128;
/// The most of a parse error keyward puts in a 400 answer.
const MAX_ECHO: usize = 512;
pub const KIND: &str = "AdmissionReview";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionReview {
    pub api_version: String,
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<AdmissionRequest>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response: Option<AdmissionResponse>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionRequest {
    pub uid: String,
    pub kind: GroupVersionKind,
    pub resource: GroupVersionResource,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sub_resource: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    pub operation: String,
    #[serde(default)]
    pub user_info: UserInfo,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub object: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dry_run: Option<bool>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupVersionKind {
    #[serde(default)]
    pub group: String,
    #[serde(default)]
    pub version: String,
    #[serde(default)]
    pub kind: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupVersionResource {
    #[serde(default)]
    pub group: String,
    #[serde(default)]
    pub version: String,
    #[serde(default)]
    pub resource: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserInfo {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionResponse {
    pub uid: String,
    pub allowed: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<Status>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub patch: Option<ByteString>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub patch_type: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub audit_annotations: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Status {
    pub code: u16,
    #[serde(default)]
    pub reason: String,
    #[serde(default)]
    pub message: String,
}

impl AdmissionReview {
    /// Parses a request envelope. The error is one line that says what is wrong, and echoes
    /// at most a little of what was sent.
    pub fn parse_request(body: &[u8]) -> Result<AdmissionRequest, Error> {
        let review: AdmissionReview = serde_json::from_slice(body).map_err(|e| {
            Error::Review(format!("body is not an AdmissionReview: {}", clip(&e.to_string(), MAX_ECHO)))
        })?;
        if review.api_version != API_VERSION || review.kind != KIND {
            return Err(Error::Review(format!(
                "body is apiVersion {} kind {}, expected {API_VERSION} {KIND}; set admissionReviewVersions: [v1] in the webhook configuration",
                quoted(&review.api_version, 64),
                quoted(&review.kind, 64)
            )));
        }
        let request = review.request.ok_or_else(|| Error::Review("AdmissionReview has no request".into()))?;
        if request.uid.is_empty() || request.uid.len() > MAX_UID_BYTES {
            return Err(Error::Review(format!(
                "request.uid is {} bytes; the apiserver sends a UID of 36 characters, and keyward accepts up to {MAX_UID_BYTES}",
                request.uid.len()
            )));
        }
        Ok(request)
    }

    /// The response envelope for `uid`. `patchType` is set only when there is a patch.
    pub fn respond(uid: &str, decision: &Decision) -> Result<AdmissionReview, Error> {
        let mut response = AdmissionResponse {
            uid: uid.to_string(),
            allowed: decision.allowed(),
            status: None,
            patch: None,
            patch_type: None,
            audit_annotations: decision.audit_annotations.clone(),
            warnings: decision.warnings.clone(),
        };
        match &decision.outcome {
            Ok(m) if !m.patch.is_empty() => {
                let bytes = serde_json::to_vec(&m.patch)
                    .map_err(|e| Error::Internal(format!("cannot encode the patch: {e}")))?;
                response.patch = Some(ByteString(bytes));
                response.patch_type = Some("JSONPatch".into());
            }
            Ok(_) => {}
            Err(denial) => {
                response.status =
                    Some(Status { code: 403, reason: "Forbidden".into(), message: denial.message.clone() });
            }
        }
        Ok(AdmissionReview {
            api_version: API_VERSION.into(),
            kind: KIND.into(),
            request: None,
            response: Some(response),
        })
    }
}

impl AdmissionRequest {
    /// The facts the engine decides on.
    pub fn facts(&self) -> RequestFacts {
        RequestFacts {
            operation: self.operation.clone(),
            group: self.resource.group.clone(),
            resource: self.resource.resource.clone(),
            sub_resource: self.sub_resource.clone().unwrap_or_default(),
            namespace: self.namespace.clone().unwrap_or_default(),
            requester: Requester::User(self.user_info.username.clone().unwrap_or_default()),
            dry_run: self.dry_run.unwrap_or(false),
        }
    }
}
