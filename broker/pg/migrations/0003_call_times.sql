-- When a worker started each call (finished_at is already there): overlap is visible.
ALTER TABLE tool_calls ADD COLUMN started_at timestamptz;
