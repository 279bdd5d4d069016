//! What a gRPC request names: a top-level string field of its message, found by field number
//! without the message's descriptor.
//!
//! The gate compares such a field with the caller (an LMEvalJob driver may update only the job
//! its certificate names), so it must never read a value other than the one the server acts
//! on. Where parsers could differ, the message is refused: a field sent twice (protobuf's Go
//! and C++ parsers take the last, a hand-written one may take the first: a driver could put
//! its own job first and another's last), a field of that number that is not length-delimited,
//! a group, a string that is not UTF-8. Nested messages are never entered. Time is linear in
//! the message and nothing is allocated.

use crate::Error;

/// The largest gRPC message the gate reads: gRPC's default limit on a received message.
pub const MAX_MESSAGE_BYTES: usize = 4 * 1024 * 1024;
/// The largest field number protobuf allows.
const MAX_FIELD_NUMBER: u64 = (1 << 29) - 1;
/// The length-prefix of each gRPC message: a compressed flag and a big-endian length.
const PREFIX: usize = 5;

/// The first message of a gRPC request body (a unary call's only one), uncompressed. A body
/// cut short, a compressed message (the gate cannot read it, so cannot judge it), or one past
/// [`MAX_MESSAGE_BYTES`] is refused.
pub fn first_message(body: &[u8]) -> Result<&[u8], Error> {
    let Some((prefix, rest)) = body.split_first_chunk::<PREFIX>() else {
        return Err(Error::Grpc(format!(
            "the request body has {} bytes, fewer than a gRPC message's 5-byte prefix",
            body.len()
        )));
    };
    let [compressed, length @ ..] = *prefix;
    if compressed != 0 {
        return Err(Error::Grpc(
            "the request's message is compressed; the gate reads only uncompressed messages (send without grpc-encoding, or leave this method out of field rules)"
                .into(),
        ));
    }
    let length = u32::from_be_bytes(length) as usize;
    if length > MAX_MESSAGE_BYTES {
        return Err(Error::Grpc(format!(
            "the request's message is {length} bytes, more than the {MAX_MESSAGE_BYTES} the gate reads"
        )));
    }
    rest.get(..length).ok_or_else(|| {
        Error::Grpc(format!("the request's message says {length} bytes and the body holds {}", rest.len()))
    })
}

/// The body of a call whose one message the rules read: exactly one message, nothing after it.
/// A field condition is checked on that message, so a body of two (a client stream, or a
/// unary call with a second message the server might read instead) is refused: the gate
/// cannot tell which one the server acts on.
pub fn only_message(body: &[u8]) -> Result<&[u8], Error> {
    let message = first_message(body)?;
    let rest = body.len() - PREFIX - message.len();
    if rest > 0 {
        return Err(Error::Grpc(format!(
            "the request holds more than one message ({rest} bytes after the first); a method whose rule reads a field must be called with exactly one (unary or server-streaming)"
        )));
    }
    Ok(message)
}

/// The value of top-level string field `number` in a protobuf `message`: `None` when the
/// message does not carry it (proto3 reads that as `""`).
pub fn string_field(message: &[u8], number: u32) -> Result<Option<&str>, Error> {
    let mut at = 0;
    let mut found = None;
    while at < message.len() {
        let tag = varint(message, &mut at)?;
        let field = tag >> 3;
        let wire = (tag & 7) as u8;
        if field == 0 || field > MAX_FIELD_NUMBER {
            return Err(Error::Grpc(format!(
                "the message has a field numbered {field}, which protobuf does not allow"
            )));
        }
        let value = match wire {
            0 => {
                varint(message, &mut at)?;
                None
            }
            1 => Some(skip(message, &mut at, 8)?),
            2 => {
                let length = varint(message, &mut at)?;
                let length = usize::try_from(length).unwrap_or(usize::MAX);
                Some(skip(message, &mut at, length)?)
            }
            5 => Some(skip(message, &mut at, 4)?),
            3 | 4 => {
                return Err(Error::Grpc(format!(
                    "field {field} is a group (wire type {wire}), which the gate does not read"
                )))
            }
            _ => {
                return Err(Error::Grpc(format!("field {field} has wire type {wire}, which protobuf does not define")))
            }
        };
        if field == u64::from(number) {
            let bytes = match (wire, value) {
                (2, Some(bytes)) => bytes,
                _ => {
                    return Err(Error::Grpc(format!(
                        "field {number} is not a string (wire type {wire}, not 2): the method's message is not what the rule expects"
                    )))
                }
            };
            let text = std::str::from_utf8(bytes)
                .map_err(|_| Error::Grpc(format!("field {number} is not UTF-8, which a protobuf string must be")))?;
            if found.replace(text).is_some() {
                return Err(Error::Grpc(format!(
                    "field {number} appears more than once; parsers differ on which one counts, so the gate reads neither"
                )));
            }
        }
    }
    Ok(found)
}

