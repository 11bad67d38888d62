//! The fleet repo as seen through git2: clone/fetch, cheap change detection, reading trees into a `Checkout`.
