"""The n-gram study: token PLE against a hashed n-gram table of the same bytes and reads, at two table sizes."""
