//! `ReleaseAdmissionPolicy`: bounds on what a release may touch (namespaces, cluster-scoped kinds, cluster-admin bindings).
