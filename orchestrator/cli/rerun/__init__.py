"""Commands that run recorded jobs again from their ledger: `replay`, `fork`, `eval`."""
