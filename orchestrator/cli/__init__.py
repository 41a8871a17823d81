"""The `clawq` command line: one module per command group, and the local stack."""
