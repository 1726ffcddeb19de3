//! Lifting a hot request's base64 out of a text message while the message
//! arrives, so that a large `fs/writeFile` never holds its base64 whole.
//!
//! [`crate::hot::decode_text`] decodes a hot member in place once the whole
//! message is in memory: a 64 MiB file then needs its 85 MiB of base64 at
//! once. A [`HotLift`] instead follows the message as its bytes land in the
//! receive buffer: it finds `params.dataBase64` (or `params.chunk`) in the
//! message's first bytes, then decodes the base64 received so far in place
//! and moves what follows down, so the buffer holds decoded bytes (¾ of the
//! text) plus the last read. When the message ends, [`HotLift::finish`]
//! gives the message with that string emptied and the bytes apart
//! ([`LiftedText`]), which [`crate::hot::decode_lifted`] checks and decodes
//! exactly as [`crate::hot::decode_text`] would have.
//!
//! Nothing is lost on the way: only whole groups of four base64 characters
//! that are followed by more base64 are decoded early (a group decodes to
//! three bytes and encodes back to the same four characters), and the last
//! group waits for the closing quote. Anything unexpected (a backslash, a
//! character outside base64, a length that is not a multiple of four, a
//! message that ends inside the string) encodes the decoded bytes back in
//! place and gives the original text.

use crate::skim;
use bytes::Bytes;

/// How far into a message the hot member must begin: 64 KiB. A request
/// whose member starts later is read as plain text.
pub const SEARCH_LIMIT_BYTES: usize = 64 * 1024;

/// Base64 strings shorter than this stay in the text (the plain path is as
/// fast for them): 16 KiB, as [`crate::hot::LIFT_MIN_BYTES`].
const MIN_BASE64_BYTES: usize = crate::hot::LIFT_MIN_BYTES;

/// Members that can be lifted (of the top-level `params` object).
const MEMBERS: [&str; 2] = ["dataBase64", "chunk"];

/// Follows one text message as it arrives (see the module documentation).
#[derive(Debug, Default)]
pub struct HotLift {
    state: State,
    /// Decoded bytes on their way down the buffer (one step's worth).
    scratch: Vec<u8>,
}

/// Base64 decoded per step: 64 KiB (the step's bytes stay in cache while
/// they are decoded and moved).
const STEP_TEXT_BYTES: usize = 64 * 1024;

#[derive(Debug, Default)]
enum State {
    /// Looking for the member in the message's first bytes.
    #[default]
    Searching,
    /// The buffer is: text up to and including the opening quote (`start`
    /// bytes), `decoded` decoded bytes, then text not yet decoded.
    Decoding {
        member: &'static str,
        start: usize,
        decoded: usize,
    },
    /// As `Decoding`, and the text after the decoded bytes is the last four
    /// base64 characters, the closing quote and the rest of the message.
    Closed {
        member: &'static str,
        start: usize,
        decoded: usize,
    },
    /// Nothing lifted: the buffer is the text as received.
    Off,
}

/// A message whose hot member's string was emptied, and the member's bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiftedText {
    /// The message with `""` in place of the member's string; not yet
    /// checked as UTF-8.
    pub skeleton: Vec<u8>,
    /// Offset in `skeleton` just past the emptied string's opening quote.
    pub at: usize,
    /// The member's name (`dataBase64` or `chunk`).
    pub member: &'static str,
    /// The decoded bytes: the string was valid base64.
    pub payload: Bytes,
}

impl LiftedText {
    /// The message as it was received: the payload encoded back into its
    /// string.
    pub fn restore(&self) -> Vec<u8> {
        let mut text = Vec::with_capacity(
            self.skeleton.len() + exec_server_protocol::bytes::encoded_len(self.payload.len()),
        );
        text.extend_from_slice(&self.skeleton[..self.at]);
        let mut encoded =
            String::with_capacity(exec_server_protocol::bytes::encoded_len(self.payload.len()));
        exec_server_base64::encode_append(&self.payload, &mut encoded);
        text.extend_from_slice(encoded.as_bytes());
        text.extend_from_slice(&self.skeleton[self.at..]);
        text
    }
}

