//! How the gate says no: a 403 with a one-line reason to an HTTP caller; to a gRPC caller, a
//! trailers-only response (HTTP 200, `grpc-status: 7`, PERMISSION_DENIED) whose
//! `grpc-message` is percent-encoded as the gRPC protocol requires, so that any reason reaches
//! the client intact and none can break the header block.

use keyward_engine::text::prefix;

use crate::starts_with_ignore_case;

/// gRPC's PERMISSION_DENIED.
pub const GRPC_PERMISSION_DENIED: u8 = 7;
/// gRPC's UNAUTHENTICATED: no identity could be read at all.
pub const GRPC_UNAUTHENTICATED: u8 = 16;
/// gRPC's UNAVAILABLE: the gate could not decide now (the API server did not answer) or the
/// upstream could not be reached; clients retry it.
pub const GRPC_UNAVAILABLE: u8 = 14;
/// The longest reason sent (a refusal names rules and values; the log line has it whole).
pub const MAX_REASON_BYTES: usize = 1024;

/// A refusal as the transport writes it: status, headers, body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub status: u16,
    pub headers: Vec<(&'static str, String)>,
    pub body: String,
}

/// Whether the caller spoke gRPC: its request's `content-type` is `application/grpc` or a
/// subtype (`application/grpc+proto`).
pub fn is_grpc(content_type: Option<&str>) -> bool {
    content_type.is_some_and(|t| {
        let t = t.trim();
        t.eq_ignore_ascii_case("application/grpc")
            || starts_with_ignore_case(t, "application/grpc+")
            || starts_with_ignore_case(t, "application/grpc;")
    })
}

/// The refusal for a caller that was identified but is not allowed.
pub fn forbidden(grpc: bool, reason: &str) -> Refusal {
    refuse(grpc, 403, GRPC_PERMISSION_DENIED, reason)
}

/// The refusal for a caller with no identity the gate accepts (no certificate, no token, or
/// one the gate or the API server rejected).
pub fn unauthenticated(grpc: bool, reason: &str) -> Refusal {
    refuse(grpc, 401, GRPC_UNAUTHENTICATED, reason)
}

/// The answer when the gate cannot decide now (a review the API server did not answer in
/// time) or cannot reach the upstream: it fails closed, and says so as a retryable error.
pub fn unavailable(grpc: bool, http_status: u16, reason: &str) -> Refusal {
    refuse(grpc, http_status, GRPC_UNAVAILABLE, reason)
}

fn refuse(grpc: bool, http_status: u16, grpc_status: u8, reason: &str) -> Refusal {
    let reason = prefix(reason, MAX_REASON_BYTES);
    let line = format!("keyward gate: {reason}");
    if grpc {
        Refusal {
            status: 200,
            headers: vec![
                ("content-type", "application/grpc".into()),
                ("grpc-status", grpc_status.to_string()),
                ("grpc-message", percent_encode(&line)),
            ],
            body: String::new(),
        }
    } else {
        Refusal {
            status: http_status,
            headers: vec![("content-type", "text/plain; charset=utf-8".into())],
            body: format!("{}\n", line.replace(['\r', '\n'], " ")),
        }
    }
}

/// gRPC's percent-encoding of `grpc-message`: every byte outside printable ASCII, and `%`,
/// as `%XX` (upper-case hex) of the UTF-8 bytes.
pub fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if (0x20..=0x7e).contains(&b) && b != b'%' {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_grpc_caller_gets_permission_denied_in_trailers_only_with_the_reason_encoded() {
        let r = forbidden(true, "rule \"own job\": gRPC field 1 is \"other\"\n100% é");
        assert_eq!(r.status, 200);
        assert_eq!(
            r.headers,
            [
                ("content-type", "application/grpc".to_string()),
                ("grpc-status", "7".to_string()),
                (
                    "grpc-message",
                    "keyward gate: rule \"own job\": gRPC field 1 is \"other\"%0A100%25 %C3%A9".to_string()
                ),
            ]
        );
        assert!(r.body.is_empty());
        assert_eq!(unauthenticated(true, "no certificate").headers[1], ("grpc-status", "16".to_string()));
    }

    #[test]
    fn an_http_caller_gets_403_or_401_with_one_line() {
        let r = forbidden(false, "no rule covers this\r\nX-Injected: 1");
        assert_eq!(r.status, 403);
        assert_eq!(r.body, "keyward gate: no rule covers this  X-Injected: 1\n");
        assert_eq!(unauthenticated(false, "no token").status, 401);
        assert_eq!(unavailable(false, 503, "the API server did not answer").status, 503);
        let r = unavailable(true, 503, "the API server did not answer");
        assert_eq!((r.status, r.headers[1].1.as_str()), (200, "14"));
    }

    #[test]
    fn a_long_reason_is_clipped_at_a_character_boundary() {
        let long = "é".repeat(1000);
        let r = forbidden(false, &long);
        assert!(r.body.len() <= MAX_REASON_BYTES + 20, "{}", r.body.len());
        assert!(r.body.ends_with("é\n"));
    }

    #[test]
    fn grpc_content_types_are_recognised() {
        for t in ["application/grpc", "application/grpc+proto", "Application/GRPC; charset=x", " application/grpc "] {
            assert!(is_grpc(Some(t)), "{t}");
        }
        for t in [None, Some("application/json"), Some("application/grpc-web"), Some("application/grpcx")] {
            assert!(!is_grpc(t), "{t:?}");
        }
    }
}
