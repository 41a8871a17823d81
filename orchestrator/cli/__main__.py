"""`python -m orchestrator.cli`: the `clawq` command."""

from orchestrator.cli.main import main

main()
