"""Benchmarks that print ratios against the peers (run by `make bench-NAME`)."""
