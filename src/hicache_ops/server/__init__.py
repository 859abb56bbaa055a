"""`hicache serve`: the HTTP API over the embedded tiered cache, its runtime and its client."""
