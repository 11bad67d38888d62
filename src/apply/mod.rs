//! Server-side apply of a verified release in phases, inventory and prune, snapshots and restore, drift.
