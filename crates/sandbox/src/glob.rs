//! Expanding a glob entry into the paths it names now.
//!
//! The `glob` crate was not reachable from this build environment, so this is a
//! deliberately small matcher over one path component at a time: `*` (any
//! run), `?` (one character), `[abc]`, `[a-z]` and `[!…]`/`[^…]` character
//! classes (an unterminated `[` is literal), and `**` as a whole component for
//! any number of components. `{a,b}` alternation and `\` escapes are refused
//! ([`Incomplete::Unsupported`]) rather than taken literally. `*` and `?` match a leading dot too: a `deny`
//! pattern should hide more, never less.
//!
//! `**` does not descend symlinked directories: a match through a link in a
//! directory a sandbox may write would be resolved wherever that link was
//! pointed (and is refused by [`crate::links`] when a pattern component
//! names one). The walk is bounded by
//! [`MAX_GLOB_VISITS`] entries and [`crate::MAX_GLOB_MATCHES`] matches; a walk
//! cut short, or a directory that could not be read, is reported in
//! [`Expansion::incomplete`] so a `deny` entry can fail closed.

use crate::MAX_GLOB_MATCHES;
use std::path::{Path, PathBuf};

/// Most directory entries one expansion visits: 50 000.
pub const MAX_GLOB_VISITS: usize = 50_000;

/// Longest pattern expanded: 4 096 bytes (`PATH_MAX`); a longer one names
/// no path and is refused.
pub const MAX_PATTERN_BYTES: usize = 4096;

/// Why an expansion may have missed matches.
#[derive(Debug, thiserror::Error)]
pub enum Incomplete {
    /// More than [`crate::MAX_GLOB_MATCHES`] paths match.
    #[error("it matches more than {MAX_GLOB_MATCHES} paths")]
    TooManyMatches,
    /// The walk read [`MAX_GLOB_VISITS`] directory entries before it ended.
    #[error("its walk passes {MAX_GLOB_VISITS} directory entries")]
    TooManyEntries,
    /// The pattern is longer than [`MAX_PATTERN_BYTES`].
    #[error("it is longer than {MAX_PATTERN_BYTES} bytes")]
    TooLong,
    /// The pattern has `{…}` alternation or a `\` escape, which other glob
    /// dialects expand and this one does not: taken literally, a `deny`
    /// would hide nothing.
    #[error("it uses {{…}} alternation or a \\ escape, which are not supported")]
    Unsupported,
    /// A directory the pattern reaches could not be listed.
    #[error("{0} cannot be listed: {1}")]
    Unreadable(PathBuf, std::io::Error),
}

/// What one pattern names: the matches found, and whether the walk saw
/// everything.
#[derive(Debug, Default)]
pub struct Expansion {
    /// Existing paths that match (not canonicalised).
    pub paths: Vec<PathBuf>,
    /// `Some` when matches may be missing from [`Self::paths`].
    pub incomplete: Option<Incomplete>,
}

/// One element of a component pattern.
#[derive(Debug, Clone, PartialEq)]
enum Token {
    Char(char),
    Any,
    Star,
    /// A character class: the inclusive ranges it names; `negated` for `[!…]`.
    Class {
        negated: bool,
        ranges: Vec<(char, char)>,
    },
}

fn tokenize(pattern: &str) -> Vec<Token> {
    let chars: Vec<char> = pattern.chars().collect();
    let mut out = Vec::with_capacity(chars.len());
    let mut i = 0;
    // Once a `[` finds no `]` to close it, no later one can: without this,
    // a run of `[` rescans to the end for each (quadratic).
    let mut unclosed = false;
    while i < chars.len() {
        match chars[i] {
            '*' => out.push(Token::Star),
            '?' => out.push(Token::Any),
            '[' if unclosed => out.push(Token::Char('[')),
            '[' => match class(&chars[i + 1..]) {
                Some((token, used)) => {
                    out.push(token);
                    i += used;
                }
                None => {
                    unclosed = true;
                    out.push(Token::Char('['));
                }
            },
            c => out.push(Token::Char(c)),
        }
        i += 1;
    }
    out
}

