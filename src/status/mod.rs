//! Commit statuses: the status model, the Git-notes backend, forge backends, the fleet matrix and wave gating.
