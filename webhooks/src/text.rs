//! Text that came from a request, made safe to echo in a message or a log line.

use std::borrow::Cow;

/// At most `max` bytes of `s`, cut at a character boundary, saying how much was left out.
/// Anything a pod creator controls can be megabytes long; what keyward echoes is not.
pub fn clip(s: &str, max: usize) -> Cow<'_, str> {
    if s.len() <= max {
        return Cow::Borrowed(s);
    }
    let kept = prefix(s, max);
    Cow::Owned(format!("{kept}…({} more bytes)", s.len() - kept.len()))
}

/// At most `max` bytes of `s`, cut at a character boundary, with no marker (for names whose
/// length a format limits).
pub fn prefix(s: &str, max: usize) -> &str {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// `s`, clipped to `max` bytes and quoted with Rust's escapes, so that a newline or a quote in
/// it cannot end the message it sits in.
pub fn quoted(s: &str, max: usize) -> String {
    format!("{:?}", clip(s, max))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clipping_keeps_short_text_and_cuts_at_a_character_boundary() {
        assert_eq!(clip("short", 10), "short");
        assert_eq!(clip("abcdef", 3), "abc…(3 more bytes)");
        // "é" is two bytes: never cut inside it.
        assert_eq!(clip("aéb", 2), "a…(3 more bytes)");
        assert_eq!(quoted("a\nb\"c", 16), r#""a\nb\"c""#);
        assert_eq!(quoted(&"x".repeat(100), 4), "\"xxxx…(96 more bytes)\"");
    }
}
