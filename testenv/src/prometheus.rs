//! Prometheus from Debian's package, scraping a metrics endpoint the test serves.
