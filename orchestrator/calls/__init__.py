"""Everything a call passes before a worker runs it: gate, rules, permissions, hooks, approvals,
tenancy, dispatch."""
