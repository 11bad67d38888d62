//! Throw-away GnuPG homes with generated keys.
