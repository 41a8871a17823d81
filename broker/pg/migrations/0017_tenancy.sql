-- Tenancy: a key names the agents it may run; allow-always grants belong to a user and
-- an agent (one user's answer never lets another's call run).
ALTER TABLE api_keys ADD COLUMN agents text[] NOT NULL DEFAULT '{main}';

ALTER TABLE permission_grants ADD COLUMN user_id text NOT NULL DEFAULT '';
ALTER TABLE permission_grants DROP CONSTRAINT permission_grants_pkey;
ALTER TABLE permission_grants ADD PRIMARY KEY (user_id, agent_id, rule);
