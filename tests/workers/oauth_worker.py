"""One mcp worker's sessions in a process of its own, for the OAuth tests: waits for a go
file (so several start at once), then calls a tool of a server and prints the result as
JSON (or the error). Settings from the environment, as a worker's.

`python -m tests.workers.oauth_worker SERVER TOOL GO_FILE`"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from broker.config.settings import Settings
from workers.tools.mcp.client import CatalogStore, McpError, McpManager
from workers.tools.mcp.oauth import OAuthAuth


def main(server: str, tool: str, go: Path) -> None:
    settings = Settings()
    catalog = CatalogStore(settings)
    deadline = time.monotonic() + 30
    while not go.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    manager = McpManager(
        settings, catalog.load, catalog.on_listed, OAuthAuth(settings, catalog.oauth_rows())
    )
    try:
        print(json.dumps(manager.call(server, tool, {})))
    except McpError as exc:
        print(json.dumps({"error": str(exc)}))
    finally:
        manager.close()
        catalog.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], Path(sys.argv[3]))
