//! Text from a snapshot made safe to print. File and function names come
//! from the file, and a terminal obeys what it is sent: an escape sequence
//! in a "file name" could clear the screen or retitle the window, a
//! right-to-left override could make one site read as another, and a NUL
//! ends a string early in C tools reading the HTML. Such characters are
//! shown as `\u{…}` escapes instead, everywhere a name is shown.

use std::borrow::Cow;

/// Whether `c` would act on a terminal or on the text around it rather than show.
pub fn acts(c: char) -> bool {
    c.is_control()
        || matches!(c,
            // Zero-width characters and joiners, the byte-order mark.
            '\u{200b}'..='\u{200d}' | '\u{2060}' | '\u{feff}'
            // Bidirectional marks, embeddings, overrides and isolates.
            | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// `s` with every character that acts rather than shows written as `\u{…}`.
pub fn printable(s: &str) -> Cow<'_, str> {
    if !s.chars().any(acts) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if acts(c) {
            out.extend(c.escape_unicode());
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::printable;

    #[test]
    fn escapes_nul_and_right_to_left_overrides_are_shown_not_obeyed() {
        assert_eq!(printable("\x1b[2J\x1b]0;pwned\x07x.py"), "\\u{1b}[2J\\u{1b}]0;pwned\\u{7}x.py");
        assert_eq!(printable("a\0b\u{202e}c\u{200b}"), "a\\u{0}b\\u{202e}c\\u{200b}");
        assert!(matches!(printable("train.py:10 in step — ünïcode"), std::borrow::Cow::Borrowed(_)));
    }
}
