-- The canvas: a versioned document per session that the agent presents (HTML, or
-- Markdown rendered to HTML); the last versions are kept, older ones removed.

CREATE TABLE canvas_versions (
    session_id text NOT NULL,
    version integer NOT NULL,
    format text NOT NULL CHECK (format IN ('html', 'markdown')),
    content text NOT NULL,
    html text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (session_id, version)
);
