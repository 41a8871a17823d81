-- Live configuration: versions of the reloadable settings, layered over the environment.
-- The applied version with the highest number is in force; rolled back and bad versions
-- are kept for the history.

CREATE TABLE config_versions (
    version bigserial PRIMARY KEY,
    config jsonb NOT NULL,
    status text NOT NULL DEFAULT 'applied' CHECK (status IN ('applied', 'rolled_back', 'bad')),
    applied_by text NOT NULL DEFAULT '',
    note text NOT NULL DEFAULT '',
    created_at timestamptz NOT NULL DEFAULT now()
);