/// Parses a class from just after its `[`: the token and how many characters
/// it used (up to and including `]`), or `None` when no `]` closes it.
fn class(rest: &[char]) -> Option<(Token, usize)> {
    let mut i = 0;
    let negated = matches!(rest.first(), Some('!' | '^'));
    if negated {
        i += 1;
    }
    let mut ranges = Vec::new();
    let mut first = true;
    loop {
        let c = *rest.get(i)?;
        // A `]` right after `[` or `[!` is a member, as in glob(7).
        if c == ']' && !first {
            return Some((Token::Class { negated, ranges }, i + 1));
        }
        first = false;
        match (rest.get(i + 1), rest.get(i + 2)) {
            (Some('-'), Some(&hi)) if hi != ']' => {
                ranges.push((c, hi));
                i += 3;
            }
            _ => {
                ranges.push((c, c));
                i += 1;
            }
        }
    }
}

fn token_matches(t: &Token, c: char) -> bool {
    match t {
        Token::Char(p) => *p == c,
        Token::Any => true,
        Token::Star => false,
        Token::Class { negated, ranges } => {
            ranges.iter().any(|(lo, hi)| (*lo..=*hi).contains(&c)) != *negated
        }
    }
}

/// True if `name` (one path component) matches `pattern`.
pub fn matches(pattern: &str, name: &str) -> bool {
    matches_tokens(&tokenize(pattern), name)
}

fn matches_tokens(p: &[Token], name: &str) -> bool {
    let n: Vec<char> = name.chars().collect();
    // The classic single-star backtracking match: linear in practice.
    let (mut pi, mut ni, mut star, mut mark) = (0, 0, None, 0);
    while ni < n.len() {
        if pi < p.len() && token_matches(&p[pi], n[ni]) {
            pi += 1;
            ni += 1;
        } else if pi < p.len() && p[pi] == Token::Star {
            star = Some(pi);
            mark = ni;
            pi += 1;
        } else if let Some(s) = star {
            pi = s + 1;
            mark += 1;
            ni = mark;
        } else {
            return false;
        }
    }
    while pi < p.len() && p[pi] == Token::Star {
        pi += 1;
    }
    pi == p.len()
}

/// The existing paths matching the absolute `pattern`.
pub fn expand(pattern: &str) -> Expansion {
    expand_within(pattern, MAX_GLOB_VISITS)
}

fn expand_within(pattern: &str, visits: usize) -> Expansion {
    let refused = if pattern.len() > MAX_PATTERN_BYTES {
        Some(Incomplete::TooLong)
    } else if pattern.contains(['{', '}', '\\']) {
        Some(Incomplete::Unsupported)
    } else {
        None
    };
    if refused.is_some() {
        return Expansion {
            paths: Vec::new(),
            incomplete: refused,
        };
    }
    let parts: Vec<&str> = pattern.split('/').filter(|s| !s.is_empty()).collect();
    let mut walk = Walk {
        found: Expansion::default(),
        budget: visits,
    };
    walk.visit(Path::new("/"), &parts);
    walk.found
}

struct Walk {
    found: Expansion,
    budget: usize,
}

impl Walk {
    fn stop(&mut self, why: Incomplete) {
        self.found.incomplete.get_or_insert(why);
    }

    fn visit(&mut self, base: &Path, parts: &[&str]) {
        if self.found.incomplete.is_some() {
            return;
        }
        let Some((first, rest)) = parts.split_first() else {
            if base.symlink_metadata().is_ok() {
                if self.found.paths.len() >= MAX_GLOB_MATCHES {
                    return self.stop(Incomplete::TooManyMatches);
                }
                self.found.paths.push(base.to_path_buf());
            }
            return;
        };
        if *first == "**" {
            // Zero components, then one more level with `**` still pending.
            self.visit(base, rest);
            for child in self.children(base) {
                if child.symlink_metadata().is_ok_and(|m| m.is_dir()) {
                    self.visit(&child, parts);
                }
            }
            return;
        }
        let tokens = tokenize(first);
        if tokens.iter().all(|t| matches!(t, Token::Char(_))) {
            let literal: String = tokens
                .iter()
                .filter_map(|t| match t {
                    Token::Char(c) => Some(*c),
                    _ => None,
                })
                .collect();
            return self.visit(&base.join(literal), rest);
        }
        for child in self.children(base) {
            let name = child.file_name().map(|n| n.to_string_lossy().into_owned());
            if name.is_some_and(|n| matches_tokens(&tokens, &n)) {
                self.visit(&child, rest);
            }
        }
    }

