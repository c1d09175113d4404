"""Measurement code: what the scripts in benchmarks/ (thin wrappers that print a table and write JSON)
and the experiments that reuse a benchmark's measurements both call, so experiments run from an
installed package."""
