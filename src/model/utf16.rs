//! Lone UTF-16 surrogate escapes in provider stream events. A provider that cuts its text into
//! UTF-16 units may send an emoji as `"\ud83d"` at the end of one event and `"\ude00"` at the
//! start of the next; neither half is valid JSON text on its own. [`mark_lone_surrogates`] turns
//! each lone half into a private-use stand-in so the event parses, and a [`Joiner`] per streamed
//! field joins a high half with the low half that follows it (in the same piece or the next).
//! Whatever cannot be joined becomes U+FFFD: a broken character never fails a turn.

use std::borrow::Cow;

/// The stand-in of surrogate unit `u` is `STAND_IN_BASE + (u - 0xD800)` (U+10F800..=U+10FFFF).
const STAND_IN_BASE: u32 = 0x10_F800;

/// The surrogate unit a stand-in character stands for.
fn unit_of(c: char) -> Option<u16> {
    let code = c as u32;
    (code >= STAND_IN_BASE).then(|| (code - STAND_IN_BASE + 0xD800) as u16)
}

fn is_high(unit: u16) -> bool {
    (0xD800..0xDC00).contains(&unit)
}

fn is_low(unit: u16) -> bool {
    (0xDC00..0xE000).contains(&unit)
}

/// The unit of a `\uXXXX` escape starting at `at` (the backslash).
fn escape_at(bytes: &[u8], at: usize) -> Option<u16> {
    if bytes.get(at + 1) != Some(&b'u') {
        return None;
    }
    let hex = std::str::from_utf8(bytes.get(at + 2..at + 6)?).ok()?;
    u16::from_str_radix(hex, 16).ok()
}

/// One stream event's JSON, parsed with its lone surrogate halves as stand-ins. `marked` says
/// whether its strings may hold stand-ins: only then does a [`Joiner`] read them as halves, so
/// a model's own characters of the stand-in range pass through untouched.
pub(crate) fn parse_event(data: &str) -> Result<(serde_json::Value, bool), serde_json::Error> {
    let (text, marked) = mark_lone_surrogates(data);
    Ok((serde_json::from_str(&text)?, marked))
}

/// `data` (a JSON text) with every lone surrogate escape replaced by its stand-in, so that it
/// parses (borrowed when there is none), and whether stand-ins were used. When the text already
/// holds characters of the stand-in range, lone halves become U+FFFD instead (they then cannot be
/// joined across events).
fn mark_lone_surrogates(data: &str) -> (Cow<'_, str>, bool) {
    let bytes = data.as_bytes();
    let mut lone: Vec<(usize, u16)> = Vec::new();
    let mut collides = false;
    let mut at = 0;
    while let Some(offset) = bytes[at..].iter().position(|&b| b == b'\\') {
        at += offset;
        let Some(unit) = escape_at(bytes, at) else {
            // Any other escape is two bytes (`\"`, `\\`, `\n`, ...).
            at += 2;
            continue;
        };
        if is_high(unit)
            && let Some(next) = escape_at(bytes, at + 6).filter(|next| is_low(*next))
        {
            collides |= char::from_u32(0x10000 + ((u32::from(unit) - 0xD800) << 10) + (u32::from(next) - 0xDC00))
                .and_then(unit_of)
                .is_some();
            at += 12;
            continue;
        }
        if is_high(unit) || is_low(unit) {
            lone.push((at, unit));
        }
        at += 6;
    }
    if lone.is_empty() {
        return (Cow::Borrowed(data), false);
    }
    collides |= data.chars().any(|c| unit_of(c).is_some());
    let mut out = String::with_capacity(data.len());
    let mut copied = 0;
    for (at, unit) in lone {
        out.push_str(&data[copied..at]);
        let stand_in = if collides { None } else { char::from_u32(STAND_IN_BASE + u32::from(unit) - 0xD800) };
        out.push(stand_in.unwrap_or(char::REPLACEMENT_CHARACTER));
        copied = at + 6;
    }
    out.push_str(&data[copied..]);
    (Cow::Owned(out), !collides)
}

/// Joins surrogate halves across the pieces of one streamed field.
#[derive(Debug, Default)]
pub(crate) struct Joiner {
    /// A high half that ended the previous piece.
    pending: Option<u16>,
}