    /// The entries of `dir`; nothing for a path that is absent or not a
    /// directory (it holds no match), an [`Incomplete`] for any other failure.
    fn children(&mut self, dir: &Path) -> Vec<PathBuf> {
        let rd = match std::fs::read_dir(dir) {
            Ok(rd) => rd,
            Err(e) if absent(&e) => return Vec::new(),
            Err(e) => {
                self.stop(Incomplete::Unreadable(dir.to_path_buf(), e));
                return Vec::new();
            }
        };
        let mut v = Vec::new();
        for e in rd {
            if self.budget == 0 {
                self.stop(Incomplete::TooManyEntries);
                break;
            }
            self.budget -= 1;
            match e {
                Ok(e) => v.push(e.path()),
                Err(err) => {
                    self.stop(Incomplete::Unreadable(dir.to_path_buf(), err));
                    break;
                }
            }
        }
        v
    }
}

fn absent(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("sbx-glob-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn expands_stars_and_double_stars() {
        let d = tmp("stars");
        std::fs::create_dir_all(d.join("a/b")).unwrap();
        std::fs::write(d.join("x.env"), "").unwrap();
        std::fs::write(d.join("a/b/y.env"), "").unwrap();
        std::fs::write(d.join("a/z.txt"), "").unwrap();
        let mut got = expand(&format!("{}/**/*.env", d.display()));
        assert!(got.incomplete.is_none());
        got.paths.sort();
        assert_eq!(got.paths, vec![d.join("a/b/y.env"), d.join("x.env")]);
        assert_eq!(
            expand(&format!("{}/a/?.txt", d.display())).paths,
            vec![d.join("a/z.txt")]
        );
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn character_classes_match_as_in_glob7() {
        assert!(matches("[a].key", "a.key"));
        assert!(!matches("[a].key", "[a].key"));
        assert!(matches("id_[rd]sa*", "id_rsa.pub"));
        assert!(matches("[!a-c]x", "dx") && !matches("[!a-c]x", "bx"));
        assert!(matches("[^0-9]", "z") && !matches("[^0-9]", "5"));
        assert!(matches("[]]", "]") && matches("[!]]", "a"));
        assert!(matches("[a-]", "-"));
        // Unterminated: the `[` is literal.
        assert!(matches("[ab", "[ab") && !matches("[ab", "a"));
        assert!(matches("*[0-9]", ".env2"));
        // A run of unclosed `[` is literal (parsed in one pass: it was
        // quadratic, 60 000 took 2.9 s of a start).
        let run = "[".repeat(200_000);
        assert!(matches(&run, &run) && !matches(&run, "["));
        assert!(matches!(
            expand(&format!("/{}", "a".repeat(MAX_PATTERN_BYTES))).incomplete,
            Some(Incomplete::TooLong)
        ));
        for other_dialects in ["/w/a/{k,kx}.pem", "/w/\\*.key"] {
            assert!(matches!(
                expand(other_dialects).incomplete,
                Some(Incomplete::Unsupported)
            ));
        }
    }

    #[test]
    fn a_class_expands_on_disk() {
        let d = tmp("class");
        std::fs::write(d.join("a.key"), "").unwrap();
        std::fs::write(d.join("b.key"), "").unwrap();
        let got = expand(&format!("{}/[a].key", d.display()));
        assert_eq!(got.paths, vec![d.join("a.key")]);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn double_stars_do_not_descend_symlinked_directories() {
        let d = tmp("links");
        let out = tmp("links-out");
        std::fs::write(out.join("k.pem"), "").unwrap();
        std::os::unix::fs::symlink(&out, d.join("link")).unwrap();
        std::os::unix::fs::symlink(&d, d.join("loop")).unwrap();
        let got = expand(&format!("{}/**/*.pem", d.display()));
        assert!(got.incomplete.is_none(), "{:?}", got.incomplete);
        assert_eq!(got.paths, Vec::<PathBuf>::new());
        std::fs::remove_dir_all(&d).unwrap();
        std::fs::remove_dir_all(&out).unwrap();
    }

    #[test]
    fn a_walk_cut_short_says_so() {
        let d = tmp("budget");
        for i in 0..3 {
            let sub = d.join(format!("d{i}"));
            std::fs::create_dir_all(&sub).unwrap();
            for j in 0..40 {
                std::fs::write(sub.join(format!("f{j}")), "").unwrap();
            }
        }
        let got = expand_within(&format!("{}/**/*.key", d.display()), 100);
        assert!(
            matches!(got.incomplete, Some(Incomplete::TooManyEntries)),
            "{:?}",
            got.incomplete
        );
        let got = expand_within(&format!("{}/d1/f*", d.display()), 100);
        assert!(got.incomplete.is_none());
        assert_eq!(got.paths.len(), 40);
        std::fs::remove_dir_all(&d).unwrap();
    }
}
