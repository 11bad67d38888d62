//! Parsing and ordering a release's rendered manifests into a `ManifestSet`.
