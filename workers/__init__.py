"""The tool contract and registry, worker-side execution of a call, tools by group."""
