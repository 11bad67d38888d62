//! [`error_chain`]: the one way an error becomes text for people. By convention an error's message
//! does not repeat its `source()`'s text; the chain is printed once, here, at the edge (the CLI's
//! output, the agent's status, Events, notifications and logs), so no layer's detail is lost and
//! none is printed twice.

use std::error::Error;

/// `err` and every `source()` below it, joined with ": ". A source whose text the message so far
/// already contains (foreign error types that print their source themselves) is not repeated.
pub fn error_chain(err: &(dyn Error + 'static)) -> String {
    let mut out = err.to_string();
    let mut source = err.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    enum Inner {
        #[error("connection refused")]
        Refused,
    }

    #[derive(Debug, thiserror::Error)]
    enum Middle {
        #[error("fetching git://host/fleet.git")]
        Fetch(#[source] Inner),
    }

    /// A foreign-style error that prints its source itself as well as returning it.
    #[derive(Debug, thiserror::Error)]
    enum Repeating {
        #[error("source: {0}")]
        Source(#[source] Middle),
    }

    #[test]
    fn error_chain_prints_each_source_once() {
        let e = Middle::Fetch(Inner::Refused);
        assert_eq!(error_chain(&e), "fetching git://host/fleet.git: connection refused");
        let e = Repeating::Source(Middle::Fetch(Inner::Refused));
        assert_eq!(error_chain(&e), "source: fetching git://host/fleet.git: connection refused");
    }
}