/// A gRPC request body of one message holding string `fields` in the order given, for a dry
/// run (`keyward check-gate --grpc-field`) and for tests.
pub fn encode_strings(fields: &[(u32, &str)]) -> Vec<u8> {
    fn varint(out: &mut Vec<u8>, mut v: u64) {
        while v >= 0x80 {
            out.push((v & 0x7f) as u8 | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
    }
    let mut message = Vec::new();
    for (number, value) in fields {
        varint(&mut message, u64::from(*number) << 3 | 2);
        varint(&mut message, value.len() as u64);
        message.extend_from_slice(value.as_bytes());
    }
    let mut body = vec![0];
    body.extend_from_slice(&u32::try_from(message.len()).unwrap_or(u32::MAX).to_be_bytes());
    body.extend_from_slice(&message);
    body
}

/// A base-128 varint at `*at`: at most 10 bytes, and no bits past 64.
fn varint(bytes: &[u8], at: &mut usize) -> Result<u64, Error> {
    let mut value: u64 = 0;
    for i in 0..10 {
        let Some(&b) = bytes.get(*at) else {
            return Err(Error::Grpc("the message ends inside a varint".into()));
        };
        *at += 1;
        if i == 9 && b > 1 {
            return Err(Error::Grpc("the message has a varint longer than 64 bits".into()));
        }
        value |= u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            return Ok(value);
        }
    }
    Err(Error::Grpc("the message has a varint longer than 10 bytes".into()))
}

/// The next `n` bytes at `*at`.
fn skip<'m>(bytes: &'m [u8], at: &mut usize, n: usize) -> Result<&'m [u8], Error> {
    let end = at.checked_add(n).filter(|end| *end <= bytes.len()).ok_or_else(|| {
        Error::Grpc(format!("the message ends inside a field ({n} bytes from byte {} of {})", *at, bytes.len()))
    })?;
    let out = &bytes[*at..end];
    *at = end;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A protobuf encoder for the tests, field by field.
    #[derive(Default)]
    struct Message(Vec<u8>);

    impl Message {
        fn varint(mut self, mut v: u64) -> Self {
            loop {
                let b = (v & 0x7f) as u8;
                v >>= 7;
                if v == 0 {
                    self.0.push(b);
                    return self;
                }
                self.0.push(b | 0x80);
            }
        }
        fn tag(self, field: u64, wire: u64) -> Self {
            self.varint(field << 3 | wire)
        }
        fn string(self, field: u64, s: &[u8]) -> Self {
            let mut m = self.tag(field, 2).varint(s.len() as u64);
            m.0.extend_from_slice(s);
            m
        }
        fn int(self, field: u64, v: u64) -> Self {
            self.tag(field, 0).varint(v)
        }
        fn framed(&self) -> Vec<u8> {
            let mut out = vec![0];
            out.extend_from_slice(&(self.0.len() as u32).to_be_bytes());
            out.extend_from_slice(&self.0);
            out
        }
    }

    fn text(e: Error) -> String {
        e.to_string()
    }

    #[test]
    fn a_string_field_is_found_by_number_among_others_and_nested_messages_are_not_entered() {
        // A nested message (field 3) carrying its own field 1 must not be read as field 1.
        let nested = Message::default().string(1, b"someone-else");
        let mut m = Message::default().int(4, 300).string(3, &nested.0).string(1, b"evaljob-sample").tag(6, 1);
        m.0.extend_from_slice(&[0; 8]); // a fixed64
        let mut m = m.tag(7, 5);
        m.0.extend_from_slice(&[1, 2, 3, 4]); // a fixed32
        let m = m.string(2, b"team-a");
        let body = m.framed();
        let message = first_message(&body).unwrap();
        assert_eq!(string_field(message, 1).unwrap(), Some("evaljob-sample"));
        assert_eq!(string_field(message, 2).unwrap(), Some("team-a"));
        assert_eq!(string_field(message, 5).unwrap(), None);
    }

    #[test]
    fn the_bounds_are_where_protobuf_and_grpc_put_them() {
        // Field numbers: 2^29 - 1 is protobuf's largest; 2^29 is refused.
        let largest = (1u64 << 29) - 1;
        let m = Message::default().string(largest, b"x");
        assert_eq!(string_field(&m.0, largest as u32).unwrap(), Some("x"));
        let m = Message::default().string(largest + 1, b"x");
        assert_eq!(
            text(string_field(&m.0, 1).unwrap_err()),
            "gRPC request: the message has a field numbered 536870912, which protobuf does not allow"
        );
        // Message length: 4 MiB is read (here cut short), a byte more is refused outright.
        let prefix = |n: u32| {
            let mut b = vec![0];
            b.extend_from_slice(&n.to_be_bytes());
            b
        };
        let at_limit = text(first_message(&prefix(MAX_MESSAGE_BYTES as u32)).unwrap_err());
        assert!(at_limit.contains("the body holds 0"), "{at_limit}");
        let over = text(first_message(&prefix(MAX_MESSAGE_BYTES as u32 + 1)).unwrap_err());
        assert!(over.contains("more than the 4194304 the gate reads"), "{over}");
    }

    #[test]
    fn only_one_message_is_read_as_the_call_and_a_second_refuses_it() {
        let first = Message::default().string(1, b"mine").framed();
        assert_eq!(only_message(&first).unwrap(), &first[5..]);
        let mut two = first.clone();
        two.extend_from_slice(&Message::default().string(1, b"theirs").framed());
        assert_eq!(
            text(only_message(&two).unwrap_err()),
            "gRPC request: the request holds more than one message (13 bytes after the first); a method whose rule reads a field must be called with exactly one (unary or server-streaming)"
        );
        let mut trailing = first.clone();
        trailing.push(0);
        assert!(text(only_message(&trailing).unwrap_err()).contains("(1 bytes after the first)"));
        assert!(text(only_message(&first[..first.len() - 1]).unwrap_err()).contains("the body holds"));
    }

    #[test]
    fn a_field_sent_twice_is_refused_whichever_value_comes_first() {
        let m = Message::default().string(1, b"mine").string(2, b"team-a").string(1, b"theirs");
        assert_eq!(
            text(string_field(&m.0, 1).unwrap_err()),
            "gRPC request: field 1 appears more than once; parsers differ on which one counts, so the gate reads neither"
        );
        assert_eq!(string_field(&m.0, 2).unwrap(), Some("team-a"), "another field is read as usual");
    }

    #[test]
    fn a_field_of_that_number_that_is_not_a_string_is_refused() {
        let m = Message::default().int(1, 7);
        assert_eq!(
            text(string_field(&m.0, 1).unwrap_err()),
            "gRPC request: field 1 is not a string (wire type 0, not 2): the method's message is not what the rule expects"
        );
        let m = Message::default().string(1, b"ok").int(1, 7);
        assert!(text(string_field(&m.0, 1).unwrap_err()).contains("is not a string"), "a later one is read too");
        let m = Message::default().string(1, &[0xff, 0xfe]);
        assert_eq!(
            text(string_field(&m.0, 1).unwrap_err()),
            "gRPC request: field 1 is not UTF-8, which a protobuf string must be"
        );
    }

    #[test]
    fn malformed_messages_are_refused_saying_why() {
        let cases: [(&[u8], &str); 7] = [
            (&[0x0a, 0x05, b'a'], "the message ends inside a field (5 bytes from byte 2 of 3)"),
            (&[0x0a], "the message ends inside a varint"),
            (
                &[0x0a, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f],
                "the message has a varint longer than 64 bits",
            ),
            (&[0x00], "the message has a field numbered 0, which protobuf does not allow"),
            (&[0x0b], "field 1 is a group (wire type 3), which the gate does not read"),
            (&[0x0e], "field 1 has wire type 6, which protobuf does not define"),
            (&[0x0a, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01], "the message ends inside a field"),
        ];
        for (bytes, want) in cases {
            let e = text(string_field(bytes, 2).unwrap_err());
            assert!(e.starts_with(&format!("gRPC request: {want}")), "{bytes:?}: {e}");
        }
    }

    #[test]
    fn the_frame_must_be_whole_uncompressed_and_within_the_limit() {
        assert_eq!(first_message(&[0, 0, 0, 0, 0]).unwrap(), b"");
        assert_eq!(first_message(&[0, 0, 0, 0, 2, 8, 1, 99]).unwrap(), &[8, 1], "a second message is not read here");
        let cases: [(&[u8], &str); 4] = [
            (&[0, 0, 0], "the request body has 3 bytes, fewer than a gRPC message's 5-byte prefix"),
            (&[1, 0, 0, 0, 0], "the request's message is compressed"),
            (&[0, 0, 0, 0, 3, 1], "the request's message says 3 bytes and the body holds 1"),
            (
                &[0, 0xff, 0xff, 0xff, 0xff],
                "the request's message is 4294967295 bytes, more than the 4194304 the gate reads",
            ),
        ];
        for (body, want) in cases {
            let e = text(first_message(body).unwrap_err());
            assert!(e.starts_with(&format!("gRPC request: {want}")), "{body:?}: {e}");
        }
    }

    #[test]
    fn an_encoded_body_reads_back() {
        let body = encode_strings(&[(1, "evaljob-sample"), (2, "team-a"), (300, &"x".repeat(200))]);
        let message = first_message(&body).unwrap();
        assert_eq!(string_field(message, 1).unwrap(), Some("evaljob-sample"));
        assert_eq!(string_field(message, 2).unwrap(), Some("team-a"));
        assert_eq!(string_field(message, 300).unwrap().map(str::len), Some(200));
    }

    proptest! {
        /// Any bytes: an answer or an error, never a panic, in one pass.
        #[test]
        fn any_bytes_are_read_or_refused(bytes in proptest::collection::vec(any::<u8>(), 0..256), field in 1u32..20) {
            let _ = string_field(&bytes, field);
            let _ = first_message(&bytes);
        }

        /// Whatever other fields surround it, the field reads as the value written to it, and
        /// written twice it is refused.
        #[test]
        fn the_field_reads_as_written_among_any_others(
            value in "[a-z0-9-]{0,20}",
            before in proptest::collection::vec((2u64..30, any::<u64>()), 0..6),
            after in proptest::collection::vec((2u64..30, any::<u64>()), 0..6),
            twice in any::<bool>(),
        ) {
            let mut m = Message::default();
            for (field, n) in &before {
                m = m.int(*field, *n).string(field + 30, b"x");
            }
            m = m.string(1, value.as_bytes());
            for (field, n) in &after {
                m = m.int(*field, *n);
            }
            if twice {
                m = m.string(1, b"other");
                prop_assert!(string_field(&m.0, 1).is_err());
            } else {
                prop_assert_eq!(string_field(&m.0, 1).unwrap(), Some(value.as_str()));
            }
        }
    }
}
