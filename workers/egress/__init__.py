"""Every outbound byte of a tool: the egress client, its address checks and the local proxy for
browsers."""
