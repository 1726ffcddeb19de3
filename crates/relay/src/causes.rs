//! An error with its causes, for messages an operator reads.

/// `e` and its causes, "a: b: c", each said once. Libraries keep the
/// reason in the source chain: reqwest says "error sending request" of a
/// refused connection, tokio-postgres "db error" of what the server
/// answered (`database "x" does not exist`); the operator needs the reason.
pub fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let said = c.to_string();
        if !text.contains(&said) {
            text.push_str(": ");
            text.push_str(&said);
        }
        cause = c.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::chain;

    #[derive(Debug, thiserror::Error)]
    #[error("{0}")]
    struct E(&'static str, #[source] Option<Box<E>>);

    #[test]
    fn each_cause_is_said_once_in_order() {
        let inner = E("connection refused", None);
        let mid = E("client error: connection refused", Some(Box::new(inner)));
        let top = E("error sending request", Some(Box::new(mid)));
        assert_eq!(
            chain(&top),
            "error sending request: client error: connection refused"
        );
    }
}
