//! `PathUri`: every path on the wire is a `file:` URI.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::path::{Path, PathBuf};
use url::Url;

/// A `file:` URI such as `file:///tmp/a%20b`. Parsing applies URL normalisation
/// (`..` segments are resolved, `file:tmp` names `/tmp`). Errors, as the reference's:
/// `invalid URI: relative URL without a base` for a bare path and
/// ``unsupported path URI scheme `http` `` for another scheme.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PathUri(Url);

impl PathUri {
    /// Parses and checks a URI string.
    pub fn parse(s: &str) -> Result<Self, String> {
        let url = Url::parse(s).map_err(|e| format!("invalid URI: {e}"))?;
        if url.scheme() != "file" {
            return Err(format!("unsupported path URI scheme `{}`", url.scheme()));
        }
        if url.query().is_some() || url.fragment().is_some() {
            return Err(format!("file URI `{s}` must not have a query or fragment"));
        }
        Ok(PathUri(url))
    }

    /// The URI of an absolute local path; `None` for a relative path.
    pub fn from_path(path: &Path) -> Option<Self> {
        Url::from_file_path(path).ok().map(PathUri)
    }

    /// The native path named by the URI. Errors with
    /// ``path `URI` is not valid on this exec-server host`` when it has a host or
    /// cannot be represented.
    pub fn to_path(&self) -> Result<PathBuf, String> {
        self.0
            .to_file_path()
            .map_err(|_| format!("path `{}` is not valid on this exec-server host", self.0))
    }

    /// The URI text.
    pub fn as_str(&self) -> &str {
        self.0.as_str()
    }
}

impl fmt::Display for PathUri {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0.as_str())
    }
}

impl Serialize for PathUri {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.0.as_str())
    }
}

impl<'de> Deserialize<'de> for PathUri {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        PathUri::parse(&s).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quirks_of_the_reference() {
        assert_eq!(
            PathUri::parse("/some/dir").unwrap_err(),
            "invalid URI: relative URL without a base"
        );
        assert_eq!(
            PathUri::parse("http://x/y").unwrap_err(),
            "unsupported path URI scheme `http`"
        );
        assert_eq!(
            PathUri::parse("file:tmp").unwrap().to_path().unwrap(),
            Path::new("/tmp")
        );
        assert_eq!(
            PathUri::parse("file:///a/sub/../x")
                .unwrap()
                .to_path()
                .unwrap(),
            Path::new("/a/x")
        );
        let p = PathUri::from_path(Path::new("/tmp/a b")).unwrap();
        assert_eq!(p.as_str(), "file:///tmp/a%20b");
        assert_eq!(p.to_path().unwrap(), Path::new("/tmp/a b"));
    }
}
