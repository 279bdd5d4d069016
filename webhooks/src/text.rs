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

/// `s` with every character that could act on a terminal escaped as `\u{..}`: control
/// characters (C0, DEL, C1: ESC sequences, BEL, OSC 52 clipboard writes, carriage returns that
/// overwrite a line, newlines that fake one) and the invisible format characters that reorder
/// or hide text (bidirectional overrides and isolates, zero-width characters). Text from the
/// cluster is printed through it.
pub fn terminal_safe(s: &str) -> Cow<'_, str> {
    fn unsafe_char(c: char) -> bool {
        c.is_control()
            || matches!(c, '\u{061c}' | '\u{200b}'..='\u{200f}' | '\u{2028}'..='\u{202e}' | '\u{2060}'..='\u{2069}' | '\u{feff}' | '\u{fff9}'..='\u{fffb}')
    }
    if !s.chars().any(unsafe_char) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 16);
    for c in s.chars() {
        if unsafe_char(c) {
            out.push_str(&format!("\\u{{{:x}}}", u32::from(c)));
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
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

    #[test]
    fn nothing_that_acts_on_a_terminal_gets_through() {
        assert_eq!(terminal_safe("plain-name é"), "plain-name é");
        assert!(matches!(terminal_safe("plain"), Cow::Borrowed(_)));
        // A window title, a clipboard write, a line rewritten, a faked line, reordered text.
        assert_eq!(terminal_safe("\u{1b}]0;pwned\u{7}"), "\\u{1b}]0;pwned\\u{7}");
        assert_eq!(terminal_safe("\u{1b}]52;c;ZXZpbA==\u{1b}\\"), "\\u{1b}]52;c;ZXZpbA==\\u{1b}\\");
        assert_eq!(terminal_safe("a\rb\nno findings"), "a\\u{d}b\\u{a}no findings");
        assert_eq!(terminal_safe("x\u{202e}gpj.exe\u{9b}"), "x\\u{202e}gpj.exe\\u{9b}");
        assert_eq!(terminal_safe("zero\u{200b}width"), "zero\\u{200b}width");
    }
}
