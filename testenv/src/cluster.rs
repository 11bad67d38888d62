//! Real Kubernetes test clusters.