/// What [`HotLift::finish`] gives.
#[derive(Debug, PartialEq, Eq)]
pub enum Finished {
    /// The message's text exactly as received.
    Text(Vec<u8>),
    /// The member was lifted.
    Lifted(LiftedText),
}

impl HotLift {
    /// A lift for a new message.
    pub fn new() -> Self {
        Self::default()
    }

    /// Called after bytes were appended to `buf`, the message so far (as
    /// this lift left it, plus the new bytes). Decodes what it can in place;
    /// `buf` may get shorter.
    pub fn progress(&mut self, buf: &mut Vec<u8>) {
        if let State::Searching = self.state {
            self.state = match hot_member_start(buf) {
                // However much has arrived, a member that starts late is
                // left in the text (the same answer whatever the pieces).
                Some((_, start)) if start > SEARCH_LIMIT_BYTES => State::Off,
                Some((member, start)) => State::Decoding {
                    member,
                    start,
                    decoded: 0,
                },
                None if buf.len() < SEARCH_LIMIT_BYTES => return,
                None => State::Off,
            };
        }
        let State::Decoding {
            member,
            start,
            decoded,
        } = self.state
        else {
            return;
        };
        let from = start + decoded;
        // Whole blocks of base64 that more base64 follows go straight into
        // place first where the CPU has the wide kernels: no search for the
        // closing quote is needed, since neither it nor a backslash is a
        // base64 character.
        let (chars, bytes) = exec_server_base64::decode_leading_in_place(&mut buf[from..]);
        let mut done = (from + chars, from + bytes); // (text read up to, bytes written up to)
        let mut failed = false;
        let (end, closed) = match memchr::memchr2(b'"', b'\\', &buf[done.0..]) {
            Some(i) if buf[done.0 + i] == b'"' => (done.0 + i, true),
            Some(_) => {
                failed = true;
                (done.0, false)
            }
            None => (buf.len(), false),
        };
        let waiting = end - done.0;
        failed |= closed && (waiting < 4 || waiting % 4 != 0);
        // Keep the last group (it may hold padding, or be followed by more).
        let take = match (failed, closed) {
            (true, _) => 0,
            (false, true) => waiting - 4,
            (false, false) => waiting.saturating_sub(4) / 4 * 4,
        };
        let stop = done.0 + take;
        while done.0 < stop {
            let n = (stop - done.0).min(STEP_TEXT_BYTES);
            let most = n / 4 * 3;
            // Padding can only end the string: not in a group followed by more.
            let out = if buf[done.0 + n - 1] == b'=' {
                None
            } else if done.1 + most <= done.0 {
                // Where the bytes go lies wholly before the text: straight
                // there (what it overwrites was decoded already). The text
                // is only read, so it is intact if it is not base64.
                let (written, text) = buf.split_at_mut(done.0);
                exec_server_base64::decode(&text[..n], &mut written[done.1..done.1 + most])
            } else {
                // Overlapping: decoded out of the text into scratch first,
                // then written down.
                self.scratch.resize(STEP_TEXT_BYTES / 4 * 3, 0);
                let out = exec_server_base64::decode(&buf[done.0..done.0 + n], &mut self.scratch);
                if let Some(out) = out {
                    buf[done.1..done.1 + out].copy_from_slice(&self.scratch[..out]);
                }
                out
            };
            let Some(out) = out else {
                failed = true;
                break;
            };
            done = (done.0 + n, done.1 + out);
        }
        if done.0 > from {
            buf.copy_within(done.0.., done.1);
            buf.truncate(buf.len() - (done.0 - done.1));
            self.state = State::Decoding {
                member,
                start,
                decoded: decoded + (done.1 - from),
            };
        }
        if failed {
            return self.give_up(buf);
        }
        if closed {
            let State::Decoding { decoded, .. } = self.state else {
                return;
            };
            self.state = State::Closed {
                member,
                start,
                decoded,
            };
        }
    }