impl Joiner {
    /// `piece` with its stand-ins resolved (`marked`: its event used stand-ins, see
    /// [`parse_event`]): a high half followed by its low half (here, or held from the previous
    /// piece) becomes the character, a high half ending the piece is held for the next one, any
    /// other half becomes U+FFFD.
    pub(crate) fn piece<'a>(&mut self, piece: &'a str, marked: bool) -> Cow<'a, str> {
        if self.pending.is_none() && !marked {
            return Cow::Borrowed(piece);
        }
        let unit = |c: char| if marked { unit_of(c) } else { None };
        let mut out = String::with_capacity(piece.len());
        for c in piece.chars() {
            match (self.pending.take(), unit(c)) {
                (Some(high), Some(low)) if is_low(low) => {
                    let code = 0x10000 + ((u32::from(high) - 0xD800) << 10) + (u32::from(low) - 0xDC00);
                    out.push(char::from_u32(code).unwrap_or(char::REPLACEMENT_CHARACTER));
                }
                (held, unit) => {
                    if held.is_some() {
                        out.push(char::REPLACEMENT_CHARACTER);
                    }
                    match unit {
                        Some(high) if is_high(high) => self.pending = Some(high),
                        Some(_) => out.push(char::REPLACEMENT_CHARACTER),
                        None => out.push(c),
                    }
                }
            }
        }
        Cow::Owned(out)
    }

    /// The end of the field: a held high half never got its low half (U+FFFD).
    pub(crate) fn finish(&mut self) -> Option<char> {
        self.pending.take().map(|_| char::REPLACEMENT_CHARACTER)
    }

    /// A whole field at once (ids, names): every half it holds resolved.
    pub(crate) fn whole(text: &str, marked: bool) -> Cow<'_, str> {
        let mut joiner = Joiner::default();
        let joined = joiner.piece(text, marked);
        match joiner.finish() {
            Some(tail) => Cow::Owned(format!("{joined}{tail}")),
            None => joined,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The string `t` of an event, and whether the event used stand-ins.
    fn parsed(data: &str) -> (String, bool) {
        let (value, marked) = parse_event(data).unwrap();
        (value["t"].as_str().unwrap().to_string(), marked)
    }

    fn joined(joiner: &mut Joiner, data: &str) -> String {
        let (text, marked) = parsed(data);
        joiner.piece(&text, marked).into_owned()
    }

    #[test]
    fn lone_halves_parse_and_join_across_pieces() {
        assert!(serde_json::from_str::<serde_json::Value>(r#"{"t":"\ud83d"}"#).is_err(), "serde refuses lone halves");
        let mut joiner = Joiner::default();
        assert_eq!(joined(&mut joiner, r#"{"t":"hi \ud83d"}"#), "hi ");
        assert_eq!(joined(&mut joiner, r#"{"t":"\ude00!"}"#), "😀!");
        assert_eq!(joiner.finish(), None);
        // Pairs inside one event, escaped or raw, and other escapes are left alone.
        for text in [r#"{"t":"a\ud83d\ude00b"}"#, r#"{"t":"a😀b"}"#] {
            assert!(matches!(mark_lone_surrogates(text), (Cow::Borrowed(_), false)));
            let (t, marked) = parsed(text);
            assert_eq!(Joiner::whole(&t, marked), "a😀b");
        }
        assert_eq!(parsed(r#"{"t":"q\\ud83d\"\u00e9"}"#).0, "q\\ud83d\"é");
    }

    #[test]
    fn halves_that_cannot_be_joined_become_replacement_characters() {
        let mut joiner = Joiner::default();
        assert_eq!(joined(&mut joiner, r#"{"t":"\ude00x\ud83d"}"#), "\u{FFFD}x");
        assert_eq!(joined(&mut joiner, r#"{"t":"y"}"#), "\u{FFFD}y");
        assert_eq!(joined(&mut joiner, r#"{"t":"\ud83d\ud83d"}"#), "\u{FFFD}");
        assert_eq!(joiner.finish(), Some('\u{FFFD}'));
        let (t, marked) = parsed(r#"{"t":"end\ud83d"}"#);
        assert_eq!(Joiner::whole(&t, marked), "end\u{FFFD}");
    }

    #[test]
    fn a_models_own_stand_in_range_characters_pass_through() {
        let mut joiner = Joiner::default();
        // Without lone halves in the event, nothing is read as a half.
        assert_eq!(joined(&mut joiner, r#"{"t":"\udbff\udffd"}"#), "\u{10FFFD}");
        assert_eq!(joined(&mut joiner, "{\"t\":\"\u{10F800}\"}"), "\u{10F800}");
        // With both in one event, the lone half becomes U+FFFD and the character stays.
        let raw = format!(r#"{{"t":"{}\ud83d"}}"#, '\u{10FFFD}');
        assert_eq!(joined(&mut joiner, &raw), "\u{10FFFD}\u{FFFD}");
        assert_eq!(joined(&mut joiner, r#"{"t":"\udbff\udffd\ud83d"}"#), "\u{10FFFD}\u{FFFD}");
        assert_eq!(joiner.finish(), None);
    }
}
