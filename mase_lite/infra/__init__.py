"""The tool's own plumbing: user errors and I/O faults, files written whole, JSON read strictly, size limits, run
locks, progress, thread counts, the trust policy and its signatures, and the modules' old names."""
