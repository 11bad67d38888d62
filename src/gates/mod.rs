//! Gates: pre-apply (CRD compatibility, cluster requirements, existing CRs) and post-apply (health, restarts, CEL, Prometheus) evaluations.