    /// The message is complete (and [`Self::progress`] saw its last bytes):
    /// what was lifted, or the text as received.
    pub fn finish(mut self, mut buf: Vec<u8>) -> Finished {
        let State::Closed {
            member,
            start,
            decoded,
        } = self.state
        else {
            self.give_up(&mut buf);
            return Finished::Text(buf);
        };
        let last = start + decoded;
        let group_ok = buf
            .get(last..last + 4)
            .is_some_and(exec_server_base64::is_valid);
        if !group_ok || decoded / 3 * 4 + 4 < MIN_BASE64_BYTES {
            self.give_up(&mut buf);
            return Finished::Text(buf);
        }
        let Some(n) = exec_server_base64::decode_in_place(&mut buf[last..last + 4]) else {
            self.give_up(&mut buf);
            return Finished::Text(buf);
        };
        let mut skeleton = Vec::with_capacity(start + buf.len() - (last + 4));
        skeleton.extend_from_slice(&buf[..start]);
        skeleton.extend_from_slice(&buf[last + 4..]);
        Finished::Lifted(LiftedText {
            skeleton,
            at: start,
            member,
            payload: Bytes::from(buf).slice(start..last + n),
        })
    }

    /// Puts the decoded bytes back as base64 (in place, from the end, so
    /// nothing unread is overwritten) and stops lifting.
    fn give_up(&mut self, buf: &mut Vec<u8>) {
        if let State::Decoding { start, decoded, .. } | State::Closed { start, decoded, .. } =
            self.state
        {
            encode_back(buf, start, decoded);
        }
        self.state = State::Off;
    }
}

/// Re-encodes `buf[start..start + decoded]` (a multiple of 3 bytes, decoded
/// from whole groups) in place, moving what follows up.
fn encode_back(buf: &mut Vec<u8>, start: usize, decoded: usize) {
    const CHUNK: usize = 3 * 16 * 1024;
    let encoded = decoded / 3 * 4;
    let rest = start + decoded..buf.len();
    let grow = encoded - decoded;
    buf.resize(buf.len() + grow, 0);
    buf.copy_within(rest, start + encoded);
    let mut tmp = String::with_capacity(CHUNK / 3 * 4);
    let mut end = decoded;
    while end > 0 {
        // From the last chunk to the first: chunk k's text lands at or
        // after where its bytes began, past every chunk not yet encoded.
        let begin = (end - 1) / CHUNK * CHUNK;
        tmp.clear();
        exec_server_base64::encode_append(&buf[start + begin..start + end], &mut tmp);
        let at = start + begin / 3 * 4;
        buf[at..at + tmp.len()].copy_from_slice(tmp.as_bytes());
        end = begin;
    }
}

/// The lifted member's name and where its string's contents begin, when
/// `b` (a message's first bytes) shows the top-level `params` object with a
/// member in [`MEMBERS`] whose value is a string. `None` when not (yet).
fn hot_member_start(b: &[u8]) -> Option<(&'static str, usize)> {
    let mut i = skim::object_open(b, 0)?;
    loop {
        let (key, value) = skim::member_at(b, i)?;
        if &b[key.clone()] == b"params" {
            let mut j = skim::object_open(b, value)?;
            loop {
                let (key, value) = skim::member_at(b, j)?;
                if b.get(value) == Some(&b'"') {
                    if let Some(m) = MEMBERS.iter().find(|m| m.as_bytes() == &b[key.clone()]) {
                        return Some((m, value + 1));
                    }
                }
                j = skim::next_member(b, skim::value_end(b, value)?)?;
            }
        }
        i = skim::next_member(b, skim::value_end(b, value)?)?;
    }
}

#[cfg(test)]
mod tests;
