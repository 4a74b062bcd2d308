"""The fuzz harness (harness.py) the fuzz tests use."""
