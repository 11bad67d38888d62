//! Release engineering in Git: cutting a signed release, promoting it by a branch commit (and PR), rolling back by revert.
